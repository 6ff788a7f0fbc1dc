"""ModelConfig: the validated shape of a Llama checkpoint, parsed from its config.json.

Accepts both config.json dialects Hugging Face writes: the legacy one (`rope_theta` at top level,
`rope_scaling` with `type` or `rope_type`) and the transformers 5 one (`rope_parameters`).
Everything the forward pass needs is resolved here once (head_dim, rope parameters, eos ids),
so the model code never looks at the raw dict.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from pagedllm.model.errors import CheckpointError
from pagedllm.model.files import read_json
from pagedllm.model.generation_config import (GENERATION_CONFIG, check_generation_config,
                                              token_ids_problem)
from pagedllm.model.limits import MAX_DIMENSIONS, head_dim_problem

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def _activation(name):
    """config.json's hidden_act with transformers' aliases of SiLU ("swish") as "silu"."""
    return "silu" if name == "swish" else name


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. `rope_type` is "linear" or "llama3".

    linear: every inverse frequency is divided by `factor`.
    llama3: low frequencies are divided by `factor`, high ones kept, the band between smoothed
    (wavelength thresholds original_max_position_embeddings / {low,high}_freq_factor).
    """

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3"):
            raise ValueError(f"rope_scaling.rope_type {self.rope_type!r}: expected 'linear' or "
                             f"'llama3'")
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"rope_scaling.factor = {self.factor}: expected a positive number")
        if self.rope_type == "llama3":
            if not self.high_freq_factor > self.low_freq_factor > 0:
                raise ValueError(
                    f"rope_scaling: expected high_freq_factor > low_freq_factor > 0, got "
                    f"high_freq_factor={self.high_freq_factor}, "
                    f"low_freq_factor={self.low_freq_factor}")
            if self.original_max_position_embeddings <= 0:
                raise ValueError("rope_scaling.original_max_position_embeddings must be positive")

    def to_hf_dict(self) -> dict[str, Any]:
        """The `rope_scaling` entry of a Hugging Face config.json."""
        if self.rope_type == "linear":
            return {"rope_type": "linear", "factor": self.factor}
        return {"rope_type": "llama3", "factor": self.factor,
                "low_freq_factor": self.low_freq_factor, "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_position_embeddings}


@dataclass(frozen=True)
class ModelConfig:
    """A Llama (LlamaForCausalLM) architecture, validated on construction.

    Field names follow Hugging Face's config.json. `eos_token_ids` merges config.json's
    `eos_token_id` with generation_config.json's (which wins when present).
    Every dimension is bounded (model/limits.py: far above any released Llama) and head_dim
    must be one the attention kernels run. Raises ValueError on an inconsistent, unsupported
    or absurd config (from_dir turns it into CheckpointError).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScaling] = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    initializer_range: float = 0.02
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()
    checkpoint_dtype: Optional[str] = None  # "torch_dtype"/"dtype" of config.json, informational
    hidden_act: str = field(default="silu")

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"{name} = {value!r}: expected a positive integer")
            if value > MAX_DIMENSIONS.get(name, value):
                raise ValueError(f"{name} = {value}: expected at most {MAX_DIMENSIONS[name]} "
                                 f"(no Llama is that large; is config.json corrupt?)")
        problem = head_dim_problem(self.head_dim)
        if problem:
            raise ValueError(problem)
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads = {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads = {self.num_key_value_heads}")
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps > 0):
            raise ValueError(f"rms_norm_eps = {self.rms_norm_eps!r}: expected a positive number")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ValueError(f"rope_theta = {self.rope_theta!r}: expected a positive number")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act = {self.hidden_act!r}: only 'silu' is supported")
        for tid in self.eos_token_ids + (() if self.bos_token_id is None else (self.bos_token_id,)):
            if not 0 <= tid < self.vocab_size:
                raise ValueError(f"special token id {tid} is outside the vocabulary "
                                 f"[0, {self.vocab_size})")

    # --- derived sizes ------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        """Width of the query projection: num_attention_heads * head_dim."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of each of the key and value projections: num_key_value_heads * head_dim."""
        return self.num_key_value_heads * self.head_dim

    @property
    def num_kv_groups(self) -> int:
        """Query heads per KV head (1: MHA, num_attention_heads: MQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    def num_parameters(self) -> int:
        """Parameters of the checkpoint (a tied lm_head counted once)."""
        h, f, q, kv = self.hidden_size, self.intermediate_size, self.q_size, self.kv_size
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv + h if self.attention_bias else 0)
        mlp = 3 * h * f + (2 * f + h if self.mlp_bias else 0)
        per_layer = attn + mlp + 2 * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * per_layer + h + lm_head

    # --- conversion ---------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any],
                  generation_config: Optional[Mapping[str, Any]] = None) -> "ModelConfig":
        """Parses a Hugging Face config.json dict (plus an optional generation_config.json dict).

        Raises:
            ValueError: a missing, mistyped, contradictory or unsupported field (message names it).
        """
        archs = d.get("architectures")
        if archs is not None:
            if not isinstance(archs, list) or not any(a in SUPPORTED_ARCHITECTURES for a in archs):
                raise ValueError(f"architectures = {archs!r}: unsupported, expected "
                                 f"{list(SUPPORTED_ARCHITECTURES)}")
        model_type = d.get("model_type")
        if model_type is not None and model_type != "llama":
            raise ValueError(f"model_type = {model_type!r}: unsupported, expected 'llama'")
        if archs is None and model_type is None:
            raise ValueError("neither 'architectures' nor 'model_type' is set: expected "
                             "architectures ['LlamaForCausalLM'] or model_type 'llama'")

        def req_int(key: str) -> int:
            if key not in d:
                raise ValueError(f"required field {key!r} is missing")
            return _as_int(key, d[key])

        hidden = req_int("hidden_size")
        heads = req_int("num_attention_heads")
        kv_heads = d.get("num_key_value_heads")
        kv_heads = heads if kv_heads is None else _as_int("num_key_value_heads", kv_heads)
        head_dim = d.get("head_dim")
        if head_dim is None:
            if hidden % heads != 0:
                raise ValueError(f"hidden_size = {hidden} is not a multiple of "
                                 f"num_attention_heads = {heads} and no head_dim is given")
            head_dim = hidden // heads
        max_pos = _as_int("max_position_embeddings", d.get("max_position_embeddings", 2048))
        rope_theta, rope_scaling = _parse_rope(d, max_pos)
        quant = d.get("quantization_config")
        if quant is not None:  # its tensors would be refused one by one as odd dtypes or names
            method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
            raise ValueError(f"quantization_config (quant_method {method!r}): quantized "
                             "checkpoints are not supported; use the unquantized (fp32, fp16 or "
                             "bf16) weights")
        partial = d.get("partial_rotary_factor", 1.0)
        if partial != 1.0:
            raise ValueError(f"partial_rotary_factor = {partial!r}: only 1.0 is supported "
                             f"for Llama")

        gen = generation_config or {}
        vocab = req_int("vocab_size")
        for key in ("bos_token_id", "eos_token_id"):  # config.json's own, even when gen overrides
            problem = token_ids_problem(key, d.get(key), vocab) if vocab > 0 else None
            if problem:
                raise ValueError(problem)
        eos = gen.get("eos_token_id", d.get("eos_token_id"))
        bos = gen.get("bos_token_id", d.get("bos_token_id"))
        eos_ids = tuple(_as_int("eos_token_id", e) for e in
                        (eos if isinstance(eos, list) else ([] if eos is None else [eos])))
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=req_int("intermediate_size"),
            num_hidden_layers=req_int("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=_as_int("head_dim", head_dim),
            max_position_embeddings=max_pos,
            rms_norm_eps=_as_float("rms_norm_eps", d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=_as_bool("tie_word_embeddings",
                                         d.get("tie_word_embeddings", False)),
            attention_bias=_as_bool("attention_bias", d.get("attention_bias", False)),
            mlp_bias=_as_bool("mlp_bias", d.get("mlp_bias", False)),
            initializer_range=_as_float("initializer_range", d.get("initializer_range", 0.02)),
            bos_token_id=None if bos is None else _as_int("bos_token_id", bos),
            eos_token_ids=eos_ids,
            checkpoint_dtype=d.get("torch_dtype", d.get("dtype")),
            hidden_act=_activation(d.get("hidden_act", "silu")),
        )

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> "ModelConfig":
        """Reads config.json (required) and generation_config.json (optional) from `path`.

        Only regular files are read (a FIFO or device named config.json is refused, never
        waited on). generation_config.json is validated (model/generation_config.py).

        Raises:
            CheckpointError: a missing/unreadable/non-regular file or an invalid config (names
                the file).
        """
        cfg_path = os.path.join(path, "config.json")
        d = read_json(cfg_path)
        gen_path = os.path.join(path, GENERATION_CONFIG)
        gen = read_json(gen_path) if os.path.lexists(gen_path) else None
        if gen is not None:
            vocab = d.get("vocab_size")
            if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
                check_generation_config(gen, vocab, gen_path)
        try:
            return cls.from_dict(d, gen)
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{cfg_path}: {e}") from None

    def to_hf_dict(self) -> dict[str, Any]:
        """A Hugging Face config.json dict (legacy rope keys, read by transformers 4.45+ and 5)."""
        ids = self.eos_token_ids
        eos: Any = ids[0] if len(ids) == 1 else list(ids)
        d = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": self.hidden_act,
            "max_position_embeddings": self.max_position_embeddings,
            "initializer_range": self.initializer_range,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_scaling is None else self.rope_scaling.to_hf_dict(),
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "mlp_bias": self.mlp_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos if self.eos_token_ids else None,
            "pretraining_tp": 1,
            "use_cache": True,
        }
        if self.checkpoint_dtype is not None:
            d["torch_dtype"] = self.checkpoint_dtype
        return d


def _parse_rope(d: Mapping[str, Any], max_pos: int) -> tuple[float, Optional[RopeScaling]]:
    # transformers' precedence: rope_scaling (legacy) over rope_parameters (v5); theta inside the
    # dict over the top-level rope_theta.
    params = d.get("rope_scaling") or d.get("rope_parameters") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"rope_scaling/rope_parameters = {params!r}: expected an object")
    theta = _as_float("rope_theta", params.get("rope_theta", d.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope type {rope_type!r} is not supported (supported: "
                         f"{', '.join(SUPPORTED_ROPE_TYPES)})")
    if rope_type == "default":
        return theta, None

    def need(key: str) -> float:
        if key not in params:
            raise ValueError(f"rope_scaling of type {rope_type!r} needs {key!r}")
        return _as_float(f"rope_scaling.{key}", params[key])

    if rope_type == "linear":
        return theta, RopeScaling("linear", need("factor"))
    orig = _as_int("rope_scaling.original_max_position_embeddings",
                   params.get("original_max_position_embeddings", max_pos))
    return theta, RopeScaling("llama3", need("factor"), need("low_freq_factor"),
                              need("high_freq_factor"), orig)


def _as_int(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key} = {v!r}: expected an integer")
    return v


def _as_float(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{key} = {v!r}: expected a number")
    return float(v)


def _as_bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{key} = {v!r}: expected true or false")
    return v
