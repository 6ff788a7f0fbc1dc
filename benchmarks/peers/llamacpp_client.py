"""llama.cpp as a peer: the worker llamacpp_runner.py in the venv of setup_llamacpp.sh.

    with LlamaCppPeer(model_dir) as peer:    # converts the checkpoint to GGUF once
        result = peer.generate(requests)     # timed inside the worker
"""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.peers.worker_client import WorkerPeer, venv_python

HERE = Path(__file__).resolve().parent
SETUP = HERE.parent / "setup_llamacpp.sh"
RUNNER = HERE / "llamacpp_runner.py"


def llamacpp_python(build: bool = False) -> str:
    """The llama.cpp venv's python. Building it compiles llama.cpp (tens of minutes), so by
    default an absent venv makes the peer unavailable instead."""
    venv = Path(os.environ.get("LLAMACPP_VENV", Path.home() / ".cache/pagedllm/llamacpp-venv"))
    return venv_python(SETUP, venv, build)


class LlamaCppPeer(WorkerPeer):
    """llama.cpp with continuous batching, fp32 KV, no flash attention.

    Args:
        model_dir: the checkpoint directory.
        max_seqs: sequences decoded together (llama.cpp's n_seq_max).
        seq_tokens: KV slots per sequence.
        threads: llama.cpp threads (default: every core this process may use).
        kv_unified: one KV buffer for all sequences (batches the matmuls; attention spans
            every sequence's cells) instead of one region per sequence.
    """

    def __init__(self, model_dir: str, max_seqs: int = 64, seq_tokens: int = 2048,
                 threads: int = 0, kv_unified: bool = False):
        threads = threads or len(os.sched_getaffinity(0))
        cmd = [llamacpp_python(), str(RUNNER), model_dir, "--max-seqs", str(max_seqs),
               "--seq-tokens", str(seq_tokens), "--threads", str(threads)]
        if kv_unified:
            cmd.append("--kv-unified")
        super().__init__("llama.cpp", cmd)
