"""Images in: PIL images, encoded bytes and `data:` URLs -> validated, decoded RGB images.

Encoded images must be PNG or JPEG (Pillow decodes them). The limits (limits.py) are checked
before the pixels are decoded: encoded size first, then the header's width x height. A corrupt,
truncated or unrecognised file, another format, or a limit exceeded is an ImageInputError
(a ValueError) saying which. Remote `http(s)` URLs are never fetched by this engine: they are
refused, with a different message when the operator listed the domain in
`allowed_media_domains` (allowing a domain does not make this machine reach the network).
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from typing import Iterable, Optional
from urllib.parse import urlparse

from PIL import Image

from pagedllm.multimodal.limits import MultiModalLimits

FORMATS = ("PNG", "JPEG")
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)"
                       r"(?P<b64>;base64)?,(?P<data>.*)$", re.DOTALL)
_MEDIA_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG"}


class ImageInputError(ValueError):
    """An image that cannot be used: bad data, an unsupported format, a refused URL or a limit."""


def load_image(image: object, limits: MultiModalLimits) -> Image.Image:
    """A decoded RGB image from a PIL image or encoded bytes, within `limits`.

    Args:
        image: a PIL.Image.Image, or bytes / bytearray of a PNG or JPEG file.
        limits: the size limits.
    Returns:
        A loaded PIL image in mode RGB.
    Raises:
        ImageInputError: see the module docstring.
    """
    if isinstance(image, Image.Image):
        _check_pixels(image, limits)
        try:
            image.load()  # a lazily opened file may still be truncated
        except (OSError, SyntaxError, ValueError) as e:
            raise ImageInputError(f"corrupt or truncated image data ({e})") from None
        return to_rgb(image)
    if isinstance(image, (bytes, bytearray, memoryview)):
        return decode_image(bytes(image), limits)
    raise ImageInputError(f"an image must be a PIL.Image.Image or the bytes of a PNG/JPEG file, "
                          f"got {type(image).__name__}")


def decode_image(data: bytes, limits: MultiModalLimits,
                 expected_format: Optional[str] = None) -> Image.Image:
    """Decodes a PNG or JPEG file (see load_image); `expected_format` is the data URL's claim."""
    try:
        limits.check_bytes(len(data))
    except ValueError as e:
        raise ImageInputError(str(e)) from None
    fmt = ""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            fmt = img.format
            if fmt not in FORMATS:
                raise ImageInputError(f"unsupported image format {fmt}: expected one of "
                                      f"{', '.join(FORMATS)}")
            if expected_format is not None and fmt != expected_format:
                raise ImageInputError(f"the data URL says {expected_format} but the data is "
                                      f"{fmt}")
            _check_pixels(img, limits)
            img.load()
    except ImageInputError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageInputError(f"image refused as a decompression bomb ({e})") from None
    except Image.UnidentifiedImageError:
        raise ImageInputError(f"the image data ({len(data)} bytes) is not a PNG or JPEG file "
                              f"Pillow can identify") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageInputError(f"corrupt or truncated {fmt + ' ' if fmt else ''}image data "
                              f"({e})") from None
    return to_rgb(img)


def to_rgb(image: Image.Image) -> Image.Image:
    """The image in mode RGB, transparency composited onto white (transformers'
    convert_to_rgb, so pixel values match its processors)."""
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _check_pixels(img: Image.Image, limits: MultiModalLimits) -> None:
    w, h = img.size
    if w < 1 or h < 1:
        raise ImageInputError(f"an image of {w}x{h} pixels is empty")
    try:
        limits.check_pixels(w, h)
    except ValueError as e:
        raise ImageInputError(str(e)) from None


def image_from_url(url: str, limits: MultiModalLimits,
                   allowed_media_domains: Iterable[str] = ()) -> Image.Image:
    """The image of an OpenAI `image_url` content part.

    Args:
        url: a `data:image/png;base64,...` or `data:image/jpeg;base64,...` URL.
        limits: the size limits.
        allowed_media_domains: domains the operator allows for remote images; this engine
            still never fetches them (it refuses them with a message saying so).
    Returns:
        The decoded RGB image.
    Raises:
        ImageInputError: a malformed or non-image data URL, a remote or other URL, bad data.
    """
    if not isinstance(url, str):
        raise ImageInputError(f"image_url.url must be a string, got {type(url).__name__}")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        host = (urlparse(url).hostname or "").lower()
        allowed = {d.lower().lstrip(".") for d in allowed_media_domains}
        if host and any(host == d or host.endswith("." + d) for d in allowed):
            raise ImageInputError(f"remote image URLs are allowed for {host} "
                                  f"(--allowed-media-domains) but this server does not fetch "
                                  f"remote media (no network access from the engine); send "
                                  f"the image inline as a data: URL")
        raise ImageInputError(f"remote image URL refused (host {host or '?'} is not in "
                              f"--allowed-media-domains); send the image inline as a "
                              f"data:image/png;base64,... or data:image/jpeg;base64,... URL")
    if scheme != "data":
        raise ImageInputError(f"image_url.url with scheme {scheme or '(none)'!r}: expected a "
                              f"data: URL (base64 PNG or JPEG)")
    m = _DATA_URL.match(url)
    if m is None or not m.group("b64"):
        raise ImageInputError("malformed data URL: expected data:image/png;base64,<data> or "
                              "data:image/jpeg;base64,<data>")
    media = (m.group("type") or "").lower()
    fmt = _MEDIA_TYPES.get(media)
    if fmt is None:
        raise ImageInputError(f"data URL media type {media or '(none)'!r}: expected one of "
                              f"{', '.join(sorted(_MEDIA_TYPES))}")
    payload = m.group("data")
    if len(payload) // 4 * 3 > limits.max_image_bytes + 3:
        raise ImageInputError(f"an image of about {len(payload) // 4 * 3} bytes exceeds "
                              f"max_image_bytes = {limits.max_image_bytes}")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageInputError(f"the data URL's base64 payload is invalid ({e})") from None
    return decode_image(data, limits, expected_format=fmt)
