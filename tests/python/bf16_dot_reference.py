"""The error bound of the avx512_bf16 engine's decode against the float64 reference.

That engine rounds the query rows (unscaled: the softmax scale and fp8 k_scale multiply the
fp32 scores) to bf16 once per step and the softmax probabilities to bf16 for p.v; products are
exact and sums fp32. With
u = 2^-8 (bf16 unit roundoff), to first order, per query row and output element d:
- score t is off by at most E_t = u * scale * sum_d |q_d| |k_td|;
- weight w_t = softmax_t is then off by at most w_t (E_t + E_bar), E_bar = sum_t w_t E_t, and
  by 2 u w_t more from rounding p (the running sum adds the rounded p, so the weights still
  sum to 1);
- the output o = sum_t w_t v_t moves by sum_t dw_t (v_t - o) (the dw sum to 0), so
  |out_d - ref_d| <= sum_t w_t (E_t + E_bar + 2u) (|v_td| + |o_d|).
bf16_bound() returns that times 1.25 (room for the second-order terms, which are below
E_t^2 ~ 1e-3 relative here) plus the fp32 / output-dtype rounding of the exact engines'
bound.
"""

from __future__ import annotations

import torch

U_BF16 = 2.0 ** -8


def bf16_bound(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               positions: torch.Tensor, u_out: float,
               exact_scores: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 reference and per-element error bound of one sequence.

    Args:
        q: [Q, H, D] query rows; k, v: [L, KVH, D] float64 stored values (times their scales).
        scale: the softmax scale; positions: [Q] position of each query token (it attends keys
            0..position); u_out: unit roundoff of the output dtype.
        exact_scores: the query is exact in bf16: E_t = 0, only the probabilities' rounding
            is left.
    Returns:
        (ref, bound), both [Q, H, D] float64.
    """
    q = q.to(torch.float64)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # [L, H, D]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # [H, Q, L]
    mask = torch.arange(k.shape[0])[None, :] > positions[:, None]  # [Q, L]
    w = torch.softmax(scores.masked_fill(mask[None], float("-inf")), dim=-1)  # [H, Q, L]
    ref = torch.einsum("hqk,khd->qhd", w, v)  # [Q, H, D]
    e = U_BF16 * scale * torch.einsum("qhd,khd->hqk", q.abs(), k.abs())  # [H, Q, L]
    if exact_scores:
        e = torch.zeros_like(e)
    e_bar = (w * e).sum(-1, keepdim=True)
    coef = w * (e + e_bar + 2 * U_BF16)  # [H, Q, L]
    first_order = (torch.einsum("hqk,khd->qhd", coef, v.abs()) +
                   coef.sum(-1).transpose(0, 1)[..., None] * ref.abs())
    bound = 1.25 * first_order + u_out * ref.abs() + 1e-5 * max(1.0, ref.abs().max().item())
    return ref, bound
