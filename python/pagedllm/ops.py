"""The paged-KV kernels behind one set of functions, chosen by where the tensors live.

Each function has the signature of the CPU kernel in ``pagedllm._core`` and calls it for CPU
tensors, or its CUDA twin in ``pagedllm._core.cuda`` when the cache (or, for swap_blocks, either
pool) is on a GPU. The model and the engine call these and never pick a backend themselves.

CUDA calls run on the calling thread's current kernel stream: 0 (the legacy default stream,
which is torch's default) unless ``cuda_stream`` set another. Argument checks, errors and
numerics are the kernels' own: see ``pagedllm._core`` and docs/ARCHITECTURE.md ("CUDA").
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch

from pagedllm import _core


def cuda_available() -> bool:
    """True when the CUDA kernels are compiled in and a GPU is visible."""
    mod = getattr(_core, "cuda", None)
    return mod is not None and mod.device_count() > 0


def _cuda():
    mod = getattr(_core, "cuda", None)
    if mod is None:
        raise RuntimeError(
            "this build of pagedllm has no CUDA kernels (it was built without nvcc); "
            "rebuild with PAGEDLLM_CUDA=ON, or keep the tensors on the CPU")
    return mod


def _is_cuda(t: torch.Tensor) -> bool:
    return isinstance(t, torch.Tensor) and t.is_cuda


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor,
                      kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                      v_scale: float = 1.0) -> None:
    """Writes new keys/values into their cache slots (slot -1: skipped).

    Args:
        key, value: [num_tokens, num_kv_heads, head_dim] float32 / float16 / bfloat16.
        key_cache, value_cache: [num_blocks, num_kv_heads, block_size, head_dim].
        slot_mapping: [num_tokens] int32 / int64, on the caches' device.
        kv_cache_dtype, k_scale, v_scale: the storage format (fp8: stored = x / scale).
    """
    backend = _cuda() if _is_cuda(key_cache) else _core
    backend.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
                              kv_cache_dtype, k_scale, v_scale)


def paged_attention_decode(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, block_tables: torch.Tensor,
                           context_lens: torch.Tensor, scale: float,
                           kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                           v_scale: float = 1.0) -> None:
    """Attention of one query token per sequence over its paged context; writes `out`.

    Args:
        out, query: [num_seqs, num_heads, head_dim].
        key_cache, value_cache: [num_blocks, num_kv_heads, block_size, head_dim].
        block_tables: [num_seqs, max_blocks] int32; context_lens: [num_seqs] int32.
        scale: softmax scale.
        kv_cache_dtype, k_scale, v_scale: the storage format.
    """
    backend = _cuda() if _is_cuda(key_cache) else _core
    backend.paged_attention_decode(out, query, key_cache, value_cache, block_tables,
                                   context_lens, scale, kv_cache_dtype, k_scale, v_scale)


def paged_attention_prefill(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, block_tables: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, scale: float,
                            kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                            v_scale: float = 1.0) -> None:
    """Causal attention of packed new tokens over their sequences' paged context.

    Args:
        out, query: [num_tokens, num_heads, head_dim].
        key_cache, value_cache: [num_blocks, num_kv_heads, block_size, head_dim].
        block_tables: [num_seqs, max_blocks] int32.
        cu_seqlens_q: [num_seqs + 1] int32; context_lens: [num_seqs] int32 (new tokens included).
        scale, kv_cache_dtype, k_scale, v_scale: as for decode.
    """
    backend = _cuda() if _is_cuda(key_cache) else _core
    backend.paged_attention_prefill(out, query, key_cache, value_cache, block_tables,
                                    cu_seqlens_q, context_lens, scale, kv_cache_dtype,
                                    k_scale, v_scale)


def paged_attention_decode_sparse(out: torch.Tensor, query: torch.Tensor,
                                  key_cache: torch.Tensor, value_cache: torch.Tensor,
                                  block_tables: torch.Tensor, context_lens: torch.Tensor,
                                  sparse_indptr: torch.Tensor, sparse_indices: torch.Tensor,
                                  scale: float, kv_cache_dtype: str = "auto",
                                  k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """paged_attention_decode over only the listed logical blocks (block-sparse, CSR).

    Args:
        out, query, key_cache, value_cache, block_tables, context_lens, scale,
            kv_cache_dtype, k_scale, v_scale: as for paged_attention_decode.
        sparse_indptr: [num_lists + 1] int32, num_lists = num_seqs (one list per sequence) or
            num_seqs * num_kv_heads (list seq * num_kv_heads + h for KV head h).
        sparse_indices: [sparse_indptr[-1]] int32, each list's logical block ids, increasing.
    """
    backend = _cuda() if _is_cuda(key_cache) else _core
    backend.paged_attention_decode_sparse(out, query, key_cache, value_cache, block_tables,
                                          context_lens, sparse_indptr, sparse_indices, scale,
                                          kv_cache_dtype, k_scale, v_scale)


def paged_attention_prefill_sparse(out: torch.Tensor, query: torch.Tensor,
                                   key_cache: torch.Tensor, value_cache: torch.Tensor,
                                   block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                   context_lens: torch.Tensor, sparse_indptr: torch.Tensor,
                                   sparse_indices: torch.Tensor, scale: float,
                                   kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                                   v_scale: float = 1.0) -> None:
    """paged_attention_prefill over only the listed logical blocks (CSR as for decode)."""
    backend = _cuda() if _is_cuda(key_cache) else _core
    backend.paged_attention_prefill_sparse(out, query, key_cache, value_cache, block_tables,
                                           cu_seqlens_q, context_lens, sparse_indptr,
                                           sparse_indices, scale, kv_cache_dtype, k_scale,
                                           v_scale)


def paged_cross_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, block_tables: torch.Tensor,
                          cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor,
                          kv_ranges: torch.Tensor, scale: float, kv_cache_dtype: str = "auto",
                          k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Non-causal cross-attention (Mllama) over each sequence's paged cross K/V; writes `out`.

    Args:
        out, query: [num_tokens, num_heads, head_dim] (packed query tokens of every sequence).
        key_cache, value_cache: [num_blocks, num_kv_heads, block_size, head_dim], the cross
            K/V written by reshape_and_cache into the sequences' cross blocks.
        block_tables: [num_seqs, max_blocks] int32, each sequence's CROSS block table.
        cu_seqlens_q: [num_seqs + 1] int32 (any number of query tokens per sequence).
        context_lens: [num_seqs] int32, the cross tokens stored for each sequence.
        kv_ranges: [num_tokens, 2] int32: query token i attends its sequence's cross positions
            kv_ranges[i, 0] <= j < kv_ranges[i, 1]; 0 <= lo <= hi <= context_len; lo == hi
            gives an output row of exactly zero.
        scale, kv_cache_dtype, k_scale, v_scale: as for paged_attention_decode.
    """
    backend = _cuda() if _is_cuda(key_cache) else _core
    backend.paged_cross_attention(out, query, key_cache, value_cache, block_tables,
                                  cu_seqlens_q, context_lens, kv_ranges, scale, kv_cache_dtype,
                                  k_scale, v_scale)


def copy_blocks(caches: Sequence[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Copies block src -> dst ([k, 2] pairs) inside every cache tensor (copy-on-write)."""
    backend = _cuda() if caches and _is_cuda(caches[0]) else _core
    backend.copy_blocks(list(caches), block_mapping)


# --- fused element-wise ops of a layer: _core on CPU float32 / bfloat16, torch elsewhere -------
_FUSED_DTYPES = (torch.float32, torch.bfloat16)


def _fused_on_cpu(x: torch.Tensor) -> bool:
    return not x.is_cuda and x.dtype in _FUSED_DTYPES


def _torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # float32: F.rms_norm; other dtypes: transformers' sequence (fp32 statistics, round, scale)
    if x.dtype == torch.float32:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rms_norm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """out = weight * x / sqrt(mean(x^2) + eps) per row (statistics in float32; bfloat16 rounds
    the normalised row before the weight, as transformers).

    Args:
        out, x: [rows, hidden], rows contiguous (out may be x).
        weight: [hidden].
        eps: added to the mean of squares.
    """
    if _fused_on_cpu(x):
        _core.rms_norm(out, x, weight, eps)
    else:
        out.copy_(_torch_rms_norm(x, weight, eps))


def fused_add_rms_norm(out: torch.Tensor, x: torch.Tensor, delta: torch.Tensor,
                       weight: torch.Tensor, eps: float) -> None:
    """x += delta in place, then out = rms_norm(x): vLLM's fused_add_rms_norm, one pass on CPU.

    Args:
        out: [rows, hidden], written.
        x: [rows, hidden], the residual stream, updated in place.
        delta: [rows, hidden], added to x.
        weight, eps: as for rms_norm.
    """
    if _fused_on_cpu(x):
        _core.fused_add_rms_norm(out, x, delta, weight, eps)
        return
    x += delta
    out.copy_(_torch_rms_norm(x, weight, eps))


def silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    """out = silu(x[:, :f]) * x[:, f:] (vLLM's silu_and_mul), one pass on CPU.

    Args:
        out: [rows, f], written.
        x: [rows, 2 * f], the gate then the up projection.
    """
    if _fused_on_cpu(x):
        _core.silu_and_mul(out, x)
        return
    gate, up = x.chunk(2, dim=-1)
    torch.mul(torch.nn.functional.silu(gate), up, out=out)


def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotates every head of every token in place: x = x * cos + swap_halves(x) * sin.

    Args:
        x: [num_tokens, num_heads, head_dim], any token / head strides, head_dim contiguous
            (q and k of a fused projection, say).
        cos, sin: [num_tokens, 1, head_dim] from pagedllm.model.rope.RotaryEmbedding.tables
            (of x's dtype).
    """
    if _fused_on_cpu(x):
        _core.rotary_embedding(x, cos, sin)
        return
    t, n, d = x.shape
    swapped = x.reshape(t, n, 2, d // 2).flip(2).reshape(t, n, d)
    rotated = x * cos
    rotated += swapped * sin
    x.copy_(rotated)


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Copies block src of `src` to block dst of `dst` for each (src, dst) pair of the CPU
    tensor `block_mapping`; either pool may be on a GPU (then the host one should be pinned)."""
    backend = _cuda() if _is_cuda(src) or _is_cuda(dst) else _core
    backend.swap_blocks(src, dst, block_mapping)


@contextlib.contextmanager
def cuda_stream(handle: int, device: int | None = None) -> Iterator[torch.cuda.ExternalStream]:
    """Runs torch's ops and the CUDA kernels on one stream (Streams.compute_stream, say).

    Args:
        handle: the cudaStream_t as an int.
        device: its device (None: torch's current device).
    Yields:
        The torch.cuda.ExternalStream wrapping it.
    """
    mod = _cuda()
    stream = torch.cuda.ExternalStream(handle, device=device)
    previous = mod.current_stream()
    with torch.cuda.stream(stream):
        mod.set_current_stream(handle)
        try:
            yield stream
        finally:
            mod.set_current_stream(previous)
