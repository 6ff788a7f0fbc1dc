"""Shared helpers of the model tests: an engine-like runner on the paged cache and the
transformers reference it is checked against.

`PagedRunner` does what the engine does, minimally and independently of it: admits sequences
into a `_core.KVCacheManager` (prefix caching optional), reserves slots each step, builds slot
mappings, block tables, context lengths and cu_seqlens_q, packs decode sequences first and
prefill chunks after, runs the model and picks greedy tokens. It records the logits of every
position it computes, so they can be compared with transformers' position by position.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import pytest
import torch

from pagedllm import _core
from pagedllm.model import AttentionMetadata, ModelConfig, PagedKVCache

# Prompt lengths of the parity batch: 16 sequences, lengths crossing block boundaries of 16 and
# 128 (a prompt of 129 tokens plus 64 decode steps spans two 128-token blocks).
PARITY_PROMPT_LENGTHS = (1, 2, 3, 5, 8, 13, 16, 17, 31, 33, 47, 64, 80, 100, 128, 129)


@dataclass
class _Seq:
    seq_id: int
    prompt: list[int]
    num_computed: int = 0                       # tokens whose K/V are in the cache
    generated: list[int] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)   # [q_len, vocab] per step
    first_position: int = 0                     # position of the first recorded logits row
    forced: Optional[list[int]] = None          # tokens to emit instead of the argmax

    @property
    def prefilled(self) -> bool:
        return self.num_computed >= len(self.prompt)


@dataclass
class RunResult:
    """Per sequence: greedy tokens, logits of the positions computed, first such position."""

    tokens: list[list[int]]
    logits: list[torch.Tensor]        # [num_positions, vocab] float32, consecutive positions
    first_position: list[int]         # tokens served from the prefix cache are not computed


class PagedRunner:
    """Greedy generation for a batch of prompts on a PagedKVCache, engine style.

    Args:
        model, config: from load_model.
        block_size, num_blocks: the pool.
        kv_cache_dtype: storage of the cache.
        enable_prefix_caching: share full prompt blocks across batches.
    """

    def __init__(self, model: torch.nn.Module, config: ModelConfig, block_size: int,
                 num_blocks: int, kv_cache_dtype: str = "auto",
                 enable_prefix_caching: bool = False) -> None:
        self.model = model
        self.manager = _core.KVCacheManager(num_blocks, block_size, enable_prefix_caching)
        self.kv = PagedKVCache(config, num_blocks, block_size, kv_cache_dtype, dtype=model.dtype)
        self._next_id = 0
        self.mixed_steps = 0  # steps that had both decode and prefill sequences

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 chunk_size: Optional[int] = None,
                 forced: Optional[Sequence[Sequence[int]]] = None) -> RunResult:
        """Runs every prompt to `max_new_tokens` greedy tokens, all in one batch.

        chunk_size None prefills each prompt in one step; otherwise at most chunk_size prompt
        tokens per sequence per step, so short prompts decode while long ones still prefill.
        forced: per prompt, the tokens to feed instead of the greedy ones (teacher forcing;
        the logits are still those of the model).
        """
        seqs = []
        for i, p in enumerate(prompts):
            s = _Seq(self._next_id, list(p), forced=None if forced is None else list(forced[i]))
            self._next_id += 1
            cached = self.manager.allocate(s.seq_id, np.asarray(s.prompt, dtype=np.int32))
            s.num_computed = s.first_position = cached
            seqs.append(s)
        active = list(seqs)
        while active:
            decode = [s for s in active if s.prefilled]
            prefill = [s for s in active if not s.prefilled]
            self._step(decode, prefill, chunk_size)
            active = [s for s in active if len(s.generated) < max_new_tokens]
        for s in seqs:
            self.manager.free(s.seq_id)
        return RunResult([s.generated for s in seqs], [torch.cat(s.rows) for s in seqs],
                         [s.first_position for s in seqs])

    def _step(self, decode: list[_Seq], prefill: list[_Seq], chunk_size: Optional[int]) -> None:
        batch = decode + prefill
        self.mixed_steps += bool(decode and prefill)
        new_tokens: list[list[int]] = [[s.generated[-1]] for s in decode]
        for s in prefill:
            end = len(s.prompt) if chunk_size is None else min(len(s.prompt), s.num_computed + chunk_size)
            new_tokens.append(s.prompt[s.num_computed:end])
        counts = np.array([len(t) for t in new_tokens], dtype=np.int32)
        flat = np.concatenate([np.asarray(t, dtype=np.int32) for t in new_tokens])
        ids = np.array([s.seq_id for s in batch], dtype=np.int64)
        reserved = self.manager.append_batch(ids, counts, flat)
        assert reserved is not None, "pool too small for the test batch"
        slots, cow = reserved
        if len(cow):
            self.kv.copy_blocks(torch.from_numpy(cow))
        starts = np.array([s.num_computed for s in batch], dtype=np.int64)
        positions = np.concatenate([np.arange(a, a + c) for a, c in zip(starts, counts)])
        cu = np.zeros(len(batch) + 1, dtype=np.int32)
        np.cumsum(counts, out=cu[1:])
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(slots),
            block_tables=torch.from_numpy(self.manager.block_tables(ids)),
            context_lens=torch.from_numpy((starts + counts).astype(np.int32)),
            cu_seqlens_q=torch.from_numpy(cu),
            num_decode_seqs=len(decode))
        hidden = self.model(torch.from_numpy(flat.astype(np.int64)), torch.from_numpy(positions),
                            meta, self.kv)
        logits = self.model.compute_logits(hidden)  # [num_tokens, vocab]
        for i, s in enumerate(batch):
            rows = logits[cu[i]:cu[i + 1]]
            s.rows.append(rows)
            s.num_computed += int(counts[i])
            if s.prefilled:
                greedy = s.forced[len(s.generated)] if s.forced else int(rows[-1].argmax())
                s.generated.append(greedy)


def prefill_meta(n: int, block_size: int = 16) -> AttentionMetadata:
    """One sequence prefilling n tokens into blocks 0, 1, ... (slots 0 .. n - 1)."""
    blocks = -(-n // block_size)
    return AttentionMetadata(slot_mapping=torch.arange(n, dtype=torch.int64),
                             block_tables=torch.arange(blocks, dtype=torch.int32)[None],
                             context_lens=torch.tensor([n], dtype=torch.int32),
                             cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32),
                             num_decode_seqs=0)


def load_hf(path: str | os.PathLike) -> torch.nn.Module:
    """transformers' LlamaForCausalLM from `path`, float32, eager attention, eval mode."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(path, attn_implementation="eager",
                                            dtype=torch.float32).eval()


@torch.inference_mode()
def hf_logits(hf_model: torch.nn.Module, tokens: Sequence[int]) -> torch.Tensor:
    """[len(tokens), vocab] float32 logits of one unpadded sequence (teacher forced)."""
    return hf_model(torch.tensor([list(tokens)])).logits[0].float()


def make_prompts(vocab_size: int, lengths: Sequence[int] = PARITY_PROMPT_LENGTHS,
                 seed: int = 0) -> list[list[int]]:
    """Random prompts of the given lengths (token ids in [0, vocab_size))."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lengths]


def blocks_needed(prompts: Sequence[Sequence[int]], max_new_tokens: int, block_size: int) -> int:
    """Pool blocks that keep every sequence of a batch resident to the end."""
    return sum(-(-(len(p) + max_new_tokens) // block_size) for p in prompts)


# --- tokenizers for the tokenizer tests (built with the `tokenizers` library, no download) ---

TOKENIZER_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, hello there! the weather is nice today.",
    "paged attention keeps the kv cache in blocks",
] * 20


def write_byte_level_tokenizer(path: str | os.PathLike) -> None:
    """A GPT-2/Llama-3 style byte-level BPE (bos added by its post-processor): writes
    tokenizer.json and tokenizer_config.json. Characters outside the corpus split into bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|begin|>", "<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(TOKENIZER_CORPUS, trainer)
    bos = tk.token_to_id("<|begin|>")
    tk.post_processor = processors.TemplateProcessing(single="<|begin|> $A",
                                                      special_tokens=[("<|begin|>", bos)])
    tk.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        f.write('{"bos_token": "<|begin|>", "eos_token": {"content": "<|end|>"}}')


def write_sentencepiece_style_tokenizer(path: str | os.PathLike) -> None:
    """A Llama-2 style tokenizer: "▁" word marks, byte fallback (<0xNN> tokens), no
    post-processor (bos comes from add_bos_token in tokenizer_config.json)."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789,.!?'":
        vocab[ch] = len(vocab)
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("l", "l"), ("e", "ll"), ("h", "ell"),
              ("hell", "o"), ("▁", "hello")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                              fuse_unk=True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tk.add_special_tokens(["<unk>", "<s>", "</s>"])
    tk.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        f.write('{"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": true}')


@pytest.fixture(scope="module", autouse=False)
def torch_one_thread():
    """Runs a test module with one torch thread, then restores the setting.

    The model tests use tiny matrices, where a second OpenMP thread only adds synchronisation;
    on a busy machine, spinning OpenMP workers made these modules over 10x slower.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
