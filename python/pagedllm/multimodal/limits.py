"""Limits on the images of one prompt: count, encoded size and decoded pixel count.

Checked before anything is decoded into memory (the count, the encoded bytes, the header's
width x height), so a decompression bomb or an oversized upload is refused cheaply. A value
beyond a limit is a ValueError naming the limit and the value (the server turns it into a 400).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MultiModalLimits:
    """Per-prompt image limits.

    Attributes:
        max_images_per_prompt: most images in one prompt.
        max_image_bytes: most encoded bytes of one image (after base64 decoding).
        max_image_pixels: most width * height of one decoded image.
    """

    max_images_per_prompt: int = 4
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 4096 * 4096

    def __post_init__(self) -> None:
        for name in ("max_images_per_prompt", "max_image_bytes", "max_image_pixels"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} = {v!r}: expected a positive integer")

    def check_count(self, n: int) -> None:
        """Raises ValueError when a prompt has more than max_images_per_prompt images."""
        if n > self.max_images_per_prompt:
            raise ValueError(f"the prompt has {n} images; at most max_images_per_prompt = "
                             f"{self.max_images_per_prompt} are allowed")

    def check_bytes(self, n: int) -> None:
        """Raises ValueError when an encoded image is larger than max_image_bytes."""
        if n > self.max_image_bytes:
            raise ValueError(f"an image of {n} bytes exceeds max_image_bytes = "
                             f"{self.max_image_bytes}")

    def check_pixels(self, width: int, height: int) -> None:
        """Raises ValueError when width * height exceeds max_image_pixels."""
        if width * height > self.max_image_pixels:
            raise ValueError(f"an image of {width}x{height} = {width * height} pixels exceeds "
                             f"max_image_pixels = {self.max_image_pixels}")
