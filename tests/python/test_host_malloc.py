"""host_malloc.keep_freed_memory: freed step tensors are reused, not page-faulted anew.

Each check runs in a fresh interpreter (mallopt is process-wide and set once): a 16 MiB tensor
allocated and freed 20 times, after three warm-up rounds, faults in none of its 4096 pages
again with the thresholds raised, against once per allocation where every block of that size
is mapped and unmapped (glibc's way with blocks over its mmap threshold, here set to 128 KiB).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON_DIR = str(Path(__file__).resolve().parents[2] / "python")

SCRIPT = r"""
import ctypes, resource, sys
import torch
from pagedllm.engine import host_malloc
mode = sys.argv[1]
if mode == "keep":
    assert host_malloc.keep_freed_memory()
    assert host_malloc.keep_freed_memory()  # once; the same answer again
elif mode == "off":
    print(host_malloc.keep_freed_memory())
    sys.exit(0)
else:  # glibc's default path for blocks over the threshold: mapped and unmapped each time
    libc = ctypes.CDLL(None)
    assert libc.mallopt(host_malloc.M_MMAP_THRESHOLD, 128 << 10) == 1
for _ in range(3):  # 16 MiB, touched so its pages are faulted in (the heap grows twice)
    x = torch.empty(4 << 20)
    x.fill_(1.0)
    del x
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    x = torch.empty(4 << 20)
    x.fill_(1.0)
    del x
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt thresholds are glibc's")


def run(mode: str, env_value: str = "1") -> str:
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, PAGEDLLM_KEEP_FREED_MEMORY=env_value)
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@glibc_only
def test_freed_tensors_are_reused_without_page_faults():
    kept = int(run("keep"))
    remapped = int(run("remap"))
    assert remapped >= 20 * 4096 // 2, f"the control re-faulted only {remapped} pages"
    assert kept < 1000, f"{kept} minor faults for 20 reallocations of a freed 16 MiB tensor"


@glibc_only
def test_turned_off_by_the_environment():
    assert run("off", env_value="0") == "False"
