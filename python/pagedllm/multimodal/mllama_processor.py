"""Mllama's image preprocessing (preprocessor_config.json, MllamaImageProcessor), Pillow + numpy.

Step for step transformers' PIL backend (image_processing_pil_mllama.py), so pixel values,
aspect-ratio ids and masks agree with it exactly:

1. convert to RGB (transparency onto white: image_io.to_rgb);
2. pick the canvas: among the tile arrangements (rows x cols tiles, rows * cols <=
   max_image_tiles), the one needing the smallest upscale, else the mildest downscale; ties
   go to the smallest area;
3. resize, keeping the aspect ratio, to fit that canvas (each side clamped to [tile_size,
   canvas side] first), with the configured resample filter;
4. pad with zeros on the bottom and right to the canvas;
5. rescale (x * rescale_factor, in float64, stored float32) and normalise ((x - mean) / std);
6. split into rows x cols tiles, row by row, and pad with all-zero tiles to max_image_tiles.

The arrangement is the image's aspect ratio; its id is its 1-based index in
`supported_aspect_ratios(max_image_tiles)` (0 is reserved for padding).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import Image

from pagedllm.multimodal.hashing import image_hash
from pagedllm.multimodal.image_io import load_image, to_rgb
from pagedllm.multimodal.limits import MultiModalLimits
from pagedllm.multimodal.processor import PREPROCESSOR_CONFIG, read_preprocessor_config

_IMAGENET_STANDARD = (0.5, 0.5, 0.5)
_MAX_TILES = 64


@functools.lru_cache(maxsize=16)
def supported_aspect_ratios(max_image_tiles: int) -> tuple[tuple[int, int], ...]:
    """Every (rows, cols) tile arrangement with rows * cols <= max_image_tiles, in
    transformers' order (get_all_supported_aspect_ratios); aspect-ratio id = index + 1."""
    n = max_image_tiles
    return tuple((r, c) for r in range(1, n + 1) for c in range(1, n + 1) if r * c <= n)


@dataclass(frozen=True)
class MllamaImageProcessorConfig:
    """The fields of preprocessor_config.json that shape Mllama's pixel values.

    Attributes:
        tile_size: a tile's side in pixels (`size.height` == `size.width`).
        max_image_tiles: most tiles per image; every image's pixel values have this many.
        resample: Pillow resample filter id (2 = bilinear).
    """

    tile_size: int = 224
    max_image_tiles: int = 4
    resample: int = 2
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = _IMAGENET_STANDARD
    image_std: tuple[float, float, float] = _IMAGENET_STANDARD

    def __post_init__(self) -> None:
        for name, limit in (("tile_size", 1 << 15), ("max_image_tiles", _MAX_TILES)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limit:
                raise ValueError(f"{name} = {v!r}: expected an integer in [1, {limit}]")
        if self.resample not in {int(r) for r in Image.Resampling}:
            raise ValueError(f"resample = {self.resample!r}: expected a Pillow filter id "
                             f"(0 nearest, 1 lanczos, 2 bilinear, 3 bicubic, 4 box, 5 hamming)")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise ValueError(f"image_mean / image_std = {list(self.image_mean)} / "
                             f"{list(self.image_std)}: expected 3 values each, std positive")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MllamaImageProcessorConfig":
        """Parses preprocessor_config.json (MllamaImageProcessor keys; its defaults otherwise).

        Raises:
            ValueError: a mistyped or unsupported field (named).
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"{PREPROCESSOR_CONFIG}: expected an object, got {d!r}")
        for flag in ("do_resize", "do_pad", "do_convert_rgb"):
            if d.get(flag, True) is not True:
                raise ValueError(f"{flag} = {d[flag]!r}: MllamaImageProcessor needs it true "
                                 f"(images are always converted, resized and padded to tiles)")
        size = d.get("size", {"height": 224, "width": 224})
        if isinstance(size, int) and not isinstance(size, bool):
            size = {"height": size, "width": size}
        if (not isinstance(size, Mapping) or size.get("height") is None
                or size.get("height") != size.get("width")):
            raise ValueError(f"size = {size!r}: expected {{\"height\": n, \"width\": n}} "
                             f"(square tiles)")
        mean = d.get("image_mean", _IMAGENET_STANDARD)
        std = d.get("image_std", _IMAGENET_STANDARD)
        try:
            mean, std = _three(mean), _three(std)
            factor = float(d.get("rescale_factor", 1 / 255))
        except (TypeError, ValueError):
            raise ValueError(f"image_mean / image_std / rescale_factor = {mean!r} / {std!r} / "
                             f"{d.get('rescale_factor')!r}: expected numbers") from None
        return cls(tile_size=size["height"], max_image_tiles=d.get("max_image_tiles", 4),
                   resample=d.get("resample", 2), do_rescale=bool(d.get("do_rescale", True)),
                   rescale_factor=factor, do_normalize=bool(d.get("do_normalize", True)),
                   image_mean=mean, image_std=std)

    @classmethod
    def from_dir(cls, path: str) -> "MllamaImageProcessorConfig":
        """preprocessor_config.json of a checkpoint directory (transformers' defaults when the
        file is absent).

        Raises:
            ValueError: an invalid file (named).
        """
        return read_preprocessor_config(path, cls)

    def check_vision(self, image_size: int, max_num_tiles: int, max_aspect_ratio_id: int) -> None:
        """Raises ValueError unless these pixel values fit the vision encoder's config."""
        n_ids = len(supported_aspect_ratios(self.max_image_tiles))
        if (self.tile_size, self.max_image_tiles) != (image_size, max_num_tiles) \
                or n_ids > max_aspect_ratio_id:
            raise ValueError(f"{PREPROCESSOR_CONFIG} (size {self.tile_size}, max_image_tiles "
                             f"{self.max_image_tiles}, {n_ids} aspect ratios) does not fit "
                             f"vision_config (image_size {image_size}, max_num_tiles "
                             f"{max_num_tiles}, {max_aspect_ratio_id} aspect ratios)")


def _three(v: Any) -> tuple[float, float, float]:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v] * 3
    return tuple(float(x) for x in v)  # type: ignore[return-value]


@dataclass(frozen=True)
class MllamaImage:
    """One preprocessed image.

    Attributes:
        pixel_values: float32 [max_image_tiles, 3, tile_size, tile_size]; tiles >= num_tiles
            are zero.
        aspect_ratio_id: 1-based index of (rows, cols) in supported_aspect_ratios.
        aspect_ratio_mask: int64 [max_image_tiles], 1 for the first num_tiles tiles.
        num_tiles: rows * cols.
        aspect_ratio: (rows, cols) of tiles.
        content_hash: BLAKE2b-128 of the decoded RGB pixels (hashing.image_hash: the encoder
            cache's key).
    """

    pixel_values: np.ndarray
    aspect_ratio_id: int
    aspect_ratio_mask: np.ndarray
    num_tiles: int
    aspect_ratio: tuple[int, int]
    content_hash: bytes


def optimal_canvas(height: int, width: int, max_image_tiles: int,
                   tile_size: int) -> tuple[int, int]:
    """(canvas height, canvas width) for an image (transformers' get_optimal_tiled_canvas)."""
    canvases = np.array(supported_aspect_ratios(max_image_tiles)) * tile_size
    heights, widths = canvases.T
    scale_h, scale_w = heights / height, widths / width
    scales = np.where(scale_w > scale_h, scale_h, scale_w)  # the image must fit both ways
    up = scales[scales >= 1]
    chosen = canvases[scales == (np.min(up) if len(up) else np.max(scales[scales < 1]))]
    best = chosen[np.argmin(chosen[:, 0] * chosen[:, 1])] if len(chosen) > 1 else chosen[0]
    return int(best[0]), int(best[1])


def fit_to_canvas(height: int, width: int, canvas_height: int, canvas_width: int,
                  tile_size: int) -> tuple[int, int]:
    """(new height, new width): the image resized into the canvas, aspect ratio kept
    (transformers' get_image_size_fit_to_canvas)."""
    target_w = int(np.clip(width, tile_size, canvas_width))
    target_h = int(np.clip(height, tile_size, canvas_height))
    scale_h, scale_w = target_h / height, target_w / width
    if scale_w < scale_h:
        return min(math.floor(height * scale_w) or 1, target_h), target_w
    return target_h, min(math.floor(width * scale_h) or 1, target_w)


def preprocess_mllama(image: Image.Image, cfg: MllamaImageProcessorConfig) -> MllamaImage:
    """Pixel values, aspect-ratio id and mask of one image, as MllamaImageProcessor computes
    them (see the module docstring).

    Args:
        image: a decoded image (any mode; converted to RGB), non-empty.
        cfg: the checkpoint's preprocessing.
    Returns:
        The MllamaImage.
    Raises:
        ValueError: an empty image.
    """
    rgb = to_rgb(image)
    w, h = rgb.size
    if w < 1 or h < 1:
        raise ValueError(f"an image of {w}x{h} pixels is empty")
    t = cfg.tile_size
    canvas_h, canvas_w = optimal_canvas(h, w, cfg.max_image_tiles, t)
    rows, cols = canvas_h // t, canvas_w // t
    new_h, new_w = fit_to_canvas(h, w, canvas_h, canvas_w, t)
    img = rgb.resize((new_w, new_h), resample=Image.Resampling(cfg.resample))
    canvas = np.zeros((3, canvas_h, canvas_w), dtype=np.uint8)
    canvas[:, :new_h, :new_w] = np.asarray(img).transpose(2, 0, 1)
    x = canvas.astype(np.float32)
    if cfg.do_rescale:
        x = (canvas.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    if cfg.do_normalize:
        mean = np.asarray(cfg.image_mean, dtype=np.float32)[:, None, None]
        std = np.asarray(cfg.image_std, dtype=np.float32)[:, None, None]
        x = (x - mean) / std
    # x: [3, rows * t, cols * t] -> tiles: [rows * cols, 3, t, t], row by row
    tiles = x.reshape(3, rows, t, cols, t).transpose(1, 3, 0, 2, 4).reshape(rows * cols, 3, t, t)
    n = rows * cols
    pixels = np.zeros((cfg.max_image_tiles, 3, t, t), dtype=np.float32)
    pixels[:n] = tiles
    mask = np.zeros(cfg.max_image_tiles, dtype=np.int64)
    mask[:n] = 1
    ratio_id = supported_aspect_ratios(cfg.max_image_tiles).index((rows, cols)) + 1
    return MllamaImage(pixels, ratio_id, mask, n, (rows, cols), image_hash(rgb))


def process_images(images: Sequence[object], cfg: MllamaImageProcessorConfig,
                   limits: MultiModalLimits) -> list[MllamaImage]:
    """Decodes (image_io.load_image, within `limits`) and preprocesses a prompt's images.

    Args:
        images: PIL images or the bytes of PNG/JPEG files, in prompt order.
        cfg: the checkpoint's preprocessing.
        limits: count, encoded size and pixel limits.
    Returns:
        One MllamaImage per image.
    Raises:
        ValueError: too many images; ImageInputError (a ValueError): an image that cannot be
            used (corrupt, truncated, unsupported format, too large), saying which.
    """
    limits.check_count(len(images))
    return [preprocess_mllama(load_image(im, limits), cfg) for im in images]


def stack_images(images: Sequence[MllamaImage]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The vision encoder's inputs for several images.

    Args:
        images: preprocessed images (same config), at least one.
    Returns:
        (pixel_values float32 [n, max_image_tiles, 3, t, t], aspect_ratio_ids int64 [n],
        aspect_ratio_mask int64 [n, max_image_tiles]).
    """
    if not images:
        raise ValueError("stack_images: expected at least one image")
    return (np.stack([im.pixel_values for im in images]),
            np.array([im.aspect_ratio_id for im in images], dtype=np.int64),
            np.stack([im.aspect_ratio_mask for im in images]))
