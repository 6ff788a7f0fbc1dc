"""`pagedllm serve` flags of the HTTP policy (issue 20): CORS, field strictness, metrics access,
prefix-cache salting and per-request limits. Kept here, next to ServerSettings, so the command
adds them with one call; importing this module does not import FastAPI.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_policy_arguments(group) -> None:
    """Adds the flags to an argparse parser or argument group.

    Args:
        group: what ``add_argument`` is called on.
    """
    group.add_argument("--allowed-origins", metavar="ORIGINS", default="",
                       help="comma-separated origins browsers may call the API from (CORS; "
                            "'*' for any); default: none, no CORS headers")
    group.add_argument("--strict-fields", action="store_true",
                       help="refuse unknown request fields with 400 (default: ignore them, "
                            "log a warning and list them in the X-Ignored-Fields header)")
    group.add_argument("--metrics-public", action="store_true",
                       help="serve /metrics without the API key (default: behind it)")
    group.add_argument("--cache-salt-by-api-key", action="store_true",
                       help="give each bearer token its own prefix-cache namespace, so clients "
                            "with different keys never share cached blocks")
    group.add_argument("--max-prompts-per-request", type=_positive, default=256, metavar="N",
                       help="most prompts in one /v1/completions request (256)")
    group.add_argument("--max-sequences-per-request", type=_positive, default=256, metavar="N",
                       help="most sequences one request runs: prompts x max(n, best_of) (256)")
    group.add_argument("--max-logprobs-per-request", type=_positive, default=1 << 20,
                       metavar="N", help="most logprob entries one request asks for: "
                       "sequences x max_tokens x (logprobs + 1) + prompt tokens x "
                       "(prompt_logprobs + 1) (1048576)")
    group.add_argument("--allowed-media-domains", metavar="DOMAINS", default="",
                       help="comma-separated domains whose http(s) image URLs are allowed "
                            "(the engine still never fetches them: send images as data: URLs)")


def policy_settings(args: argparse.Namespace) -> Dict[str, Any]:
    """The ServerSettings keyword arguments the flags set.

    Args:
        args: parsed arguments of a parser given add_policy_arguments().
    Returns:
        {field: value} for ServerSettings(...).
    """
    origins = [o.strip() for o in args.allowed_origins.split(",") if o.strip()]
    return {"allowed_origins": tuple(origins), "strict_fields": args.strict_fields,
            "metrics_public": args.metrics_public,
            "cache_salt_by_api_key": args.cache_salt_by_api_key,
            "max_prompts_per_request": args.max_prompts_per_request,
            "max_sequences_per_request": args.max_sequences_per_request,
            "max_logprobs_per_request": args.max_logprobs_per_request,
            "allowed_media_domains": tuple(d.strip() for d in args.allowed_media_domains.split(",")
                                           if d.strip())}
