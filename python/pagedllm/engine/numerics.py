"""check_numerics, the engine's side: which requests a step's NaN/Inf belongs to, and what to
do about them (warn, or fail those requests alone).

Two sources of findings, both plain data (no device tensor reaches the engine):

- `LayerFaults`, from the worker's per-layer probe (engine/layer_probe.py): packed token rows
  whose residual stream went non-finite, each with the first layer where it did;
- the step's host logits: rows of the sampled tokens with a NaN/Inf (a row sum first, then an
  element-wise check of the rows whose sum is not finite), which catches what the final norm
  or lm_head produce.

A row of the packed step belongs to the scheduled entry i with cu_seqlens_q[i] <= row <
cu_seqlens_q[i + 1]; its position is positions[row].
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

logger = logging.getLogger("pagedllm")

EMBEDDINGS = -1  # LayerFaults.layers value of the embedding lookup's output


@dataclass
class LayerFaults:
    """Packed token rows of one step whose activations went non-finite.

    Attributes:
        rows: rows of the step's packed tokens (ascending).
        layers: for each row, the first decoder layer whose output had a NaN/Inf there
            (EMBEDDINGS: already the embedding lookup's output).
    """

    rows: List[int]
    layers: List[int]


def layer_name(layer: int) -> str:
    """'layer 3 (model.layers.3)' or 'the embeddings (model.embed_tokens)'."""
    if layer == EMBEDDINGS:
        return "the embeddings (model.embed_tokens)"
    return f"layer {layer} (model.layers.{layer})"


def nonfinite_logit_rows(logits: torch.Tensor) -> List[int]:
    """Rows of float32 [rows, vocab] logits holding a NaN or Inf, ascending.

    A row with a NaN/Inf has a non-finite sum (30x cheaper than isfinite over every element of
    a large vocabulary); candidates (a finite row's sum can also overflow) are then confirmed
    element-wise.
    """
    candidates = torch.nonzero(~torch.isfinite(logits.sum(dim=-1))).flatten()
    if not candidates.numel():
        return []
    confirmed = ~torch.isfinite(logits[candidates]).all(dim=-1)
    return candidates[confirmed].tolist()


class NumericsChecker:
    """Turns a step's findings into warnings or failed requests (check_numerics warn | fail).

    Args:
        mode: "warn" or "fail".
        scheduler: the engine's Scheduler (fail_request is the only state change made).
        kv_manager: the KV-cache manager (its prefix cache is forgotten after a failure: the
            failed requests' blocks may hold non-finite K/V).
    """

    def __init__(self, mode: str, scheduler, kv_manager):
        if mode not in ("warn", "fail"):
            raise ValueError(f"check_numerics={mode!r}: expected 'warn' or 'fail' here")
        self.mode = mode
        self.scheduler = scheduler
        self.kv_manager = kv_manager
        self.num_errors = 0  # steps with a finding
        self._warned: set = set()  # "warn": requests already named (one warning each)

    def check(self, out, step: int, faults: Optional[LayerFaults],
              logits: Optional[torch.Tensor]) -> None:
        """Applies the policy to one executed step.

        Args:
            out: the step's SchedulerOutput.
            step: the step's index, from 0 (for the message; a trace started with the
                engine numbers its steps the same).
            faults: the worker's per-layer findings (None: nothing found, or not probed).
            logits: float32 [len(out.logits_indices), vocab] host logits (None: no row sampled);
                in "fail" mode the failed requests' rows are zeroed (their draws are skipped,
                and the sampler never sees a NaN).
        """
        found = self._from_layers(out, faults) if faults is not None else {}
        bad_logit_rows = nonfinite_logit_rows(logits) if logits is not None else []
        if bad_logit_rows:
            for rid, (seq, pos, row) in self._from_logits(out, bad_logit_rows).items():
                found.setdefault(rid, (seq, f"the logits (logits row {row}) at position {pos}"))
        if not found:
            return
        self.num_errors += 1
        if len(self._warned) > 4096:  # forget the requests that have left the engine
            self._warned &= set(self.scheduler.requests)
        for rid, (seq, where) in found.items():
            message = (f"numeric check: NaN/Inf in {where} of request {rid} (sequence "
                       f"{seq.index}, step {step})")
            if self.mode == "warn":
                if rid not in self._warned:
                    self._warned.add(rid)
                    logger.warning("%s (further findings of this request are not logged)",
                                   message)
                continue
            logger.error("%s; failing the request", message)
            self.scheduler.fail_request(seq.request, message)
        if self.mode == "fail":
            if logits is not None:
                rows = [t.row for t in out.sample_targets if t.seq.request.request_id in found]
                rows += [row for row, seq in out.beam_rows if seq.request.request_id in found]
                if rows:
                    with torch.inference_mode():
                        logits[rows] = 0.0
            self.kv_manager.reset_prefix_cache()

    @staticmethod
    def _from_layers(out, faults: LayerFaults) -> Dict[str, Tuple[object, str]]:
        """request id -> (sequence, where) for the earliest (layer, position) of each request."""
        entry_of = np.searchsorted(out.cu_seqlens_q, np.asarray(faults.rows), side="right") - 1
        best: Dict[str, Tuple[int, int, object]] = {}
        for row, layer, i in zip(faults.rows, faults.layers, entry_of.tolist()):
            seq = out.scheduled[i].seq
            pos = int(out.positions[row])
            rid = seq.request.request_id
            if rid not in best or (layer, pos) < best[rid][:2]:
                best[rid] = (layer, pos, seq)
        return {rid: (seq, f"the output of {layer_name(layer)} at position {pos}")
                for rid, (layer, pos, seq) in best.items()}

    @staticmethod
    def _from_logits(out, rows: List[int]) -> Dict[str, Tuple[object, int, int]]:
        """request id -> (sequence, position, logits row) of its first non-finite logits row."""
        wanted = set(rows)
        where = {e.seq.seq_id: e.context_len - 1 for e in out.scheduled}
        hits: Dict[str, Tuple[object, int, int]] = {}
        pairs = [(t.row, t.seq) for t in out.sample_targets] + list(out.beam_rows)
        for row, seq in pairs:
            if row in wanted:
                pos = where.get(seq.seq_id, seq.num_tokens - 1)
                hits.setdefault(seq.request.request_id, (seq, pos, row))
        return hits
