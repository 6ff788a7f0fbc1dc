"""PagedKVCache: the one tensor that holds every layer's keys and values in blocks.

Layout, block-major:

    pool: [num_blocks, num_layers, 2, num_kv_heads, block_size, head_dim]

so one block of one sequence (all layers, keys and values) is one contiguous region: copying
a block for copy-on-write, swapping it to host memory or persisting it moves one run of bytes.
`key_cache(layer)` / `value_cache(layer)` are the views pool[:, layer, 0] / pool[:, layer, 1],
shaped [num_blocks, num_kv_heads, block_size, head_dim] with a block stride of
num_layers * 2 * num_kv_heads * block_size * head_dim elements, which the kernels accept.

Storage dtypes (`kv_cache_dtype`): "auto" (the model dtype), "fp32", "fp16", "bf16", "fp8" (=
"fp8_e4m3") and "fp8_e5m2" (float8 bytes in a uint8 tensor, stored value = x / k_scale or
x / v_scale, saturated). The kernels convert on
write and accumulate in fp32 on read. The pool is zero-filled; nothing reads a slot before the
step that writes it.

With key_bounds=True (block-sparse "quest" attention) the pool has ceil(num_layers /
block_size) more "layers" after the model's: layer l's per-block key minimum lives in row
l % block_size of extra layer l // block_size's key half, its maximum in the same row of the
value half, so the bounds sit inside each block's region and move with it (see
pagedllm.sparse.key_bounds).
"""

from __future__ import annotations

import torch

from pagedllm import ops
from pagedllm.kv_dtypes import KV_CACHE_DTYPES as _NAMES
from pagedllm.model import huge_pages
from pagedllm.model.config import ModelConfig

# kv_cache_dtype name -> (storage torch dtype, None meaning the model dtype; the name the kernels
# take: "auto" lets them read the storage type off the tensor, fp8 bytes need the format named)
_KV_DTYPES: dict[str, tuple[torch.dtype | None, str]] = {
    "auto": (None, "auto"),
    "fp32": (torch.float32, "auto"), "float32": (torch.float32, "auto"),
    "fp16": (torch.float16, "auto"), "float16": (torch.float16, "auto"),
    "half": (torch.float16, "auto"),
    "bf16": (torch.bfloat16, "auto"), "bfloat16": (torch.bfloat16, "auto"),
    "fp8": (torch.uint8, "fp8_e4m3"), "fp8_e4m3": (torch.uint8, "fp8_e4m3"),
    "fp8_e5m2": (torch.uint8, "fp8_e5m2"),
}
KV_CACHE_DTYPES = tuple(_KV_DTYPES)
assert KV_CACHE_DTYPES == _NAMES, "kv_dtypes.py and this table must list the same names"


def _bound_layers(num_layers: int, block_size: int) -> int:
    """Extra pool layers that hold every layer's key bounds (one row per layer and half)."""
    return -(-num_layers // block_size)


def resolve_kv_cache_dtype(kv_cache_dtype: str,
                           model_dtype: torch.dtype) -> tuple[torch.dtype, str]:
    """(storage torch dtype, kernel dtype name) of a kv_cache_dtype name.

    Raises:
        ValueError: an unknown name.
    """
    if kv_cache_dtype not in _KV_DTYPES:
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r}: expected one of {list(_KV_DTYPES)}")
    storage, kernel_name = _KV_DTYPES[kv_cache_dtype]
    return (model_dtype if storage is None else storage), kernel_name


class PagedKVCache:
    """The paged K/V pool of one model (not thread-safe; the engine uses it from one thread).

    Args:
        config: the model whose layers and KV heads the pool holds.
        num_blocks: blocks in the pool (block ids 0..num_blocks-1 as the KVCacheManager gives).
        block_size: tokens per block.
        kv_cache_dtype: storage dtype name (see module doc).
        k_scale, v_scale: fp8 scales (stored = value / scale); ignored by other dtypes.
        dtype: the model dtype, which "auto" means.
        device: where the pool lives (the CPU, or a GPU for the CUDA kernels).
        key_bounds: also keep each block's per-layer key min/max (see module doc).

    Attributes:
        key_caches, value_caches: per layer, the [num_blocks, num_kv_heads, block_size,
            head_dim] views of the pool (tuples made once; key_cache(i) is key_caches[i]).
        has_key_bounds: whether the pool keeps the key bounds.
    """

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int,
                 kv_cache_dtype: str = "auto", k_scale: float = 1.0, v_scale: float = 1.0,
                 dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", key_bounds: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks = {num_blocks}, block_size = {block_size}: "
                             f"expected >= 1 each")
        if not (k_scale > 0 and v_scale > 0):
            raise ValueError(f"k_scale = {k_scale}, v_scale = {v_scale}: expected positive scales")
        self.storage_dtype, self.kernel_kv_dtype = resolve_kv_cache_dtype(kv_cache_dtype, dtype)
        self.kv_cache_dtype = kv_cache_dtype
        self.num_blocks, self.block_size = num_blocks, block_size
        self.num_layers = config.num_hidden_layers
        self.k_scale, self.v_scale = float(k_scale), float(v_scale)
        extra = _bound_layers(config.num_hidden_layers, block_size) if key_bounds else 0
        # pool: [num_blocks, num_layers (+ extra), 2, num_kv_heads, block_size, head_dim]
        # (on 2 MiB pages on the CPU with PAGEDLLM_HUGE_PAGES=1: huge_pages.py)
        self.pool = huge_pages.zeros((num_blocks, config.num_hidden_layers + extra, 2,
                                      config.num_key_value_heads, block_size, config.head_dim),
                                     dtype=self.storage_dtype, device=device)
        self.device = self.pool.device
        # per layer: [num_blocks, num_kv_heads, block_size, head_dim] views, made once.
        self.key_caches = tuple(self.pool[:, i, 0] for i in range(self.num_layers))
        self.value_caches = tuple(self.pool[:, i, 1] for i in range(self.num_layers))
        # per layer: ([num_blocks, num_kv_heads, head_dim] min, max) views, or None
        self.has_key_bounds = key_bounds
        self._bounds = [(self.pool[:, self.num_layers + i // block_size, 0, :, i % block_size],
                         self.pool[:, self.num_layers + i // block_size, 1, :, i % block_size])
                        if key_bounds else None for i in range(self.num_layers)]

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, kv_cache_dtype: str = "auto",
                        dtype: torch.dtype = torch.float32, key_bounds: bool = False) -> int:
        """Bytes one block takes (all layers, keys and values; the key bounds' extra layers
        when key_bounds), to size a pool from a budget."""
        storage, _ = resolve_kv_cache_dtype(kv_cache_dtype, dtype)
        layers = config.num_hidden_layers + (
            _bound_layers(config.num_hidden_layers, block_size) if key_bounds else 0)
        elems = (layers * 2 * config.num_key_value_heads * block_size
                 * config.head_dim)
        return elems * torch.empty((), dtype=storage).element_size()

    @property
    def nbytes(self) -> int:
        """Bytes of the whole pool."""
        return self.pool.numel() * self.pool.element_size()

    def key_cache(self, layer: int) -> torch.Tensor:
        """Keys of `layer`: [num_blocks, num_kv_heads, block_size, head_dim] view of the pool."""
        return self.key_caches[layer]

    def value_cache(self, layer: int) -> torch.Tensor:
        """Values of `layer`: [num_blocks, num_kv_heads, block_size, head_dim] view of the pool."""
        return self.value_caches[layer]

    def key_bounds(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Per-block key (min, max) of `layer`, [num_blocks, num_kv_heads, head_dim] views of
        the pool, or None when the pool keeps no bounds."""
        return self._bounds[layer]

    def copy_blocks(self, pairs: torch.Tensor) -> None:
        """Copies whole blocks (every layer, keys and values): pool[dst] = pool[src].

        Args:
            pairs: [k, 2] int32 (src, dst) rows, as KVCacheManager.append returns for
                copy-on-write. Destinations distinct and never also a source.
        Raises:
            ValueError / IndexError: a malformed pairs tensor or an id outside the pool (from
                the kernels, before anything is copied).
        """
        pairs = torch.as_tensor(pairs)
        if pairs.numel() == 0:
            return
        # the pool's first dim is blocks and each block is contiguous: one copy per pair
        ops.copy_blocks([self.pool], pairs)
