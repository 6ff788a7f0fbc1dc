"""The Mllama vision encoder against transformers' MllamaVisionModel on tiny random configs:
outputs equal in float32 for 1 and 2 images, every tile count (padded tiles included) and
aspect ratio; weights loaded from both checkpoint layouts; bad configs, inputs and weights
refused with an error naming what is wrong."""

from __future__ import annotations

import os

import pytest
import torch

from mllama_fixtures import (hf_image_processor, hf_mllama_model, hf_vision_model,
                             random_image, tiny_mllama_config, tiny_preprocessor_config,
                             tiny_vision_config, write_tiny_mllama)
from pagedllm.model.mllama_vision import MllamaVisionModel
from pagedllm.model.mllama_vision_config import MllamaVisionConfig
from pagedllm.model.mllama_vision_weights import vision_tensor_shapes
from pagedllm.multimodal.mllama_processor import (MllamaImageProcessorConfig, preprocess_mllama,
                                                  stack_images)

TIGHT = dict(rtol=1e-5, atol=1e-5)
# (aspect_ratio_id, tiles) of the default supported ratios for max_num_tiles 4:
# [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]] -> ids 1..8
RATIOS = {1: 1, 2: 2, 3: 3, 4: 4, 5: 2, 6: 4, 7: 3, 8: 4}


def ours_from(hf, vision: dict, dtype=torch.float32) -> MllamaVisionModel:
    model = MllamaVisionModel(MllamaVisionConfig.from_dict(vision), dtype)
    model.load_state(hf.state_dict())
    return model


def inputs(ids, cfg: dict, seed: int = 0):
    """Random pixels for images with aspect-ratio ids `ids`; padded tiles zero, as the
    processor makes them. Returns (pixel_values [n, T, 3, S, S], ids [n], mask [n, T])."""
    g = torch.Generator().manual_seed(seed)
    t, s = cfg["max_num_tiles"], cfg["image_size"]
    ratios = cfg.get("supported_aspect_ratios")
    tiles = [RATIOS[i] if ratios is None else ratios[i - 1][0] * ratios[i - 1][1] for i in ids]
    px = torch.randn(len(ids), t, 3, s, s, generator=g)
    mask = torch.zeros(len(ids), t, dtype=torch.long)
    for n, k in enumerate(tiles):
        px[n, k:] = 0
        mask[n, :k] = 1
    return px, torch.tensor(ids), mask


def hf_forward(hf, px, ids, mask):
    # transformers' inputs are [batch, num_images, ...]: all images in one batch row
    with torch.inference_mode():
        return hf(px[None], ids[None], mask[None]).last_hidden_state[0]


@pytest.mark.parametrize("vision", [
    tiny_vision_config(),
    tiny_vision_config(image_size=56, intermediate_layers_indices=(-1, 0, 1)),  # 17 -> 24 rows
    tiny_vision_config(image_size=42, max_num_tiles=2, num_global_layers=1,
                       intermediate_layers_indices=(1,)),
], ids=["tile28", "tile56-neg-index", "tiles2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_matches_transformers_every_aspect_ratio(vision, attn):
    hf = hf_vision_model(vision, seed=1)
    hf.config._attn_implementation = attn
    ours = ours_from(hf, vision)
    n_ids = MllamaVisionConfig.from_dict(vision).max_aspect_ratio_id
    for ids in ([1], [n_ids], list(range(1, n_ids + 1)), [2, 1] if n_ids > 1 else [1, 1]):
        px, ids_t, mask = inputs(ids, vision, seed=len(ids))
        got = ours(px, ids_t, mask)
        cfg = ours.config
        assert got.shape == (len(ids), cfg.max_num_tiles, cfg.num_patches, cfg.vision_output_dim)
        torch.testing.assert_close(got, hf_forward(hf, px, ids_t, mask), **TIGHT)


def test_two_images_batched_equal_each_alone():
    vision = tiny_vision_config()
    hf = hf_vision_model(vision, seed=2)
    ours = ours_from(hf, vision)
    px, ids, mask = inputs([6, 5], vision, seed=3)  # 4 tiles and 2 tiles (2 padded)
    both = ours(px, ids, mask)
    for i in range(2):
        alone = ours(px[i:i + 1], ids[i:i + 1], mask[i:i + 1])
        torch.testing.assert_close(both[i:i + 1], alone, **TIGHT)
        torch.testing.assert_close(alone, hf_forward(hf, px[i:i + 1], ids[i:i + 1],
                                                     mask[i:i + 1]), **TIGHT)


def test_gates_and_tiles_matter():
    """The comparison is not vacuous: the aspect-ratio id and the padded tiles' mask change
    the output (the tile embeddings and the attention bias are live)."""
    vision = tiny_vision_config()
    ours = ours_from(hf_vision_model(vision, seed=4), vision)
    px, ids, mask = inputs([6], vision)
    base = ours(px, ids, mask)
    assert not torch.allclose(base, ours(px, torch.tensor([8]), mask), atol=1e-3)
    half = mask.clone()
    half[0, 2:] = 0
    assert not torch.allclose(base, ours(px, ids, half), atol=1e-3)


def test_processor_then_encoder_match_transformers():
    """Real images of different aspect ratios: our processor + encoder against transformers'
    processor + encoder, 1 and 2 images."""
    vision = tiny_vision_config()
    hf = hf_vision_model(vision, seed=12)
    ours = ours_from(hf, vision)
    cfg = MllamaImageProcessorConfig.from_dict(tiny_preprocessor_config())
    images = [random_image(1, (90, 30)), random_image(2, (50, 60), "RGBA"),
              random_image(3, (20, 20), "L")]
    for group in ([images[0]], images[1:]):
        ref = hf_image_processor()([group], return_tensors="pt")
        with torch.inference_mode():
            want = hf(ref["pixel_values"], ref["aspect_ratio_ids"],
                      ref["aspect_ratio_mask"]).last_hidden_state[0]
        px, ids, mask = (torch.from_numpy(a) for a in
                         stack_images([preprocess_mllama(im, cfg) for im in group]))
        torch.testing.assert_close(ours(px, ids, mask), want, **TIGHT)


def test_bfloat16_close_to_float32():
    vision = tiny_vision_config()
    hf = hf_vision_model(vision, seed=5)
    px, ids, mask = inputs([6, 2], vision, seed=5)
    got = ours_from(hf, vision, torch.bfloat16)(px, ids, mask)
    assert got.dtype == torch.bfloat16
    ref = hf_forward(hf, px, ids, mask)
    assert float((got.float() - ref).abs().max()) < 0.05 * float(ref.abs().max())


def test_tensor_shapes_are_transformers_state_dict():
    for vision in (tiny_vision_config(), tiny_vision_config(max_num_tiles=2, image_size=42)):
        hf = hf_vision_model(vision)
        want = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
        assert vision_tensor_shapes(MllamaVisionConfig.from_dict(vision)) == want


# ---- weights: both checkpoint layouts, and bad ones -------------------------------------

def _check_loaded(ours: MllamaVisionModel, hf_vision) -> None:
    vision = tiny_mllama_config()["vision_config"]
    px, ids, mask = inputs([6, 3], vision, seed=7)
    torch.testing.assert_close(ours(px, ids, mask), hf_forward(hf_vision, px, ids, mask),
                               **TIGHT)


def test_loads_transformers_in_memory_layout():
    """MllamaForConditionalGeneration.state_dict(): model.vision_model.* beside the language
    model's and the projector's tensors (ignored)."""
    hf = hf_mllama_model(seed=8)
    sd = hf.state_dict()
    assert any(k.startswith("model.vision_model.") for k in sd)
    ours = MllamaVisionModel(MllamaVisionConfig.from_dict(tiny_mllama_config()["vision_config"]))
    ours.load_state(sd)
    _check_loaded(ours, hf.model.vision_model)


def test_loads_saved_checkpoint_original_layout(tmp_path):
    """save_pretrained writes the original Hub layout: vision_model.* (language_model.*)."""
    from safetensors.torch import load_file
    from transformers import MllamaForConditionalGeneration

    path = write_tiny_mllama(str(tmp_path), seed=9)
    tensors = load_file(os.path.join(path, "model.safetensors"))
    assert any(k.startswith("vision_model.") for k in tensors)
    assert not any(k.startswith("model.vision_model.") for k in tensors)
    ours = MllamaVisionModel(MllamaVisionConfig.from_dict(tiny_mllama_config()["vision_config"]))
    ours.load_state(tensors)
    hf = MllamaForConditionalGeneration.from_pretrained(path).eval()
    _check_loaded(ours, hf.model.vision_model)


def _bad_state(edit):
    hf = hf_vision_model(tiny_vision_config(), seed=10)
    sd = {f"vision_model.{k}": v.clone() for k, v in hf.state_dict().items()}
    edit(sd)
    return sd


@pytest.mark.parametrize("edit,match", [
    (lambda sd: sd.pop("vision_model.transformer.layers.1.mlp.fc1.bias"),
     r"missing tensor 'transformer\.layers\.1\.mlp\.fc1\.bias'"),
    (lambda sd: sd.update({"vision_model.transformer.layers.9.mlp.fc1.bias": torch.zeros(64)}),
     r"unexpected tensor 'vision_model\.transformer\.layers\.9\.mlp\.fc1\.bias'"),
    (lambda sd: sd.update({"vision_model.class_embedding": torch.zeros(33)}),
     r"'vision_model\.class_embedding' has shape \[33\], expected \[32\]"),
    (lambda sd: sd.update({"model.vision_model.class_embedding": torch.zeros(32)}),
     r"'model\.vision_model\.class_embedding' and 'vision_model\.class_embedding' are the "
     r"same weight"),
    (lambda sd: sd["vision_model.layernorm_pre.weight"].__setitem__(3, float("nan")),
     r"'vision_model\.layernorm_pre\.weight' has non-finite values"),
    (lambda sd: sd.update({"vision_model.gated_positional_embedding.gate":
                           torch.zeros(1, dtype=torch.int32)}),
     r"'vision_model\.gated_positional_embedding\.gate': expected a floating-point tensor"),
], ids=["missing", "unexpected", "shape", "duplicate", "nan", "int"])
def test_bad_weights_refused_model_unchanged(edit, match):
    ours = MllamaVisionModel(MllamaVisionConfig.from_dict(tiny_vision_config()))
    torch.nn.init.zeros_(ours.class_embedding)
    with pytest.raises(ValueError, match=match):
        ours.load_state(_bad_state(edit))
    assert not ours.class_embedding.any()  # nothing copied


# ---- bad config, bad inputs ---------------------------------------------------------------

@pytest.mark.parametrize("change,match", [
    (dict(model_type="clip_vision_model"), r"vision_config\.model_type = 'clip_vision_model'"),
    (dict(hidden_size=30), r"hidden_size = 30 is not a multiple of attention_heads = 4"),
    (dict(image_size=30), r"image_size = 30 is not a multiple of patch_size = 14"),
    (dict(image_size=[28, 42]), r"image_size = \[28, 42\]: only square"),
    (dict(num_hidden_layers=0), r"num_hidden_layers = 0: expected a positive integer"),
    (dict(attention_heads=True), r"attention_heads = True: expected a positive integer"),
    (dict(vision_output_dim=64), r"vision_output_dim = 64: expected hidden_size x "
                                 r"\(1 \+ len\(intermediate_layers_indices\)\) = 32 x 3 = 96"),
    (dict(intermediate_layers_indices=[0, 3]), r"intermediate_layers_indices = \[0, 3\]: "
                                               r"expected .* in \[-3, 3\)"),
    (dict(intermediate_layers_indices=[]), r"intermediate_layers_indices = \[\]"),
    (dict(hidden_act="swish"), r"hidden_act = 'swish'"),
    (dict(norm_eps=0), r"norm_eps = 0.0: expected a positive number"),
    (dict(max_num_tiles=2), r"supported_aspect_ratios is required when max_num_tiles = 2"),
    (dict(supported_aspect_ratios=[[1, 1], [3, 2]]), r"supported_aspect_ratios = "
                                                     r"\[\[1, 1\], \[3, 2\]\]: expected"),
    (dict(max_num_tiles=100, supported_aspect_ratios=[[1, 1]]), r"max_num_tiles = 100: "
                                                                r"expected at most 64"),
])
def test_bad_config_refused(change, match):
    with pytest.raises(ValueError, match=match):
        MllamaVisionConfig.from_dict({**tiny_vision_config(), **change})


def test_config_defaults_and_aliases():
    cfg = MllamaVisionConfig.from_dict({})  # transformers' defaults: Llama 3.2 Vision 11B
    assert (cfg.hidden_size, cfg.num_patches, cfg.vision_output_dim) == (1280, 1025, 7680)
    assert cfg.max_aspect_ratio_id == 8
    real = MllamaVisionConfig.from_dict({"image_size": 560})  # Llama 3.2 Vision's config.json
    assert (real.num_patches, real.head_dim) == (1601, 80)
    alias = {**tiny_vision_config(), "num_attention_heads": 8}
    del alias["attention_heads"]
    assert MllamaVisionConfig.from_dict(alias).attention_heads == 8
    assert MllamaVisionConfig.from_dict({**tiny_vision_config(), "image_size": [28, 28]}) \
        .image_size == 28


@pytest.fixture(scope="module")
def small_model():
    vision = tiny_vision_config()
    return ours_from(hf_vision_model(vision, seed=11), vision), vision


@pytest.mark.parametrize("which,value,match", [
    ("px", torch.zeros(1, 3, 3, 28, 28), r"pixel_values: expected a floating tensor "
                                         r"\[num_images >= 1, 4, 3, 28, 28\]"),
    ("px", torch.zeros(1, 4, 3, 28, 28, dtype=torch.uint8), r"pixel_values: .* got torch\.uint8"),
    ("px", torch.zeros(0, 4, 3, 28, 28), r"pixel_values: expected"),
    ("ids", torch.tensor([9]), r"aspect_ratio_ids: values 9\.\.9 outside \[0, 8\]"),
    ("ids", torch.tensor([-1]), r"aspect_ratio_ids: values -1\.\.-1 outside"),
    ("ids", torch.tensor([[1]]), r"aspect_ratio_ids: expected an integer tensor \[num_images "
                                 r"= 1\], got torch\.int64 \[1, 1\]"),
    ("ids", torch.tensor([1.0]), r"aspect_ratio_ids: expected an integer tensor"),
    ("mask", torch.ones(1, 3, dtype=torch.long), r"aspect_ratio_mask: expected \[num_images "
                                                 r"= 1, max_num_tiles = 4\], got \[1, 3\]"),
    ("mask", torch.full((1, 4), 2), r"aspect_ratio_mask: expected 0/1 values"),
])
def test_bad_inputs_refused(small_model, which, value, match):
    model, vision = small_model
    px, ids, mask = inputs([1], vision)
    args = {"px": px, "ids": ids, "mask": mask, which: value}
    with pytest.raises(ValueError, match=match):
        model(args["px"], args["ids"], args["mask"])
