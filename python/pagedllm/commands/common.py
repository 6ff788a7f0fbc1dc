"""What the commands share: CLI errors, engine options (flags and --config YAML), sizes."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import sys
from typing import Any, Dict, List, Optional

from pagedllm.config import (CHECK_NUMERICS, EXECUTOR_BACKENDS, KV_CACHE_DTYPES, MODEL_DTYPES,
                             PREEMPTION_MODES, EngineConfig)
from pagedllm.commands.errors import CliError, UsageError  # noqa: F401 (re-exported)
from pagedllm.sparse.cli_args import FLAGS as SPARSE_FLAGS
from pagedllm.sparse.cli_args import FLAG_OF_KEY, add_sparse_args, apply_sparse_args


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "ki": 2**10,
          "m": 10**6, "mb": 10**6, "mib": 2**20, "mi": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "gi": 2**30,
          "t": 10**12, "tb": 10**12, "tib": 2**40, "ti": 2**40}


def parse_size(text: str) -> int:
    """Bytes from '2GiB', '512MiB', '1.5GB' or a plain integer (argparse type)."""
    m = _SIZE.match(text)
    unit = (m.group(2) or "").lower() if m else None
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r} (expected bytes, or a number with a unit such as 512MiB, 2GiB)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (must be > 0)")
    return value


def format_bytes(n: float) -> str:
    """'2.0 GiB' style."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def block_size_arg(text: str):
    """argparse type of --block-size: an integer >= 1 or 'auto'."""
    if text.strip().lower() == "auto":
        return "auto"
    return positive_int(text)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


# flag dest -> EngineConfig field (the flag is --dest with dashes)
_ENGINE_FLAGS: Dict[str, str] = {
    "model": "model", "block_size": "block_size", "kv_cache_dtype": "kv_cache_dtype",
    "kv_cache_memory": "kv_cache_memory_bytes", "num_kv_blocks": "num_kv_blocks",
    "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
    "max_model_len": "max_model_len", "enable_prefix_caching": "enable_prefix_caching",
    "watermark": "watermark", "seed": "seed", "num_threads": "num_threads",
    "prepack_weights": "prepack_weights", "device": "device", "dtype": "dtype",
    "gpu_memory_utilization": "gpu_memory_utilization", "preemption_mode": "preemption_mode",
    "swap_space": "swap_space", "expected_mean_seq_len": "expected_mean_seq_len",
    "check_numerics": "check_numerics",
    "tensor_parallel_size": "tensor_parallel_size",
    "distributed_executor_backend": "distributed_executor_backend",
    "distributed_timeout": "distributed_timeout_s",
    "max_images_per_prompt": "max_images_per_prompt", "max_image_bytes": "max_image_bytes",
    "max_image_pixels": "max_image_pixels", "max_num_encoder_tokens": "max_num_encoder_tokens",
    "encoder_cache_images": "encoder_cache_images",
    "cross_kv_fraction": "cross_kv_fraction", "num_cross_kv_blocks": "num_cross_kv_blocks",
}
# flag dest -> persistence key
_PERSISTENCE_FLAGS: Dict[str, str] = {
    "persistence_path": "storage_path", "persistence_backend": "backend",
    "persistence_max_bytes": "max_bytes", "hot_blocks_threshold": "hot_blocks_threshold"}
# EngineConfig field -> the flag that sets it (for hints in error messages)
FLAG_OF_FIELD = {field: "--" + dest.replace("_", "-") for dest, field in _ENGINE_FLAGS.items()}
FLAG_OF_FIELD.update({f"persistence.{key}": "--" + dest.replace("_", "-")
                      for dest, key in _PERSISTENCE_FLAGS.items()})
FLAG_OF_FIELD.update(FLAG_OF_KEY)


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """The engine's options; each overrides the same option of --config."""
    g = parser.add_argument_group("engine (each flag overrides --config)")
    g.add_argument("--model", metavar="DIR",
                   help="Hugging Face Llama checkpoint directory (default: the bundled model)")
    g.add_argument("--config", metavar="FILE.yaml",
                   help="engine options as YAML (sections model, kv_cache, scheduler, runtime; "
                        "see docs/USAGE.md)")
    g.add_argument("--block-size", type=block_size_arg, metavar="N|auto",
                   help="tokens per KV block (16); auto: max(16, 2^ceil(log2(mean seq len / 10))) "
                        "on --expected-mean-seq-len, else on max_model_len")
    g.add_argument("--expected-mean-seq-len", type=positive_int, metavar="TOKENS",
                   help="the workload's mean prompt + output length, for --block-size auto")
    g.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, help="KV storage dtype (auto)")
    g.add_argument("--kv-cache-memory", type=parse_size, metavar="SIZE",
                   help="KV pool budget, e.g. 512MiB (2GiB)")
    g.add_argument("--num-kv-blocks", type=positive_int, metavar="N",
                   help="exact KV pool size in blocks (overrides --kv-cache-memory)")
    g.add_argument("--max-num-seqs", type=positive_int, metavar="N", help="sequences per step (256)")
    g.add_argument("--max-num-batched-tokens", type=positive_int, metavar="N",
                   help="tokens per step (max(2048, max-num-seqs))")
    g.add_argument("--max-model-len", type=positive_int, metavar="N",
                   help="longest prompt + output (the model's limit, capped by the pool)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse cached KV blocks of shared prompt prefixes (on)")
    g.add_argument("--watermark", type=float, metavar="F",
                   help="fraction of blocks kept free when admitting requests (0.01)")
    g.add_argument("--seed", type=int, metavar="N", help="seed of the engine's sampler (0)")
    g.add_argument("--num-threads", type=positive_int, metavar="N",
                   help="CPU threads (all available cores)")
    g.add_argument("--prepack-weights", action=argparse.BooleanOptionalAction, default=None,
                   help="weights in oneDNN's blocked layout for faster CPU matmuls (on)")
    g.add_argument("--device", metavar="DEV",
                   help="auto, cpu, cuda or cuda:N (auto: a GPU when usable, else the CPU)")
    g.add_argument("--dtype", choices=MODEL_DTYPES,
                   help="weights and activations (auto: float32 on the CPU, bfloat16 on a GPU)")
    g.add_argument("--gpu-memory-utilization", type=float, metavar="F",
                   help="share of GPU memory the engine may use (0.9)")
    g.add_argument("--preemption-mode", choices=PREEMPTION_MODES,
                   help="when the KV pool runs out: recompute the victim later, or swap its "
                        "blocks to host memory (recompute)")
    g.add_argument("--swap-space", type=float, metavar="GIB",
                   help="GiB of host memory for swapped-out KV blocks (4)")
    g.add_argument("--check-numerics", choices=CHECK_NUMERICS,
                   help="NaN/Inf in a layer's output or the logits: off, warn (log the layer, "
                        "position and request) or fail (finish that request with an error) (off)")
    t = parser.add_argument_group("tensor parallelism (YAML section parallel:)")
    t.add_argument("-tp", "--tensor-parallel-size", type=positive_int, metavar="N",
                   help="split the model over N ranks (heads, MLP, vocabulary, KV heads) (1)")
    t.add_argument("--distributed-executor-backend", choices=EXECUTOR_BACKENDS,
                   help="mp: N spawned local processes (default when N > 1); ray: Ray actors "
                        "on the cluster of RAY_ADDRESS or `ray start`, across hosts")
    t.add_argument("--distributed-timeout", type=float, metavar="SECONDS",
                   help="a rank that dies or does not answer a step within this stops the "
                        "engine with an error naming it (300)")
    m = parser.add_argument_group("images, LLaVA and Mllama models (YAML section multimodal:)")
    m.add_argument("--max-images-per-prompt", type=positive_int, metavar="N",
                   help="most images in one prompt (4)")
    m.add_argument("--max-image-bytes", type=parse_size, metavar="SIZE",
                   help="most encoded bytes of one image (20MiB)")
    m.add_argument("--max-image-pixels", type=positive_int, metavar="N",
                   help="most width x height of one decoded image (16777216)")
    m.add_argument("--max-num-encoder-tokens", type=positive_int, metavar="N",
                   help="most image embeddings encoded per step (max(max-num-batched-tokens, "
                        "one image))")
    m.add_argument("--encoder-cache-images", type=int, metavar="N",
                   help="unused image encoder outputs kept for repeated images (8)")
    m.add_argument("--cross-kv-fraction", type=float, metavar="F",
                   help="Mllama: share of the KV memory for the cross-attention pool (0.25)")
    m.add_argument("--num-cross-kv-blocks", type=positive_int, metavar="N",
                   help="Mllama: exact blocks of the cross-attention pool (from the fraction)")
    p = parser.add_argument_group("persistent KV tier (YAML section persistence:)")
    p.add_argument("--persistence-path", metavar="DIR",
                   help="keep full prompt blocks in a store under DIR that survives restarts "
                        "(turns the tier on)")
    p.add_argument("--persistence-backend", choices=("file", "rocksdb"),
                   help="the store's backend (file)")
    p.add_argument("--persistence-max-bytes", type=parse_size, metavar="SIZE",
                   help="the store's size cap, least recently used records go first (none)")
    p.add_argument("--hot-blocks-threshold", type=int, metavar="N",
                   help="write a block once served N times from memory; 0: every full prompt "
                        "block when computed (0)")
    add_sparse_args(parser)


def add_trace_arg(parser: argparse.ArgumentParser) -> None:
    """The profiling flags (generate, serve, bench): --profile-trace FILE.json (alias --trace),
    --profile-layers, --profile-torch-steps START:END, --profile-cuda-steps START:END."""
    g = parser
    g.add_argument("--profile-trace", "--trace", dest="trace", metavar="FILE.json",
                   help="write a Chrome/Perfetto trace of every engine step: schedule, KV "
                        "transfers, prepare inputs, forward, logits, sample, update, detokenize")
    g.add_argument("--profile-layers", action="store_true",
                   help="also a span per decoder layer inside forward")
    g.add_argument("--profile-torch-steps", metavar="START:END",
                   help="a torch.profiler capture of engine steps START..END-1, written "
                        "beside the trace as FILE.torch.json")
    g.add_argument("--profile-cuda-steps", metavar="START:END",
                   help="cudaProfilerStart/Stop around engine steps START..END-1 (for nsys "
                        "profile --capture-range=cudaProfilerApi; CUDA only; NVTX ranges on)")


_PROFILE_FLAGS = (("profile_trace", "--profile-trace"), ("profile_layers", "--profile-layers"),
                  ("profile_torch_steps", "--profile-torch-steps"),
                  ("profile_cuda_steps", "--profile-cuda-steps"))


def _trace_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The LLMEngine.start_trace options of the --profile-* flags (all None/False: none given)."""
    return dict(path=getattr(args, "trace", None),
                layers=bool(getattr(args, "profile_layers", False)),
                torch_steps=getattr(args, "profile_torch_steps", None),
                cuda_steps=getattr(args, "profile_cuda_steps", None))


def _profile_usage_error(e: ValueError) -> UsageError:
    message = str(e)
    for field, flag in _PROFILE_FLAGS:
        message = message.replace(field, flag)
    return UsageError(f"{message} (fix the --profile-* flags)")


def check_profile_flags(args: argparse.Namespace) -> None:
    """Checks the --profile-* flags before the model loads: the --profile-trace path as
    --stats-file's (not empty, not a directory, in a writable directory) and the step windows.

    Args:
        args: the parsed flags of a command with add_trace_arg (others: nothing to check).
    Raises:
        UsageError: a bad flag (named).
    """
    options = _trace_options(args)
    check_output_file(options["path"], "--profile-trace")
    from pagedllm.engine.trace_options import TraceOptions  # no torch: os and dataclasses

    try:
        TraceOptions(**options)
    except ValueError as e:
        raise _profile_usage_error(e) from None


def start_trace(engine, args: argparse.Namespace) -> None:
    """Starts the engine's step trace when a profiling flag was given.

    Args:
        engine: the LLMEngine to trace.
        args: the parsed flags (see add_trace_arg).
    Raises:
        UsageError: a bad profiling flag (named).
    """
    options = _trace_options(args)
    if options["path"] is None and not (options["cuda_steps"] or options["layers"]
                                        or options["torch_steps"]):
        return
    try:
        engine.start_trace(**options)
    except ValueError as e:
        raise _profile_usage_error(e) from None


def report_trace(paths) -> None:
    """Tells stderr where the trace files went."""
    for path in paths:
        print(f"trace of the engine's steps written to {path}", file=sys.stderr)


def end_run(engine, stats, unfinished) -> None:
    """Ends a generate / bench run, also one that failed or was interrupted (Ctrl-C): aborts
    the requests still unfinished (counted as aborted in the stats file), writes the stats file
    a last time, ends the step trace and says where it went.

    Args:
        engine: the LLMEngine of the run.
        stats: its StatsFileWriter, or None.
        unfinished: ids of the requests added and not finished.
    """
    if unfinished:
        try:
            engine.abort_request(list(unfinished))
        except Exception:  # noqa: BLE001 - an engine broken mid-step: the figures still go out
            logging.getLogger(__name__).debug("aborting the unfinished requests failed",
                                              exc_info=True)
        if stats is not None:
            stats.aborted(unfinished)
    if stats is not None:
        stats.write()
    report_trace(engine.stop_trace())


def length_fix(engine, shorten: str) -> str:
    """What fixes a request too long for the engine, as flags: `shorten` (e.g. "lower
    --max-tokens"), then only the limits that can still be raised: --max-model-len when it
    was set below the model's positions, the KV pool's flag when the pool set the limit
    (--num-kv-blocks when given: it wins over --kv-cache-memory)."""
    raise_ = []
    if engine.max_model_len < engine.model_config.max_position_embeddings:
        if engine.config.max_model_len is not None:
            raise_.append("--max-model-len")
        else:
            raise_.append("--num-kv-blocks" if engine.config.num_kv_blocks is not None
                          else "--kv-cache-memory")
    return shorten + (f", or raise {' / '.join(raise_)}" if raise_ else
                      f": the model's {engine.model_config.max_position_embeddings} positions "
                      f"are the limit")


def is_length_error(message: str) -> bool:
    """Whether an add_request refusal is about length (max_model_len or the KV pool)."""
    return "max_model_len" in message or "KV" in message


def request_failure(output) -> Optional[str]:
    """Why a finished request failed, on one line; None when it did not.

    Args:
        output: the request's final RequestOutput.
    Returns:
        Its `error` (the engine sets it with finish_reason "error"), or a generic reason when a
        completion finished with "error" and no error was given; None for a request that
        finished normally (stop, length, abort).
    """
    if output.error:
        return _one_line(str(output.error))
    if any(c.finish_reason == "error" for c in output.outputs):
        return "the engine ended it with an error (no reason given)"
    return None


def report_failures(failures: Dict[str, str]) -> int:
    """Says on stderr which requests failed and why, one line each:
    ``pagedllm: error: <label> failed: <why>``.

    Args:
        failures: label (e.g. 'prompt 2 (request generate-1)') -> why, in the order to print.
    Returns:
        The exit code of the run: 1 when any request failed, else 0.
    """
    for label, why in failures.items():
        print(f"pagedllm: error: {label} failed: {why}", file=sys.stderr)
    return 1 if failures else 0


def check_output_file(path: Optional[str], flag: str) -> None:
    """Checks, before any work, that a file can be written at `path`.

    Args:
        path: the flag's value (None: the flag was not given, nothing to check).
        flag: the flag, for the message ('--stats-file').
    Raises:
        UsageError: `path` is empty or a directory, or its directory is missing or not
            writable (names `flag`).
    """
    if path is None:
        return
    if not path.strip():
        raise UsageError(f"{flag} {path!r} is empty (fix {flag}: give a file path)")
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path!r} is a directory (fix {flag}: give a file path)")
    if not os.path.isdir(directory):
        raise UsageError(f"{flag} {path!r}: directory {directory!r} does not exist (fix {flag})")
    if not os.access(directory, os.W_OK | os.X_OK) or (
            os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path!r}: cannot write there: permission denied (fix {flag})")


def make_sampling_params(fields: Dict[str, Any], flags: Optional[Dict[str, str]] = None):
    """SamplingParams(**fields), checked before the model loads.

    Args:
        fields: the SamplingParams fields of the flags.
        flags: renames of the flag a field's error names ('--max-tokens' -> '--output-len').
    Raises:
        UsageError: a bad value, naming its flag.
    """
    from pagedllm.sampling_params import SamplingParams

    try:
        return SamplingParams(**fields)
    except ValueError as e:
        message = re.sub(r"SamplingParams\.(\w+)",  # the field as its flag; values kept as given
                         lambda m: "--" + m.group(1).replace("_", "-"), str(e))
        for field_flag, flag in (flags or {}).items():
            message = message.replace(field_flag, flag)
        raise UsageError(message) from None


def engine_flags_given(args: argparse.Namespace) -> bool:
    """Whether any engine flag (not --config) was given."""
    dests = [*_ENGINE_FLAGS, *_PERSISTENCE_FLAGS, *SPARSE_FLAGS]
    return any(getattr(args, dest, None) is not None for dest in dests)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig of --config (if given) with the flags applied over it. Every engine
    command calls this first, so it also checks the --profile-* flags (they set the engine's
    trace) before the model loads.

    Raises:
        UsageError: unreadable YAML, an unknown key or an invalid value, or a bad --profile-*
            flag (named).
    """
    check_profile_flags(args)
    overrides: Dict[str, Any] = {field: getattr(args, dest, None)
                                 for dest, field in _ENGINE_FLAGS.items()}
    persistence = {key: getattr(args, dest, None) for dest, key in _PERSISTENCE_FLAGS.items()}
    persistence = {k: v for k, v in persistence.items() if v is not None}
    try:
        if args.config:
            cfg = EngineConfig.from_yaml(args.config, **overrides)
        else:
            cfg = EngineConfig(**{k: v for k, v in overrides.items() if v is not None})
        # An exact size in the file (num_blocks) would win over a --kv-cache-memory flag: the
        # flag wins over the file, so it clears it (a --num-kv-blocks flag wins anyway). The
        # same for the Mllama cross pool's --cross-kv-fraction and num_cross_kv_blocks.
        for budget, exact in (("kv_cache_memory", "num_kv_blocks"),
                              ("cross_kv_fraction", "num_cross_kv_blocks")):
            field = _ENGINE_FLAGS[exact]
            if (getattr(args, budget, None) is not None and getattr(args, exact, None) is None
                    and getattr(cfg, field) is not None):
                cfg = cfg.replace(**{field: None})
        if persistence:
            base = dataclasses.asdict(cfg.persistence) if cfg.persistence else {}
            if "storage_path" in persistence:
                base["enabled"] = True
            cfg = cfg.replace(persistence={**base, **persistence})
            if not cfg.persistence.enabled:
                flags = " and ".join("--" + dest.replace("_", "-")
                                     for dest, key in _PERSISTENCE_FLAGS.items()
                                     if key in persistence)
                raise UsageError(f"{flags} {'need' if ' and ' in flags else 'needs'} "
                                 f"--persistence-path: the persistent KV tier is off (give "
                                 f"--persistence-path DIR, or enable persistence in the --config "
                                 f"file)")
        return apply_sparse_args(cfg, args)
    except FileNotFoundError:
        raise UsageError(f"config file {args.config!r} not found (check the --config path)") from None
    except OSError as e:
        raise UsageError(f"cannot read config file {args.config!r}: {e.strerror}") from None
    except ValueError as e:
        flags = flag_hint(str(e))
        fix = " or ".join(filter(None, [flags, "the --config file" if args.config else None]))
        raise UsageError(f"{e} (fix {fix or 'the options'})") from None
    except Exception as e:  # yaml.YAMLError: the file is not YAML
        if type(e).__module__.startswith("yaml"):
            raise UsageError(f"{args.config}: not valid YAML ({_one_line(str(e))})") from None
        raise


def build_engine(config: EngineConfig):
    """An LLMEngine for `config` (imports torch and the model only now).

    Raises:
        CliError: no --model was given and the bundled default model is not available.
        UsageError: the options can never make an engine (no such model directory, a KV budget
            that holds no block, a dtype or device this machine lacks, ...): exit code 2, the
            message with the flags that set the fields it names.
    """
    if config.model is None:
        config = config.replace(model=bundled_model_path())
    from pagedllm.engine.llm_engine import LLMEngine

    try:
        return LLMEngine(config)
    except (ValueError, FileNotFoundError) as e:
        message = str(e.args[0]) if isinstance(e, FileNotFoundError) and e.args else str(e)
        message = " ".join(message.split())  # one line
        hint = flag_hint(message)
        raise UsageError(message + (f" (flags: {hint})" if hint else "")) from e


def bundled_model_path() -> str:
    """The bundled default model's directory.

    Raises:
        CliError: it is not part of this build, or its files are missing.
    """
    try:
        from pagedllm.default_model import default_model_path
    except ImportError:
        raise CliError("the bundled default model is not part of this build "
                       "(give a checkpoint directory with --model DIR)") from None
    try:
        return default_model_path()
    except (RuntimeError, OSError) as e:
        raise CliError(f"{_one_line(str(e))} (or give a checkpoint directory with --model DIR)") from None


def read_lines(stream, what: str) -> List[str]:
    """The lines of a --file (a binary file, or a text stream such as stdin), UTF-8 with any
    newline convention, without their line ends.

    Raises:
        UsageError: the bytes are not UTF-8 (names `what`, the line and --file).
    """
    binary = getattr(stream, "buffer", stream)
    data = binary.read()
    if isinstance(data, str):  # a text stream without a buffer
        text = data
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise UsageError(f"{what} is not UTF-8: byte 0x{data[e.start]:02x} on line {line} "
                             f"(save it as UTF-8; check --file)") from None
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()  # the last newline ends a line, it does not start one
    return lines


def _one_line(text: str) -> str:
    return " ".join(text.split())


def flag_hint(message: str) -> Optional[str]:
    """The flags that set the config fields a message names, e.g. '--kv-cache-memory'."""
    # lists of valid keys or values ("(known: a, b)", "keys ['a', 'b']") are not advice
    message = re.sub(r"\(known: [^)]*\)|\[[^][()]*\]", "", message)
    flags = [flag for field, flag in FLAG_OF_FIELD.items()
             if field != "model" and re.search(rf"\b{re.escape(field)}\b", message)]
    return ", ".join(dict.fromkeys(flags)) or None
