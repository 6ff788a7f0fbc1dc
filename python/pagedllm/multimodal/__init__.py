"""Images for multimodal (LLaVA, Mllama) models, on the host side of the engine.

- `limits.py`: per-prompt image count, encoded bytes and pixel count limits.
- `image_io.py`: PIL images, raw bytes and `data:` URLs -> validated RGB images (PNG / JPEG).
- `processor.py`: preprocessor_config.json's resize / center crop / rescale / normalise.
- `mllama_processor.py`: Mllama's tiling preprocessing (canvas, resize, pad, tiles, aspect ids).
- `hashing.py`: an image's content hash and the per-position prefix-cache ids derived from it.
- `prompt.py`: a prompt's image placeholders expanded to the patch count -> MultiModalPrompt.
- `encoder_schedule.py`: the scheduler's side of the encoder cache and the encoder budget.
- `encoder_cache.py`: the worker's side: encoder outputs by content hash, rows for a step.
"""
