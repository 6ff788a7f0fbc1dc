"""Image requests: throughput and time to first token with and without the image prefix cache,
and KV memory per image (LLaVA: patch tokens in ordinary blocks; Mllama: vision tokens in
cross-attention blocks, bench_multimodal_mllama.py).

    python -m benchmarks.bench_multimodal [--requests 16] [--image-size 224] [--quick]
                                          [--arch llava|mllama|all]

Builds a random LLaVA checkpoint with transformers (CLIP ViT-B/32-sized tower at 224 px: 49
patches; a 4-layer, 256-wide Llama), sends `requests` prompts that share one image and
differ in their text after it, in three modes: no prefix caching and no encoder cache reuse
(encoder_cache_images=0), prefix caching alone, prefix caching plus encoder cache reuse.
TTFT is measured one request at a time, throughput over the 16 at once. Prints one JSON line
per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))


def main(argv=None) -> list:
    """Runs the three modes; returns their result dicts (also printed as JSON lines)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--quick", action="store_true",
                    help="a tiny tower and 3 requests (the smoke test)")
    ap.add_argument("--arch", choices=("llava", "mllama", "all"), default="llava")
    args = ap.parse_args(argv)
    if args.arch != "llava":
        from benchmarks.bench_multimodal_mllama import run

        mllama = run(3 if args.quick else args.requests, args.quick)
        if args.arch == "mllama":
            return mllama
    tower = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, image_size=64, patch_size=16) if args.quick else
             dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                  num_attention_heads=12, image_size=args.image_size, patch_size=32))
    if args.quick:
        args.requests = 3
    import torch
    from transformers import (CLIPImageProcessorPil, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration)

    from mm_fixtures import random_image, text_prompt
    from benchmarks.mm_timing import time_requests
    from pagedllm import LLM, SamplingParams

    path = tempfile.mkdtemp()
    torch.manual_seed(0)
    vc = CLIPVisionConfig(**tower)
    size = tower["image_size"]
    tc = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=1024,
                     num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
    LlavaForConditionalGeneration(LlavaConfig(vision_config=vc, text_config=tc,
                                              image_token_id=1000)).save_pretrained(path)
    CLIPImageProcessorPil(size={"shortest_edge": size},
                          crop_size={"height": size, "width": size}).save_pretrained(path)
    image = random_image(0, (320, 240))
    prompts = [{"prompt_token_ids": text_prompt(20, 0) + [1000] + text_prompt(8, 1 + i),
                "multi_modal_data": {"image": image}} for i in range(args.requests)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    results = []
    for caching, keep in ((False, 0), (True, 0), (True, 8)):
        llm = LLM(path, num_kv_blocks=1024, block_size=16, enable_prefix_caching=caching,
                  encoder_cache_images=keep,
                  num_threads=int(os.environ.get("OMP_NUM_THREADS", "2")))
        timing = time_requests(llm, prompts, params)
        eng = llm.engine
        cfg = eng.model_config
        per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
        n_img = eng.images.processor.num_image_tokens
        results.append({
            "prefix_caching": caching, "encoder_cache_images": keep, "requests": args.requests,
            **timing,
            "images_encoded": eng.images.encoder.num_encoded_images,
            "image_tokens": n_img, "kv_bytes_per_image_fp32": n_img * per_token})
        print(json.dumps(results[-1]))
        llm.engine.shutdown()
    shutil.rmtree(path, ignore_errors=True)  # the random checkpoint
    return results


if __name__ == "__main__":
    main()
