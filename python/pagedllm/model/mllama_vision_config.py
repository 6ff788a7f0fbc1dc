"""MllamaVisionConfig: config.json's `vision_config` of a Mllama checkpoint, validated.

transformers' MllamaVisionConfig defaults (Llama 3.2 Vision 11B) fill absent fields. Every
field the vision model's shapes or numerics depend on is checked once, here, with an error that
names the field and says what was expected; the torch module (model/mllama_vision.py) then
trusts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pagedllm.model.clip_vision import ACTIVATIONS

_MAX_DIM = 1 << 15
_MAX_LAYERS = 256
_MAX_TILES = 64
_DEFAULT_ASPECT_RATIOS = ((1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2), (3, 1), (4, 1))
_DEFAULTS: dict[str, Any] = dict(
    hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_global_layers=8,
    attention_heads=16, num_channels=3, vision_output_dim=7680, image_size=448, patch_size=14,
    norm_eps=1e-5, max_num_tiles=4, hidden_act="gelu")
_INT_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_global_layers",
               "attention_heads", "num_channels", "vision_output_dim", "image_size", "patch_size",
               "max_num_tiles")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class MllamaVisionConfig:
    """The Mllama vision encoder's hyper-parameters (transformers' names).

    Attributes:
        num_hidden_layers: layers of the local transformer (ungated; despite the name it
            attends across all tiles of an image, as transformers' does).
        num_global_layers: layers of the global transformer (tanh-gated branches).
        attention_heads: heads of every vision attention (`num_attention_heads` in transformers'
            attribute map).
        vision_output_dim: width of the output, hidden_size x (1 +
            len(intermediate_layers_indices)).
        image_size: a tile's side in pixels (square tiles).
        max_num_tiles: tiles per image, padded tiles included.
        intermediate_layers_indices: local-transformer layers whose outputs are appended to the
            final state (index i = the output of layer i, Python indexing).
        supported_aspect_ratios: the tile arrangements the aspect-ratio ids 1..len() select
            (id 0 is padding); the encoder uses only their count (the embedding tables' rows),
            the processor (multimodal/mllama_processor.py) their order.
    """

    hidden_size: int = 1280
    intermediate_size: int = 5120
    num_hidden_layers: int = 32
    num_global_layers: int = 8
    attention_heads: int = 16
    num_channels: int = 3
    vision_output_dim: int = 7680
    image_size: int = 448
    patch_size: int = 14
    norm_eps: float = 1e-5
    max_num_tiles: int = 4
    intermediate_layers_indices: tuple[int, ...] = (3, 7, 15, 23, 30)
    supported_aspect_ratios: tuple[tuple[int, int], ...] = _DEFAULT_ASPECT_RATIOS
    hidden_act: str = "gelu"

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            v = getattr(self, name)
            if not _is_int(v) or v <= 0:
                raise ValueError(f"vision_config.{name} = {v!r}: expected a positive integer")
            limit = {"num_hidden_layers": _MAX_LAYERS, "num_global_layers": _MAX_LAYERS,
                     "max_num_tiles": _MAX_TILES}.get(name, _MAX_DIM)
            if v > limit:
                raise ValueError(f"vision_config.{name} = {v}: expected at most {limit}")
        if not isinstance(self.norm_eps, float) or not self.norm_eps > 0:
            raise ValueError(f"vision_config.norm_eps = {self.norm_eps!r}: expected a positive "
                             f"number")
        if self.hidden_size % self.attention_heads:
            raise ValueError(f"vision_config.hidden_size = {self.hidden_size} is not a multiple "
                             f"of attention_heads = {self.attention_heads}")
        if self.image_size % self.patch_size:
            raise ValueError(f"vision_config.image_size = {self.image_size} is not a multiple of "
                             f"patch_size = {self.patch_size}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"vision_config.hidden_act = {self.hidden_act!r}: expected one of "
                             f"{', '.join(ACTIVATIONS)}")
        self._check_intermediate_layers()
        self._check_aspect_ratios()

    def _check_intermediate_layers(self) -> None:
        idx, n = self.intermediate_layers_indices, self.num_hidden_layers
        if not idx or any(not _is_int(i) or not -n <= i < n for i in idx):
            raise ValueError(f"vision_config.intermediate_layers_indices = {list(idx)}: expected "
                             f"a non-empty list of layer indices in [{-n}, {n}) "
                             f"(num_hidden_layers = {n})")
        want = self.hidden_size * (len(idx) + 1)
        if self.vision_output_dim != want:
            raise ValueError(f"vision_config.vision_output_dim = {self.vision_output_dim}: "
                             f"expected hidden_size x (1 + len(intermediate_layers_indices)) = "
                             f"{self.hidden_size} x {len(idx) + 1} = {want}")

    def _check_aspect_ratios(self) -> None:
        ratios = self.supported_aspect_ratios
        bad = [r for r in ratios if len(r) != 2 or not all(_is_int(x) and x > 0 for x in r)
               or r[0] * r[1] > self.max_num_tiles]
        if not ratios or bad:
            raise ValueError(f"vision_config.supported_aspect_ratios = "
                             f"{[list(r) for r in ratios]}: expected a non-empty list of "
                             f"pairs of positive tile counts whose product is at most "
                             f"max_num_tiles = {self.max_num_tiles}")

    @property
    def num_patches(self) -> int:
        """Positions per tile in the output: (image_size / patch_size)^2 + 1 (the class token)."""
        return (self.image_size // self.patch_size) ** 2 + 1

    @property
    def max_aspect_ratio_id(self) -> int:
        """The largest valid aspect-ratio id (ids 1.. select supported_aspect_ratios; 0 pads)."""
        return len(self.supported_aspect_ratios)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.attention_heads

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MllamaVisionConfig":
        """Parses a Mllama `vision_config` dict (transformers' defaults for absent fields).

        Args:
            d: the dict (model_type mllama_vision_model).
        Returns:
            The validated config.
        Raises:
            ValueError: a mistyped, inconsistent or unsupported field (named).
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"vision_config = {d!r}: expected an object")
        mt = d.get("model_type", "mllama_vision_model")
        if mt != "mllama_vision_model":
            raise ValueError(f"vision_config.model_type = {mt!r}: expected "
                             f"'mllama_vision_model'")
        kw = {k: d.get(k, v) for k, v in _DEFAULTS.items()}
        if "attention_heads" not in d and "num_attention_heads" in d:
            kw["attention_heads"] = d["num_attention_heads"]
        for name in ("image_size", "patch_size"):
            v = kw[name]
            if isinstance(v, (list, tuple)) and len(v) == 2 and v[0] == v[1]:
                kw[name] = v[0]  # [n, n] is a square tile
            elif isinstance(v, (list, tuple)):
                raise ValueError(f"vision_config.{name} = {list(v)}: only square tiles and "
                                 f"patches are supported (one integer, or [n, n])")
        eps = kw["norm_eps"]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise ValueError(f"vision_config.norm_eps = {eps!r}: expected a positive number")
        kw["norm_eps"] = float(eps)
        layers = d.get("intermediate_layers_indices")
        kw["intermediate_layers_indices"] = _int_tuple(
            [3, 7, 15, 23, 30] if layers is None else layers, "intermediate_layers_indices")
        ratios = d.get("supported_aspect_ratios")
        if ratios is None:
            if kw["max_num_tiles"] != 4:
                raise ValueError(f"vision_config.supported_aspect_ratios is required when "
                                 f"max_num_tiles = {kw['max_num_tiles']} (the default list is "
                                 f"for max_num_tiles = 4)")
            ratios = _DEFAULT_ASPECT_RATIOS
        if not isinstance(ratios, (list, tuple)) or not all(
                isinstance(r, (list, tuple)) for r in ratios):
            raise ValueError(f"vision_config.supported_aspect_ratios = {ratios!r}: expected a "
                             f"list of pairs of tile counts")
        kw["supported_aspect_ratios"] = tuple(tuple(r) for r in ratios)
        return cls(**kw)


def _int_tuple(v: Any, name: str) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)) or not all(_is_int(x) for x in v):
        raise ValueError(f"vision_config.{name} = {v!r}: expected a list of integers")
    return tuple(v)
