"""Turns a SchedulerOutput's arrays into device tensors, runs the model and returns the logits.

The runner reads only the SchedulerOutput's arrays (never a Request or a Sequence). Per step:
inputs uploaded (on the CPU, zero-copy views of the numpy arrays; on a GPU, through persistent
pinned staging buffers with non-blocking copies; AttentionMetadata checks the values on the
host copy, so nothing waits on the device), one forward over the packed new tokens of every
scheduled sequence, then logits only for the rows that are needed (the last token of every sequence whose known
tokens are now all computed, plus the prompt rows of sequences that asked for prompt logprobs),
copied to the host for sampling. With check_numerics, a probe sums each layer's output rows
during the forward and is checked once the logits are on the host (engine/layer_probe.py); with a
trace, prepare_inputs / forward / logits spans (engine/tracing.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch

from pagedllm.engine.layer_probe import LayerObservers, LayerSpans, NumericsProbe
from pagedllm.engine.numerics import LayerFaults
from pagedllm.engine.scheduler import SchedulerOutput
from pagedllm.engine.tracing import NULL_RECORDER
from pagedllm.model import AttentionMetadata, PagedKVCache
from pagedllm.multimodal.cross_writer import CrossKVWriter
from pagedllm.multimodal.encoder_cache import EncoderCache
from pagedllm.sparse.attend import SparseStep


@dataclass
class ModelOutput:
    """What one step's forward returns, on the host.

    Attributes:
        logits: float32 [len(logits_indices), vocab] (None when no row is sampled).
        prompt_logits: entry index -> float32 [rows, vocab] for prompt logprobs.
        layer_faults: packed rows whose activations went NaN/Inf, with the first layer where
            they did (check_numerics; None: none found, or not checked).
    """

    logits: Optional[torch.Tensor]
    prompt_logits: Dict[int, torch.Tensor]
    layer_faults: Optional[LayerFaults] = None


class _Staging:
    """Persistent pinned host buffers and device buffers for one step's inputs (GPU only)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._host: Dict[str, torch.Tensor] = {}
        self._dev: Dict[str, torch.Tensor] = {}

    def upload(self, name: str, arr: np.ndarray) -> torch.Tensor:
        """A device tensor with arr's contents (valid for this step)."""
        src = torch.from_numpy(np.ascontiguousarray(arr))
        numel = src.numel()
        host = self._host.get(name)
        if host is None or host.numel() < numel or host.dtype != src.dtype:
            size = max(numel, 2 * (host.numel() if host is not None else 0), 256)
            host = torch.empty(size, dtype=src.dtype, pin_memory=True)
            self._host[name] = host
            self._dev[name] = torch.empty(size, dtype=src.dtype, device=self.device)
        dev = self._dev[name]
        host[:numel].copy_(src.reshape(-1))
        dev[:numel].copy_(host[:numel], non_blocking=True)
        return dev[:numel].view(src.shape)


class ModelRunner:
    """Runs the model over the paged KV cache.

    Args:
        model: the loaded Llama (pagedllm.model), in eval mode, on `kv_cache.device`.
        kv_cache: the paged KV pool its attention reads and writes.
        check_numerics: probe every layer's output for NaN/Inf (engine/layer_probe.py).
        cross_kv: the cross-attention layers' pool of an Mllama model (None: none).
    """

    def __init__(self, model: torch.nn.Module, kv_cache: PagedKVCache,
                 check_numerics: bool = False, cross_kv: Optional[PagedKVCache] = None):
        self.model = model
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self._staging = _Staging(self.device) if self.device.type == "cuda" else None
        self.encoder_cache = EncoderCache(model, self.device)  # image embeddings by hash
        self.cross_writer = (CrossKVWriter(model, cross_kv, self.device)
                             if cross_kv is not None else None)  # Mllama's cross K/V
        # decoder layers (LLaVA: its language model's)
        self.num_layers = len(getattr(model, "language_model", model).layers)
        self.probe = NumericsProbe(self.num_layers, self.device) if check_numerics else None
        self.recorder = NULL_RECORDER
        self._observer = self.probe

    def set_tracing(self, recorder, layers: bool) -> None:
        """Records prepare_inputs / forward / logits spans (and `layer i` spans when `layers`)
        into `recorder`; None stops."""
        self.recorder = recorder or NULL_RECORDER
        observers = [o for o in (self.probe,) if o is not None]
        if recorder is not None and layers:
            observers.append(LayerSpans(recorder, self.num_layers))
        self._observer = (None if not observers else observers[0] if len(observers) == 1
                          else LayerObservers(observers))

    def _tensor(self, name: str, arr: np.ndarray) -> torch.Tensor:
        if self._staging is None:
            return torch.from_numpy(arr)
        return self._staging.upload(name, arr)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelOutput:
        """Runs one step's forward (the KV transfers have run). See the module docstring.

        Args:
            out: the scheduler's decision for this step (slots already reserved).
        Returns:
            The logits of the rows to sample from (and of prompt rows when requested).
        """
        rec = self.recorder
        with rec.span("prepare_inputs", cat="worker"):
            meta = AttentionMetadata(
                slot_mapping=self._tensor("slots", out.slot_mapping),       # [num_tokens] int64
                block_tables=self._tensor("tables", out.block_tables),      # [num_seqs, W] int32
                context_lens=self._tensor("ctx", out.context_lens),         # [num_seqs] int32
                cu_seqlens_q=self._tensor("cu", out.cu_seqlens_q),          # [num_seqs + 1] int32
                num_decode_seqs=out.num_decode_seqs,
                cu_seqlens_q_host=out.cu_seqlens_q,  # checked on the host, not on the device
                sparse=(SparseStep.build(out.sparse, self.device) if out.sparse is not None
                        else None),                                         # decode block lists
            )
            ids = self._tensor("ids", out.input_ids)                        # [num_tokens] int64
            pos = self._tensor("pos", out.positions)                        # [num_tokens] int64
        extra = {}
        if out.multimodal is not None:
            with rec.span("encoder", cat="worker"):
                # {"mm_rows": [k], "mm_embeds": [k, hidden]} (the image encoder runs first)
                extra = self.encoder_cache.model_inputs(out.multimodal)
        if out.cross is not None:
            with rec.span("encoder", cat="worker"):
                # Mllama: images encoded, cross K/V written, then the step's cross metadata
                extra["cross"] = self.cross_writer.step(out.cross, meta.cu_seqlens_q,
                                                        self._tensor)
        if self.probe is not None:
            self.probe.start(len(out.input_ids))
        with rec.span("forward", cat="worker"):
            hidden = self.model(ids, pos, meta, self.kv_cache, observer=self._observer,
                                **extra)                                    # [num_tokens, hidden]
        with rec.span("logits", cat="worker"):
            prompt_logits: Dict[int, torch.Tensor] = {}
            for i, a, b in out.prompt_logit_spans:
                # [q_len, vocab] on the host
                prompt_logits[i] = self.model.compute_logits(hidden[a:b]).cpu()
            logits = None
            n = len(out.logits_indices)
            if n == hidden.shape[0]:  # every row, in order (a pure decode step): no gather
                logits = self.model.compute_logits(hidden).cpu()           # [num_sample, vocab]
            elif n:
                rows = self._tensor("rows", out.logits_indices)
                logits = self.model.compute_logits(hidden[rows]).cpu()     # [num_sample, vocab]
        # After the logits' copy to the host (which waits for the device): no extra sync.
        faults = self.probe.faults(hidden) if self.probe is not None else None
        return ModelOutput(logits, prompt_logits, faults)
