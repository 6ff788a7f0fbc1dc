"""Observers of the forward's layers (worker side): the per-layer numeric probe and per-layer
trace spans.

LlamaForCausalLM.forward calls an observer's `after_layer(-1, x)` after the embedding lookup
and `before_layer(i)` / `after_layer(i, x)` around decoder layer i (x: the residual stream,
[num_tokens, hidden]).

**NumericsProbe** (check_numerics): one reduction per layer per step, `sum(x, dim=-1)` into
row `i + 1` of a persistent float32 [num_layers + 1, num_tokens] buffer; nothing is read back
during the forward (no device sync). After it, one `isfinite(...).all()` over the buffer
decides; only when it trips are rows resolved. A NaN/Inf in a row makes its sum non-finite; a
non-finite element stays non-finite through every later residual add and turns the final
RMSNorm's row into NaN, so a candidate row (its sum may merely have overflowed) is confirmed
on the forward's output row. A row's layer is the first whose sum is not finite.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from pagedllm.engine.numerics import EMBEDDINGS, LayerFaults


class NumericsProbe:
    """Per-layer row sums of one step's residual stream.

    Args:
        num_layers: decoder layers of the model.
        device: where the forward runs (the buffer lives there).
    """

    def __init__(self, num_layers: int, device: torch.device):
        self.num_layers = num_layers
        self.device = device
        self._buf: Optional[torch.Tensor] = None  # float32 [num_layers + 1, capacity]
        self._sums: Optional[torch.Tensor] = None  # the step's view [num_layers + 1, n]

    def start(self, num_tokens: int) -> "NumericsProbe":
        """Prepares the buffer for a step of num_tokens packed tokens (call in inference mode,
        where the buffer is then written)."""
        if self._buf is None or self._buf.shape[1] < num_tokens:
            cap = max(num_tokens, 2 * (self._buf.shape[1] if self._buf is not None else 0), 64)
            self._buf = torch.empty(self.num_layers + 1, cap, dtype=torch.float32,
                                    device=self.device)
        self._sums = self._buf[:, :num_tokens]
        return self

    def before_layer(self, i: int) -> None:
        """Nothing to do before a layer."""

    def after_layer(self, i: int, x: torch.Tensor) -> None:
        """Records the row sums of x [num_tokens, hidden] after layer i (-1: embeddings)."""
        torch.sum(x, dim=-1, dtype=torch.float32, out=self._sums[i + 1])

    def faults(self, hidden: torch.Tensor) -> Optional[LayerFaults]:
        """The step's findings, or None when every sum is finite.

        Args:
            hidden: [num_tokens, hidden] the forward's output (final norm applied).
        """
        sums = self._sums  # [num_layers + 1, n]
        if bool(torch.isfinite(sums).all()):
            return None
        bad = ~torch.isfinite(sums)                                  # [num_layers + 1, n]
        rows = torch.nonzero(bad.any(dim=0)).flatten()               # candidate rows
        rows = rows[~torch.isfinite(hidden[rows]).all(dim=-1)]       # confirmed on the output
        if not rows.numel():
            return None
        first = bad[:, rows].to(torch.int8).argmax(dim=0) + EMBEDDINGS  # first bad layer
        return LayerFaults(rows.tolist(), first.tolist())


class LayerSpans:
    """Trace spans `layer i` around each decoder layer (--profile-layers).

    Args:
        recorder: the worker's SpanRecorder (engine/tracing.py).
        num_layers: decoder layers of the model.
    """

    def __init__(self, recorder, num_layers: int):
        self.recorder = recorder
        self.names = [f"layer {i}" for i in range(num_layers)]
        self._t0 = 0

    def before_layer(self, i: int) -> None:
        self._t0 = self.recorder.begin(self.names[i])

    def after_layer(self, i: int, x: torch.Tensor) -> None:
        if i >= 0:
            self.recorder.end(self.names[i], self._t0)


class LayerObservers:
    """Several observers as one (spans close before the probe's reduction runs).

    Args:
        observers: NumericsProbe / LayerSpans instances, in call order for before_layer.
    """

    def __init__(self, observers: List[object]):
        self.observers = observers
        self._after = list(reversed(observers))

    def before_layer(self, i: int) -> None:
        for o in self.observers:
            o.before_layer(i)

    def after_layer(self, i: int, x: torch.Tensor) -> None:
        for o in self._after:
            o.after_layer(i, x)
