"""Benchmark of the CPU paged-attention kernels against memory bandwidth and torch SDPA.

Decode: batch x context grid, 32 query / 8 KV heads, head_dim 128, block 16, K/V in randomly
permuted blocks, storage fp32 / bf16 / fp8 (e4m3; with a bf16 query, as a bf16 model and vLLM's
peer case have it, and again with a float32 one, "fp8_fp32q"). For each case, in interleaved rounds: the
machine's read bandwidth (a 1 GiB float32 sum in C++ on all kernel threads, which also evicts
the caches), the paged kernel (caches and probe on the pages the engine's KV pool gets:
4 KiB ones, or 2 MiB with PAGEDLLM_HUGE_PAGES=1, model/huge_pages.py, and then vLLM's caches
too, by torch's THP_MEM_ALLOC_ENABLE), and torch's scaled_dot_product_attention over the same data laid
out contiguously ([B, H, L, D]; fp8 has no SDPA, so its baseline is SDPA on bf16). Reported:
K/V bytes read per second, that as a fraction of the bandwidth measured in the same rounds, and
SDPA time / kernel time. The machine is shared, so each fraction is paired within a round (the
kernel's K/V bytes per second over the bandwidth probed just before it) and the median over
rounds is reported; so are the median times and per-round time ratios (the best-of-rounds
figures are kept in the JSON as best_*).
Engines: every CPU attention engine this CPU runs (avx512, avx2, generic, and the opt-in
avx512_bf16 where it runs), forced in turn within each round (a bandwidth probe before each),
on the target cases 16 x 2k and 1 x 8k, reported as the fraction of the read bandwidth probed
just before each run (median over rounds) and its distance to the target (0.8; fp8 0.6).
Peer: vLLM's CPU decode kernel (`cpu_attention_with_kv_cache`, in the venv of setup_vllm.sh,
driven as a subprocess: peers/vllm_attention.py) on the same shapes, dtypes and bytes, at
block 16 (pagedllm's) and 128 (vLLM's CPU default), timed in the same rounds; reported as
vLLM time / pagedllm time, median of the per-round ratios. pagedllm is timed at its default block
(16) and again at 128 (the same shapes on 128-token blocks: 16 KiB-64 KiB contiguous runs per
KV head instead of 4-8 KiB), its own probe before each. Left out, with the reason in the
JSON, when its venv is missing (or with --no-peer).
Prefill: causal attention of whole prompts, tokens per second against causal SDPA.

Usage: PYTHONPATH=python python benchmarks/bench_attention.py [--quick] [--rounds N] [--no-peer]
       ... --engines [--rounds N]   (only the per-engine target cases)
Writes benchmarks/results/attention.json (--engines: attention_engines.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks import isa
from pagedllm import _core, threads
from pagedllm.model import huge_pages

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
BIG_BLOCK = 128  # pagedllm is also timed at vLLM's CPU default block (longer contiguous runs)
# storage: (cache tensor dtype, kv_cache_dtype, query dtype). fp8 is timed with a bf16 query (a
# bf16 model's, and what vLLM's peer case uses: "auto" then decodes with bf16 dot products where
# the CPU has them) and again with a float32 one (an fp32 model's: the exact engine); bf16 caches
# likewise ("bf16_fp32q": an fp32 model with kv_cache_dtype="bf16"; the peer's case for it is its
# bf16 one, a bf16 query).
STORAGE = {"fp32": (torch.float32, "auto", torch.float32),
           "bf16": (torch.bfloat16, "auto", torch.bfloat16),
           "bf16_fp32q": (torch.bfloat16, "bf16", torch.float32),
           "fp8": (torch.uint8, "fp8", torch.bfloat16),
           "fp8_fp32q": (torch.uint8, "fp8", torch.float32)}
MAX_TOKENS = 65536  # batch * context cap: keeps fp32 K/V + its contiguous copy near 1 GiB
ENGINE_CASES = [(16, 2048), (1, 8192)]  # batch x context of the bandwidth targets
TARGET_FRAC = 0.8  # of the read bandwidth (fp8: 0.6)


CLOCK = time.perf_counter  # --cpu-time: time.thread_time (one thread; others' slices excluded)


def timed(fn) -> float:
    t = CLOCK()
    fn()
    return CLOCK() - t


class Bandwidth:
    """Read bandwidth probe: sum of a 1 GiB float32 buffer with the kernel thread pool."""

    def __init__(self, gib: float = 1.0):
        # On the pages the engine's KV pool gets (huge_pages.py): 2 MiB ones read faster.
        self.buf = huge_pages.zeros((int(gib * (1 << 30)) // 4,), torch.float32)
        self.buf.fill_(1.0)
        _core.stream_read_sum(self.buf)
        self.lowest, self.highest = math.inf, 0.0  # bytes/s of the probes so far

    def measure(self) -> float:
        rate = self.buf.numel() * 4 / timed(lambda: _core.stream_read_sum(self.buf))
        self.lowest, self.highest = min(self.lowest, rate), max(self.highest, rate)
        return rate

    def against_highest(self, rows: list) -> str:
        """Adds frac_of_run_max_bw (the row's kernel rate over the highest probe of the run) to
        each row; returns a line saying so. On a shared host the probe steps between levels
        (a 2-core Zen 4 VM: 30-38 and 42-66 GB/s) while the kernels' rates stay put, so the
        per-round fractions follow the probe; this one does not."""
        for r in rows:
            r["frac_of_run_max_bw"] = r["kv_gbps"] * 1e9 / self.highest
        cases = ", ".join(f"{r['storage']} {r['batch']}x{r['context']}"
                          f"{' ' + r['engine'] if 'engine' in r else ''} "
                          f"{r['frac_of_run_max_bw']:.2f}" for r in rows)
        return (f"probes of this run: {self.lowest / 1e9:.1f}-{self.highest / 1e9:.1f} GB/s; "
                f"each kernel rate over the highest: {cases}")


VLLM_BLOCKS = (16, 128)  # pagedllm's block size, and vLLM's CPU default


class VllmKernel:
    """vLLM's CPU decode-attention kernel in its venv (peers/vllm_attention.py).

    Args:
        threads: the threads it runs with (the same as pagedllm's kernels).
    Raises:
        PeerUnavailable: no vLLM venv, or the worker did not start.
    """

    def __init__(self, threads: int):
        from benchmarks.peers.vllm_client import vllm_python
        from benchmarks.peers.worker_client import WorkerPeer

        script = Path(__file__).resolve().parent / "peers" / "vllm_attention.py"
        self.threads = threads
        self.peer = WorkerPeer("vllm-attention", [vllm_python(build=False), str(script)],
                               {"VLLM_TARGET_DEVICE": "cpu", "OMP_NUM_THREADS": str(threads),
                                # its caches on huge pages too, like pagedllm's (torch's switch)
                                "THP_MEM_ALLOC_ENABLE": "1" if huge_pages.enabled() else "0"})
        self.version = self.peer.version
        self.kernel_libraries = self.peer.info.get("kernel_libraries")

    def case(self, key: str, batch: int, ctx: int, storage: str, block: int) -> dict:
        """Builds one case in the worker; returns its ISA and K/V bytes."""
        return self.peer.call({"op": "case", "key": key, "batch": batch, "context": ctx,
                               "storage": storage, "block_size": block, "heads": HEADS,
                               "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                               "threads": self.threads})

    def time(self, key: str) -> float:
        """Seconds of one kernel call of case `key`, timed in the worker."""
        return self.peer.call({"op": "time", "key": key})["s"]

    def drop(self) -> None:
        self.peer.call({"op": "drop"})

    def close(self) -> None:
        self.peer.close()


def on_pool_pages(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` on the memory the engine's KV pool gets (huge_pages.zeros)."""
    out = huge_pages.zeros(t.shape, t.dtype)
    out.copy_(t)
    return out


def make_decode_case(batch: int, ctx: int, storage: str, gen: torch.Generator,
                     block: int = BLOCK, sdpa: bool = True):
    """Paged caches of `block`-token blocks (permuted), tables, query, and (when `sdpa`) the
    contiguous copy SDPA reads."""
    dtype, kv_cache_dtype, act = STORAGE[storage]
    blocks = batch * ctx // block
    if dtype == torch.uint8:  # fp8 bytes of N(0, 1) values (k_scale = v_scale = 1)
        kc = torch.randn((blocks, KV_HEADS, block, HEAD_DIM), generator=gen)
        kc = kc.to(torch.float8_e4m3fn).view(torch.uint8)
        vc = torch.randn((blocks, KV_HEADS, block, HEAD_DIM), generator=gen)
        vc = vc.to(torch.float8_e4m3fn).view(torch.uint8)
    else:
        kc = torch.randn((blocks, KV_HEADS, block, HEAD_DIM), generator=gen).to(dtype)
        vc = torch.randn((blocks, KV_HEADS, block, HEAD_DIM), generator=gen).to(dtype)
    kc, vc = on_pool_pages(kc), on_pool_pages(vc)
    tables = torch.randperm(blocks, generator=gen).to(torch.int32).reshape(batch, ctx // block)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    q = torch.randn((batch, HEADS, HEAD_DIM), generator=gen).to(act)

    def contiguous(cache):  # [B, KVH, L, D] in SDPA's dtype (fp8 -> bf16)
        c = cache[tables.long()]  # [B, L/bs, KVH, bs, D]
        if dtype == torch.uint8:
            c = c.view(torch.float8_e4m3fn).to(torch.bfloat16)
        return c.permute(0, 2, 1, 3, 4).reshape(batch, KV_HEADS, ctx, HEAD_DIM).contiguous()

    case = dict(kc=kc, vc=vc, tables=tables, lens=lens, q=q, out=torch.empty_like(q),
                kv_cache_dtype=kv_cache_dtype,
                kv_bytes=2 * batch * ctx * KV_HEADS * HEAD_DIM * kc.element_size())
    if sdpa:
        case["k_sdpa"], case["v_sdpa"] = contiguous(kc), contiguous(vc)
        case["q_sdpa"] = q.to(case["k_sdpa"].dtype).reshape(batch, HEADS, 1, HEAD_DIM)
    return case


def decode_kernel(storage: str) -> str:
    """The engine "auto" decodes this storage case on: the one in use, except a bf16 query on a
    bf16 or fp8 cache, which takes avx512_bf16 where this CPU runs it (attention.cpp,
    decode_engine)."""
    auto = os.environ.get("PAGEDLLM_CPU_ENGINE", "auto") in ("", "auto")
    bf16_query_rounded_cache = (STORAGE[storage][0] in (torch.uint8, torch.bfloat16)
                                and STORAGE[storage][2] == torch.bfloat16)
    if auto and bf16_query_rounded_cache and "avx512_bf16" in _core.cpu_engines():
        return "avx512_bf16"
    return _core.cpu_kernel()


def peer_storage(storage: str) -> str:
    """The peer's name for a storage case: its fp8 / bf16 case (always a bf16 query) for both of
    ours."""
    return "fp8" if storage.startswith("fp8") else storage.removesuffix("_fp32q")


def paired_frac(kv_bytes: int, times: list, probes: list) -> float:
    """Median over rounds of (K/V bytes / kernel time) / (the read bandwidth probed just before
    that kernel run): each round's fraction uses its own probe, so the machine's bandwidth
    drifting between rounds (other tenants) cancels instead of pairing one round's best probe
    with another's best time."""
    return statistics.median(kv_bytes / t / b for t, b in zip(times, probes))


def bench_decode(batch, ctx, storage, bw: Bandwidth, rounds, gen, peer=None) -> dict:
    c = make_decode_case(batch, ctx, storage, gen)
    big = make_decode_case(batch, ctx, storage, gen, BIG_BLOCK, sdpa=False)
    vllm, vllm_errors = {}, {}
    if peer is not None:
        for block in VLLM_BLOCKS:
            try:  # e.g. vLLM has no fp8 path at block 16 ("Unsupported CPU attention ...")
                vllm[block] = dict(peer.case(f"b{block}", batch, ctx, peer_storage(storage),
                                             block), s=[])
            except RuntimeError as e:
                vllm_errors[str(block)] = str(e).split(" (log:")[0]
    scale = 1.0 / math.sqrt(HEAD_DIM)

    def kernel(case=c):
        _core.paged_attention_decode(case["out"], case["q"], case["kc"], case["vc"],
                                     case["tables"], case["lens"], scale, case["kv_cache_dtype"])

    def sdpa():
        F.scaled_dot_product_attention(c["q_sdpa"], c["k_sdpa"], c["v_sdpa"], scale=scale,
                                       enable_gqa=True)

    def kernel_big():
        kernel(big)

    kernel(), kernel_big(), sdpa()  # warm up
    bws, ts, ts_sdpa, bws_big, ts_big = [], [], [], [], []
    for _ in range(rounds):
        bws.append(bw.measure())  # also evicts the caches before the kernel
        ts.append(timed(kernel))
        bws_big.append(bw.measure())
        ts_big.append(timed(kernel_big))
        bw.measure()
        ts_sdpa.append(timed(sdpa))
        for block, v in vllm.items():
            v.setdefault("bw", []).append(bw.measure())
            v["s"].append(peer.time(f"b{block}"))
    if peer is not None:
        peer.drop()
    t, t_sdpa, bandwidth = min(ts), min(ts_sdpa), max(bws)
    kv = c["kv_bytes"]
    peer_out = {"vllm_errors": vllm_errors} if vllm_errors else {}
    if vllm:
        best = min(vllm, key=lambda b: statistics.median(vllm[b]["s"]))
        v = vllm[best]
        peer_out.update(
            vllm_ms={str(b): min(x["s"]) * 1e3 for b, x in vllm.items()},
            vllm_median_ms={str(b): statistics.median(x["s"]) * 1e3 for b, x in vllm.items()},
            vllm_isa={str(b): x["isa"] for b, x in vllm.items()}, vllm_best_block=best,
            vllm_frac_of_bw=paired_frac(v["kv_bytes"], v["s"], v["bw"]),
            best_vllm_frac_of_bw=v["kv_bytes"] / min(v["s"]) / bandwidth,
            speedup_vs_vllm=statistics.median(tv / tp for tv, tp in zip(v["s"], ts)),
            best_speedup_vs_vllm=min(v["s"]) / t,
            speedup_vs_vllm_big_block=statistics.median(tv / tp for tv, tp in zip(v["s"],
                                                                                   ts_big)))
    return dict(**peer_out, batch=batch, context=ctx, storage=storage,
                query_dtype=str(STORAGE[storage][2]), kernel=decode_kernel(storage),
                kernel_ms=statistics.median(ts) * 1e3, sdpa_ms=statistics.median(ts_sdpa) * 1e3,
                sdpa_dtype=str(c["k_sdpa"].dtype), kv_bytes=kv,
                kv_gbps=kv / statistics.median(ts) / 1e9,
                read_bw_gbps=statistics.median(bws) / 1e9, frac_of_bw=paired_frac(kv, ts, bws),
                speedup_vs_sdpa=statistics.median(a / b for a, b in zip(ts_sdpa, ts)),
                best_kernel_ms=t * 1e3, best_sdpa_ms=t_sdpa * 1e3,
                best_read_bw_gbps=bandwidth / 1e9, best_frac_of_bw=kv / t / bandwidth,
                big_block=BIG_BLOCK, kernel_ms_big_block=statistics.median(ts_big) * 1e3,
                frac_of_bw_big_block=paired_frac(kv, ts_big, bws_big))


def bench_engines(batch, ctx, storage, engines, bw: Bandwidth, rounds, gen) -> list:
    """One decode case with each engine forced in turn, interleaved within each round (each
    timing preceded by a bandwidth probe, which also evicts the caches)."""
    c = make_decode_case(batch, ctx, storage, gen)
    scale = 1.0 / math.sqrt(HEAD_DIM)

    def kernel():
        _core.paged_attention_decode(c["out"], c["q"], c["kc"], c["vc"], c["tables"], c["lens"],
                                     scale, c["kv_cache_dtype"])

    ts = {e: [] for e in engines}
    bws = {e: [] for e in engines}
    try:
        for e in engines:  # warm up
            _core.set_cpu_engine(e)
            kernel()
        for _ in range(rounds):
            for e in engines:
                _core.set_cpu_engine(e)
                bws[e].append(bw.measure())
                ts[e].append(timed(kernel))
    finally:
        _core.set_cpu_engine("auto")
    target = 0.6 if storage.startswith("fp8") else TARGET_FRAC
    out = []
    bandwidth = max(max(b) for b in bws.values())  # the case's best probe, all engines' rounds
    kv = c["kv_bytes"]
    for e in engines:
        t = statistics.median(ts[e])
        frac = paired_frac(kv, ts[e], bws[e])
        out.append(dict(engine=e, batch=batch, context=ctx, storage=storage, kernel_ms=t * 1e3,
                        kv_bytes=kv, kv_gbps=kv / t / 1e9,
                        read_bw_gbps=statistics.median(bws[e]) / 1e9, frac_of_bw=frac,
                        target_frac=target, frac_short_of_target=max(0.0, target - frac),
                        best_kernel_ms=min(ts[e]) * 1e3, best_read_bw_gbps=bandwidth / 1e9,
                        best_frac_of_bw=kv / min(ts[e]) / bandwidth,
                        median_frac_of_bw=frac))
    return out


def run_engines(bw: Bandwidth, rounds: int, gen) -> list:
    """Every engine this CPU runs, on the target cases, every storage type; prints a table."""
    engines = _core.cpu_engines()
    print(f"engines {engines}: fraction of the read bandwidth (target 0.8, fp8 0.6), median of "
          f"{rounds} rounds, each paired with its own bandwidth probe")
    print(f"{'storage':>9} {'case':>9} " + " ".join(f"{e:>14}" for e in engines))
    rows = []
    for storage in STORAGE:
        for batch, ctx in ENGINE_CASES:
            res = bench_engines(batch, ctx, storage, engines, bw, rounds, gen)
            rows += res
            print(f"{storage:>9} {batch:>3}x{ctx:<5} " + " ".join(
                f"{r['frac_of_bw']:5.2f} ({r['kernel_ms']:5.1f}ms)" for r in res), flush=True)
    return rows


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, as lscpu prints it), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bench_prefill(batch, prompt, dtype, rounds, gen) -> dict:
    """Whole prompts of `prompt` tokens: paged causal prefill vs causal SDPA."""
    blocks = batch * prompt // BLOCK
    kc = on_pool_pages(torch.randn((blocks, KV_HEADS, BLOCK, HEAD_DIM), generator=gen).to(dtype))
    vc = on_pool_pages(torch.randn((blocks, KV_HEADS, BLOCK, HEAD_DIM), generator=gen).to(dtype))
    tables = torch.randperm(blocks, generator=gen).to(torch.int32).reshape(batch, -1)
    lens = torch.full((batch,), prompt, dtype=torch.int32)
    cu = torch.arange(0, batch + 1, dtype=torch.int32) * prompt
    q = torch.randn((batch * prompt, HEADS, HEAD_DIM), generator=gen).to(dtype)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(HEAD_DIM)

    def contiguous(cache):
        c = cache[tables.long()].permute(0, 2, 1, 3, 4)
        return c.reshape(batch, KV_HEADS, prompt, HEAD_DIM).contiguous()

    k_s, v_s = contiguous(kc), contiguous(vc)
    q_s = q.reshape(batch, prompt, HEADS, HEAD_DIM).transpose(1, 2).contiguous()

    def kernel():
        _core.paged_attention_prefill(out, q, kc, vc, tables, cu, lens, scale)

    def sdpa():
        F.scaled_dot_product_attention(q_s, k_s, v_s, is_causal=True, scale=scale,
                                       enable_gqa=True)

    kernel(), sdpa()
    ts, ts_sdpa = [], []
    for _ in range(rounds):  # interleaved, so both see the same disturbances
        ts.append(timed(kernel))
        ts_sdpa.append(timed(sdpa))
    t, t_sdpa = min(ts), min(ts_sdpa)
    tokens = batch * prompt
    return dict(batch=batch, prompt=prompt, dtype=str(dtype), kernel_ms=t * 1e3,
                sdpa_ms=t_sdpa * 1e3, tokens_per_s=tokens / t, sdpa_tokens_per_s=tokens / t_sdpa,
                speedup_vs_sdpa=t_sdpa / t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few cases only (smoke run)")
    ap.add_argument("--headline", action="store_true",
                    help="only batch 16 x 2k and 8 x 8k, many rounds (the targets' cases)")
    ap.add_argument("--engines", action="store_true",
                    help="only every engine on the target cases 16 x 2k and 1 x 8k")
    ap.add_argument("--cpu-time", action="store_true",
                    help="one thread for the kernels and torch, timed in thread CPU time (on a "
                         "shared machine this excludes other jobs' time slices)")
    ap.add_argument("--no-peer", action="store_true",
                    help="leave vLLM's kernel out even when its venv exists")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "attention.json"))
    ap.add_argument("--isa", default="native", choices=isa.ISAS,
                    help="avx2: pagedllm's, torch's and vLLM's kernels held to AVX2 (an "
                         "AVX2-only CPU emulated, benchmarks/isa.py)")
    args = ap.parse_args()
    isa.emulate(args.isa)
    args.isa_check = isa.check(args.isa)
    threads.share_torch_threads()  # the kernels on torch's OpenMP team, as in the engine
    if args.cpu_time:
        global CLOCK
        CLOCK = time.thread_time
        _core.set_num_threads(1)  # a 1-thread pool runs on the calling thread
    torch.set_num_threads(_core.get_num_threads())  # SDPA gets the same cores as the kernels
    gen = torch.Generator().manual_seed(0)
    bw = Bandwidth()
    batches = [1, 8, 16] if args.quick else [1, 4, 8, 16, 32, 64]
    contexts = [512, 2048] if args.quick else [512, 2048, 8192]
    cases = [(b, c) for b in batches for c in contexts if b * c <= MAX_TOKENS]
    if args.headline:
        cases = [(16, 2048), (8, 8192)]
    print(f"cpu={cpu_model()!r} threads={_core.get_num_threads()} kernel={_core.cpu_kernel()} "
          f"runtime={_core.parallel_runtime()}")
    if args.engines:
        out = args.out
        if out == str(Path(__file__).parent / "results" / "attention.json"):
            out = str(Path(__file__).parent / "results" / "attention_engines.json")
        args.out = out
        engines = run_engines(bw, args.rounds, gen)
        print(bw.against_highest(engines))
        args.run_bw = (bw.lowest / 1e9, bw.highest / 1e9)
        write_results(args, [], [], [], engines)
        return
    decode = []
    peer, args.peer = start_peer(args.no_peer)
    print(f"{'storage':>9} {'batch':>5} {'ctx':>5} {'ms':>8} {'KV GB/s':>8} {'bw GB/s':>8} "
          f"{'%bw':>5} {'sdpa ms':>8} {'vs sdpa':>7} {'vllm %bw':>8} {'vs vllm':>7}"
          f" | block {BIG_BLOCK}: {'%bw':>4} {'vs vllm':>7}")
    try:
        for storage in STORAGE:
            for batch, ctx in cases:
                r = bench_decode(batch, ctx, storage, bw, args.rounds, gen, peer)
                decode.append(r)
                vl = (f"{100 * r['vllm_frac_of_bw']:7.0f}% {r['speedup_vs_vllm']:6.2f}x"
                      if "speedup_vs_vllm" in r else f"{'-':>8} {'-':>7}")
                vb = (f"{r['speedup_vs_vllm_big_block']:6.2f}x"
                      if "speedup_vs_vllm_big_block" in r else f"{'-':>7}")
                print(f"{storage:>9} {batch:>5} {ctx:>5} {r['kernel_ms']:8.2f} "
                      f"{r['kv_gbps']:8.2f} {r['read_bw_gbps']:8.2f} "
                      f"{100 * r['frac_of_bw']:4.0f}% {r['sdpa_ms']:8.2f} "
                      f"{r['speedup_vs_sdpa']:6.2f}x {vl} | {'':>10}"
                      f"{100 * r['frac_of_bw_big_block']:4.0f}% {vb}", flush=True)
    finally:
        if peer is not None:
            peer.close()
    print(bw.against_highest(decode))
    args.run_bw = (bw.lowest / 1e9, bw.highest / 1e9)
    if args.headline:
        write_results(args, decode, [], [])
        return
    # Every engine on the target cases, for comparison.
    engines = run_engines(bw, args.rounds, gen)
    prefill = []
    for dtype in [torch.float32, torch.bfloat16]:
        for batch, prompt in ([(1, 512)] if args.quick else [(1, 512), (1, 2048), (4, 512)]):
            r = bench_prefill(batch, prompt, dtype, max(3, args.rounds // 2), gen)
            prefill.append(r)
            print(f"prefill {r['dtype']:>14} {batch}x{prompt}: {r['tokens_per_s']:9.0f} tok/s, "
                  f"sdpa {r['sdpa_tokens_per_s']:9.0f} tok/s ({r['speedup_vs_sdpa']:.2f}x)",
                  flush=True)
    write_results(args, decode, [], prefill, engines)


def start_peer(disabled: bool):
    """vLLM's kernel as a peer, or None; and what the JSON records about it."""
    if disabled:
        return None, {"vllm": "left out (--no-peer)"}
    from benchmarks.peers.worker_client import PeerUnavailable

    try:
        peer = VllmKernel(_core.get_num_threads())
    except PeerUnavailable as e:
        print(f"vLLM kernel peer left out: {e}")
        return None, {"vllm": f"left out: {e}"}
    return peer, {"vllm": peer.version, "vllm_blocks": list(VLLM_BLOCKS),
                  "vllm_kernel_libraries": peer.kernel_libraries}


def write_results(args, decode, generic, prefill, engines=()) -> None:
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=platform.processor() or
                platform.machine(), cpu_model=cpu_model(), cpu_engines=_core.cpu_engines(),
                default_engine=_core.cpu_kernel(), cpus=os.cpu_count(),
                thread_runtime=_core.parallel_runtime(),
                threads=_core.get_num_threads(),
                clock="thread_time" if args.cpu_time else "perf_counter",
                torch=torch.__version__, rounds=args.rounds, peer=getattr(args, "peer", None),
                read_bw_range_gbps=getattr(args, "run_bw", None),
                isa=args.isa, isa_check=args.isa_check,
                load_avg=os.getloadavg() if hasattr(os, "getloadavg") else None)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(meta=meta, decode=decode, decode_generic=generic,
                                              decode_engines=list(engines), prefill=prefill),
                                         indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
