"""make_executor: the Executor a config asks for (the one place that knows every kind).

In-process (UniProcExecutor) for tensor_parallel_size 1; for more, spawned local ranks
(mp_executor.MultiprocExecutor) or Ray actors (ray_executor.RayExecutor), as
distributed_executor_backend says. Kept apart from executor.py so that the executors import
their interface without it importing them back.
"""

from __future__ import annotations

from pagedllm.config import EngineConfig
from pagedllm.engine.executor import Executor, UniProcExecutor


def make_executor(config: EngineConfig, model_path: str) -> Executor:
    """The executor for a config: in-process for tensor_parallel_size 1, else spawned local
    ranks ("mp") or Ray actors ("ray"), as distributed_executor_backend says.

    Raises:
        ValueError: a combination this machine or model cannot run (names the option).
    """
    if config.tensor_parallel_size == 1 and config.distributed_executor_backend is None:
        return UniProcExecutor(config, model_path)
    from pagedllm.engine.tp_checks import check_parallel_config  # the TP modules load lazily

    backend = check_parallel_config(config, model_path)
    if backend == "ray":
        from pagedllm.engine.ray_executor import RayExecutor

        return RayExecutor(config, model_path)
    from pagedllm.engine.mp_executor import MultiprocExecutor

    return MultiprocExecutor(config, model_path)
