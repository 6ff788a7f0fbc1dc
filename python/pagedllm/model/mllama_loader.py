"""load_mllama: an MllamaForConditionalGeneration checkpoint directory -> the paged Mllama model.

Accepts the two tensor layouts transformers writes: the original (Llama 3.2 Vision on the Hub,
and transformers 5's save_pretrained: `vision_model.*`, `multi_modal_projector.*`,
`language_model.model.*`, `language_model.lm_head.weight`) and the in-memory one
(`model.vision_model.*`, `model.multi_modal_projector.*`, `model.language_model.*`,
`lm_head.weight`). Names are mapped to one canonical form; then, as for text Llama, every
expected tensor must be present once with its shape and a usable dtype, nothing unexpected may
be there, and every value must be finite. All problems are listed in one CheckpointError.
"""

from __future__ import annotations

import os
import re
from typing import Optional

import torch

from pagedllm.model import safetensors_files as st
from pagedllm.model.config import ModelConfig
from pagedllm.model.mllama import MllamaForConditionalGeneration
from pagedllm.model.mllama_config import (EMBED_EXTRA_ROWS, MllamaConfig, is_mllama_checkpoint,
                                          read_mllama_config)
from pagedllm.model.mllama_vision import MllamaVisionModel
from pagedllm.model.mllama_vision_weights import vision_tensor_shapes
from pagedllm.model.weight_names import TensorSlot, expected_tensors

_IGNORED = ("rotary_emb.inv_freq",)
_RENAMES = (  # checkpoint prefix -> canonical prefix, first match wins
    (re.compile(r"^(model\.)?vision_model\."), "vision_model."),
    (re.compile(r"^(model\.)?multi_modal_projector\."), "multi_modal_projector."),
    (re.compile(r"^language_model\.model\."), "model."),
    (re.compile(r"^model\.language_model\."), "model."),
    (re.compile(r"^language_model\.lm_head\."), "lm_head."),
)
_CROSS_TENSORS = ("cross_attn.q_proj.weight", "cross_attn.k_proj.weight",
                  "cross_attn.v_proj.weight", "cross_attn.o_proj.weight",
                  "cross_attn.q_norm.weight", "cross_attn.k_norm.weight")


def canonical_name(name: str) -> str:
    """A checkpoint tensor name in the canonical layout (vision_model.*, multi_modal_projector.*,
    model.* and lm_head.* of the decoder)."""
    for pattern, repl in _RENAMES:
        if pattern.match(name):
            return pattern.sub(repl, name, count=1)
    return name


def _cross_layer_tensors(cfg: MllamaConfig, i: int) -> dict[str, TensorSlot]:
    c = cfg.text
    h, f = c.hidden_size, c.intermediate_size
    d = c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
    shapes = dict(zip(_CROSS_TENSORS, ((q, h), (kv, h), (kv, h), (h, q), (d,), (d,))))
    shapes.update({"cross_attn_attn_gate": (1,), "cross_attn_mlp_gate": (1,),
                   "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
                   "mlp.down_proj.weight": (h, f)})
    dst = f"language_model.layers.{i}"
    out = {f"model.layers.{i}.{n}": TensorSlot(s, f"{dst}.{n}") for n, s in shapes.items()}
    gate_up = f"{dst}.mlp.gate_up_proj.weight"  # gate rows, then up rows (fused)
    out[f"model.layers.{i}.mlp.gate_proj.weight"] = TensorSlot((f, h), gate_up, 0)
    out[f"model.layers.{i}.mlp.up_proj.weight"] = TensorSlot((f, h), gate_up, f)
    return out


def expected_mllama_tensors(cfg: MllamaConfig) -> dict[str, TensorSlot]:
    """Canonical tensor name -> slot (shape, parameter of MllamaForConditionalGeneration), for
    the model with its vision encoder."""
    out = {f"vision_model.{name}": TensorSlot(tuple(shape), f"vision_model.{name}")
           for name, shape in vision_tensor_shapes(cfg.vision).items()}
    out.update(expected_text_tensors(cfg))
    return out


def expected_text_tensors(cfg: MllamaConfig) -> dict[str, TensorSlot]:
    """Canonical name -> slot of the projector and the decoder (everything but the vision
    encoder)."""
    out: dict[str, TensorSlot] = {}
    h = cfg.text.hidden_size
    out["multi_modal_projector.weight"] = TensorSlot((h, cfg.vision_output_dim),
                                                     "multi_modal_projector.weight")
    out["multi_modal_projector.bias"] = TensorSlot((h,), "multi_modal_projector.bias")
    cross = set(cfg.cross_attention_layers)
    for name, slot in expected_tensors(cfg.text).items():
        m = re.match(r"^model\.layers\.(\d+)\.", name)
        if m and int(m.group(1)) in cross:
            continue
        shape = slot.shape
        if name == "model.embed_tokens.weight":
            shape = (cfg.text.vocab_size + EMBED_EXTRA_ROWS, h)
        out[name] = TensorSlot(shape, f"language_model.{slot.param}", slot.row_offset)
    for i in cfg.cross_attention_layers:
        out.update(_cross_layer_tensors(cfg, i))
    return out


def load_mllama(path: str | os.PathLike, dtype: torch.dtype = torch.float32,
                prepack: bool = False) -> tuple[MllamaForConditionalGeneration, ModelConfig]:
    """Loads an Mllama checkpoint directory.

    Args:
        path: directory with config.json (vision_config, text_config) and safetensors.
        dtype: torch.float32 (the reference) or torch.bfloat16.
        prepack: prepack the decoder's projections (load_model's option).
    Returns:
        (model in eval mode, the decoder's self-attention-only ModelConfig: what the ordinary
        KV pool is sized from; the cross pool is sized from model.mllama_config).
    Raises:
        CheckpointError: any problem with the directory, naming the file and tensor.
    """
    if dtype not in st.SUPPORTED_MODEL_DTYPES:
        raise ValueError(f"dtype {dtype}: expected one of {st.SUPPORTED_MODEL_DTYPES}")
    path = os.fspath(path)
    cfg = read_mllama_config(path)
    files, _ = st.weight_files(path)
    found = st.scan(files)
    slots = expected_mllama_tensors(cfg)
    by_ckpt = st.match_tensors(path, slots, found, canonical_name,
                               "MllamaForConditionalGeneration", _IGNORED)
    model = MllamaForConditionalGeneration(cfg, dtype, MllamaVisionModel(cfg.vision, dtype))
    st.fill_matched(by_ckpt, found, dict(model.named_parameters()))
    if prepack:
        model.prepack_weights()
    return model.eval(), cfg.self_text



def maybe_load_mllama(path: str, dtype: torch.dtype, prepack: bool
                      ) -> Optional[tuple[MllamaForConditionalGeneration, ModelConfig]]:
    """load_mllama when `path` is an Mllama checkpoint, else None (load_model's dispatch)."""
    if not os.path.isdir(path) or not is_mllama_checkpoint(path):
        return None
    return load_mllama(path, dtype, prepack)
