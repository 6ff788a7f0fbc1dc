"""load_model: a Hugging Face Llama checkpoint directory -> LlamaForCausalLM on the paged cache.

Reads config.json (+ generation_config.json), then the weights with the `safetensors` library
(memory-mapped, never pickle): model.safetensors, or the shards named by
model.safetensors.index.json. Everything is checked before the model is built: each file opens
and is complete, every tensor the config implies is present exactly once with the right shape
and a usable dtype (F32, F16, BF16, converted to the model dtype), nothing unexpected is there,
and the index agrees with the files. Then each tensor is copied straight into its block of the
(fused) model parameter and checked to be finite. Any problem raises CheckpointError naming the
file and tensor; no partially loaded model is ever returned.

Cheap checks come first: config.json's dimensions are bounded (model/limits.py), only regular
files are opened (a FIFO named model.safetensors is refused, not waited on), and when the
config implies many more tensors and parameters than the files hold (num_hidden_layers: 1000
in a 2-layer checkpoint) the load stops with a one-line summary before the expected-tensor
table is built.

A tied-embedding checkpoint (tie_word_embeddings = true) that also holds an `lm_head.weight`:
equal to the embedding, it is skipped (its shape still checked); different (a fine-tune that kept
a trained head under the base model's config), it is loaded untied with a warning, as
transformers does. `*.rotary_emb.inv_freq` buffers are skipped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Optional

import torch

from pagedllm.model.config import ModelConfig
from pagedllm.model.errors import CheckpointError
from pagedllm.model.llama import LlamaForCausalLM
from pagedllm.model.llava_loader import maybe_load_llava
from pagedllm.model.mllama_loader import maybe_load_mllama
from pagedllm.model.safetensors_files import (INDEX_FILE, SUPPORTED_MODEL_DTYPES, USABLE_DTYPES,
                                              TensorInfo, fill, same_values, scan,
                                              weight_files)
from pagedllm.model.weight_names import (IGNORED_SUFFIXES, TensorSlot, expected_tensor_count,
                                         expected_tensors)

logger = logging.getLogger("pagedllm")

_MAX_LISTED = 12


def load_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32,
               prepack: bool = False) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Loads a LlamaForCausalLM checkpoint directory.

    Args:
        path: directory with config.json and model.safetensors (or sharded files + index).
        dtype: model dtype: torch.float32 (the reference: matches transformers to fp32
            rounding) or torch.bfloat16 (weights and activations in bf16, attention still
            accumulates in fp32; several times faster matmuls on CPUs with AVX512-BF16/AMX).
        prepack: move the projection weights into their GEMM kernel's layout after loading
            (`LlamaForCausalLM.prepack_weights`, pagedllm.model.packed_linear): faster matmuls,
            `Linear.weight` is then None.
    Returns:
        (model in eval mode with gradients off, its ModelConfig). A LLaVA checkpoint
        (LlavaForConditionalGeneration) gives the LLaVA model and its decoder's ModelConfig;
        an Mllama one (MllamaForConditionalGeneration) the Mllama model and its decoder's
        self-attention-only ModelConfig (model/mllama_loader.py).
    Raises:
        CheckpointError: any problem with the directory, naming the file, tensor and expectation.
    """
    if dtype not in SUPPORTED_MODEL_DTYPES:
        raise ValueError(f"dtype {dtype}: expected one of {SUPPORTED_MODEL_DTYPES}")

    llava = maybe_load_llava(os.fspath(path), dtype, prepack)
    if llava is not None:
        return llava
    mllama = maybe_load_mllama(os.fspath(path), dtype, prepack)
    if mllama is not None:
        return mllama
    config, slots, by_file = inspect_checkpoint(path)
    model = LlamaForCausalLM(config, dtype)
    params = dict(model.named_parameters())
    for file, names in by_file.items():
        fill(file, names, slots, params)
    del params
    if prepack:
        model.prepack_weights()
    return model.eval(), config


def inspect_checkpoint(path: str | os.PathLike) -> tuple[ModelConfig, dict[str, TensorSlot],
                                                        dict[str, list[str]]]:
    """Reads config.json and checks every safetensors header against it (no weight data read).

    Returns:
        (config, expected tensor name -> slot, file -> the expected tensor names it holds).
    Raises:
        CheckpointError: as load_model.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory (expected a Hugging Face checkpoint "
                              f"directory)")
    config = ModelConfig.from_dir(path)
    files, index_map = weight_files(path)
    found = scan(files)
    config = _untie_if_distinct(path, config, found)
    _check_size(path, config, found)
    slots = expected_tensors(config)
    _validate(path, config, slots, found, index_map)
    by_file: dict[str, list[str]] = {}
    for name in slots:
        by_file.setdefault(found[name].file, []).append(name)
    return config, slots, by_file


def _untie_if_distinct(path: str, config: ModelConfig,
                       found: dict[str, TensorInfo]) -> ModelConfig:
    """`config` untied when it ties the embeddings but the files hold an lm_head.weight of the
    same shape with other values (transformers then keeps the file's head, with a warning);
    else `config` as it is."""
    head, embed = "lm_head.weight", "model.embed_tokens.weight"
    if (not config.tie_word_embeddings or head not in found or embed not in found
            or found[head].shape != found[embed].shape or same_values(found, head, embed)):
        return config
    logger.warning("%s: config.json has tie_word_embeddings = true, but %r differs from %r: "
                   "loading it as a separate output layer (as transformers does)", path, head,
                   embed)
    return dataclasses.replace(config, tie_word_embeddings=False)


def _check_size(path: str, config: ModelConfig, found: dict[str, TensorInfo]) -> None:
    """Refuses a config that implies far more than the files hold, before any table is built.

    Only when the detailed listing of _validate would be mostly missing tensors (more than
    _MAX_LISTED more expected than found) and the parameter count is larger too: one line
    with both sizes says more than twelve 'missing tensor' lines.
    """
    expected_count = expected_tensor_count(config)
    if expected_count <= len(found) + _MAX_LISTED:
        return
    held = sum(_numel(i.shape) for n, i in found.items() if not n.endswith(IGNORED_SUFFIXES))
    expected = config.num_parameters()
    if expected <= held:
        return
    raise CheckpointError(
        f"{path}: config.json describes {expected_count} tensors with {expected} parameters, but "
        f"the safetensors files hold {len(found)} tensors with {held} parameters; config: "
        f"{_dims(config)}")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _validate(path: str, config: ModelConfig, slots: dict[str, TensorSlot],
              found: dict[str, TensorInfo], index_map: Optional[dict[str, str]]) -> None:
    problems: list[str] = []
    if index_map is not None:
        for name, file in index_map.items():
            got = found.get(name)
            if got is None or got.file != file:
                where = "no file" if got is None else got.file
                problems.append(f"{os.path.join(path, INDEX_FILE)}: lists {name!r} in {file}, "
                                f"but it is in {where}")
        for name, info in found.items():
            if name not in index_map:
                problems.append(f"{info.file}: tensor {name!r} is not listed in {INDEX_FILE}")
    for name, info in found.items():
        if name.endswith(IGNORED_SUFFIXES):
            continue
        if info.dtype not in USABLE_DTYPES:
            problems.append(f"{info.file}: tensor {name!r} has dtype {info.dtype}, expected one of "
                            f"{', '.join(USABLE_DTYPES)}")
        slot = slots.get(name)
        if slot is None and name == "lm_head.weight" and config.tie_word_embeddings:
            slot = TensorSlot((config.vocab_size, config.hidden_size), "")  # tolerated, unused
        if slot is None:
            problems.append(f"{info.file}: unexpected tensor {name!r}"
                            f"{_unexpected_hint(name, config)}")
        elif info.shape != slot.shape:
            problems.append(f"{info.file}: tensor {name!r} has shape {list(info.shape)}, expected "
                            f"{list(slot.shape)}")
    searched = ", ".join(sorted({os.path.basename(i.file) for i in found.values()})) or "no tensors"
    for name in (n for n in slots if n not in found):
        problems.append(f"{path}: missing tensor {name!r} (searched {searched})"
                        f"{_missing_hint(name, config)}")
    if problems:
        listed = "\n  - ".join(problems[:_MAX_LISTED])
        extra = len(problems) - _MAX_LISTED
        more = f"\n  ... and {extra} more" if extra > 0 else ""
        raise CheckpointError(
            f"{path}: the weights do not match config.json ({len(problems)} problem(s)); config: "
            f"{_dims(config)}\n  - {listed}{more}")


_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


def _unexpected_hint(name: str, config: ModelConfig) -> str:
    m = _LAYER_RE.match(name)
    if m and int(m.group(1)) >= config.num_hidden_layers:
        return f" (config.json has num_hidden_layers = {config.num_hidden_layers})"
    if re.search(r"self_attn\.[qkvo]_proj\.bias$", name) and not config.attention_bias:
        return " (config.json has attention_bias = false)"
    if re.search(r"mlp\.(gate|up|down)_proj\.bias$", name) and not config.mlp_bias:
        return " (config.json has mlp_bias = false)"
    return " (not part of a LlamaForCausalLM with this config)"


def _missing_hint(name: str, config: ModelConfig) -> str:
    if name == "lm_head.weight":
        return "; config.json has tie_word_embeddings = false"
    if re.search(r"self_attn\.[qkvo]_proj\.bias$", name):
        return "; config.json has attention_bias = true"
    if re.search(r"mlp\.(gate|up|down)_proj\.bias$", name):
        return "; config.json has mlp_bias = true"
    return ""


def _dims(c: ModelConfig) -> str:
    return (f"vocab_size={c.vocab_size}, hidden_size={c.hidden_size}, intermediate_size="
            f"{c.intermediate_size}, num_hidden_layers={c.num_hidden_layers}, num_attention_heads="
            f"{c.num_attention_heads}, num_key_value_heads={c.num_key_value_heads}, head_dim="
            f"{c.head_dim}, tie_word_embeddings={str(c.tie_word_embeddings).lower()}, "
            f"attention_bias={str(c.attention_bias).lower()}, mlp_bias={str(c.mlp_bias).lower()}")
