"""Print what this build of pagedllm is and what it finds on this machine.

Version, compiler, CPU features found, CPU kernels compiled in and the one in use, CUDA (compiled in or not,
runtime and driver versions, GPUs), torch and its threads, the bundled default model. With
--config and/or engine flags, also validates them and prints the engine options they resolve to
(a flag wins over the file, as for generate, serve and bench; no model is loaded).

examples:
  pagedllm info
  pagedllm info --json
  pagedllm info --config engine.yaml
  pagedllm info --config engine.yaml --kv-cache-memory 1GiB
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
from typing import Any, Dict

from pagedllm.commands import HELPS
from pagedllm._version import __version__
from pagedllm.commands.common import add_engine_args, engine_config, engine_flags_given

NAME = "info"
HELP = HELPS[NAME]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")
    add_engine_args(p)  # --config FILE.yaml and the flags: validated, the result shown


def _shows_engine_config(args: argparse.Namespace) -> bool:
    """Whether --config or an engine flag was given (then the resolved options are shown)."""
    return bool(args.config) or engine_flags_given(args)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _default_model() -> str:
    try:
        from pagedllm.default_model import default_model_path
    except ImportError:
        return "not included in this build"
    try:
        return default_model_path()
    except Exception as e:  # a broken install: say so, info must still print
        return f"unavailable ({' '.join(str(e).split())})"


def collect() -> Dict[str, Any]:
    """Everything `info` prints, as a dict."""
    from pagedllm import _core

    build = dict(_core.build_info())
    if hasattr(_core, "cpu_kernel"):
        build["cpu_kernel_in_use"] = _core.cpu_kernel()
    facts: Dict[str, Any] = {"version": __version__, "python": platform.python_version(),
                             "platform": platform.platform(), "build": build,
                             "cpu": {"model": _cpu_model(), "cores": len(os.sched_getaffinity(0))}}
    try:
        import torch

        facts["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads(),
                          "cuda_available": bool(torch.cuda.is_available())}
    except ImportError:
        facts["torch"] = None
    facts["default_model"] = _default_model()
    return facts


def format_facts(f: Dict[str, Any]) -> str:
    """The facts as indented text."""
    b = f["build"]
    lines = [f"pagedllm {f['version']} (python {f['python']}, {f['platform']})",
             f"  compiler        {b.get('compiler', '?')}",
             f"  CPU             {f['cpu']['model']}, {f['cpu']['cores']} cores available",
             f"  CPU features    {' '.join(b.get('cpu_features', [])) or 'none detected'}",
             f"  CPU kernels     {', '.join(b.get('cpu_kernels_compiled', [])) or 'none'} "
             f"compiled, {b.get('cpu_kernel_in_use', '?')} in use"]
    if b.get("cuda_compiled"):
        gpus = b.get("gpu_names", [])
        lines.append(f"  CUDA            compiled in (runtime {b.get('cuda_runtime_version') or '?'}, "
                     f"driver {b.get('cuda_driver_version') or 'none'})")
        lines.append(f"  GPUs            {len(gpus)}" + (": " + ", ".join(gpus) if gpus else ""))
    else:
        lines.append("  CUDA            not compiled in (CPU only)")
    lines.append(f"  KV stores       {', '.join(b.get('block_store_backends', [])) or 'none'} "
                 f"(persistence backends compiled in)")
    t = f.get("torch")
    lines.append(f"  torch           {t['version']}, {t['threads']} threads" if t else
                 "  torch           not installed")
    lines.append(f"  default model   {f['default_model']}")
    return "\n".join(lines)


def store_facts(persistence) -> Dict[str, Any]:
    """What a config's persistent store holds: backend, path, records and bytes (opened and
    closed again: a store a running engine holds is reported as in use)."""
    from pagedllm import _core

    out: Dict[str, Any] = {"backend": persistence.backend, "path": persistence.storage_path}
    if not os.path.isdir(persistence.storage_path):
        out["state"] = "not created yet"
        return out
    try:
        store = _core.BlockStore(persistence.storage_path, persistence.backend,
                                 persistence.max_bytes)
    except Exception as e:  # noqa: BLE001 - locked, unreadable, backend missing
        out["state"] = f"cannot open ({e})"
        return out
    try:
        st = store.stats()
        out.update(state="ok", records=st.get("records"), bytes=st.get("bytes"))
    finally:
        store.close()
    return out


def run(args: argparse.Namespace) -> int:
    shown = _shows_engine_config(args)
    cfg = engine_config(args) if shown else None  # a bad file or flag: before anything prints
    facts = collect()
    if cfg is not None:
        facts["engine_config"] = dataclasses.asdict(cfg)
        if cfg.persistence is not None and cfg.persistence.enabled:
            facts["kv_store"] = store_facts(cfg.persistence)
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    print(format_facts(facts))
    if cfg is not None:
        source = " with the flags" if engine_flags_given(args) else ""
        print(f"engine config ({args.config + source if args.config else 'the flags'}):")
        width = max(map(len, facts["engine_config"])) + 2
        for key, value in facts["engine_config"].items():
            print(f"  {key:<{width}}{value}")
    if "kv_store" in facts:
        st = facts["kv_store"]
        detail = (f"{st['records']} records, {st['bytes']} bytes" if st.get("state") == "ok"
                  else st["state"])
        print(f"persistent KV store: {st['backend']} at {st['path']}: {detail}")
    return 0
