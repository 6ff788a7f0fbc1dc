"""Typed stubs of the pagedllm._core extension (C++ core, pybind11)."""

from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

# Integer arguments: a sequence of ints or an integer array (numpy, a CPU torch tensor). Values
# are range-checked into the C++ type (token ids int32, sequence ids int64, hashes uint64) and a
# float, bool or out-of-range value raises ValueError: nothing is rounded or wrapped.
IntArray = Union[Sequence[int], npt.NDArray[np.integer]]

def build_info() -> dict[str, Any]:
    """version, cuda_compiled, cuda_runtime_version, cuda_driver_version, gpu_count, gpu_names,
    cpu_kernels_compiled, cpu_features, block_store_backends (["file"] or ["file", "rocksdb"]),
    compiler."""

# ---- persistent KV block store (block_store.h) ----------------------------------------------

ROOT_BLOCK_KEY: bytes
"""The parent key (16 bytes) of a sequence's first block."""

def file_digest(path: str) -> bytes:
    """XXH3-128 of every byte of the file at path (16 bytes), read front to back without the
    GIL. Raises OSError naming the path when it cannot be read."""
    ...
def block_key(parent: bytes, tokens: IntArray, extra_key: int = 0) -> bytes:
    """128-bit chained content key (XXH3-128) of one block: parent key (16 bytes), the block's
    token ids (int32), an extra key (tenant salt, image hash). Returns 16 bytes; stable across
    processes and machines (``key.hex()`` is the record's file name)."""

class BlockStore:
    """Persistent content-addressed KV block store; ``backend`` is "file" (always built) or
    "rocksdb" (when built with RocksDB: see ``build_info()["block_store_backends"]``).

    Thread-safe; every call that touches the disk releases the GIL. Payloads are any
    C-contiguous CPU buffer (numpy array, bytes, bytearray, memoryview, or a tensor exporting
    DLPack, e.g. a torch CPU tensor). Opening raises OSError for an unusable path (not
    creatable, a regular file, no permission, read-only) or one already open (the lock), and
    ValueError for an unknown or not-compiled backend. Calls on a closed store raise
    RuntimeError."""
    def __init__(self, path: str, backend: str = "file", max_bytes: int = 0,
                 fsync: bool = False) -> None: ...
    def put(self, key: bytes, fingerprint: str, block_size: int, tokens: IntArray,
            payload: Any, parent: Optional[bytes] = None) -> bool:
        """True once the record is visible; False on a write failure (disk full, EROFS,
        EACCES) or a record over max_bytes. Never raises for I/O. parent: the chain's previous
        block's key (the record is then evicted before it)."""
    def get_into(self, key: bytes, fingerprint: str, block_size: int, tokens: IntArray,
                 out: Any) -> bool:
        """Writes the verified payload into the writable buffer ``out`` (exactly its size).
        False on a miss: absent, header mismatch or corrupt (both erased), or a size mismatch
        (kept); ``out`` is then unspecified."""
    def get(self, key: bytes, fingerprint: str, block_size: int,
            tokens: IntArray) -> Optional[bytes]: ...
    def contains(self, key: bytes) -> bool:
        """Whether a record is indexed (no disk access; a later get may still miss)."""
    def __contains__(self, key: bytes) -> bool: ...
    def erase(self, key: bytes) -> bool: ...
    def touch(self, keys: list[bytes]) -> None:
        """Marks the indexed records among keys as used now, in order (the last is the most
        recently used, evicted last); unknown keys are skipped."""
    def keys(self) -> list[bytes]: ...
    def __len__(self) -> int: ...
    def stats(self) -> dict[str, Any]:
        """backend, path, records, bytes (on disk), max_bytes, hits, misses, corrupt_dropped,
        mismatch_dropped, bytes_read, bytes_written, puts, write_errors, evictions."""
    def close(self) -> None:
        """Releases the store and its lock (once calls in flight return); idempotent."""
    @property
    def closed(self) -> bool: ...
    @property
    def backend(self) -> str: ...
    @property
    def path(self) -> str: ...
    def __enter__(self) -> "BlockStore": ...
    def __exit__(self, *args: Any) -> None: ...

class BlockAllocator:
    """Bitmap pool of KV blocks with per-block refcounts (not thread-safe)."""
    def __init__(self, num_blocks: int) -> None: ...
    def allocate(self) -> Optional[int]: ...
    def allocate_n(self, n: int) -> Optional[list[int]]: ...
    def incref(self, block_id: int) -> None: ...
    def decref(self, block_id: int, park_at_zero: bool = False) -> bool: ...
    def release(self, block_id: int) -> None: ...
    def refcount(self, block_id: int) -> int: ...
    def is_allocated(self, block_id: int) -> bool: ...
    def is_parked(self, block_id: int) -> bool: ...
    def churn(self, pairs: int, batch: int = 1) -> int: ...
    @property
    def num_free(self) -> int: ...
    @property
    def capacity(self) -> int: ...

class KVCacheManager:
    """Admission, slot reservation with copy-on-write, forking, prefix caching, stats."""
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 watermark_blocks: int = 0) -> None: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def enable_prefix_caching(self) -> bool: ...
    @property
    def watermark_blocks(self) -> int: ...
    @property
    def num_available_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    def num_cached_tokens(self, prompt: IntArray, extra_key: int = 0) -> int: ...
    def can_allocate(self, prompt: IntArray, extra_key: int = 0, num_new_tokens: int = 0) -> bool: ...
    def allocate(self, seq_id: int, prompt: IntArray, extra_key: int = 0) -> int: ...
    def block_hashes(self, tokens: IntArray, extra_key: int = 0) -> npt.NDArray[np.uint64]: ...
    def query_admission(self, tokens: IntArray, hashes: npt.ArrayLike, extra_key: int,
                        max_cached_tokens: int, want_new_tokens: int) -> Tuple[int, int]: ...
    def admit(self, seq_id: int, tokens: IntArray, hashes: npt.ArrayLike, extra_key: int,
              max_cached_tokens: int, num_new_tokens: int, cache_new_blocks: bool = True
              ) -> Optional[Tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int32]]]: ...
    def blocks_needed(self, seq_id: int, n: int) -> int: ...
    def can_append(self, seq_id: int, n: int) -> bool: ...
    def append(self, seq_id: int, tokens: IntArray
               ) -> Optional[Tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]]: ...
    def append_batch(self, seq_ids: IntArray, counts: IntArray, tokens: IntArray
                     ) -> Optional[Tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]]: ...
    def fork(self, parent_id: int, child_id: int) -> None: ...
    def free(self, seq_id: int) -> None: ...
    def drop_blocks(self, seq_id: int, begin: int, end: int) -> int:
        """Drops logical blocks [begin, end) of seq_id (never read again; entries become -1,
        positions keep counting; the last block cannot be dropped); each is freed once no other
        table holds it. Returns the blocks newly dropped."""
    def stop_caching(self, seq_id: int) -> None:
        """Registers none of seq_id's blocks that fill from now on in the prefix cache (K/V
        computed by block-sparse attention); its forks inherit this."""
    def caching(self, seq_id: int) -> bool:
        """Whether seq_id's blocks are still registered in the prefix cache as they fill."""
    def reset_prefix_cache(self) -> None: ...
    def reset_peak(self) -> None: ...
    def contains(self, seq_id: int) -> bool: ...
    def __contains__(self, seq_id: int) -> bool: ...
    def num_tokens(self, seq_id: int) -> int: ...
    def block_table(self, seq_id: int) -> npt.NDArray[np.int32]: ...
    def block_tables(self, seq_ids: IntArray, width: int = -1) -> npt.NDArray[np.int32]: ...
    def refcount(self, block_id: int) -> int: ...
    def is_cached(self, block_id: int) -> bool: ...
    def is_parked(self, block_id: int) -> bool: ...
    def lru_front(self) -> Optional[int]: ...
    def stats(self) -> dict[str, Union[int, float]]: ...

# --- CPU kernels (appended by the kernels work) -------------------------------------------

# Tensors: anything with __dlpack__ on the CPU (torch.Tensor, numpy.ndarray), borrowed
# zero-copy. Activations float32 / float16 / bfloat16; caches
# [num_blocks, num_kv_heads, block_size, head_dim] with contiguous inner dims (the block dim may
# have any stride); fp8 caches uint8 (or torch.float8_e4m3fn / float8_e5m2). kv_cache_dtype:
# "auto" (the cache tensor's dtype), "fp16", "bf16", "fp32", "fp8" / "fp8_e4m3", "fp8_e5m2".
# Bad input raises ValueError (IndexError for an id outside the pool) before anything is written.
Tensor = Any

def reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                      slot_mapping: Tensor, kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                      v_scale: float = 1.0) -> None:
    """key/value: [num_tokens, num_kv_heads, head_dim]; slot_mapping: [num_tokens] int32/int64,
    slot = block * block_size + offset, -1 skips the token. fp8 stores x / scale, saturated."""
def rms_norm(out: Tensor, x: Tensor, weight: Tensor, eps: float) -> None:
    """out = weight * x / sqrt(mean(x^2, last dim) + eps) for x/out [rows, cols] (last dim
    contiguous; out may be x) and weight [cols], all float32 or all bfloat16 (the normalised
    row is rounded before the weight, as transformers does)."""
def fused_add_rms_norm(out: Tensor, x: Tensor, delta: Optional[Tensor], weight: Tensor,
                       eps: float) -> None:
    """x += delta in place (the residual stream), then out = rms_norm(x); float32 or bfloat16
    [rows, cols] (last dim contiguous); delta None: a plain rms_norm."""
def silu_and_mul(out: Tensor, x: Tensor) -> None:
    """out [rows, f] = silu(x[:, :f]) * x[:, f:] for x [rows, 2 f]; float32 or bfloat16."""
def rotary_embedding(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    """RoPE in place on x [num_tokens, heads, head_dim] (head_dim contiguous and even; the
    token and head dims may lie in memory in either order, e.g. a transposed
    [heads, tokens, head_dim] tensor, as long as no two heads overlap):
    x = x * cos + swap_halves(x) * sin with cos / sin [num_tokens, (1,) head_dim] (sin's first
    half negated: pagedllm.model.rope's tables); float32 or bfloat16."""
def greedy_tokens(x: Tensor) -> Optional[List[int]]:
    """Per row of float32 x [rows, cols] the index of its first maximum, as a list of ints;
    None when a row's maximum is not a finite float above the lowest one (NaN, +-inf: those
    rows need the exact non-finite handling). argmax_rows without index tensors."""
def argmax_rows(x: Tensor, index: Tensor, max_value: Tensor) -> int:
    """Per row of float32 x [rows, cols]: index (int64 [rows]) of its first maximum and
    max_value (float32 [rows]; NaN if the row holds one). Returns how many rows have a maximum
    that is not a finite float above the lowest one."""
def token_rows(x: Tensor, cos: Tensor, sin: Tensor, ids: Tensor, positions: Tensor,
               embedding: Tensor, vocab: int, packed: bool, cos_table: Tensor,
               sin_table: Tensor) -> int:
    """A step's input rows in one call: x [n, hidden] = the embedding's rows ids (int64 [n]; a
    dense [vocab, hidden] matrix, or packed=True: pack_linear_weight's panels), cos / sin
    [n, (1,) head_dim] = the tables' rows at positions (int64 [n]); float32 or bfloat16, copies.
    Returns 0, or (writing nothing) the table rows the largest position needs when the tables
    are shorter. IndexError: an id outside [0, vocab) or a negative position."""
def paged_attention_decode(out: Tensor, query: Tensor, key_cache: Tensor, value_cache: Tensor,
                           block_tables: Tensor, context_lens: Tensor, scale: float,
                           kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                           v_scale: float = 1.0) -> None:
    """query/out: [num_seqs, num_heads, head_dim] (last dim contiguous, other strides free);
    block_tables: [num_seqs, max_blocks] int32; context_lens: [num_seqs] int32 (0 -> zeros)."""
def paged_attention_prefill(out: Tensor, query: Tensor, key_cache: Tensor, value_cache: Tensor,
                            block_tables: Tensor, cu_seqlens_q: Tensor, context_lens: Tensor,
                            scale: float, kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                            v_scale: float = 1.0) -> None:
    """query/out: [num_tokens, num_heads, head_dim], the new tokens of each sequence packed;
    cu_seqlens_q: [num_seqs + 1] int32. Query token i of a sequence with context length L and
    q_len Q is at position L - Q + i and attends keys 0 .. L - Q + i."""
def paged_attention_decode_sparse(out: Tensor, query: Tensor, key_cache: Tensor,
                                  value_cache: Tensor, block_tables: Tensor, context_lens: Tensor,
                                  sparse_indptr: Tensor, sparse_indices: Tensor, scale: float,
                                  kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                                  v_scale: float = 1.0) -> None:
    """paged_attention_decode over the listed logical blocks only: sparse_indptr
    [num_seqs + 1] or [num_seqs * num_kv_heads + 1] int32, sparse_indices the lists' block ids
    (strictly increasing per list, inside each sequence's used blocks). Only listed table
    entries are read. All blocks == dense bit for bit."""
def paged_attention_prefill_sparse(out: Tensor, query: Tensor, key_cache: Tensor,
                                   value_cache: Tensor, block_tables: Tensor,
                                   cu_seqlens_q: Tensor, context_lens: Tensor,
                                   sparse_indptr: Tensor, sparse_indices: Tensor, scale: float,
                                   kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                                   v_scale: float = 1.0) -> None:
    """paged_attention_prefill over the listed blocks only (CSR as for decode)."""
def paged_cross_attention(out: Tensor, query: Tensor, key_cache: Tensor, value_cache: Tensor,
                          block_tables: Tensor, cu_seqlens_q: Tensor, context_lens: Tensor,
                          kv_ranges: Tensor, scale: float, kv_cache_dtype: str = "auto",
                          k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Non-causal cross-attention (Mllama) of packed query tokens [num_tokens, num_heads,
    head_dim] over their sequences' paged cross K/V: token i attends cross positions
    kv_ranges[i, 0] <= j < kv_ranges[i, 1] (int32 [num_tokens, 2]; an empty range gives a zero
    row); cu_seqlens_q / context_lens as for paged_attention_prefill."""
def quest_select(query: Tensor, key_min: Tensor, key_max: Tensor, block_tables: Tensor,
                 num_seq_blocks: Tensor, budget: Tensor, forced_indptr: Tensor,
                 forced_indices: Tensor, out_indptr: Tensor, out_indices: Tensor,
                 kv_cache_dtype: str = "auto") -> None:
    """Quest's choice per (sequence, KV head): the forced blocks plus the blocks of largest
    bound of q.k from key_min / key_max [num_blocks, num_kv_heads, head_dim], up to budget
    blocks (0: the forced list), sorted, written into out_indices at out_indptr."""
def copy_blocks(caches: Sequence[Tensor], block_mapping: Tensor) -> None:
    """Copies block src -> dst (block_mapping int32/int64 [k, 2]) in every tensor of caches
    (first dim blocks, whose stride must cover a whole block). Destinations must be distinct
    and not also sources."""
def swap_blocks(src: Tensor, dst: Tensor, block_mapping: Tensor) -> None:
    """Copies block src of `src` to block dst of `dst` for each (src, dst) row of block_mapping."""
def set_num_threads(n: int) -> None:
    """Size of the kernel thread pool (default: CPUs available, or PAGEDLLM_NUM_THREADS)."""
def get_num_threads() -> int: ...
def adopt_loaded_openmp() -> bool:
    """Runs the kernels on the team of an OpenMP runtime already loaded in the process (torch's
    libgomp); False when none is loaded, or in a child forked after the parent's team ran."""
def use_builtin_pool() -> None:
    """Runs the kernels on the built-in std::thread pool again."""
def parallel_runtime() -> str:
    """Where the kernels run: "builtin" or "openmp:<library>"."""
def stream_read_sum(x: Tensor) -> float:
    """Sum of a contiguous float32 tensor, read once by all pool threads (bandwidth probe)."""
def cpu_kernel() -> str:
    """The attention engine in use: "avx512", "avx2", "generic" or "avx512_bf16"."""
def get_cpu_engine() -> str:
    """The attention engine in use (same as cpu_kernel())."""
def set_cpu_engine(name: str) -> None:
    """Uses attention engine `name` ("generic", "avx2", "avx512", "avx512_bf16" (opt-in: bf16
    dot products for bf16 / fp8 K/V); "auto" = the best exact one this CPU runs, except that
    decode of a bf16 query on an fp8 cache uses avx512_bf16 where the CPU has it). ValueError
    for an unknown name, one not compiled in, or one this CPU lacks. The initial choice is
    PAGEDLLM_CPU_ENGINE (read at the first kernel call) or "auto"."""
def cpu_engines() -> list[str]:
    """The attention engines compiled in that this CPU runs: the exact ones best first, then
    the opt-in avx512_bf16."""
def force_generic_kernels(on: bool) -> None:
    """Forces the portable kernel (tests, benchmarks) or restores the best one (False)."""
def packed_linear_elements(dtype: str, out_features: int, in_features: int) -> int:
    """Elements of the packed form of an [out_features, in_features] linear weight (dtype
    "float32" or "bfloat16"; 16-column panels, zero-padded)."""
def pack_linear_weight(packed: Tensor, weight: Tensor) -> None:
    """Writes weight [out_features, in_features] into packed (1-D, packed_linear_elements
    elements of the same dtype) for linear()."""
def linear(y: Tensor, x: Tensor, packed: Tensor, bias: Optional[Tensor]) -> None:
    """y [rows, out_features] = x [rows, in_features] @ W.T (+ bias), W packed by
    pack_linear_weight; float32 or bfloat16, float32 sums, y rounded once. y must not share
    memory with x, packed or bias (ValueError)."""
def packed_rows(out: Tensor, packed: Tensor, out_features: int, ids: Tensor) -> None:
    """out [n, in_features] = W[ids] (ids: int64 [n], each in [0, out_features)) read from W's
    packed form (pack_linear_weight): an embedding lookup from a tied lm_head's panels,
    bit-identical to the weight's rows. IndexError: an id out of range (nothing written)."""
class DecoderWeights:
    """A Llama model's decoder weights for decoder_stack, borrowed (kept alive) and checked once:
    per layer (input_norm, post_norm, qkv, qkv_bias, o, o_bias, gate_up, gate_up_bias, down,
    down_bias), norm weights [hidden], projections packed by pack_linear_weight, biases or None;
    one float dtype throughout (ValueError otherwise)."""
    def __init__(self, layers: Sequence[tuple], final_norm: Tensor, hidden: int, num_heads: int,
                 num_kv_heads: int, head_dim: int, intermediate: int) -> None: ...
    @property
    def num_layers(self) -> int: ...
    def workspace_bytes(self, num_tokens: int) -> int:
        """Bytes of workspace decoder_stack needs for a step of num_tokens tokens."""
def decoder_stack(weights: DecoderWeights, out: Tensor, x: Tensor, cos: Tensor, sin: Tensor,
                  slot_mapping: Tensor, block_tables: Tensor, context_lens: Tensor,
                  cu_seqlens_q: Tensor, num_decode_seqs: int, key_caches: Sequence[Tensor],
                  value_caches: Sequence[Tensor], kv_cache_dtype: str, k_scale: float,
                  v_scale: float, eps: float, scale: float, workspace: Tensor) -> None:
    """One step's packed tokens x [num_tokens, hidden] (the residual stream, updated in place)
    through every decoder layer over the paged caches; writes the final RMSNorm(x) into out.
    cos / sin: [num_tokens, (1,) head_dim] RoPE tables; the attention metadata as for
    paged_attention_decode / _prefill (the first num_decode_seqs sequences decode); workspace:
    uint8 of weights.workspace_bytes(num_tokens), 64-byte aligned. Bit for bit the kernels'
    outputs when called one by one (ValueError / IndexError on bad input, nothing written)."""
def linear_kernel(dtype: str) -> str:
    """The tile loops linear() runs for dtype: "avx512", "avx512_bf16", "avx2" or "generic"
    (they follow set_cpu_engine)."""
