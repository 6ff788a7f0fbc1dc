"""Block-sparse decode attention: time against dense, per strategy and density, at long context.

Kernel: one decode step of one layer (batch B, 32 query / 8 KV heads, head_dim 128, block 16,
bf16 K/V in randomly permuted blocks) at 8k, 16k and 32k tokens: the dense kernel, then the
sparse kernel on the block lists each strategy picks at 1/8 density (fixed_pattern = streaming:
sink 1 + a window; dilated: stride 8 + local 4; random: density 1/8 + sink + local; quest:
token_budget ctx/8, its top-k selection timed apart and added), and the random strategy over a
density sweep (1 .. 1/32). Dense and sparse calls alternate within each round; the figure is
the median over rounds (the machine is shared). "all blocks" runs the sparse kernel on every
block (its overhead over dense).
Step: a whole model decode step (a random 4-layer model of the same attention shape; K/V
written straight into the pool, no prefill) dense vs each strategy: the end-to-end decode
tokens/s of a batch at that context (model forward + selection; the scheduler's per-step
bookkeeping, the same for both, is left out).

Usage: PYTHONPATH=python python benchmarks/bench_sparse.py [--quick] [--rounds N] [--batch B]
Writes benchmarks/results/sparse.json.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch

from benchmarks.common import write_results
from pagedllm import _core, ops
from pagedllm.sparse import SparseAttentionConfig
from pagedllm.sparse.plan import plan_step
from pagedllm.sparse.quest_select import quest_lists

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16


def strategies(ctx: int) -> dict:
    """The 1/8-density configs at context ctx (tokens)."""
    n = ctx // BLOCK
    eighth = max(1, n // 8)
    return {
        "fixed_pattern": SparseAttentionConfig("fixed_pattern", sink_blocks=1,
                                               local_blocks=eighth - 1),
        "dilated": SparseAttentionConfig("dilated", stride=8, local_blocks=4),
        "random": SparseAttentionConfig("random", density=1 / 8, local_blocks=4),
        "quest": SparseAttentionConfig("quest", token_budget=ctx // 8, local_blocks=4),
    }


class Case:
    """Paged bf16 caches of `batch` sequences of `ctx` tokens, a query, and key bounds."""

    def __init__(self, batch: int, ctx: int, gen: torch.Generator):
        blocks = batch * ctx // BLOCK
        shape = (blocks, KV_HEADS, BLOCK, HEAD_DIM)
        self.kc = torch.randn(shape, generator=gen).to(torch.bfloat16)
        self.vc = torch.randn(shape, generator=gen).to(torch.bfloat16)
        self.tables = torch.randperm(blocks, generator=gen).to(torch.int32).reshape(batch, -1)
        self.lens = torch.full((batch,), ctx, dtype=torch.int32)
        self.q = torch.randn((batch, HEADS, HEAD_DIM), generator=gen).to(torch.bfloat16)
        self.out = torch.empty_like(self.q)
        self.kmin = self.kc.amin(dim=2)  # [blocks, kv heads, head_dim]
        self.kmax = self.kc.amax(dim=2)
        self.scale = HEAD_DIM ** -0.5

    def dense(self) -> None:
        ops.paged_attention_decode(self.out, self.q, self.kc, self.vc, self.tables, self.lens,
                                   self.scale)

    def sparse(self, indptr: torch.Tensor, indices: torch.Tensor) -> None:
        ops.paged_attention_decode_sparse(self.out, self.q, self.kc, self.vc, self.tables,
                                          self.lens, indptr, indices, self.scale)

    def lists(self, cfg: SparseAttentionConfig):
        """(indptr, indices, blocks read per KV head, seconds of selection) of a config."""
        plan = plan_step([cfg] * len(self.lens), self.lens.numpy(), BLOCK, always=True)
        if plan.query_aware:
            t = time.perf_counter()
            ip, ix = quest_lists(self.q, self.kmin, self.kmax, self.tables, plan, "auto")
            return ip, ix, plan.blocks_read, time.perf_counter() - t
        return (torch.from_numpy(plan.indptr), torch.from_numpy(plan.indices), plan.blocks_read,
                0.0)


def kernel_section(contexts, batch: int, rounds: int, gen) -> list:
    rows = []
    for ctx in contexts:
        case = Case(batch, ctx, gen)
        held = batch * ctx // BLOCK
        configs = dict(strategies(ctx))
        configs["all blocks"] = SparseAttentionConfig("dilated", stride=1)
        for d in (0.5, 0.25, 1 / 16, 1 / 32):
            configs[f"random 1/{round(1 / d)}"] = SparseAttentionConfig(
                "random", density=d, local_blocks=1)
        lists = {name: case.lists(cfg) for name, cfg in configs.items()}
        times = {name: [] for name in ["dense", *configs]}
        select = {name: [] for name in configs}
        for _ in range(rounds):
            for name, cfg in configs.items():
                t = time.perf_counter()
                case.dense()
                times["dense"].append(time.perf_counter() - t)
                ip, ix, _, _ = lists[name]
                if configs[name].strategy == "quest":  # re-select: the per-step cost
                    ip, ix, _, sel = case.lists(cfg)
                    select[name].append(sel)
                t = time.perf_counter()
                case.sparse(ip, ix)
                times[name].append(time.perf_counter() - t)
        dense = statistics.median(times["dense"])
        for name in configs:
            read = lists[name][2]
            kern = statistics.median(times[name])
            sel = statistics.median(select[name]) if select[name] else 0.0
            rows.append(dict(context=ctx, batch=batch, strategy=name,
                             density=round(read / held, 4), dense_ms=dense * 1e3,
                             sparse_ms=kern * 1e3, select_ms=sel * 1e3,
                             speedup=dense / kern, speedup_with_select=dense / (kern + sel)))
            print(f"{ctx:6d} {name:14s} read {read / held:6.3f}  dense {dense * 1e3:8.2f} ms  "
                  f"sparse {kern * 1e3:8.2f} ms (+select {sel * 1e3:6.2f})  "
                  f"x{dense / kern:5.2f} (x{dense / (kern + sel):5.2f} with selection)",
                  flush=True)
        del case
    return rows


def step_section(contexts, batch: int, rounds: int) -> list:
    """Model decode steps at each context: dense vs each strategy."""
    from benchmarks.sparse_step import ModelStep

    rows = []
    for ctx in contexts:
        step = ModelStep(batch, ctx, BLOCK)
        configs = strategies(ctx)
        times = {name: [] for name in ["dense", *configs]}
        for _ in range(rounds):
            times["dense"].append(step.time(None))
            for name, cfg in configs.items():
                times[name].append(step.time(cfg))
        dense = statistics.median(times["dense"])
        for name in configs:
            t = statistics.median(times[name])
            rows.append(dict(context=ctx, batch=batch, strategy=name,
                             dense_tok_s=batch / dense, sparse_tok_s=batch / t,
                             speedup=dense / t))
            print(f"step {ctx:6d} {name:14s} dense {batch / dense:8.1f} tok/s  "
                  f"sparse {batch / t:8.1f} tok/s  x{dense / t:5.2f}", flush=True)
        del step
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small contexts, 2 rounds")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--no-step", action="store_true", help="the kernel section only")
    args = ap.parse_args()
    contexts = [1024, 2048] if args.quick else [8192, 16384, 32768]
    rounds = 2 if args.quick else args.rounds
    gen = torch.Generator().manual_seed(0)
    print(f"engine {_core.get_cpu_engine()}, {_core.get_num_threads()} threads", flush=True)
    result = {"engine": _core.get_cpu_engine(), "threads": _core.get_num_threads(),
              "kernel": kernel_section(contexts, args.batch, rounds, gen)}
    if not args.no_step:
        result["step"] = step_section(contexts, args.batch, max(3, rounds // 2))
    path = write_results("sparse" + ("_quick" if args.quick else ""), result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
