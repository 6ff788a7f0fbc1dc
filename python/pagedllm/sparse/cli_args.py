"""The sparse_attention CLI flags (generate, serve, bench): --sparse-attention STRATEGY and one
--sparse-KEY per config key; each overrides the same key of --config's sparse_attention
section."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Dict

from pagedllm.sparse.config import DENSE, KEYS

# flag dest -> config key
FLAGS = {"sparse_attention": "strategy", **{f"sparse_{k}": k for k in KEYS if k != "strategy"}}
# "sparse_attention.<key>" -> flag, for error hints
FLAG_OF_KEY = {f"sparse_attention.{key}": "--" + dest.replace("_", "-")
               for dest, key in FLAGS.items()}


def add_sparse_args(parser: argparse.ArgumentParser) -> None:
    """Adds the flags (a group of their own)."""
    g = parser.add_argument_group("block-sparse decode attention (YAML section sparse_attention:)")
    g.add_argument("--sparse-attention", metavar="STRATEGY",
                   help=f"{DENSE}, fixed_pattern, dilated, random, quest or streaming ({DENSE})")
    g.add_argument("--sparse-sink-blocks", type=int, metavar="N",
                   help="leading blocks always read (1)")
    g.add_argument("--sparse-local-blocks", type=int, metavar="N",
                   help="trailing blocks always read, the current one included (4)")
    g.add_argument("--sparse-stride", type=int, metavar="N",
                   help="dilated: read every N-th block (8)")
    g.add_argument("--sparse-density", type=float, metavar="F",
                   help="random: fraction of the middle blocks read (0.125)")
    g.add_argument("--sparse-token-budget", type=int, metavar="TOKENS",
                   help="quest: tokens read per KV head per step (2048)")
    g.add_argument("--sparse-min-context", type=int, metavar="TOKENS",
                   help="dense below this context length (0)")
    g.add_argument("--sparse-seed", type=int, metavar="N", help="random: the draws' seed (0)")


def apply_sparse_args(cfg, args: argparse.Namespace):
    """cfg (an EngineConfig) with the given flags over its sparse_attention.

    Raises:
        ValueError: a bad value or combination (naming the key).
    """
    given: Dict[str, Any] = {key: getattr(args, dest, None) for dest, key in FLAGS.items()}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return cfg
    base = dataclasses.asdict(cfg.sparse_attention) if cfg.sparse_attention else {}
    merged = {**base, **given}
    if "strategy" not in merged:
        raise ValueError("sparse_attention.strategy is required with the other --sparse-* "
                         "flags (give --sparse-attention STRATEGY)")
    return cfg.replace(sparse_attention=merged)
