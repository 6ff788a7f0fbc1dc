"""The timing loop bench_multimodal.py and bench_multimodal_mllama.py share: warm-up, the
time to first token of each request alone, and the throughput of all requests together."""

from __future__ import annotations

import time


def time_requests(llm, prompts: list, params) -> dict:
    """Times an LLM on image prompts (the first one also warms the caches up).

    Args:
        llm: a pagedllm.LLM.
        prompts: at least two prompt dicts (prompt_token_ids, multi_modal_data).
        params: the SamplingParams of the throughput run.

    Returns:
        {"ttft_median_ms": median over prompts[1:], each run alone with max_tokens=1,
         "requests_per_s": len(prompts) / the seconds llm.generate(prompts, params) took}.
    """
    from pagedllm import SamplingParams

    llm.generate(prompts[:1], params, use_tqdm=False)  # warm-up (and fills the caches)
    eng = llm.engine
    ttft = []
    for p in prompts[1:]:
        t0 = time.perf_counter()
        eng.add_request(None, p, SamplingParams(temperature=0, max_tokens=1))
        while eng.has_unfinished_requests():
            eng.step()
        ttft.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return {"ttft_median_ms": round(1000 * sorted(ttft)[len(ttft) // 2], 2),
            "requests_per_s": round(len(prompts) / dt, 2)}
