"""The subcommands of ``pagedllm``. Each module has NAME, HELP, a docstring (its --help text),
add_arguments(parser) and run(args) -> exit code; heavy imports happen inside run().

The command line imports only the module of the command it runs (``load``), inside main()'s
error handling: `pagedllm --help` lists the commands from HELPS without importing any of them
(nor torch), and a Ctrl-C while one is imported is an interrupt like any other.
"""

import importlib
from types import ModuleType

# name -> one-line help, in the order `pagedllm --help` lists them (each module's HELP)
HELPS = {
    "generate": "generate text for prompts (streamed to the terminal)",
    "serve": "start the OpenAI-compatible HTTP server",
    "bench": "benchmark throughput and latency on a workload",
    "monitor": "show a running server's (or an offline run's) live metrics",
    "info": "print the build (CUDA, CPU features, version) and the devices found",
}


def load(name: str) -> ModuleType:
    """The module of command `name` (one of HELPS), imported now."""
    return importlib.import_module(f"pagedllm.commands.{name}")
