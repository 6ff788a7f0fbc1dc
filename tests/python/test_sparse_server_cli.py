"""sparse_attention through the server's extra body field and the CLI flags: good values reach
SamplingParams / EngineConfig, bad ones are a 400 / a usage error naming the key."""

from __future__ import annotations

import argparse

import httpx
import pytest

from pagedllm.commands.common import UsageError, add_engine_args, engine_config
from pagedllm.server import ServerSettings, create_app
from server_fixtures import ScriptedEngine, ServerThread


class RecordingEngine(ScriptedEngine):
    """Keeps the SamplingParams of each request."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen = []

    def add_request(self, request_id, prompt, params=None, **kw):
        self.seen.append(params)
        return super().add_request(request_id, prompt, params, **kw)


@pytest.fixture(scope="module")
def server():
    engine = RecordingEngine(step_delay=0.001)
    with ServerThread(create_app(engine, ServerSettings())) as s:
        s.engine = engine
        yield s


def test_extra_body_field(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        body = {"prompt": "hi", "max_tokens": 3,
                "sparse_attention": {"strategy": "dilated", "stride": 3}}
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        cfg = server.engine.seen[-1].sparse_attention
        assert cfg.strategy == "dilated" and cfg.stride == 3
        r = c.post("/v1/completions", json={**body, "sparse_attention": {"strategy": "dilated",
                                                                         "stride": 0}})
        assert r.status_code == 400
        assert "sparse_attention.stride: expected an integer >= 1" in r.json()["error"]["message"]


def _parse(argv):
    p = argparse.ArgumentParser()
    add_engine_args(p)
    args = p.parse_args(argv)
    args.config = None
    return engine_config(args)


def test_cli_flags():
    cfg = _parse(["--sparse-attention", "random", "--sparse-density", "0.25",
                  "--sparse-seed", "7"]).sparse_attention
    assert (cfg.strategy, cfg.density, cfg.seed) == ("random", 0.25, 7)
    with pytest.raises(UsageError, match=r"sparse_attention.density: .* \(fix --sparse-density\)"):
        _parse(["--sparse-attention", "random", "--sparse-density", "2"])
    with pytest.raises(UsageError, match="give --sparse-attention STRATEGY"):
        _parse(["--sparse-stride", "4"])


def test_yaml_section(tmp_path):
    from pagedllm.config import EngineConfig

    path = tmp_path / "c.yaml"
    path.write_text("sparse_attention:\n  strategy: quest\n  token_budget: 512\n")
    assert EngineConfig.from_yaml(str(path)).sparse_attention.token_budget == 512
    path.write_text("sparse_attention:\n  strategy: quest\n  budget: 512\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['budget'\]"):
        EngineConfig.from_yaml(str(path))
