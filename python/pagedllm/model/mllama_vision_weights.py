"""The Mllama vision encoder's tensor names and shapes, and loading them from a state dict.

Canonical names are MllamaVisionModel's parameter names, which are transformers' own
(`patch_embedding.weight`, `transformer.layers.3.self_attn.q_proj.weight`, ...). Checkpoints
put them under `vision_model.` (the original Llama 3.2 Vision layout on the Hub) or
`model.vision_model.` (transformers >= 4.52 / 5.x in memory and save_pretrained);
`vision_weight_name` maps either to the canonical name. A checkpoint loader can use
`vision_tensor_shapes` + `vision_weight_name` (as the LLaVA loader does with CLIP's);
`load_vision_state` does the whole job for an in-memory mapping of tensors.
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch
from torch import nn

from pagedllm.model.mllama_vision_config import MllamaVisionConfig

VISION_PREFIXES = ("model.vision_model.", "vision_model.")
_MAX_LISTED = 12


def vision_weight_name(name: str) -> Optional[str]:
    """The canonical name of a checkpoint tensor under a vision prefix, else None."""
    for prefix in VISION_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return None


def vision_tensor_shapes(cfg: MllamaVisionConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the vision encoder (canonical names) with its shape."""
    h, f, p, c = cfg.hidden_size, cfg.intermediate_size, cfg.patch_size, cfg.num_channels
    ids, tiles, pos = cfg.max_aspect_ratio_id + 1, cfg.max_num_tiles, cfg.num_patches
    out: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (h, c, p, p),
        "class_embedding": (h,),
        "gated_positional_embedding.gate": (1,),
        "gated_positional_embedding.embedding": (pos, h),
        "gated_positional_embedding.tile_embedding.weight": (ids, tiles * pos * h),
    }
    for name in ("pre_tile_positional_embedding", "post_tile_positional_embedding"):
        out[f"{name}.embedding.weight"] = (ids, tiles * h)
        out[f"{name}.gate"] = (1,)
    for name in ("layernorm_pre", "layernorm_post"):
        out[f"{name}.weight"] = (h,)
        out[f"{name}.bias"] = (h,)
    for encoder, n, gated in (("transformer", cfg.num_hidden_layers, False),
                              ("global_transformer", cfg.num_global_layers, True)):
        for i in range(n):
            pre = f"{encoder}.layers.{i}"
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[f"{pre}.self_attn.{proj}.weight"] = (h, h)
            out[f"{pre}.mlp.fc1.weight"] = (f, h)
            out[f"{pre}.mlp.fc1.bias"] = (f,)
            out[f"{pre}.mlp.fc2.weight"] = (h, f)
            out[f"{pre}.mlp.fc2.bias"] = (h,)
            for ln in ("input_layernorm", "post_attention_layernorm"):
                out[f"{pre}.{ln}.weight"] = (h,)
                out[f"{pre}.{ln}.bias"] = (h,)
            if gated:
                out[f"{pre}.gate_attn"] = (1,)
                out[f"{pre}.gate_ffn"] = (1,)
    return out


def load_vision_state(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copies vision weights into `model` (an MllamaVisionModel), checking them all first.

    Args:
        model: the module to fill (its `config` is the MllamaVisionConfig).
        tensors: bare canonical names, or names under a VISION_PREFIXES prefix (then names
            without one are ignored: they belong to the language model or the projector).
    Raises:
        ValueError: every missing, duplicated, unexpected, misshapen, non-float or non-finite
            tensor, in one message; the model is unchanged then.
    """
    prefixed = any(vision_weight_name(k) is not None for k in tensors)
    expected = vision_tensor_shapes(model.config)
    problems: list[str] = []
    chosen: dict[str, torch.Tensor] = {}
    source: dict[str, str] = {}
    for name, t in tensors.items():
        canon = vision_weight_name(name) if prefixed else name
        if canon is None:
            continue
        if canon in source:
            problems.append(f"tensor {name!r} and {source[canon]!r} are the same weight "
                            f"({canon}); expected it once")
            continue
        source[canon] = name
        shape = expected.get(canon)
        if shape is None:
            problems.append(f"unexpected tensor {name!r} (not part of a Mllama vision encoder "
                            f"with this config)")
        elif not isinstance(t, torch.Tensor) or not t.is_floating_point():
            problems.append(f"tensor {name!r}: expected a floating-point tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
        elif tuple(t.shape) != shape:
            problems.append(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)}")
        elif not bool(torch.isfinite(t).all()):
            problems.append(f"tensor {name!r} has non-finite values")
        else:
            chosen[canon] = t
    where = f" (under {' or '.join(VISION_PREFIXES)})" if prefixed else ""
    problems += [f"missing tensor {n!r}{where}" for n in expected if n not in source]
    if problems:
        listed = "\n  - ".join(problems[:_MAX_LISTED])
        extra = len(problems) - _MAX_LISTED
        more = f"\n  ... and {extra} more" if extra > 0 else ""
        raise ValueError(f"the vision weights do not match vision_config ({len(problems)} "
                         f"problem(s))\n  - {listed}{more}")
    params = dict(model.named_parameters())
    assert set(params) == set(expected), "MllamaVisionModel and vision_tensor_shapes disagree"
    with torch.no_grad():
        for name, t in chosen.items():
            params[name].copy_(t.to(params[name].dtype))
