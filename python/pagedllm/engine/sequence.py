"""Requests and their sequences: the engine's bookkeeping of what each stream has produced.

A Request holds one prompt and its SamplingParams. It starts with one Sequence; in the step
that computes the end of its prompt, when best_of > 1, the sequence is forked so that every
sample shares the prompt's KV blocks. Each Sequence is one token stream with its own KV blocks
(shared or not) in the KVCacheManager, keyed by ``seq_id``.

Only the scheduler (scheduler.py and the update helpers it calls: output_processor.py,
stop_checker.py, beam_search.py) changes these objects after construction; everything else
reads them. tests/python/test_state_ownership.py checks that structurally.
"""

from __future__ import annotations

import enum
import itertools
import time
from typing import Any, List, Optional

import numpy as np
import torch

from pagedllm.sampling_params import SamplingParams

_seq_ids = itertools.count()
_arrivals = itertools.count()


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"  # not holding KV blocks (new, or preempted to be recomputed)
    RUNNING = "running"  # holding KV blocks, scheduled every step
    SWAPPED = "swapped"  # preempted by swapping: its blocks are in the host pool
    FINISHED = "finished"


class Sequence:
    """One token stream: the prompt and the tokens generated after it.

    Attributes:
        seq_id: key of this stream in the KVCacheManager.
        request: the owning request.
        index: the completion index within the request (0 .. best_of - 1).
        token_ids: prompt tokens followed by generated tokens.
        num_prompt_tokens: length of the prompt.
        num_computed_tokens: leading tokens whose K/V are in the cache.
        generator: the per-sequence torch.Generator when the request has a seed.
    """

    def __init__(self, request: "Request", index: int, token_ids: List[int],
                 generator: Optional[torch.Generator]):
        self.seq_id = next(_seq_ids)
        self.request = request
        self.index = index
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.num_computed_tokens = 0
        self.status = SequenceStatus.WAITING
        self.generator = generator
        self.cumulative_logprob = 0.0
        self.output_logprobs: Optional[list] = [] if request.params.logprobs is not None else None
        self.output_text = ""
        self.finish_reason: Optional[str] = None
        self.stop_reason: Any = None
        self.detokenizer: Any = None  # set by the engine when text is produced
        self.num_preemptions = 0
        self.beam_pending: Optional[list] = None  # beam search: (token, logprob) candidates
        self.beam_logprobs: list = []             # beam search: chosen tokens' logprobs
        self.host_blocks: Optional[List[int]] = None  # SWAPPED: host pool ids, logical order
        # Its K/V include some that block-sparse decode computed (kept out of the prefix cache,
        # swapped in without registering); False again once recomputed.
        self.sparse_kv = False

    @property
    def is_idle(self) -> bool:
        """True while the sequence has nothing to compute until its siblings catch up (a beam
        holding its candidates): the scheduler neither schedules nor readmits it."""
        return self.beam_pending is not None

    @property
    def num_tokens(self) -> int:
        """Tokens known (prompt + generated)."""
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> List[int]:
        """The generated tokens."""
        return self.token_ids[self.num_prompt_tokens:]

    def kv_tokens(self, start: int = 0, end: Optional[int] = None) -> "np.ndarray":
        """int32 ids of token_ids[start:end] as the KV-cache manager keys them: image
        positions hold their content-derived ids (pagedllm.multimodal.hashing)."""
        end = self.num_tokens if end is None else end
        kv = self.request.kv_prompt_ids
        if kv is None or start >= self.num_prompt_tokens:
            return np.asarray(self.token_ids[start:end], dtype=np.int32)
        head = kv[start:min(end, self.num_prompt_tokens)]
        if end <= self.num_prompt_tokens:
            return head
        return np.concatenate([head, np.asarray(self.token_ids[self.num_prompt_tokens:end],
                                                dtype=np.int32)])

    @property
    def arrival_key(self) -> tuple:
        """Scheduling order: earlier requests first, then completion index."""
        return (self.request.arrival_seq, self.index)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, req={self.request.request_id}, idx={self.index}, "
                f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, {self.status.value})")


class Request:
    """One prompt with its sampling parameters and its sequences.

    Attributes:
        request_id: caller-visible id.
        prompt: the prompt text (None when given as token ids).
        prompt_token_ids: the prompt's token ids.
        params: the sampling parameters.
        extra_key: prefix-cache key separating tenants / adapters (0 = shared).
        plain_greedy: each draw is the argmax of the raw logits while no token is banned
            (greedy, no penalty, no logprobs, no best_of ranking): the sampler's fast path.
        group: requests with a group are admitted fairly between groups (fewest running
            sequences first), so one client's many prompts cannot starve another's one.
        seqs: the sequences (1 until the prompt is computed, then best_of).
        prompt_logprobs: per prompt token, when requested.
        images: the prompt's ImageInputs (pagedllm.multimodal.prompt), () for text.
        kv_prompt_ids: int32 prompt ids with image positions' content-derived ids (None: text).
        cross_images: an Mllama prompt's MllamaImageInputs (their K/V in cross blocks), ().
        cross_ranges: int32 [prompt len, 2], the cross tokens each prompt position sees
            (pagedllm.multimodal.mllama_ranges; None without cross_images).
    """

    def __init__(self, request_id: str, prompt: Optional[str], prompt_token_ids: List[int],
                 params: SamplingParams, extra_key: int = 0, arrival_time: Optional[float] = None,
                 group: Optional[str] = None, images: tuple = (),
                 kv_prompt_ids: Optional[np.ndarray] = None, cross_images: tuple = (),
                 cross_ranges: Optional[np.ndarray] = None):
        self.request_id = request_id
        self.images = images
        self.kv_prompt_ids = kv_prompt_ids
        self.cross_images = cross_images
        self.cross_ranges = cross_ranges
        self.group = group  # fair-share key (an HTTP request's prompts share one); None: FCFS
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.plain_greedy = params.plain_greedy  # read once: the sampler's fast path
        self.extra_key = extra_key
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.arrival_seq = next(_arrivals)
        self.first_token_time: Optional[float] = None
        self.finish_time: Optional[float] = None
        self.beam: Any = None  # BeamSearchState for beam-search requests
        self.forked = False
        self.prompt_token_mask: Any = None  # [vocab] bool, made once by the sampler if needed
        self.prompt_ids_out: Optional[List[int]] = None  # the outputs' copy of the prompt ids
        self.prompt_logprobs: Optional[list] = [None] if params.prompt_logprobs is not None else None
        self.block_hashes: Any = None  # uint64 [full prompt blocks], made once at admission
        self.persistent_keys: Optional[list] = None  # disk-tier keys of full prompt blocks
        self.disk_first = 0  # first block of the running disk prefetch
        self.disk_miss_at = -1  # block index whose disk lookup found nothing
        self.error: Optional[str] = None  # why the engine failed this request, if it did
        self.seqs: List[Sequence] = [Sequence(self, 0, prompt_token_ids, self.make_generator(0))]

    def make_generator(self, index: int) -> Optional[torch.Generator]:
        """A generator for completion `index`, seeded from the request seed (None if unseeded).

        Each completion draws from its own generator, so its tokens do not depend on which
        other sequences share its steps.
        """
        if self.params.seed is None:
            return None
        g = torch.Generator()
        g.manual_seed((self.params.seed * 1_000_003 + index) & 0x7FFF_FFFF_FFFF_FFFF)
        return g

    @property
    def finished(self) -> bool:
        """True when every sequence finished (after the fork, when one is due)."""
        seqs = self.seqs
        if len(seqs) == 1 or (self.params.best_of > 1 and not self.forked):
            # one sequence, or aborted / failed before forking
            return seqs[0].status is SequenceStatus.FINISHED
        return all(s.status is SequenceStatus.FINISHED for s in seqs)
