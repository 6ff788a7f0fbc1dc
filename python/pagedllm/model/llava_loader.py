"""load_llava: a LlavaForConditionalGeneration checkpoint directory -> the paged LLaVA model.

Accepts the tensor layouts transformers writes: llava-1.5 on the Hub (`vision_tower.
vision_model.*`, `multi_modal_projector.*`, `language_model.model.*`,
`language_model.lm_head.weight`), transformers 5's save_pretrained (`vision_tower.*` without
`vision_model.`) and its in-memory layout (`model.vision_tower.*`, `model.language_model.*`,
`lm_head.weight`). Names are first mapped to one canonical form; then, as for text Llama
(model/loader.py, whose file scanning and copying it reuses), every expected tensor must be
present once with its shape and a usable dtype, nothing unexpected may be there, and every
value must be finite. All problems are listed in one CheckpointError.
"""

from __future__ import annotations

import os
import re
from typing import Optional

import torch

from pagedllm.model import safetensors_files as st
from pagedllm.model.clip_vision import clip_tensor_shapes
from pagedllm.model.config import ModelConfig
from pagedllm.model.llava import LlavaForConditionalGeneration
from pagedllm.model.llava_config import LlavaConfig, is_llava_checkpoint, read_llava_config
from pagedllm.model.weight_names import TensorSlot, expected_tensors

# Buffers some exports carry that hold no weights.
_IGNORED = ("rotary_emb.inv_freq", "embeddings.position_ids")
_RENAMES = (  # checkpoint prefix -> canonical prefix, first match wins
    (re.compile(r"^(model\.)?vision_tower\.(vision_model\.)?"), "vision_tower."),
    (re.compile(r"^(model\.)?multi_modal_projector\."), "multi_modal_projector."),
    (re.compile(r"^language_model\.model\."), "model."),
    (re.compile(r"^model\.language_model\."), "model."),
    (re.compile(r"^language_model\.lm_head\."), "lm_head."),
)


def canonical_name(name: str) -> str:
    """A checkpoint tensor name in the canonical layout (vision_tower.*, multi_modal_projector.*,
    model.* and lm_head.* of the Llama decoder)."""
    for pattern, repl in _RENAMES:
        if pattern.match(name):
            return pattern.sub(repl, name, count=1)
    return name


def expected_llava_tensors(cfg: LlavaConfig) -> dict[str, TensorSlot]:
    """Canonical tensor name -> slot (shape, parameter of LlavaForConditionalGeneration)."""
    out: dict[str, TensorSlot] = {}
    for name, shape in clip_tensor_shapes(cfg.vision).items():
        out[f"vision_tower.{name}"] = TensorSlot(shape, f"vision_tower.{name}")
    h = cfg.text.hidden_size
    proj = {"linear_1.weight": (h, cfg.projector_in), "linear_2.weight": (h, h)}
    if cfg.projector_bias:
        proj.update({"linear_1.bias": (h,), "linear_2.bias": (h,)})
    for name, shape in proj.items():
        out[f"multi_modal_projector.{name}"] = TensorSlot(shape, f"multi_modal_projector.{name}")
    for name, slot in expected_tensors(cfg.text).items():
        out[name] = TensorSlot(slot.shape, f"language_model.{slot.param}", slot.row_offset)
    return out


def load_llava(path: str | os.PathLike, dtype: torch.dtype = torch.float32,
               prepack: bool = False) -> tuple[LlavaForConditionalGeneration, ModelConfig]:
    """Loads a LLaVA checkpoint directory.

    Args:
        path: directory with config.json (vision_config, text_config) and safetensors.
        dtype: torch.float32 (the reference) or torch.bfloat16.
        prepack: prepack the decoder's projections (load_model's option).
    Returns:
        (model in eval mode, the decoder's ModelConfig: what the KV pool is sized from).
    Raises:
        CheckpointError: any problem with the directory, naming the file and tensor.
    """
    if dtype not in st.SUPPORTED_MODEL_DTYPES:
        raise ValueError(f"dtype {dtype}: expected one of {st.SUPPORTED_MODEL_DTYPES}")
    path = os.fspath(path)
    cfg = read_llava_config(path)
    files, _ = st.weight_files(path)
    found = st.scan(files)
    slots = expected_llava_tensors(cfg)
    by_ckpt = st.match_tensors(path, slots, found, canonical_name,
                               "LlavaForConditionalGeneration", _IGNORED,
                               lambda canon: canon == "lm_head.weight"
                               and cfg.text.tie_word_embeddings)
    model = LlavaForConditionalGeneration(cfg, dtype)
    st.fill_matched(by_ckpt, found, dict(model.named_parameters()))
    if prepack:
        model.prepack_weights()
    return model.eval(), cfg.text



def maybe_load_llava(path: str, dtype: torch.dtype,
                     prepack: bool) -> Optional[tuple[LlavaForConditionalGeneration, ModelConfig]]:
    """load_llava when `path` is a LLaVA checkpoint, else None (load_model's dispatch)."""
    if not os.path.isdir(path) or not is_llava_checkpoint(path):
        return None
    return load_llava(path, dtype, prepack)
