"""LLMEngine: add requests, step, abort — the loop that servers and the LLM facade drive.

One step, as data:

    Scheduler.schedule()          -> SchedulerOutput   (arrays + KV transfer plan; slots reserved)
    Executor.execute_model(out)   -> ModelOutput       (transfers, forward; logits on the host)
    Sampler.sample(logits, out.sample_targets) -> SampleResults
    Scheduler.update_from_output(out, ...)     -> RequestOutputs (the one place state changes)

A failure inside a step fails the requests it concerns (finish_reason "error", blocks freed),
never the engine: a forward that raises fails that step's requests; a draw that raises fails
only the requests whose draws raise.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence as Seq, Union

import numpy as np
import torch

from pagedllm import _core, threads
from pagedllm.config import EngineConfig
from pagedllm.engine import kv_diagnostics, tracing
from pagedllm.engine.executor import Executor, ExecutorDeadError, StepRefusedError
from pagedllm.engine.executor_factory import make_executor
from pagedllm.engine.numerics import NumericsChecker
from pagedllm.engine.sampler import Sampler
from pagedllm.engine.scheduler import Scheduler, SchedulerOutput
from pagedllm.engine.sequence import Request
from pagedllm.engine.trace_options import TraceOptions
from pagedllm.model.generation_config import read_generation_defaults
from pagedllm.multimodal.engine_inputs import EngineImages, images_of
from pagedllm.multimodal.limits import MultiModalLimits
from pagedllm.outputs import BeamSearchOutput, RequestOutput
from pagedllm.sampling_params import BeamSearchParams, SamplingParams
from pagedllm.text_checks import check_text

logger = logging.getLogger("pagedllm")

PromptType = Union[str, Dict[str, object], Seq[int]]


def resolve_model_path(model: Optional[str]) -> str:
    """The checkpoint directory to load: `model`, or the bundled default model when None."""
    if model is None:
        from pagedllm.default_model import default_model_path

        return default_model_path()
    if not os.path.isdir(model):
        raise FileNotFoundError(
            f"model directory {model!r} not found (expected a Hugging Face Llama checkpoint "
            f"directory with config.json and *.safetensors; omit it to use the bundled model)")
    return model


def _token_ids(ids: Any, what: str) -> List[int]:
    """ids as a list of Python ints: a sequence (or 1-D array) of integers (numpy integers
    too, never bools, floats or strings)."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"{what} must be a 1-D array of integer token ids, got an array of "
                             f"{ids.dtype} with shape {tuple(ids.shape)}")
        return [int(t) for t in ids]
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple, range)):
        raise ValueError(f"{what} must be a list of integer token ids, got "
                         f"{type(ids).__name__}")
    for i, t in enumerate(ids):
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise ValueError(f"{what}[{i}] must be an integer token id, got {t!r}")
    return [int(t) for t in ids]


def without_request_id(message: str) -> str:
    """An add_request error message without the engine's internal "request <id>: " prefix."""
    if message.startswith("request ") and ": " in message:
        return message.split(": ", 1)[1]
    return message


class LLMEngine:
    """The request-level engine (vLLM's LLMEngine, synchronous).

    Args:
        config: engine options; see EngineConfig.
    """

    def __init__(self, config: EngineConfig, executor: Optional[Executor] = None):
        self.config = config
        threads.set_num_threads(config.num_threads)
        self.model_path = resolve_model_path(config.model)
        self.executor = executor or make_executor(config, self.model_path)
        self.model_config = self.executor.model_config
        self.tokenizer = self._load_tokenizer()
        eos = list(self.tokenizer.eos_token_ids) if self.tokenizer else []
        for t in self.model_config.eos_token_ids:
            if t not in eos:
                eos.append(t)
        self.eos_token_ids = eos

        layout = self.executor.layout
        self.plan = layout.plan
        self.block_size = self.plan.block_size  # resolved ("auto" is decided by the worker)
        self.block_size_reason = getattr(layout, "block_size_reason", "configured")
        self.tier = None
        if config.persistence is not None and config.persistence.enabled:
            from pagedllm.engine.kv_tier import open_tier

            self.tier = open_tier(config.persistence, self.model_path,
                                  [self.executor.device_description.split(", ")[-1],
                                   f"kv:{config.kv_cache_dtype}:{config.k_scale}:{config.v_scale}",
                                   f"block_size:{self.block_size}"],
                                  self.block_size, self.plan.bytes_per_block)
            self.executor.set_kv_tier(self.tier)
        self.max_model_len = self.plan.max_model_len
        self.kv_manager = _core.KVCacheManager(self.plan.num_blocks, self.block_size,
                                               config.enable_prefix_caching,
                                               self.plan.watermark_blocks)
        self.images = EngineImages(
            self.model_path, MultiModalLimits(config.max_images_per_prompt,
                                              config.max_image_bytes, config.max_image_pixels),
            config.max_num_encoder_tokens, config.max_num_batched_tokens, self.block_size,
            config.encoder_cache_images, getattr(layout, "num_cross_blocks", 0),
            config.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv_manager, config.max_num_seqs,
                                   config.max_num_batched_tokens, self.eos_token_ids,
                                   self.max_model_len, self.tokenizer, config.preemption_mode,
                                   layout.num_host_blocks, self.tier, self.images.encoder,
                                   sparse_attention=config.sparse_attention,
                                   cross=self.images.cross)
        self.sampler = Sampler(self.eos_token_ids, seed=config.seed)
        self._ids = itertools.count()
        # Counters for metrics (cumulative since start).
        self.num_prompt_tokens = 0
        self.num_steps = 0
        self.num_failed_steps = 0
        # check_numerics: the worker probes every layer; this decides (engine/numerics.py).
        self.numerics = (NumericsChecker(config.check_numerics, self.scheduler, self.kv_manager)
                         if config.check_numerics != "off" else None)
        # Preemptions per step; a rate-limited warning with the OOM table's diagnosis on storms.
        self.kv_monitor = kv_diagnostics.PreemptionMonitor()
        self.tracer: Optional[tracing.StepTracer] = None  # start_trace()
        # Called after each step is scheduled with the KV pool's stats (benchmarks, monitors).
        self.on_step: Optional[Callable[[dict], None]] = None

    @property
    def requests(self) -> Dict[str, Request]:
        """The unfinished requests by id (the scheduler's registry; read-only)."""
        return self.scheduler.requests

    @property
    def stream_outputs(self) -> bool:
        """False: step() returns outputs of finished requests only (offline use: saves copying
        every running request's tokens each step)."""
        return self.scheduler.stream_outputs

    @stream_outputs.setter
    def stream_outputs(self, value: bool) -> None:
        self.scheduler.stream_outputs = bool(value)

    @property
    def num_generation_tokens(self) -> int:
        return self.scheduler.num_generation_tokens

    def shutdown(self) -> None:
        """Stops the executor's workers (pending KV transfers finish first) and closes the
        persistent tier (queued writes reach the disk first)."""
        self.stop_trace()
        self.executor.shutdown()
        if self.tier is not None:
            self.tier.close()

    def generation_defaults(self) -> dict:
        """Sampling defaults from the checkpoint's generation_config.json (vLLM's behaviour):
        temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens (as max_tokens),
        where present; temperature 0 when it sets do_sample false. Validated at load."""
        return read_generation_defaults(self.model_path, self.model_config.vocab_size)

    def default_sampling_params(self, **overrides) -> SamplingParams:
        """SamplingParams with the checkpoint's generation defaults, then `overrides`."""
        return SamplingParams(**{**self.generation_defaults(), **overrides})

    def _load_tokenizer(self):
        # lexists: a tokenizer.json that is not a regular file is refused by from_dir, not
        # silently taken for "no tokenizer".
        if not os.path.lexists(os.path.join(self.model_path, "tokenizer.json")):
            return None
        from pagedllm.tokenizer import Tokenizer

        return Tokenizer.from_dir(self.model_path)

    # --- requests -----------------------------------------------------------------------------
    def _prompt_ids(self, prompt: PromptType) -> tuple:
        """(text or None, token ids) of a prompt given as text, token ids or a dict.

        Raises:
            ValueError: not one of those forms, or a token id that is not an integer (a float
                or a string is refused, never rounded or parsed).
        """
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), _token_ids(prompt["prompt_token_ids"],
                                                        "prompt_token_ids")
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs 'prompt' (text) or 'prompt_token_ids'")
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
            if self.tokenizer is None:
                raise ValueError(f"the model at {self.model_path} has no tokenizer.json: give "
                                 "prompts as {'prompt_token_ids': [...]}")
            return prompt, self.tokenizer.encode(prompt)
        if prompt is None:
            raise ValueError("the prompt is None: expected text, a list of token ids or a "
                             "{'prompt': ...} / {'prompt_token_ids': [...]} dict")
        return None, _token_ids(prompt, "prompt")

    def _validate(self, request_id: str, ids: List[int], max_tokens: int,
                  params: Optional[SamplingParams] = None) -> None:
        vocab = self.model_config.vocab_size
        if not ids:
            raise ValueError(f"request {request_id}: the prompt is empty")
        image = self.images.mllama.image_token_id if self.images.mllama is not None else None
        bad = [t for t in ids if not 0 <= t < vocab and t != image]  # Mllama's past the vocab
        if bad:
            raise ValueError(f"request {request_id}: prompt token id {bad[0]} is outside the "
                             f"vocabulary [0, {vocab})")
        stop_ids = params.stop_token_ids if params is not None else []
        bad = [t for t in stop_ids if t >= vocab]
        if bad:  # a stop the model can never emit is a typo, not a request to run to the end
            raise ValueError(f"request {request_id}: SamplingParams.stop_token_ids holds {bad[0]}, "
                             f"outside the vocabulary [0, {vocab})")
        total = len(ids) + max_tokens
        if total > self.max_model_len:
            why = ""
            if self.config.max_model_len is None and self.max_model_len < self.model_config.max_position_embeddings:
                knob = ("num_kv_blocks" if self.plan.sized_by_blocks  # it rules
                        else "kv_cache_memory_bytes or num_kv_blocks")
                why = (f"; the KV pool ({self.plan.num_blocks} blocks of {self.block_size} "
                       f"tokens) set that limit ({kv_diagnostics.LONG_OOM}: too few blocks): "
                       f"raise {knob}")
            raise ValueError(
                f"request {request_id}: prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) = "
                f"{total} exceeds max_model_len ({self.max_model_len}), the maximum context "
                f"length{why}")
        bs = self.block_size
        need = self.scheduler.sparse.blocks_needed(params, len(ids), total)  # streaming: bounded
        admit = -(-len(ids) // bs)
        if need > self.plan.num_blocks or admit > self.plan.num_blocks - self.plan.watermark_blocks:
            raise ValueError(kv_diagnostics.admission_error(
                request_id, len(ids), total, need, admit, self.plan.num_blocks,
                self.plan.watermark_blocks, bs, self.plan.bytes_per_block, self.pool_stats(),
                self.config.watermark, self.plan.sized_by_blocks))

    def add_request(self, request_id: Optional[str], prompt: PromptType,
                    params: Optional[SamplingParams] = None, arrival_time: Optional[float] = None,
                    extra_key: int = 0, group: Optional[str] = None,
                    default_max_tokens: bool = False) -> str:
        """Queues a request. It joins the running batch at the next step.

        Args:
            request_id: a unique id (None: the engine makes one).
            prompt: text, token ids, or {"prompt": text} / {"prompt_token_ids": ids}; a dict
                may add {"multi_modal_data": {"image": PIL image or PNG/JPEG bytes, or a
                list}} for a LLaVA or Mllama model, one image placeholder token per image.
            params: sampling parameters (default SamplingParams()).
            arrival_time: for metrics (default now).
            extra_key: prefix-cache namespace (a tenant salt / adapter id hash; 0 = shared).
            group: fair-share key: waiting requests with a group are admitted group by group,
                fewest running sequences first (the server gives each HTTP request's prompts
                one group); None: arrival order.
            default_max_tokens: params.max_tokens is a default (the checkpoint's
                max_new_tokens, a CLI default), not the caller's: lowered to what fits in
                max_model_len after the prompt instead of refusing the request.
        Returns:
            The request id.
        Raises:
            ValueError: the request can never run (empty, bad token ids, too long for
                max_model_len or for the KV pool); the engine's other requests are unaffected.
        """
        params = params or SamplingParams()
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, ids = self._prompt_ids(prompt)
        ids, mm = self.images.prepare(ids, images_of(prompt))
        room = max(1, self.max_model_len - len(ids))  # a prompt too long is refused below
        if params.max_tokens is None or (default_max_tokens and params.max_tokens > room):
            params = dataclasses.replace(params, max_tokens=room,
                                         min_tokens=min(params.min_tokens, room))
        self._validate(request_id, ids, params.max_tokens, params)
        req = Request(request_id, text, ids, params, extra_key, arrival_time, group, **mm)
        self.scheduler.add_request(req)
        self.num_prompt_tokens += len(ids)
        return request_id

    def add_beam_request(self, request_id: Optional[str], prompt: PromptType,
                         params: BeamSearchParams, arrival_time: Optional[float] = None,
                         extra_key: int = 0, group: Optional[str] = None) -> str:
        """Queues a beam-search request; its result comes from beam_search_result().

        Args:
            request_id: a unique id (None: the engine makes one).
            prompt: as for add_request.
            params: beam width, max_tokens, length penalty, ...
            arrival_time: for metrics (default now).
            extra_key: prefix-cache namespace.
            group: fair-share key (see add_request).
        Returns:
            The request id.
        Raises:
            ValueError: as for add_request.
        """
        sp = SamplingParams(max_tokens=params.max_tokens, temperature=0.0,
                            ignore_eos=params.ignore_eos, detokenize=False)
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, ids = self._prompt_ids(prompt)
        ids, mm = self.images.prepare(ids, images_of(prompt))
        self._validate(request_id, ids, sp.max_tokens)
        self.scheduler.add_request(
            Request(request_id, text, ids, sp, extra_key, arrival_time, group, **mm), beam=params)
        self.num_prompt_tokens += len(ids)
        return request_id

    def abort_request(self, request_id: Union[str, Iterable[str]]) -> None:
        """Stops requests and frees their blocks; unknown ids are ignored."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            self.scheduler.abort_request(rid)

    def has_unfinished_requests(self) -> bool:
        """True while any request is waiting, running or swapped."""
        return bool(self.scheduler.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.requests)

    # --- the step -----------------------------------------------------------------------------
    def step(self) -> List[RequestOutput]:
        """Runs one scheduling + model + sampling step.

        Returns:
            A RequestOutput for every (non-beam) request that got new tokens or finished (only
            the finished ones when stream_outputs is False), and for every request the step
            failed (finish_reason "error", `error` set).
        """
        tracer = self.tracer
        if tracer is None:
            return self._step(tracing.NULL_RECORDER)
        token = tracer.begin_step()
        try:
            return self._step(tracer.recorder)
        finally:
            tracer.end_step(token)

    def _step(self, rec) -> List[RequestOutput]:
        with rec.span("schedule"):
            out = self.scheduler.schedule()
            self.kv_monitor.observe(self.scheduler.num_preemptions, self._diagnose_pressure)
        if out.is_empty:
            if self.tier is not None and self.scheduler.has_work:
                self.tier.wait_for_prefetch()  # waiting only for disk reads: block, not spin
            return self.scheduler.take_failed_outputs()
        if self.on_step is not None:
            self.on_step(self.kv_manager.stats())
        try:
            with rec.span("execute", cat="worker"):
                result = self.executor.execute_model(out)
        except ExecutorDeadError:  # the workers are gone (a rank died or hung): stop
            raise
        except Exception as e:  # noqa: BLE001 - the step's requests fail, not the engine
            what = str(e) if isinstance(e, StepRefusedError) else f"{type(e).__name__}: {e}"
            self._fail(out, f"the model step failed: {what}")
            if self.scheduler.tier is not None:  # what the step staged or planned for the disk
                self.scheduler.tier.discard([k for k, _ in out.transfer.loads],
                                            [k for _, k in out.transfer.stores])
            # Blocks this step filled were registered in the prefix cache before their K/V were
            # computed: forget every entry rather than ever serve one.
            self.kv_manager.reset_prefix_cache()
            if self.images.cross is not None:  # its cross blocks may be unwritten too
                self.images.cross.kv.reset_prefix_cache()
            return self.scheduler.take_failed_outputs()
        self.num_steps += 1
        if self.numerics is not None:
            with rec.span("numerics"):
                self.numerics.check(out, self.num_steps - 1, result.layer_faults, result.logits)
        with rec.span("sample"):
            results = self._sample(out, result.logits)
        try:
            with rec.span("update"):
                return self.scheduler.update_from_output(out, result.logits, result.prompt_logits,
                                                         results)
        except Exception as e:  # noqa: BLE001
            self._fail(out, f"applying the step's results failed: {type(e).__name__}: {e}")
            return self.scheduler.take_failed_outputs()

    # --- traces -------------------------------------------------------------------------------
    def start_trace(self, path: Optional[str] = None, *, layers: bool = False,
                    torch_steps=None, cuda_steps=None,
                    options: Optional[TraceOptions] = None) -> None:
        """Records the following steps (engine/tracing.py) until stop_trace().

        Args:
            path: the Chrome/Perfetto trace JSON to write (None: no JSON).
            layers: a span (and on CUDA an NVTX range) per decoder layer.
            torch_steps: "START:END" or (start, end): a torch.profiler capture of those steps
                (counted from this call), written beside `path` as <name>.torch.json.
            cuda_steps: "START:END" or (start, end): cudaProfilerStart/Stop around those steps
                (for nsys --capture-range=cudaProfilerApi; CUDA only).
            options: all of the above as one TraceOptions (the other arguments are ignored).
        Raises:
            ValueError: a bad option (named), or the trace's directory does not exist.
            RuntimeError: a trace is already being recorded.
        """
        if self.tracer is not None:
            raise RuntimeError(f"a trace to {self.tracer.path} is already being recorded")
        options = options or TraceOptions(path, layers, torch_steps, cuda_steps)
        if not options.enabled:
            raise ValueError("nothing to record: give profile_trace (a file) or "
                             "profile_cuda_steps")
        on_cuda = self.executor.device_description.startswith("cuda")
        self.tracer = tracing.StepTracer(options, on_cuda,
                                         torch.cuda.synchronize if on_cuda else None)
        if not self.executor.set_tracing(self.tracer.recorder, options.layers):
            logger.warning("this executor's workers record no spans: the trace holds the "
                           "engine's spans only")
        self.scheduler.processor.stop.clock = self.tracer.clock  # detokenize spans

    def stop_trace(self) -> List[str]:
        """Ends the trace started by start_trace() (on the thread that ran its steps) and
        writes it; returns the files written (none: no trace was being recorded)."""
        tracer, self.tracer = self.tracer, None
        if tracer is None:
            return []
        self.executor.set_tracing(None, False)
        self.scheduler.processor.stop.clock = None
        return tracer.close()

    def _sample(self, out: SchedulerOutput, logits) -> list:
        """Draws every target's token; on an error, draws one request at a time and fails the
        requests whose draws raise (their targets get a placeholder the update skips)."""
        targets = out.sample_targets
        if not targets:
            return []
        try:
            return self.sampler.sample(logits, targets)
        except Exception:  # noqa: BLE001
            pass
        results: list = [None] * len(targets)
        by_req: Dict[str, List[int]] = {}
        for i, t in enumerate(targets):
            by_req.setdefault(t.seq.request.request_id, []).append(i)
        for idx in by_req.values():
            try:
                got = self.sampler.sample(logits, [targets[i] for i in idx])
            except Exception as e:  # noqa: BLE001
                req = targets[idx[0]].seq.request
                self.num_failed_steps += 1
                logger.warning("request %s failed in the sampler: %s", req.request_id, e)
                self.scheduler.fail_request(req, f"sampling failed: {type(e).__name__}: {e}")
                continue
            for i, r in zip(idx, got):
                results[i] = r
        placeholder = next((r for r in results if r is not None), None)
        return [r if r is not None else placeholder for r in results]

    def _fail(self, out: SchedulerOutput, message: str) -> None:
        self.num_failed_steps += 1
        logger.error("step failed; failing its %d requests: %s",
                     len({e.seq.request.request_id for e in out.scheduled}), message)
        self.scheduler.fail_step(out, message)

    def beam_search_result(self, request_id: str) -> Optional[BeamSearchOutput]:
        """The finished beams of a beam-search request (None while it runs); forgets it.

        Raises:
            RuntimeError: the engine failed the request (the message says why).
        """
        return self.scheduler.pop_beam_result(request_id, self.tokenizer)

    # --- introspection ------------------------------------------------------------------------
    def pool_stats(self) -> dict:
        """KVCacheManager.stats() plus shared_blocks: distinct blocks that more than one
        sequence holds (forks, beams, prefix-cache hits), counted over the block tables."""
        s = self.kv_manager.stats()
        held = [q.seq_id for r in self.requests.values() for q in r.seqs
                if self.kv_manager.contains(q.seq_id)]
        s["shared_blocks"] = kv_diagnostics.count_shared_blocks(
            self.kv_manager.block_tables(np.asarray(held, dtype=np.int64), -1),
            self.kv_manager.refcount) if held else 0
        return s

    def _diagnose_pressure(self) -> "kv_diagnostics.Diagnosis":
        running = self.scheduler.running
        mean = sum(q.num_tokens for q in running) / len(running) if running else 0.0
        return kv_diagnostics.diagnose_pressure(
            self.pool_stats(), len({q.request.request_id for q in running}), mean,
            self.config.enable_prefix_caching)

    def kv_cache_stats(self) -> dict:
        """KV pool figures (see LLM.kv_cache_stats)."""
        s = self.pool_stats()
        s["preemptions_last_step"] = self.kv_monitor.last_step
        s["preemptions_per_step"] = self.kv_monitor.per_step
        s["prefix_cache_hit_rate"] = kv_diagnostics.hit_rate(s)
        s["internal_fragmentation"] = kv_diagnostics.fragmentation(s)
        s["num_preemptions"] = self.scheduler.num_preemptions
        s["num_swap_outs"] = self.scheduler.num_swap_outs
        s["num_swap_ins"] = self.scheduler.num_swap_ins
        s["num_swapped_seqs"] = len(self.scheduler.swapped)
        if self.scheduler.host is not None:
            s["host_blocks"] = self.scheduler.host.capacity
            s["host_free_blocks"] = self.scheduler.host.num_free
        s.update(self.scheduler.sparse.stats())
        s["num_failed_steps"] = self.num_failed_steps
        s["num_numeric_errors"] = self.numerics.num_errors if self.numerics is not None else 0
        s["device"] = self.executor.device_description
        if self.tier is not None:
            s.update(self.tier.stats())
        s["block_size_reason"] = self.block_size_reason
        s["kv_cache_dtype"] = self.config.kv_cache_dtype
        s["bytes_per_block"] = self.plan.bytes_per_block
        s["kv_cache_bytes"] = self.plan.bytes_per_block * self.plan.num_blocks
        if self.images.cross is not None:  # Mllama: the cross-attention layers' pool
            cross = self.images.cross.kv
            cs = cross.stats()
            s["cross_blocks"], s["cross_free_blocks"] = cs["num_blocks"], cs["free_blocks"]
            s["cross_cached_blocks"] = cs["cached_blocks"]
            s["cross_prefix_cache_hits"] = cs["prefix_cache_hits"]  # vision tokens shared
            s["cross_bytes_per_block"] = self.executor.layout.cross_bytes_per_block
        s["num_requests_running"] = len({q.request.request_id for q in self.scheduler.running})
        s["num_requests_waiting"] = len(self.requests) - s["num_requests_running"]
        return s
