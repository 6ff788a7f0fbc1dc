"""The checkpoint's image preprocessing (preprocessor_config.json, CLIPImageProcessor), in Pillow.

convert to RGB (transparency onto white) -> resize (the shortest edge to `size.shortest_edge`, the long edge
int(shortest_edge * long / short), or to `size.height` x `size.width`) with the configured
resample filter -> center crop to `crop_size` (top/left = (size - crop) // 2; zero padding when
the image is smaller) -> rescale (x * rescale_factor) -> normalise ((x - mean) / std) ->
float32 [3, H, W]. This is transformers' PIL backend step for step, so pixel values agree with
its CLIPImageProcessor to float32 rounding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np
from PIL import Image

from pagedllm.model.files import read_json
from pagedllm.multimodal.image_io import to_rgb

PREPROCESSOR_CONFIG = "preprocessor_config.json"
_OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_RESAMPLE = {0: Image.Resampling.NEAREST, 1: Image.Resampling.LANCZOS,
             2: Image.Resampling.BILINEAR, 3: Image.Resampling.BICUBIC,
             4: Image.Resampling.BOX, 5: Image.Resampling.HAMMING}


@dataclass(frozen=True)
class ImageProcessorConfig:
    """The fields of preprocessor_config.json that shape pixel values.

    Attributes:
        shortest_edge: resize target of the short edge (None: resize to height x width).
        height, width: resize target when shortest_edge is None.
        crop_height, crop_width: center crop (do_center_crop).
    """

    do_resize: bool = True
    shortest_edge: Optional[int] = 224
    height: Optional[int] = None
    width: Optional[int] = None
    resample: int = 3
    do_center_crop: bool = True
    crop_height: int = 224
    crop_width: int = 224
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = _OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = _OPENAI_CLIP_STD

    def __post_init__(self) -> None:
        if self.resample not in _RESAMPLE:
            raise ValueError(f"resample = {self.resample!r}: expected one of {sorted(_RESAMPLE)}")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise ValueError(f"image_mean / image_std = {self.image_mean} / {self.image_std}: "
                             f"expected 3 values each, std positive")

    def output_size(self) -> tuple[int, int]:
        """(height, width) of the pixel values this config produces (crop, else resize)."""
        if self.do_center_crop:
            return self.crop_height, self.crop_width
        if self.shortest_edge is None:
            return self.height, self.width
        raise ValueError("do_center_crop = false with a shortest_edge resize gives images of "
                         "varying size, which a fixed-size CLIP tower cannot take")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ImageProcessorConfig":
        """Parses preprocessor_config.json (CLIPImageProcessor keys; defaults for the rest).

        Raises:
            ValueError: a mistyped or unsupported field (named).
        """
        size = d.get("size", {"shortest_edge": 224})
        if isinstance(size, int):
            size = {"shortest_edge": size}
        crop = d.get("crop_size", {"height": 224, "width": 224})
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        if not isinstance(size, Mapping) or not isinstance(crop, Mapping):
            raise ValueError(f"size / crop_size = {size!r} / {crop!r}: expected objects")
        shortest = size.get("shortest_edge")
        if shortest is None and not ("height" in size and "width" in size):
            raise ValueError(f"size = {dict(size)}: expected shortest_edge or height and width")
        ints = {"shortest_edge": shortest, "height": size.get("height"),
                "width": size.get("width"), "crop_size.height": crop.get("height"),
                "crop_size.width": crop.get("width")}
        for k, v in ints.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{k} = {v!r}: expected a positive integer")
        return cls(do_resize=bool(d.get("do_resize", True)), shortest_edge=shortest,
                   height=size.get("height"), width=size.get("width"),
                   resample=int(d.get("resample", 3)),
                   do_center_crop=bool(d.get("do_center_crop", True)),
                   crop_height=crop.get("height", 224), crop_width=crop.get("width", 224),
                   do_rescale=bool(d.get("do_rescale", True)),
                   rescale_factor=float(d.get("rescale_factor", 1 / 255)),
                   do_normalize=bool(d.get("do_normalize", True)),
                   image_mean=tuple(float(x) for x in d.get("image_mean", _OPENAI_CLIP_MEAN)),
                   image_std=tuple(float(x) for x in d.get("image_std", _OPENAI_CLIP_STD)))

    @classmethod
    def from_dir(cls, path: str) -> "ImageProcessorConfig":
        """preprocessor_config.json of a checkpoint directory (CLIP defaults when absent).

        Raises:
            ValueError: an invalid file (named).
        """
        return read_preprocessor_config(path, cls)


def read_preprocessor_config(path: str, cls: Any) -> Any:
    """The preprocessor_config.json of a checkpoint directory read by cls.from_dict, or cls()
    (its defaults) when the file is absent; shared by the CLIP and Mllama processor configs.

    Args:
        path: the checkpoint directory.
        cls: a config class with a from_dict(Mapping) classmethod and a no-argument default.

    Returns:
        The cls instance.

    Raises:
        ValueError: an invalid file (named).
    """
    file = os.path.join(path, PREPROCESSOR_CONFIG)
    if not os.path.lexists(file):
        return cls()
    try:
        return cls.from_dict(read_json(file))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{file}: {e}") from None

def preprocess(image: Image.Image, cfg: ImageProcessorConfig) -> np.ndarray:
    """Pixel values of one image, as CLIPImageProcessor computes them.

    Args:
        image: a decoded image (any mode; converted to RGB).
        cfg: the checkpoint's preprocessing.
    Returns:
        float32 [3, height, width].
    """
    img = to_rgb(image)
    if cfg.do_resize:
        w, h = img.size
        if cfg.shortest_edge is not None:
            short, long = (w, h) if w <= h else (h, w)
            new_long = int(cfg.shortest_edge * long / short)
            new_w, new_h = (cfg.shortest_edge, new_long) if w <= h else (new_long,
                                                                          cfg.shortest_edge)
        else:
            new_w, new_h = cfg.width, cfg.height
        img = img.resize((new_w, new_h), resample=_RESAMPLE[cfg.resample])
    x = np.asarray(img).transpose(2, 0, 1)  # [3, H, W] uint8
    if cfg.do_center_crop:
        x = _center_crop(x, cfg.crop_height, cfg.crop_width)
    x = x.astype(np.float32)
    if cfg.do_rescale:
        x = (x.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    if cfg.do_normalize:
        mean = np.asarray(cfg.image_mean, dtype=np.float32)[:, None, None]
        std = np.asarray(cfg.image_std, dtype=np.float32)[:, None, None]
        x = (x - mean) / std
    return np.ascontiguousarray(x, dtype=np.float32)


def _center_crop(x: np.ndarray, ch: int, cw: int) -> np.ndarray:
    # x: [C, H, W] -> [C, ch, cw]; zero padding (centred, ceil) where the image is smaller
    _, h, w = x.shape
    if h < ch or w < cw:
        nh, nw = max(h, ch), max(w, cw)
        padded = np.zeros(x.shape[:1] + (nh, nw), dtype=x.dtype)
        top, left = -(-(nh - h) // 2), -(-(nw - w) // 2)
        padded[:, top:top + h, left:left + w] = x
        x, h, w = padded, nh, nw
    top, left = (h - ch) // 2, (w - cw) // 2
    return x[:, top:top + ch, left:left + cw]
