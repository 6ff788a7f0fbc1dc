"""The checks a tensor-parallel config passes before any process starts: one-line ValueErrors
naming the option, instead of a rank failing later with a torch.distributed traceback."""

from __future__ import annotations

import importlib.util

from pagedllm.config import EngineConfig
from pagedllm.model import ModelConfig
from pagedllm.model.llava_config import is_llava_checkpoint
from pagedllm.model.mllama_config import is_mllama_checkpoint
from pagedllm.model.tensor_parallel import check_divisible


def check_parallel_config(config: EngineConfig, model_path: str) -> str:
    """Checks that `config`'s tensor parallelism can run here; returns the backend to use.

    Args:
        config: the engine options.
        model_path: the checkpoint directory (its config.json gives the head counts).
    Returns:
        "mp" or "ray".
    Raises:
        ValueError: tensor_parallel_size does not divide the model's heads or MLP, exceeds the
            visible GPUs (backend "mp"), ray is not installed, or an option the distributed
            executors do not support is on.
        CheckpointError: an unreadable config.json.
    """
    tp = config.tensor_parallel_size
    backend = config.distributed_executor_backend or "mp"
    for kind, found in (("LLaVA", is_llava_checkpoint), ("an Mllama", is_mllama_checkpoint)):
        if found(model_path):
            raise ValueError(f"{model_path} is {'a ' * (kind == 'LLaVA')}{kind} checkpoint: "
                             f"multimodal models are not supported with tensor_parallel_size="
                             f"{tp} or distributed_executor_backend={backend!r} yet (run it "
                             "on one rank)")
    check_divisible(ModelConfig.from_dir(model_path), tp)
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError("distributed_executor_backend='ray' needs the ray package "
                         "(pip install 'pagedllm[ray]'), which is not installed")
    if config.persistence is not None and config.persistence.enabled:
        raise ValueError(f"persistence (the persistent KV tier) is not supported with "
                         f"tensor_parallel_size={tp} or distributed_executor_backend="
                         f"{backend!r} yet (turn one of them off)")
    device = config.device
    if device == "auto":
        from pagedllm.engine import device as devices

        device = devices.resolve_device("auto", devices.checkpoint_head_dim(model_path)).type
    if backend == "mp" and device.startswith("cuda"):
        import torch

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if visible < tp:
            raise ValueError(f"tensor_parallel_size={tp} needs {tp} GPUs on this host, "
                             f"{visible} visible (device={config.device!r}; use "
                             f"distributed_executor_backend='ray' to span hosts)")
    return backend
