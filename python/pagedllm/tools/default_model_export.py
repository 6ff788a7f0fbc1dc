"""Writes a trained Llama in the Hugging Face layout: config, weights, tokenizer, generation config.

The files are written by hand rather than by ``save_pretrained`` so that ``config.json`` uses the
classic Llama keys (``rope_theta``, ``torch_dtype``) that every transformers release and every
standalone loader read, and so that the weights are exactly the tensors listed here.
"""

from __future__ import annotations

import json
import os

from pagedllm.tools.default_model_tokenizer import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, tokenizer_config


def llama_config(
    *,
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    max_position_embeddings: int,
    rope_theta: float,
    rms_norm_eps: float,
    special_ids: dict[str, int],
) -> dict:
    """Returns a ``config.json`` dict for a ``LlamaForCausalLM`` with tied embeddings, bf16 weights."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": hidden_size // num_attention_heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": rms_norm_eps,
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": special_ids[BOS_TOKEN],
        "eos_token_id": special_ids[EOS_TOKEN],
        "pad_token_id": special_ids[PAD_TOKEN],
    }


def generation_config(special_ids: dict[str, int]) -> dict:
    """Returns the ``generation_config.json`` dict: special ids and the default sampling."""
    return {
        "bos_token_id": special_ids[BOS_TOKEN],
        "eos_token_id": special_ids[EOS_TOKEN],
        "pad_token_id": special_ids[PAD_TOKEN],
        "do_sample": True,
        "temperature": 0.8,
        "top_p": 0.95,
    }


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def export_hf_layout(out_dir: str, model, config: dict, tokenizer) -> list[str]:
    """Writes the model directory and returns the paths written.

    Args:
        out_dir: the directory (created if missing; existing files of the same names replaced).
        model: a transformers ``LlamaForCausalLM``; its weights are stored as bfloat16, the
            tied ``lm_head.weight`` left out (loaders take it from ``model.embed_tokens``).
        config: the ``config.json`` dict (see ``llama_config``).
        tokenizer: the ``tokenizers.Tokenizer`` to store as ``tokenizer.json``.
    """
    from safetensors.torch import save_file

    import torch

    os.makedirs(out_dir, exist_ok=True)
    special_ids = {tok: tokenizer.token_to_id(tok) for tok in (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)}
    state = {
        name: tensor.detach().to(torch.bfloat16).contiguous()
        for name, tensor in model.state_dict().items()
        if name != "lm_head.weight"
    }
    paths = {
        "config.json": os.path.join(out_dir, "config.json"),
        "generation_config.json": os.path.join(out_dir, "generation_config.json"),
        "model.safetensors": os.path.join(out_dir, "model.safetensors"),
        "tokenizer.json": os.path.join(out_dir, "tokenizer.json"),
        "tokenizer_config.json": os.path.join(out_dir, "tokenizer_config.json"),
    }
    _write_json(paths["config.json"], config)
    _write_json(paths["generation_config.json"], generation_config(special_ids))
    save_file(state, paths["model.safetensors"], metadata={"format": "pt"})
    tokenizer.save(paths["tokenizer.json"])
    _write_json(paths["tokenizer_config.json"], tokenizer_config(config["max_position_embeddings"]))
    for path in paths.values():
        os.chmod(path, 0o644)  # save_file creates 0600; package data must be world-readable
    return list(paths.values())
