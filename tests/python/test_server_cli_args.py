"""`pagedllm serve`'s HTTP-policy flags (issue 20) become ServerSettings."""

import pytest

from pagedllm import cli
from pagedllm.server.cli_args import policy_settings
from pagedllm.server.state import ServerSettings


def parse(*argv):
    return cli.build_parser().parse_args(["serve", *argv])


def test_defaults_are_closed():
    s = ServerSettings(**policy_settings(parse()))
    assert s.allowed_origins == () and not s.strict_fields and not s.metrics_public
    assert not s.cache_salt_by_api_key
    assert (s.max_prompts_per_request, s.max_sequences_per_request) == (256, 256)


def test_flags_set_the_settings():
    args = parse("--allowed-origins", "https://a.example, https://b.example", "--strict-fields",
                 "--metrics-public", "--cache-salt-by-api-key", "--max-prompts-per-request",
                 "4", "--max-sequences-per-request", "8", "--max-logprobs-per-request", "99")
    s = ServerSettings(**policy_settings(args))
    assert s.allowed_origins == ("https://a.example", "https://b.example")
    assert s.strict_fields and s.metrics_public and s.cache_salt_by_api_key
    assert (s.max_prompts_per_request, s.max_sequences_per_request,
            s.max_logprobs_per_request) == (4, 8, 99)


def test_bad_limits_are_usage_errors(capsys):
    with pytest.raises(SystemExit):
        parse("--max-sequences-per-request", "0")
    assert "positive integer" in capsys.readouterr().err


def test_the_cli_does_not_import_fastapi_to_parse():
    import subprocess
    import sys

    code = "import sys, pagedllm.cli as c; c.build_parser(); print('fastapi' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
