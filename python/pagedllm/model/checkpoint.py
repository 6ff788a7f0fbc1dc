"""Writes random-weight Llama checkpoints in the Hugging Face layout (tests and benchmarks).

The directory holds config.json, generation_config.json and either model.safetensors or
`model-0000i-of-0000n.safetensors` shards with model.safetensors.index.json, exactly what
`transformers.LlamaForCausalLM.from_pretrained` and pagedllm's loader read.

Presets (`PRESETS`), the shapes the benchmarks use:

    tiny   hidden 256,  4 layers,  8 heads, 2 KV heads, ffn  688, vocab  4096 (~5.3M params)
    small  hidden 1024, 8 layers, 16 heads, 4 KV heads, ffn 2816, vocab 32000 (~156M params)
    1b     Llama-3.2-1B's shape: hidden 2048, 16 layers, 32 heads, 8 KV heads, ffn 8192,
           vocab 128256, tied embeddings, llama3 RoPE (theta 500000) (~1.24B params)

Initialisation: linear and embedding weights ~ N(0, initializer_range), as transformers
initialises them; biases ~ N(0, initializer_range) and RMSNorm weights ~ 1 + N(0,
initializer_range) (transformers uses 0 and 1) so that every tensor influences the output.
Tensors are drawn in checkpoint order from one seeded generator, so the weights depend on the
config and seed only, not on the number of shards or the file dtype.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Union

import torch
from safetensors.torch import save_file

from pagedllm.model.config import ModelConfig
from pagedllm.model.weight_names import expected_tensors

# Defaults every checkpoint starts from; a preset and the overrides are applied on top.
BASE_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
             "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 4096},
    "small": {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
              "num_key_value_heads": 4, "intermediate_size": 2816, "vocab_size": 32000},
    # The 1B-class size users run (Llama-3.2-1B's config.json, max positions cut to 8192).
    "1b": {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
           "tie_word_embeddings": True, "rope_theta": 500000.0,
           "max_position_embeddings": 8192,
           "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}},
}

_FILE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def random_config(preset: Union[str, Mapping[str, Any]] = "tiny", **overrides: Any) -> ModelConfig:
    """The ModelConfig write_random_checkpoint would write (see there for the arguments)."""
    d = dict(BASE_CONFIG)
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}: expected one of {sorted(PRESETS)} "
                             f"or a dict")
        d.update(PRESETS[preset])
    else:
        d.update(preset)
    d.update(overrides)
    return ModelConfig.from_dict(d)


def write_random_checkpoint(path: Union[str, os.PathLike],
                            preset: Union[str, Mapping[str, Any]] = "tiny",
                            seed: int = 0, num_shards: int = 1,
                            dtype: torch.dtype = torch.float32,
                            **overrides: Any) -> ModelConfig:
    """Writes a random-weight LlamaForCausalLM checkpoint directory.

    Args:
        path: the directory (created if missing; existing checkpoint files are overwritten).
        preset: a PRESETS name, or a dict of config.json fields (applied over BASE_CONFIG).
        seed: seed of the weights.
        num_shards: 1 writes model.safetensors; n > 1 writes n shards plus the index json.
        dtype: file dtype of the weights: torch.float32, float16 or bfloat16.
        **overrides: config.json fields applied last (e.g. tie_word_embeddings=True,
            rope_scaling={...}, num_key_value_heads=1, head_dim=128).
    Returns:
        The ModelConfig of the checkpoint.
    """
    if dtype not in _FILE_DTYPES:
        raise ValueError(f"dtype {dtype}: expected one of {_FILE_DTYPES}")
    file_dtype = str(dtype).removeprefix("torch.")
    config = random_config(preset, **{"torch_dtype": file_dtype, **overrides})
    slots = expected_tensors(config)
    if not 1 <= num_shards <= len(slots):
        raise ValueError(f"num_shards = {num_shards}: expected 1..{len(slots)} "
                         f"(one tensor at least each)")
    os.makedirs(path, exist_ok=True)
    _write_json(os.path.join(path, "config.json"), config.to_hf_dict())
    _write_json(os.path.join(path, "generation_config.json"), _generation_config(config))

    shards = _split_into_shards({k: s.shape for k, s in slots.items()}, num_shards)
    gen = torch.Generator().manual_seed(seed)
    std = config.initializer_range
    weight_map: dict[str, str] = {}
    total_bytes = 0
    for i, names in enumerate(shards):
        fname = ("model.safetensors" if num_shards == 1
                 else f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors")
        tensors = {n: _random_tensor(n, slots[n].shape, std, gen).to(dtype) for n in names}
        save_file(tensors, os.path.join(path, fname), metadata={"format": "pt"})
        total_bytes += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update({n: fname for n in names})
        del tensors
    if num_shards > 1:
        _write_json(os.path.join(path, "model.safetensors.index.json"),
                    {"metadata": {"total_size": total_bytes}, "weight_map": weight_map})
    return config


def _random_tensor(name: str, shape: tuple[int, ...], std: float,
                   gen: torch.Generator) -> torch.Tensor:
    t = torch.empty(shape, dtype=torch.float32)
    if name.endswith("norm.weight"):
        return t.normal_(0.0, std, generator=gen).add_(1.0)
    return t.normal_(0.0, std, generator=gen)


def _split_into_shards(shapes: Mapping[str, tuple[int, ...]], num_shards: int) -> list[list[str]]:
    # Consecutive tensors, cut where the running size passes each 1/num_shards of the total;
    # every shard gets at least one tensor.
    names = list(shapes)
    sizes = [max(1, _numel(shapes[n])) for n in names]
    total = sum(sizes)
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    acc, shard = 0, 0
    for idx, (name, size) in enumerate(zip(names, sizes)):
        remaining_tensors = len(names) - idx
        remaining_shards = num_shards - shard - 1
        if shards[shard] and (acc >= total * (shard + 1) / num_shards
                              or remaining_tensors <= remaining_shards):
            shard += 1
        shards[shard].append(name)
        acc += size
    return shards


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _generation_config(config: ModelConfig) -> dict[str, Any]:
    ids = config.eos_token_ids
    eos: Optional[Any] = (ids[0] if len(ids) == 1 else list(ids)) if ids else None
    return {"_from_model_config": True, "bos_token_id": config.bos_token_id, "eos_token_id": eos}


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
