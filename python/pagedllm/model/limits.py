"""The sizes a checkpoint may have: what the kernels support, and sane upper bounds.

The kernel limits mirror cpp/src/kernels/validate.cpp (docs/ARCHITECTURE.md, "Limits"): a
checkpoint outside them would load and then fail its first request. The upper bounds are far
above any released Llama (405B: hidden 16384, ffn 53248, 126 layers, vocab 128256) and exist
so that an absurd config.json (num_hidden_layers: 1000000000) is refused before anything is
sized from it.
"""

from __future__ import annotations

# Kernel limits (validate_cache): head_dim a multiple of HEAD_DIM_MULTIPLE in [MIN, MAX].
MIN_HEAD_DIM = 8
MAX_HEAD_DIM = 512
HEAD_DIM_MULTIPLE = 8
# The CUDA kernels' compiled head dims (one dispatch switch; docs/ARCHITECTURE.md, CUDA).
CUDA_HEAD_DIMS = (64, 80, 96, 128, 256)

# Upper bounds of config.json's dimensions (head_dim: head_dim_problem).
MAX_DIMENSIONS = {
    "vocab_size": 1 << 22,               # 4,194,304
    "hidden_size": 1 << 16,              # 65,536
    "intermediate_size": 1 << 19,        # 524,288
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "max_position_embeddings": 1 << 24,  # 16,777,216
}


def head_dim_problem(head_dim: int, device: str = "cpu") -> str | None:
    """Why the kernels of `device` cannot run `head_dim`, or None when they can.

    Args:
        head_dim: the attention head size.
        device: "cpu" (what ModelConfig checks) or "cuda" (the compiled CUDA head dims).
    Returns:
        A message naming the value and what is supported, or None.
    """
    if device == "cuda":
        if head_dim in CUDA_HEAD_DIMS:
            return None
        return (f"head_dim = {head_dim} is not supported by the CUDA attention kernels: "
                f"expected one of {', '.join(map(str, CUDA_HEAD_DIMS))}")
    if (MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM) and head_dim % HEAD_DIM_MULTIPLE == 0:
        return None
    return (f"head_dim = {head_dim} is not supported by the attention kernels: expected a "
            f"multiple of {HEAD_DIM_MULTIPLE} in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]")
