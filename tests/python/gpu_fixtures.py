"""What the single-GPU tests share: their marks and a small random checkpoint for the device."""

from __future__ import annotations

import pytest
import torch

from pagedllm import ops

# pytestmark of a GPU test module: marked `gpu`, skipped cleanly without a GPU or the kernels.
GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (ops.cuda_available() and torch.cuda.is_available()),
                       reason="needs a CUDA GPU and the CUDA kernels"),
]

GPU_MODEL = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=512, vocab_size=512,
                 max_position_embeddings=512)


def write_gpu_model(tmp_path_factory, name: str, seed: int) -> str:
    """Writes a GPU_MODEL checkpoint with peaked attention (initializer_range 0.1).

    Args:
        tmp_path_factory: pytest's factory (the checkpoint lives for the session).
        name: the directory's name stem.
        seed: the weights' seed.
    Returns:
        The checkpoint directory.
    """
    from pagedllm.model import write_random_checkpoint

    path = tmp_path_factory.mktemp(name)
    write_random_checkpoint(path, preset=GPU_MODEL, seed=seed, initializer_range=0.1)
    return str(path)
