"""Rotary position embedding (RoPE), Llama's half-split ("rotate_half") layout.

Angles are computed per token from its own position, so the tokens of one step may belong to
many sequences at any offsets (decode, whole or chunked prefill). The float32 arithmetic is the
same as transformers' LlamaRotaryEmbedding and apply_rotary_pos_emb (default, linear and llama3
frequencies), so the rotated values agree with it bit for bit.
"""

from __future__ import annotations

import math

import torch

from pagedllm.model.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """The RoPE inverse frequencies of `config`, scaling applied.

    Returns:
        inv_freq: [head_dim // 2] float32.
    """
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (config.rope_theta ** exponents)
    rs = config.rope_scaling
    if rs is None:
        return inv_freq
    if rs.rope_type == "linear":
        return inv_freq / rs.factor
    # llama3: keep high frequencies, divide low ones by `factor`, interpolate in between.
    low_freq_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
    high_freq_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rs.factor, inv_freq)
    smooth = ((rs.original_max_position_embeddings / wavelen - rs.low_freq_factor)
              / (rs.high_freq_factor - rs.low_freq_factor))
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Computes per-token rotation tables once per step and applies them to q and k.

    Usage: `cos, sin = rope.tables(positions)` once per forward, then `rope.apply(x, cos, sin)`
    in every layer.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        # inv_freq: [head_dim // 2] float32
        self.register_buffer("inv_freq", inverse_frequencies(config), persistent=False)
        # CPU: every position's rows computed once, cos and sin [rows, 1, head_dim] per dtype,
        # grown by doubling (up to max_position_embeddings, unless a larger position is asked
        # for); remade when inv_freq changes.
        self.max_positions = config.max_position_embeddings
        self._cache: dict = {}
        self._cache_key: tuple = ()

    def tables(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotation tables for the tokens at `positions`.

        Args:
            positions: [num_tokens] int64, each token's position in its sequence.
            dtype: the dtype of the q/k the tables will be applied to.
        Returns:
            cos: [num_tokens, 1, head_dim], cos of the angle, both halves.
            sin: [num_tokens, 1, head_dim], sin of the angle, first half negated, so that
                 apply() is x * cos + swap_halves(x) * sin.
        """
        if positions.device.type != "cpu" or positions.numel() == 0:
            cos2, sin2 = self._compute(positions, dtype)
            return cos2[:, None, :], sin2[:, None, :]
        # A decode step's dozen small torch ops were 3-6% of a one-sequence step: gather rows
        # of tables made once (the same ops over 0..n-1, so the same values per position).
        cos_t, sin_t = self._tables(int(positions.max()) + 1, dtype)  # [rows, 1, head_dim]
        ids = positions if positions.dtype == torch.int64 else positions.long()
        return cos_t.index_select(0, ids), sin_t.index_select(0, ids)

    def _compute(self, positions: torch.Tensor, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        # freqs: [num_tokens, head_dim // 2] float32
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        cos2 = torch.cat((cos, cos), dim=-1).to(dtype)  # [num_tokens, head_dim]
        sin2 = torch.cat((-sin, sin), dim=-1).to(dtype)
        return cos2, sin2

    def table_rows(self, size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The CPU tables themselves (rows to gather by position, as tables() does).

        Args:
            size: rows needed (the largest position + 1).
            dtype: the dtype of the q/k the tables will be applied to.
        Returns:
            cos, sin: [>= size, 1, head_dim] contiguous, row p for position p.
        """
        return self._tables(size, dtype)

    def _tables(self, size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos / sin rows [>= size, 1, head_dim] in dtype for positions 0.. (CPU)."""
        key = (self.inv_freq._version, self.inv_freq.data_ptr())
        if key != self._cache_key:  # inv_freq changed (in place, or replaced)
            self._cache, self._cache_key = {}, key
        have = self._cache.get(dtype)
        if have is None or have[0].shape[0] < size:
            grown = min(2 * have[0].shape[0] if have is not None else 1024, self.max_positions)
            rows = -(-max(size, grown) // 64) * 64
            cos2, sin2 = self._compute(torch.arange(rows, dtype=torch.int64), dtype)
            have = self._cache[dtype] = (cos2[:, None, :], sin2[:, None, :])
        return have

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotates every head of every token.

        Args:
            x: [num_tokens, num_heads, head_dim], any strides.
            cos, sin: [num_tokens, 1, head_dim] from tables().
        Returns:
            [num_tokens, num_heads, head_dim] contiguous: (x1*c - x2*s, x2*c + x1*s), with x1, x2
            the halves of each head and c, s the per-token cos and sin.
        """
        t, n, d = x.shape
        # swapped: [num_tokens, num_heads, head_dim] = (x2, x1)
        swapped = x.reshape(t, n, 2, d // 2).flip(2).reshape(t, n, d)
        out = x * cos
        out += swapped * sin
        return out
