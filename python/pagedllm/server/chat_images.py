"""Images of a chat request: OpenAI `image_url` content parts -> decoded images + placeholders.

Each `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}` part is decoded
here (PNG or JPEG, within the engine's image limits) and replaced in the message text by the
model's image placeholder token (LLaVA's `<image>`, which the engine expands to the patch
count; Mllama's `<|image|>`, which stays one token: its images are cross-attended). Remote
`http(s)` URLs are refused with a 400 (`--allowed-media-domains` changes the message only:
this server never fetches media). An image for a text-only model is a 400.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from pagedllm.multimodal.image_io import ImageInputError, image_from_url
from pagedllm.server.errors import bad_request
from pagedllm.server.state import ServerState


def chat_images(state: ServerState, messages) -> Tuple[list, Optional[str]]:
    """The images of a conversation, in order, and the text that stands for each.

    Args:
        state: the server.
        messages: the request's ChatMessages.
    Returns:
        (decoded PIL images, the placeholder text; None when the conversation has no image).
    Raises:
        OpenAIError: 400 naming the message for a refused URL, bad image data, a limit, or
            an image sent to a text-only model.
    """
    images: List[object] = []
    for i, m in enumerate(messages):
        if not isinstance(m.content, list):
            continue
        for part in m.content:
            if part.type != "image_url":
                continue
            where = f"messages.{i}.content"
            processor = _processor(state)
            if processor is None:
                raise bad_request(f"the model {state.model_name!r} is text-only: it takes no "
                                  f"image_url parts", where)
            url = (part.image_url or {}).get("url") if isinstance(part.image_url, dict) else None
            if url is None:
                raise bad_request("an image_url part needs image_url.url", where)
            if len(images) >= processor.limits.max_images_per_prompt:
                raise bad_request(f"more than max_images_per_prompt = "
                                  f"{processor.limits.max_images_per_prompt} images", where)
            try:
                images.append(image_from_url(url, processor.limits,
                                             state.settings.allowed_media_domains))
            except ImageInputError as e:
                raise bad_request(f"messages[{i}]: {e}", where) from None
    if not images:
        return [], None
    token = _processor(state).image_token_id
    return images, state.tokenizer.decode([token], skip_special_tokens=False)


def _processor(state: ServerState):
    """The engine's ImagePromptProcessor or MllamaPromptProcessor (None: a text-only model)."""
    images = getattr(state.engine.engine, "images", None)
    return getattr(images, "processor", None) or getattr(images, "mllama", None)


def expanded_len(state: ServerState, prompt) -> int:
    """Prompt length as the engine counts it: each image placeholder becomes its patch count."""
    if not prompt.images:
        return len(prompt.token_ids)
    per_image = getattr(_processor(state), "num_image_tokens", 1)  # Mllama: not expanded
    return len(prompt.token_ids) + len(prompt.images) * (per_image - 1)
