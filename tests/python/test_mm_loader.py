"""The LLaVA loader: the Hub's llava-1.5 tensor names load like transformers 5's, and a broken
checkpoint is one CheckpointError naming the tensor or field."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from mm_fixtures import llava_dir  # noqa: F401
from pagedllm.model import CheckpointError, load_model


def copy_with(src, dst, rename=None, drop=(), reshape=None, config=None):
    shutil.copytree(src, dst)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for k, v in tensors.items():
        if k in drop:
            continue
        if reshape and k in reshape:
            v = torch.zeros(reshape[k])
        out[rename(k) if rename else k] = v
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    if config:
        with open(os.path.join(dst, "config.json")) as f:
            cfg = json.load(f)
        config(cfg)
        with open(os.path.join(dst, "config.json"), "w") as f:
            json.dump(cfg, f)
    return str(dst)


def hub_name(k: str) -> str:
    return k.replace("vision_tower.", "vision_tower.vision_model.", 1)


def test_hub_layout_loads_the_same_weights(llava_dir, tmp_path):
    a, _ = load_model(llava_dir)
    b, cfg = load_model(copy_with(llava_dir, tmp_path / "hub", rename=hub_name))
    assert cfg.vocab_size == 256
    pixels = torch.randn(1, 3, 28, 28)
    assert torch.equal(a.encode_images(pixels), b.encode_images(pixels))
    for (n1, p1), (n2, p2) in zip(a.named_parameters(), b.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)


def test_broken_checkpoints_name_the_problem(llava_dir, tmp_path):
    cases = [
        (dict(drop={"multi_modal_projector.linear_1.weight"}),
         "missing tensor 'multi_modal_projector.linear_1.weight'"),
        (dict(reshape={"vision_tower.embeddings.position_embedding.weight": (9, 32)}),
         "has shape [9, 32], expected [17, 32]"),
        (dict(rename=lambda k: k.replace("linear_2", "linear_3")),
         "unexpected tensor 'multi_modal_projector.linear_3.weight'"),
        (dict(config=lambda c: c["vision_config"].update(image_size=30)),
         "vision_config.image_size = 30 is not a multiple of patch_size = 7"),
        (dict(config=lambda c: c.update(image_token_index=999)),
         "image_token_index = 999 is outside the vocabulary"),
        (dict(config=lambda c: c.update(vision_feature_layer=7)),
         "vision_feature_layer = 7: the vision tower has 3 layers"),
        (dict(config=lambda c: c["vision_config"].update(model_type="siglip_vision_model")),
         "only 'clip_vision_model'"),
    ]
    for i, (kw, message) in enumerate(cases):
        path = copy_with(llava_dir, tmp_path / f"c{i}", **kw)
        with pytest.raises(CheckpointError, match=message.replace("[", r"\[").replace("]", r"\]")):
            load_model(path)


def test_preprocessing_that_does_not_fit_the_tower_is_refused(llava_dir, tmp_path):
    from pagedllm import LLM

    path = copy_with(llava_dir, tmp_path / "pp")
    with open(os.path.join(path, "preprocessor_config.json")) as f:
        pp = json.load(f)
    pp["crop_size"] = {"height": 32, "width": 32}
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump(pp, f)
    with pytest.raises(ValueError, match="gives 32x32 images, the vision tower takes 28x28"):
        LLM(path, num_kv_blocks=16)


def test_tensor_parallel_refuses_a_llava_checkpoint_clearly(llava_dir):
    from pagedllm.config import EngineConfig
    from pagedllm.engine.tp_checks import check_parallel_config

    with pytest.raises(ValueError, match="is a LLaVA checkpoint: multimodal models are not "
                                         "supported with tensor_parallel_size=2"):
        check_parallel_config(EngineConfig(model=llava_dir, tensor_parallel_size=2), llava_dir)
