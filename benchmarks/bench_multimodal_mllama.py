"""Mllama image requests (bench_multimodal.py's Mllama half): throughput and TTFT with and
without the image prefix cache and encoder-output reuse, and KV memory per image: an Mllama
image's vision tokens in cross-attention blocks (the cross layers only) next to what the same
tokens would take as LLaVA-style patch positions in ordinary blocks (every layer).

Builds a random MllamaForConditionalGeneration with transformers (tiles of 112 px, patch 14:
65 vision tokens per tile, up to 4 tiles; a 4-layer, 256-wide decoder with 2 cross-attention
layers), sends `requests` prompts that share one image (2x2 tiles) and differ in their text
after it. Also prints the same KV figures for the real sizes (Llama 3.2 11B Vision vs
llava-1.5-7b), computed from their published configs (nothing downloaded).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

_TEXT = dict(vocab_size=1024, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, cross_attention_layers=[1, 3],
             max_position_embeddings=2048, rope_parameters={"rope_type": "default",
                                                            "rope_theta": 10000.0},
             bos_token_id=1, eos_token_id=2, pad_token_id=0)
IMAGE_TOKEN = 1024


def real_size_kv_bytes() -> dict:
    """KV bytes (bf16) of one 4-tile image: Llama 3.2 11B Vision's cross blocks (8 cross layers,
    8 KV heads x 128, 4 x 1601 vision tokens) vs llava-1.5-7b's patch tokens (32 layers, 32 KV
    heads x 128, 576 positions)."""
    mllama = 4 * 1601 * 8 * 2 * 8 * 128 * 2
    llava = 576 * 32 * 2 * 32 * 128 * 2
    return {"mllama_11b_cross_bytes_per_image": mllama, "llava_7b_patch_bytes_per_image": llava}


def write_checkpoint(path: str, quick: bool) -> None:
    """A random Mllama checkpoint (+ preprocessor_config.json) at `path`."""
    import torch
    from transformers import (MllamaConfig, MllamaForConditionalGeneration,
                              MllamaImageProcessorPil)

    tile = 28 if quick else 112
    vision = dict(hidden_size=64 if quick else 256, intermediate_size=128 if quick else 1024,
                  num_hidden_layers=2 if quick else 4, num_global_layers=1 if quick else 2,
                  attention_heads=4, image_size=tile, patch_size=14, max_num_tiles=4,
                  intermediate_layers_indices=[0], vision_output_dim=(128 if quick else 512))
    torch.manual_seed(0)
    cfg = MllamaConfig(vision_config=vision, text_config=_TEXT, image_token_index=IMAGE_TOKEN)
    MllamaForConditionalGeneration(cfg).save_pretrained(path)
    MllamaImageProcessorPil(size={"height": tile, "width": tile},
                            max_image_tiles=4).save_pretrained(path)


def run(requests: int, quick: bool) -> list:
    """The three modes; returns their result dicts (also printed as JSON lines)."""
    from mllama_fixtures import random_image, text_prompt
    from benchmarks.mm_timing import time_requests
    from pagedllm import LLM, SamplingParams

    path = tempfile.mkdtemp()
    write_checkpoint(path, quick)
    image = random_image(0, (320, 300))  # a 2x2-tile canvas
    prompts = [{"prompt_token_ids": [IMAGE_TOKEN] + text_prompt(20, 0) + text_prompt(8, 1 + i),
                "multi_modal_data": {"image": image}} for i in range(requests)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    results = []
    for caching, keep in ((False, 0), (True, 0), (True, 8)):
        llm = LLM(path, num_kv_blocks=1024, num_cross_kv_blocks=1024, block_size=16,
                  enable_prefix_caching=caching, encoder_cache_images=keep,
                  num_threads=int(os.environ.get("OMP_NUM_THREADS", "2")))
        timing = time_requests(llm, prompts, params)
        eng = llm.engine
        s = eng.kv_cache_stats()
        (im,) = eng.images.mllama.process(prompts[0]["prompt_token_ids"], [image]).cross_images
        cross = eng.images.cross
        self_per_token = s["bytes_per_block"] // eng.block_size  # self-attention layers only
        all_layers = self_per_token * len(eng.executor.worker.model.language_model.layers) // (
            eng.model_config.num_hidden_layers)
        results.append({
            "arch": "mllama", "prefix_caching": caching, "encoder_cache_images": keep,
            "requests": requests, **timing,
            "images_encoded": cross.encoder.num_encoded_images,
            "vision_tokens_per_image": im.num_cross_tokens,
            "cross_kv_bytes_per_image_fp32": cross.blocks_needed([im]) * s["cross_bytes_per_block"],
            "as_patch_tokens_kv_bytes_fp32": im.num_cross_tokens * all_layers,
            **real_size_kv_bytes()})
        print(json.dumps(results[-1]))
        eng.shutdown()
    shutil.rmtree(path, ignore_errors=True)  # the random checkpoint
    return results
