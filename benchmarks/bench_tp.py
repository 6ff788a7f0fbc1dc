"""Tensor parallelism's communication cost: measured at TP=2 on the CPU, projected for GPUs.

Measured (two spawned ranks over gloo, one thread each, the "small" preset in fp32): for each
step shape (decode of 1/16/64 sequences with 256 tokens of context, a 512-token prefill), the
median step time (forward + logits gather) and the part of it spent inside the collectives
(2 all-reduces per layer, one for the embedding, one logits gather), next to the TP=1 step on
one thread. Also the cost of delivering a step's inputs to the ranks: the executor's way (one
pickle, a pipe write per rank, each rank's unpickle and reply) against torch.distributed's
broadcast_object_list among the ranks.

Projected (a paper model, printed as a table): bytes all-reduced per token per layer
(2 x hidden x 2 bytes in bf16) and, per model and decode batch, the bus bandwidth at which a
TP=2/4/8 step beats the TP=1 step, against NVLink and PCIe rates.

Usage:  PYTHONPATH=python python benchmarks/bench_tp.py [--repeats 15]
Writes benchmarks/results/tp.json and prints the Markdown tables of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import platform
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_model_step import BLOCK_SIZE, decode_step, prefill_step  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = (("decode1", lambda: decode_step(1, 256)), ("decode16", lambda: decode_step(16, 256)),
         ("decode64", lambda: decode_step(64, 256)), ("prefill512", lambda: prefill_step(512)))


class TimedComm:
    """TorchDistComm that adds up the seconds spent in collectives."""

    def __init__(self, rank: int, world_size: int):
        from pagedllm.engine.distributed import TorchDistComm
        from pagedllm.model.tensor_parallel import TPShard

        self.inner = TorchDistComm(TPShard(rank, world_size), torch.device("cpu"))
        self.rank, self.world_size = rank, world_size
        self.seconds, self.calls, self.bytes = 0.0, 0, 0

    def all_reduce(self, t):
        t0 = time.perf_counter()
        self.inner.all_reduce(t)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.bytes += t.numel() * t.element_size()

    def gather_last_dim(self, t):
        t0 = time.perf_counter()
        out = self.inner.gather_last_dim(t)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


def _time_steps(model, kv, comm, repeats: int) -> dict:
    out = {}
    for name, make in STEPS:
        ids, pos, meta = make()
        rows = slice(None) if name.startswith("decode") else slice(-1, None)
        times, comm_times = [], []
        for i in range(repeats + 2):
            if comm is not None:
                dist.barrier()
                comm.seconds = 0.0
            t0 = time.perf_counter()
            hidden = model(ids, pos, meta, kv)
            model.compute_logits(hidden[rows])
            if i >= 2:
                times.append(time.perf_counter() - t0)
                comm_times.append(comm.seconds if comm is not None else 0.0)
        out[name] = {"step_ms": 1e3 * statistics.median(times),
                     "comm_ms": 1e3 * statistics.median(comm_times)}
    return out


def _delivery(comm, repeats: int) -> dict:
    """broadcast_object_list of a decode-64 step's inputs from rank 0 (seconds, median)."""
    from pagedllm.engine.distributed import StepInputs
    from pagedllm.engine.transfer_plan import KVTransferPlan

    ids, pos, meta = decode_step(64, 256)
    step = StepInputs(64, ids.numpy(), pos.numpy(), meta.slot_mapping.numpy(),
                      meta.block_tables.numpy(), meta.context_lens.numpy(),
                      meta.cu_seqlens_q.numpy(), np.arange(64), [], KVTransferPlan())
    times = []
    for _ in range(repeats + 2):
        dist.barrier()
        t0 = time.perf_counter()
        box = [step if comm.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        dist.barrier()  # every rank has it
        times.append(time.perf_counter() - t0)
    return {"broadcast_object_list_ms": 1e3 * statistics.median(times[2:]),
            "step_inputs_bytes": len(pickle.dumps(step, protocol=5))}


def _rank_main(rank: int, world_size: int, port: int, path: str, repeats: int, out) -> None:
    from pagedllm.model import PagedKVCache
    from pagedllm.model.parallel_loader import load_model_shard
    from pagedllm.model.tensor_parallel import TPShard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    comm = TimedComm(rank, world_size)
    model, _ = load_model_shard(path, TPShard(rank, world_size), comm, prepack=True)
    kv = PagedKVCache(model.config, 64 * 16 + 32, BLOCK_SIZE)
    steps = _time_steps(model, kv, comm, repeats)
    calls_per_step = comm.calls // ((repeats + 2) * len(STEPS))
    delivery = _delivery(comm, repeats)
    if rank == 0:
        out.put({"steps": steps, "collectives_per_step": calls_per_step, **delivery})
    dist.destroy_process_group()


def _echo_main(conn) -> None:
    """A rank stand-in that unpickles each step and acknowledges it (the executor's pipes)."""
    while True:
        data = conn.recv_bytes()
        if data == b"stop":
            return
        pickle.loads(data)
        conn.send_bytes(pickle.dumps(("ok", None)))


def _pipe_delivery(repeats: int, world_size: int) -> float:
    """Median ms for the driver to pickle a decode-64 step, send it to world_size ranks by
    pipe and get every acknowledgement back."""
    from pagedllm.engine.distributed import StepInputs
    from pagedllm.engine.transfer_plan import KVTransferPlan

    ids, pos, meta = decode_step(64, 256)
    step = StepInputs(64, ids.numpy(), pos.numpy(), meta.slot_mapping.numpy(),
                      meta.block_tables.numpy(), meta.context_lens.numpy(),
                      meta.cu_seqlens_q.numpy(), np.arange(64), [], KVTransferPlan())
    ctx = tmp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(world_size)]
    procs = [ctx.Process(target=_echo_main, args=(child,), daemon=True) for _, child in pipes]
    for p in procs:
        p.start()
    times = []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        data = pickle.dumps(("step", step), protocol=5)
        for parent, _ in pipes:
            parent.send_bytes(data)
        for parent, _ in pipes:
            pickle.loads(parent.recv_bytes())
        times.append(time.perf_counter() - t0)
    for parent, _ in pipes:
        parent.send_bytes(b"stop")
    for p in procs:
        p.join()
    return 1e3 * statistics.median(times[2:])


def measure(repeats: int) -> dict:
    from pagedllm.engine.mp_executor import free_port
    from pagedllm.model import PagedKVCache, load_model, write_random_checkpoint

    with tempfile.TemporaryDirectory() as d:
        write_random_checkpoint(d, "small")
        torch.set_num_threads(1)
        model, config = load_model(d, prepack=True)
        tp1 = _time_steps(model, PagedKVCache(config, 64 * 16 + 32, BLOCK_SIZE), None, repeats)
        del model
        ctx = tmp.get_context("spawn")
        out = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=_rank_main, args=(r, 2, port, d, repeats, out))
                 for r in range(2)]
        for p in procs:
            p.start()
        tp2 = out.get()
        for p in procs:
            p.join()
    tp2["pipe_delivery_ms"] = _pipe_delivery(repeats, 2)
    return {"tp1": tp1, "tp2": tp2, "hidden_size": config.hidden_size,
            "num_layers": config.num_hidden_layers}


# --- the paper projection -------------------------------------------------------------------
MODELS = {  # name: (layers, hidden, bf16 weight bytes)
    "Llama-3-8B": (32, 4096, 16.1e9),
    "Llama-3-70B": (80, 8192, 141e9),
}
HBM_BYTES_PER_S = 3.35e12   # H100 SXM HBM3: a memory-bound decode step reads every weight once
LINKS = {  # name: (bus bytes/s per GPU, latency of one small all-reduce)
    "NVLink 4": (450e9, 10e-6),
    "PCIe 5 x16": (50e9, 20e-6),
    "PCIe 4 x16": (25e9, 25e-6),
}


def decode_step_s(layers: int, hidden: int, weight_bytes: float, batch: int, tp: int,
                  bandwidth: float, latency: float) -> float:
    """Modelled seconds of a decode step at TP=tp: the weights read from HBM split tp ways,
    plus 2 all-reduces per layer of batch x hidden bf16 values (ring: 2(tp-1)/tp of the bytes
    cross each GPU's link, plus a fixed latency)."""
    compute = weight_bytes / (tp * HBM_BYTES_PER_S)
    if tp == 1:
        return compute
    per_all_reduce = latency + 2 * (tp - 1) / tp * batch * hidden * 2 / bandwidth
    return compute + 2 * layers * per_all_reduce


def break_even_bandwidth(layers: int, hidden: int, weight_bytes: float, batch: int, tp: int,
                         latency: float) -> float:
    """Bus bytes/s at which the TP=tp decode step equals the TP=1 one (inf: the latency
    alone eats the saving)."""
    saved = weight_bytes / HBM_BYTES_PER_S * (1 - 1 / tp)
    fixed = 2 * layers * latency
    moved = 2 * layers * 2 * (tp - 1) / tp * batch * hidden * 2
    return moved / (saved - fixed) if saved > fixed else float("inf")


def projection_table() -> str:
    links = list(LINKS)
    lines = ["| model | bytes all-reduced per token per layer (bf16) | decode batch | "
             "break-even GB/s TP=2 / 4 / 8 (10 us latency) | "
             + " | ".join(f"speedup TP=2 / 4 / 8 on {k}" for k in links) + " |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in links) + " |"]
    for name, (layers, hidden, wbytes) in MODELS.items():
        for batch in (1, 64, 256):
            even = []
            for tp in (2, 4, 8):
                bw = break_even_bandwidth(layers, hidden, wbytes, batch, tp, 10e-6)
                even.append("never" if bw == float("inf") else f"{bw / 1e9:.1f}")
            cells = []
            for link in links:
                bw, lat = LINKS[link]
                one = decode_step_s(layers, hidden, wbytes, batch, 1, bw, lat)
                cells.append(" / ".join(
                    f"{one / decode_step_s(layers, hidden, wbytes, batch, tp, bw, lat):.2f}x"
                    for tp in (2, 4, 8)))
            lines.append(f"| {name} | {2 * hidden * 2:,} B | {batch} | {' / '.join(even)} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def measured_table(r: dict) -> str:
    lines = ["| step | TP=1 step (ms) | TP=2 step (ms) | of which collectives (ms) | "
             "collectives share |", "| --- | --- | --- | --- | --- |"]
    for name, _ in STEPS:
        one, two = r["tp1"][name], r["tp2"]["steps"][name]
        lines.append(f"| {name} | {one['step_ms']:.2f} | {two['step_ms']:.2f} | "
                     f"{two['comm_ms']:.2f} | {two['comm_ms'] / two['step_ms']:.0%} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "tp.json"))
    args = ap.parse_args()
    r = measure(args.repeats)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    r["machine"] = {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
                    "date": datetime.datetime.now(datetime.timezone.utc).strftime(
                        "%Y-%m-%d %H:%M UTC"),
                    "load_avg": os.getloadavg()[0]}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(r, f, indent=2)
    m = r["machine"]
    print(f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['date']}, "
          f"load avg {m['load_avg']:.2f}\n")
    print(measured_table(r))
    t = r["tp2"]
    print(f"\ncollectives per step: {t['collectives_per_step']}; step inputs (decode 64): "
          f"{t['step_inputs_bytes']:,} bytes pickled; delivery to 2 ranks: pipes "
          f"{t['pipe_delivery_ms']:.3f} ms (pickle, 2 writes, 2 unpickles and acks) vs "
          f"broadcast_object_list {t['broadcast_object_list_ms']:.3f} ms\n")
    print(projection_table())


if __name__ == "__main__":
    main()
