"""Llama on the paged KV cache: config, safetensors loader, torch forward, KV pool.

    from pagedllm.model import load_model, PagedKVCache, AttentionMetadata
    model, config = load_model("path/to/llama")          # LlamaForCausalLM, ModelConfig
    kv = PagedKVCache(config, num_blocks, block_size)
    hidden = model(input_ids, positions, meta, kv)       # [num_tokens, hidden_size], normed
    logits = model.compute_logits(hidden[last_rows])     # [n, vocab_size] float32
"""

from pagedllm.model.attention import AttentionMetadata, paged_attention
from pagedllm.model.checkpoint import PRESETS, random_config, write_random_checkpoint
from pagedllm.model.config import ModelConfig, RopeScaling
from pagedllm.model.errors import CheckpointError
from pagedllm.model.kv_cache import KV_CACHE_DTYPES, PagedKVCache
from pagedllm.model.llama import LlamaForCausalLM
from pagedllm.model.loader import load_model

__all__ = [
    "AttentionMetadata", "CheckpointError", "KV_CACHE_DTYPES", "LlamaForCausalLM", "ModelConfig",
    "PRESETS", "PagedKVCache", "RopeScaling", "load_model", "paged_attention", "random_config",
    "write_random_checkpoint",
]
