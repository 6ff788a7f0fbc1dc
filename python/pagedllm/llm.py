"""LLM: the offline, vLLM-style entry point.

    from pagedllm import LLM, SamplingParams
    llm = LLM()                                   # the bundled default model
    outs = llm.generate(["The list type"], SamplingParams(max_tokens=32))
    print(outs[0].outputs[0].text)
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Sequence as Seq, Union

from pagedllm.config import EngineConfig
from pagedllm.engine.llm_engine import LLMEngine, PromptType, without_request_id
from pagedllm.outputs import BeamSearchOutput, RequestOutput
from pagedllm.sampling_params import BeamSearchParams, SamplingParams
from pagedllm.text_checks import check_text


def _as_list(prompts) -> list:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(p, int) for p in prompts):
        raise ValueError("a prompt given as token ids must be wrapped: "
                         "{'prompt_token_ids': [...]} (a bare list is read as several prompts)")
    return prompts


def _check_prompt_text(prompt, index: int) -> None:
    """ValueError naming prompts[index] when its text is not valid Unicode (a lone surrogate,
    which the tokenizer would fail on with a TypeError)."""
    text = prompt.get("prompt") if isinstance(prompt, dict) else prompt
    if isinstance(text, str):
        where = f"prompts[{index}]" + ('["prompt"]' if isinstance(prompt, dict) else "")
        check_text(text, where)


class LLM:
    """A model plus a paged KV cache, generating for batches of prompts.

    Args:
        model: checkpoint directory (Hugging Face Llama layout); None = the bundled model.
        block_size: tokens per KV block, or "auto" (see EngineConfig.block_size; pass
            expected_mean_seq_len= to size it for your workload).
        kv_cache_dtype: "auto", "fp16", "bf16", "fp8" / "fp8_e4m3", "fp8_e5m2".
        kv_cache_memory_bytes: KV pool budget in bytes (default: 2 GiB, or less when
            max_num_seqs sequences of max_model_len tokens need less).
        num_kv_blocks: exact pool size in blocks (overrides the byte budget).
        max_num_seqs: most sequences per step.
        max_num_batched_tokens: most tokens per step (default max(2048, max_num_seqs)).
        max_model_len: longest prompt + output (default: the model's limit, capped by the pool).
        enable_prefix_caching: reuse cached prefix blocks across requests.
        seed: seed of the engine's sampler.
        **kwargs: further EngineConfig fields (num_threads, watermark, k_scale, v_scale,
            tensor_parallel_size, distributed_executor_backend, ...), and the profiling
            options profile_trace (a Chrome/Perfetto trace JSON of every step until
            stop_trace() or close()), profile_layers, profile_torch_steps and
            profile_cuda_steps ("START:END"; see LLMEngine.start_trace).
    """

    def __init__(self, model: Optional[str] = None, block_size: Union[int, str] = 16,
                 kv_cache_dtype: str = "auto", kv_cache_memory_bytes: Optional[int] = None,
                 num_kv_blocks: Optional[int] = None, max_num_seqs: int = 256,
                 max_num_batched_tokens: Optional[int] = None, max_model_len: Optional[int] = None,
                 enable_prefix_caching: bool = True, seed: int = 0, **kwargs):
        profiling = {key: kwargs.pop("profile_" + key, None)
                     for key in ("trace", "layers", "torch_steps", "cuda_steps")}
        config = kwargs.pop("config", None) or EngineConfig(
            model=model, block_size=block_size, kv_cache_dtype=kv_cache_dtype,
            kv_cache_memory_bytes=kv_cache_memory_bytes, num_kv_blocks=num_kv_blocks,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching, seed=seed,
            **kwargs)
        self.engine = LLMEngine(config)
        self.engine.stream_outputs = False  # generate() only needs finished requests
        self._request_counter = itertools.count()
        self._chat_template = None  # the checkpoint's, loaded by the first chat()
        if any(v is not None for v in profiling.values()):
            try:
                self.start_trace(profiling["trace"], layers=bool(profiling["layers"]),
                                 torch_steps=profiling["torch_steps"],
                                 cuda_steps=profiling["cuda_steps"])
            except BaseException:
                self.engine.shutdown()
                raise

    @classmethod
    def from_config(cls, config: EngineConfig) -> "LLM":
        """An LLM built from a ready EngineConfig (e.g. EngineConfig.from_yaml)."""
        return cls(config=config)

    def get_tokenizer(self):
        """The model's pagedllm.tokenizer.Tokenizer (None if the checkpoint has none)."""
        return self.engine.tokenizer

    def generate(self, prompts: Union[PromptType, Seq[PromptType]],
                 sampling_params: Union[SamplingParams, Seq[SamplingParams], None] = None,
                 use_tqdm: bool = True) -> List[RequestOutput]:
        """Generates completions for every prompt, batching them continuously.

        Args:
            prompts: a prompt or a list; each is text, {"prompt": text} or
                {"prompt_token_ids": [...]}; a dict may add {"multi_modal_data": {"image":
                PIL image or PNG/JPEG bytes, or a list}} for a LLaVA or Mllama model (one
                image placeholder token per image: `<image>`, `<|image|>`).
            sampling_params: one SamplingParams for all, or one per prompt (default: the
                checkpoint's generation_config.json sampling settings, as vLLM does; its
                max_new_tokens is lowered to what fits in max_model_len after each prompt).
            use_tqdm: show a progress bar.
        Returns:
            One finished RequestOutput per prompt, in input order.
        Raises:
            ValueError: a prompt or parameter is invalid (nothing runs; the message names the
                prompt's index).
        """
        plist = _as_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or self.engine.default_sampling_params()] * len(plist)
        elif isinstance(sampling_params, (list, tuple)):
            params = list(sampling_params)
            if len(params) != len(plist):
                raise ValueError(f"got {len(params)} SamplingParams for {len(plist)} prompts")
            for i, p in enumerate(params):
                if not isinstance(p, SamplingParams):
                    raise ValueError(f"sampling_params[{i}] must be a SamplingParams, got "
                                     f"{type(p).__name__} (SamplingParams(**d) builds one from "
                                     "a dict)")
        else:
            raise ValueError("sampling_params must be a SamplingParams or a list of them, got "
                             f"{type(sampling_params).__name__} (SamplingParams(**d) builds "
                             "one from a dict)")
        default = sampling_params is None  # the checkpoint's max_new_tokens: fitted per prompt
        ids = self._add_all(plist, lambda rid, p, i: self.engine.add_request(
            rid, p, params[i], default_max_tokens=default))
        done = {}
        bar = self._bar(len(ids), use_tqdm, "Generating")
        try:
            while len(done) < len(ids):
                for out in self.engine.step():
                    if out.finished and out.request_id in ids:
                        done[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
                            toks = self.engine.num_generation_tokens
                            bar.set_postfix(gen_tokens=toks, refresh=False)
        except BaseException:
            self.engine.abort_request(list(ids))
            raise
        finally:
            if bar is not None:
                bar.close()
        return [done[rid] for rid in ids]

    def chat(self, messages: Any,
             sampling_params: Union[SamplingParams, Seq[SamplingParams], None] = None,
             use_tqdm: bool = True, chat_template: Optional[str] = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             chat_template_kwargs: Optional[Dict[str, Any]] = None) -> List[RequestOutput]:
        """Generates the next message of each conversation (vLLM's LLM.chat): each is rendered
        with the chat template (the checkpoint's tokenizer_config.json one, as the server
        uses), tokenized (bos added unless the template wrote it), then generated as
        generate() does.

        Args:
            messages: a conversation, [{"role": ..., "content": ...}, ...] (content: text, or
                a list of {"type": "text", "text": ...} parts), or a list of conversations.
            sampling_params: as for generate().
            use_tqdm: show a progress bar.
            chat_template: a Jinja2 template that replaces the checkpoint's.
            add_generation_prompt: end with the header of the assistant's turn.
            continue_final_message: leave the last message open for the model to continue
                (then add_generation_prompt must be False).
            chat_template_kwargs: more template variables (e.g. ``enable_thinking``).
        Returns:
            One finished RequestOutput per conversation, in order; its ``prompt`` is the
            rendered text.
        Raises:
            ValueError: a malformed message or template, no tokenizer, or as generate().
        """
        from pagedllm.chat import chat_prompts, conversations
        from pagedllm.chat_template import ChatTemplate

        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError(f"the model at {self.engine.model_path} has no tokenizer.json, so "
                             "chat() cannot render text: use generate() with token ids")
        if self._chat_template is None:
            self._chat_template = ChatTemplate.for_model(self.engine.model_path)
        template = self._chat_template
        if chat_template is not None:  # the checkpoint's bos / eos texts still apply
            template = ChatTemplate(chat_template, template.bos_token, template.eos_token,
                                    "LLM.chat(chat_template=...)")
        prompts = chat_prompts(conversations(messages), template, tokenizer,
                               add_generation_prompt, continue_final_message,
                               chat_template_kwargs)
        return self.generate(prompts, sampling_params, use_tqdm)

    def beam_search(self, prompts: Union[PromptType, Seq[PromptType]], params: BeamSearchParams,
                    use_tqdm: bool = False) -> List[BeamSearchOutput]:
        """Beam search for every prompt; the beams share KV blocks through forks.

        Args:
            prompts: as for generate().
            params: beam width, max_tokens, length penalty, ...
            use_tqdm: show a progress bar.
        Returns:
            One BeamSearchOutput per prompt (best beam first), in input order.
        """
        plist = _as_list(prompts)
        ids = self._add_all(plist, lambda rid, p, i: self.engine.add_beam_request(rid, p, params))
        results = {}
        bar = self._bar(len(ids), use_tqdm, "Beam search")
        try:
            while len(results) < len(ids):
                self.engine.step()
                for rid in ids:
                    if rid not in results:
                        res = self.engine.beam_search_result(rid)
                        if res is not None:
                            results[rid] = res
                            if bar is not None:
                                bar.update(1)
        except BaseException:
            self.engine.abort_request([r for r in ids if r not in results])
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[rid] for rid in ids]

    def kv_cache_stats(self) -> dict:
        """KV pool figures: num_blocks, block_size, used_blocks, cached_blocks, free_blocks,
        peak_used_blocks, tokens_stored, slots_reserved, utilization, prefix_cache_queries,
        prefix_cache_hits (tokens), num_preemptions, evictions, cow_copies, shared_blocks,
        slots_empty, internal_fragmentation, prefix_cache_hit_rate, preemptions_last_step,
        preemptions_per_step, block_size_reason, num_numeric_errors, and more."""
        return self.engine.kv_cache_stats()

    def start_trace(self, path: Optional[str] = None, **options) -> None:
        """Records the following steps (generate calls on this thread) in a Chrome/Perfetto
        trace JSON at `path` until stop_trace(); options: layers, torch_steps, cuda_steps (see
        LLMEngine.start_trace)."""
        self.engine.start_trace(path, **options)

    def stop_trace(self) -> List[str]:
        """Ends the trace (started by start_trace() or profile_trace=) and returns the files
        written (none: no trace was being recorded)."""
        return self.engine.stop_trace()

    def close(self) -> None:
        """Writes a running trace and releases the engine's workers and persistent tier."""
        self.engine.shutdown()

    def _add_all(self, prompts: list, add) -> List[str]:
        for i, p in enumerate(prompts):  # before any is added: nothing runs on a bad one
            _check_prompt_text(p, i)
        ids: List[str] = []
        try:
            for i, p in enumerate(prompts):
                rid = f"llm-{next(self._request_counter)}"
                try:
                    ids.append(add(rid, p, i))
                except ValueError as e:
                    raise ValueError(f"prompt {i}: {without_request_id(str(e))}") from None
        except BaseException:
            self.engine.abort_request(ids)
            raise
        return ids

    @staticmethod
    def _bar(total: int, enabled: bool, desc: str):
        if not enabled:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit="req", dynamic_ncols=True)
