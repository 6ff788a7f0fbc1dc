"""EngineConfig: every engine option in one dataclass, validated once.

Options can also come from YAML (``EngineConfig.from_yaml``), in sections that later features
extend::

    model: path/to/llama          # optional; the bundled default model otherwise
    kv_cache:
      block_size: 16              # or auto: max(16, 2^ceil(log2(mean seq len / 10)))
      expected_mean_seq_len: null # the mean prompt + output length block_size auto sizes for
      dtype: auto                 # auto | fp32 | fp16 | bf16 | fp8 (= fp8_e4m3) | fp8_e5m2
      memory_bytes: 2147483648    # or num_blocks: 4096
      enable_prefix_caching: true
      watermark: 0.01
      swap_space: 4               # GiB of host memory for blocks swapped out (preemption: swap)
    scheduler:
      max_num_seqs: 256
      max_num_batched_tokens: 2048
      max_model_len: null
      preemption_mode: recompute  # recompute | swap
    persistence:                  # the persistent KV tier (see persistence_config.py)
      enabled: false
      storage_path: /nvme/cache
      backend: file               # file | rocksdb
      max_bytes: 0                # 0: no cap
      hot_blocks_threshold: 0     # 0: write every full prompt block; N: once served N times
    runtime:
      device: auto                # auto | cpu | cuda | cuda:N
      dtype: auto                 # auto | float32 | bfloat16 | float16 (auto: fp32 CPU, bf16 GPU)
      gpu_memory_utilization: 0.9 # share of GPU memory the engine may use (weights + KV)
      seed: 0
      num_threads: null
      prepack_weights: true       # weights packed once for the GEMM kernels (faster CPU matmuls)
      check_numerics: off         # off | warn | fail: NaN/Inf in a layer's output or the logits
    parallel:
      tensor_parallel_size: 1     # ranks the model is split over (Megatron-style)
      distributed_executor_backend: null  # mp (spawned local ranks; default when > 1) | ray
      timeout_s: 300              # a rank that dies or stops answering for this long: the engine stops
    multimodal:                   # LLaVA and Mllama checkpoints only
      max_images_per_prompt: 4
      max_image_bytes: 20971520   # encoded
      max_image_pixels: 16777216  # decoded width x height
      max_num_encoder_tokens: null  # image embeddings per step; null: max(batched tokens, 1 image)
      encoder_cache_images: 8     # unused encoder outputs kept for repeated images
      cross_kv_fraction: 0.25     # Mllama: share of the KV memory for the cross-attention pool
      num_cross_kv_blocks: null   # Mllama: exact cross pool blocks (null: from the fraction)
    sparse_attention:             # block-sparse decode attention (see pagedllm/sparse/config.py)
      strategy: dense             # dense | fixed_pattern | dilated | random | quest | streaming
      sink_blocks: 1
      local_blocks: 4
      min_context: 0              # below this many context tokens: dense

Unknown keys are an error that names them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

from pagedllm.kv_dtypes import KV_CACHE_DTYPES
from pagedllm.persistence_config import PersistenceConfig
from pagedllm.sparse.config import SparseAttentionConfig
from pagedllm.sparse.options import parse_sparse_attention

DEFAULT_KV_CACHE_MEMORY_BYTES = 2 << 30
DEVICES = ("auto", "cpu", "cuda")
MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16")
PREEMPTION_MODES = ("recompute", "swap")
CHECK_NUMERICS = ("off", "warn", "fail")
EXECUTOR_BACKENDS = ("mp", "ray")
_INT32_MAX = 2 ** 31 - 1   # block ids, token counts and positions are int32 in the C++ core
_INT64_MAX = 2 ** 63 - 1
_MAX_NUM_SEQS = 1 << 20
_MAX_BATCHED_TOKENS = 1 << 24  # per step; budgets are summed in int32 in the core

# YAML section -> {yaml key: EngineConfig field}
_YAML_SECTIONS: Dict[str, Dict[str, str]] = {
    "kv_cache": {
        "block_size": "block_size",
        "expected_mean_seq_len": "expected_mean_seq_len",
        "dtype": "kv_cache_dtype",
        "memory_bytes": "kv_cache_memory_bytes",
        "num_blocks": "num_kv_blocks",
        "enable_prefix_caching": "enable_prefix_caching",
        "watermark": "watermark",
        "swap_space": "swap_space",
    },
    "scheduler": {
        "max_num_seqs": "max_num_seqs",
        "max_num_batched_tokens": "max_num_batched_tokens",
        "max_model_len": "max_model_len",
        "preemption_mode": "preemption_mode",
    },
    "runtime": {"seed": "seed", "num_threads": "num_threads",
                "prepack_weights": "prepack_weights", "device": "device", "dtype": "dtype",
                "gpu_memory_utilization": "gpu_memory_utilization",
                "check_numerics": "check_numerics"},
    "parallel": {"tensor_parallel_size": "tensor_parallel_size",
                 "distributed_executor_backend": "distributed_executor_backend",
                 "timeout_s": "distributed_timeout_s"},
    "multimodal": {"max_images_per_prompt": "max_images_per_prompt",
                   "max_image_bytes": "max_image_bytes", "max_image_pixels": "max_image_pixels",
                   "max_num_encoder_tokens": "max_num_encoder_tokens",
                   "encoder_cache_images": "encoder_cache_images",
                   "cross_kv_fraction": "cross_kv_fraction",
                   "num_cross_kv_blocks": "num_cross_kv_blocks"},
}


@dataclass
class EngineConfig:
    """Options of the engine (vLLM's names where vLLM has them).

    Args:
        model: checkpoint directory (Hugging Face Llama layout); None = the bundled model.
        block_size: tokens per KV block (1..256), or "auto": the seed's rule
            max(16, 2^ceil(log2(mean sequence length / 10))) on expected_mean_seq_len (or, without
            it, on max_model_len as a conservative proxy), resolved where the pool is built
            (kv_sizing.resolve_block_size; kv_cache_stats()["block_size"] gives the result).
        expected_mean_seq_len: the mean prompt + output length the workload is expected to
            have (tokens); only block_size="auto" reads it.
        kv_cache_dtype: storage dtype of the KV cache ("auto" = the model's dtype).
        kv_cache_memory_bytes: KV pool budget in bytes (used when num_kv_blocks is None).
        num_kv_blocks: exact number of KV blocks (overrides the byte budget).
        max_num_seqs: most sequences in one step.
        max_num_batched_tokens: most tokens (prompt chunks + decodes) in one step.
        max_model_len: longest sequence (prompt + output); None = the model's limit.
        enable_prefix_caching: reuse cached blocks of earlier requests with the same prefix.
        watermark: fraction of blocks kept free when admitting new requests.
        seed: seed of the engine's sampling generator (requests can set their own).
        num_threads: CPU threads for torch and the kernels; None = all available cores.
        prepack_weights: reorder the projection weights once into their GEMM kernel's layout
            (pagedllm.model.packed_linear: pagedllm's or oneDNN's; faster decode steps on CPU, no
            extra memory). False = plain F.linear.
        k_scale: fp8 KV scale for keys (x / k_scale is stored).
        v_scale: fp8 KV scale for values.
        device: "auto" (a GPU when the CUDA kernels are built in, one is visible and the
            model's head_dim is compiled for it, else the CPU), "cpu", "cuda" or "cuda:N".
        dtype: weights and activations: "auto" (float32 on the CPU, bfloat16 on a GPU that
            has it, else float16), "float32", "bfloat16", "float16" (GPU only).
        gpu_memory_utilization: share of the GPU's memory the engine may use; the KV pool
            gets what the weights leave of it (when no explicit KV budget is given).
        preemption_mode: what happens to a sequence preempted when the pool runs out:
            "recompute" (blocks freed, recomputed later) or "swap" (blocks copied to the host
            pool and back; falls back to recompute when the host pool is full).
        swap_space: GiB of host memory for swapped-out blocks (vLLM's name); used by
            preemption_mode="swap".
        check_numerics: after each forward, look for NaN/Inf in every layer's output and in
            the sampled logits rows: "off" (default), "warn" (log a warning naming the layer,
            the position and the request) or "fail" (finish the affected requests with that
            error; the other requests carry on).
        persistence: the persistent KV tier (a PersistenceConfig, or a mapping with its keys:
            enabled, storage_path, backend, max_bytes, hot_blocks_threshold); None: off.
        tensor_parallel_size: ranks the model is split over (heads, KV heads, MLP and
            vocabulary; each rank holds its share of every KV block). 1: one process.
        distributed_executor_backend: how the ranks run: "mp" (spawned local processes over
            torch.distributed, the default when tensor_parallel_size > 1) or "ray" (Ray actors
            on the cluster `ray.init()` finds, e.g. several hosts). None: in-process at size 1.
        distributed_timeout_s: seconds a rank may take to answer a step (starting a rank gets
            at least 600); past it, or when a rank dies, the engine stops with an error naming
            the rank.
        num_threads (with tensor_parallel_size > 1): threads per rank; None = the cores
            shared evenly by the local ranks.
        max_images_per_prompt: multimodal (LLaVA, Mllama) models: most images in one prompt.
        max_image_bytes: most encoded bytes of one image.
        max_image_pixels: most width * height of one decoded image.
        max_num_encoder_tokens: most image embeddings encoded per step (vLLM's encoder
            budget); None = max(max_num_batched_tokens, one image's embeddings).
        encoder_cache_images: encoder outputs no running request needs that are kept (least
            recently used first out) so a repeated image is not encoded again.
        cross_kv_fraction: Mllama models: the share of the KV memory (the byte budget, or the
            self pool's size when num_kv_blocks is given) that the cross-attention layers'
            pool gets, in (0, 1).
        num_cross_kv_blocks: Mllama models: exact blocks of the cross-attention pool (then
            the KV budget sizes the self-attention pool alone); None: from cross_kv_fraction.
        sparse_attention: the default block-sparse decode attention (a SparseAttentionConfig
            or a mapping of its keys; None: dense); requests may override it.
    """

    model: Optional[str] = None
    block_size: Union[int, str] = 16
    expected_mean_seq_len: Optional[int] = None
    kv_cache_dtype: str = "auto"
    kv_cache_memory_bytes: Optional[int] = None
    num_kv_blocks: Optional[int] = None
    max_num_seqs: int = 256
    max_num_batched_tokens: Optional[int] = None
    max_model_len: Optional[int] = None
    enable_prefix_caching: bool = True
    watermark: float = 0.01
    seed: int = 0
    num_threads: Optional[int] = None
    prepack_weights: bool = True
    k_scale: float = 1.0
    v_scale: float = 1.0
    device: str = "auto"
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    preemption_mode: str = "recompute"
    swap_space: float = 4.0
    persistence: Optional[PersistenceConfig] = None
    check_numerics: str = "off"
    tensor_parallel_size: int = 1
    distributed_executor_backend: Optional[str] = None
    distributed_timeout_s: float = 300.0
    max_images_per_prompt: int = 4
    max_image_bytes: int = 20 << 20
    max_image_pixels: int = 4096 * 4096
    max_num_encoder_tokens: Optional[int] = None
    encoder_cache_images: int = 8
    cross_kv_fraction: float = 0.25
    num_cross_kv_blocks: Optional[int] = None
    sparse_attention: Optional[SparseAttentionConfig] = None

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(f"{name} must be {expected}, got {getattr(self, name)!r}")

        def check_int(name: str, lo: int, hi: int, expected: str, optional: bool = False):
            v = getattr(self, name)
            if optional and v is None:
                return
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise bad(name, expected)

        def check_real(name: str, ok, expected: str):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or not ok(v):
                raise bad(name, expected)

        if self.block_size != "auto":
            check_int("block_size", 1, 256, "an integer in [1, 256] or 'auto'")
        check_int("expected_mean_seq_len", 1, _INT32_MAX, "an integer >= 1 (tokens) or None",
                  optional=True)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise bad("kv_cache_dtype", "one of " + ", ".join(KV_CACHE_DTYPES))
        check_int("kv_cache_memory_bytes", 1, _INT64_MAX, "a positive integer (bytes)",
                  optional=True)
        check_int("num_kv_blocks", 1, _INT32_MAX, f"an integer in [1, {_INT32_MAX}]",
                  optional=True)
        check_int("max_num_seqs", 1, _MAX_NUM_SEQS, f"an integer in [1, {_MAX_NUM_SEQS}]")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = max(2048, self.max_num_seqs)
        check_int("max_num_batched_tokens", self.max_num_seqs, _MAX_BATCHED_TOKENS,
                  f"an integer in [max_num_seqs ({self.max_num_seqs}), {_MAX_BATCHED_TOKENS}]")
        check_int("max_model_len", 2, _INT32_MAX, "an integer >= 2 or None", optional=True)
        if not isinstance(self.enable_prefix_caching, bool):
            raise bad("enable_prefix_caching", "true or false")
        check_real("watermark", lambda v: 0.0 <= v < 1.0, "a fraction in [0, 1)")
        check_int("seed", 0, _INT64_MAX, f"an integer in [0, {_INT64_MAX}]")
        check_int("num_threads", 1, 1024, "an integer in [1, 1024] or None", optional=True)
        if not isinstance(self.prepack_weights, bool):
            raise bad("prepack_weights", "true or false")
        check_real("k_scale", lambda v: v > 0, "a finite number > 0")
        check_real("v_scale", lambda v: v > 0, "a finite number > 0")
        if not isinstance(self.device, str) or not _valid_device(self.device):
            raise bad("device", "one of auto, cpu, cuda, cuda:N")
        if self.dtype not in MODEL_DTYPES:
            raise bad("dtype", "one of " + ", ".join(MODEL_DTYPES))
        if (isinstance(self.gpu_memory_utilization, bool)
                or not isinstance(self.gpu_memory_utilization, (int, float))
                or not 0.0 < self.gpu_memory_utilization <= 1.0):
            raise bad("gpu_memory_utilization", "a fraction in (0, 1]")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise bad("preemption_mode", "one of " + ", ".join(PREEMPTION_MODES))
        self.persistence = PersistenceConfig.from_value(self.persistence)
        self.sparse_attention = parse_sparse_attention(self.sparse_attention)
        if self.sparse_attention is not None and isinstance(self.block_size, int):
            self.sparse_attention.check_block_size(self.block_size)
        if self.check_numerics is False:  # YAML reads a bare `off` as false
            self.check_numerics = "off"
        if self.check_numerics not in CHECK_NUMERICS:
            raise bad("check_numerics", "one of " + ", ".join(CHECK_NUMERICS))
        if (isinstance(self.tensor_parallel_size, bool)
                or not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1):
            raise bad("tensor_parallel_size", "an integer >= 1")
        if (self.distributed_executor_backend is not None
                and self.distributed_executor_backend not in EXECUTOR_BACKENDS):
            raise bad("distributed_executor_backend", "one of " + ", ".join(EXECUTOR_BACKENDS))
        if (isinstance(self.distributed_timeout_s, bool)
                or not isinstance(self.distributed_timeout_s, (int, float))
                or not self.distributed_timeout_s > 0):
            raise bad("distributed_timeout_s", "a positive number of seconds")
        if (isinstance(self.swap_space, bool) or not isinstance(self.swap_space, (int, float))
                or not 0.0 <= self.swap_space <= 1024.0 or self.swap_space != self.swap_space):
            raise bad("swap_space", "a number of GiB in [0, 1024]")
        if (isinstance(self.encoder_cache_images, bool)
                or not isinstance(self.encoder_cache_images, int) or self.encoder_cache_images < 0):
            raise bad("encoder_cache_images", "an integer >= 0")
        if (isinstance(self.cross_kv_fraction, bool)
                or not isinstance(self.cross_kv_fraction, (int, float))
                or not 0.0 < self.cross_kv_fraction < 1.0):
            raise bad("cross_kv_fraction", "a number in (0, 1)")
        for name in ("max_images_per_prompt", "max_image_bytes", "max_image_pixels",
                     "max_num_encoder_tokens", "num_cross_kv_blocks"):
            value = getattr(self, name)
            if not (name in ("max_num_encoder_tokens", "num_cross_kv_blocks")
                    and value is None) and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise bad(name, "a positive integer")

    @property
    def swap_space_bytes(self) -> int:
        """swap_space in bytes."""
        return int(self.swap_space * (1 << 30))

    @classmethod
    def from_dict(cls, data: Dict[str, Any], **overrides: Any) -> "EngineConfig":
        """Builds a config from the YAML layout (sections), then applies `overrides`.

        Args:
            data: mapping with optional keys "model", "kv_cache", "scheduler", "runtime",
                "persistence".
            **overrides: field values that win over the mapping (None values are ignored).
        Returns:
            The validated config.
        Raises:
            ValueError: on an unknown section or key (named in the message).
        """
        fields: Dict[str, Any] = {}
        for key, value in (data or {}).items():
            if key == "model":
                fields["model"] = value
            elif key == "persistence":
                fields["persistence"] = PersistenceConfig.from_value(value)
            elif key == "sparse_attention":
                fields["sparse_attention"] = parse_sparse_attention(value)
            elif key in _YAML_SECTIONS:
                if not isinstance(value, dict):
                    raise ValueError(f"config section '{key}' must be a mapping, got {value!r}")
                for sub, sub_value in value.items():
                    if sub not in _YAML_SECTIONS[key]:
                        known = ", ".join(sorted(_YAML_SECTIONS[key]))
                        raise ValueError(f"unknown key '{key}.{sub}' in config (known: {known})")
                    fields[_YAML_SECTIONS[key][sub]] = sub_value
            else:
                known = ", ".join(["model", "persistence", "sparse_attention",
                                   *sorted(_YAML_SECTIONS)])
                raise ValueError(f"unknown config section '{key}' (known: {known})")
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**fields)

    @classmethod
    def from_yaml(cls, path: str, **overrides: Any) -> "EngineConfig":
        """Reads a YAML file in the layout of this module's docstring.

        Args:
            path: the YAML file.
            **overrides: field values that win over the file.
        Returns:
            The validated config.
        """
        import yaml

        with open(path) as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the top level must be a mapping of sections")
        try:
            return cls.from_dict(data, **overrides)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def replace(self, **changes: Any) -> "EngineConfig":
        """A copy with some fields changed (validated again). A max_num_batched_tokens that was
        left to its default follows a new max_num_seqs."""
        if ("max_num_seqs" in changes and "max_num_batched_tokens" not in changes
                and self.max_num_batched_tokens == max(2048, self.max_num_seqs)):
            changes["max_num_batched_tokens"] = None
        return dataclasses.replace(self, **changes)


def _valid_device(name: str) -> bool:
    if name in DEVICES:
        return True
    head, _, index = name.partition(":")
    return head == "cuda" and index.isdigit()
