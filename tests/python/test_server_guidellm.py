"""guidellm (the real benchmark client, pinned, in a virtual environment of its own: its
dependencies would otherwise change this one's) against the server on the bundled default model:
its default OpenAI HTTP backend, streaming, synthetic prompts tokenized with the bundled
model's own tokenizer (no hub). Every request must succeed.

tests/run_all.sh creates that environment and sets PAGEDLLM_GUIDELLM to its `guidellm`; without
it the test fails (in CI) rather than skipping.
"""

import json
import os
import subprocess

import pytest

from pagedllm.server import ServerSettings
from server_fixtures import serve_tiny_model

pytestmark = pytest.mark.slow

GUIDELLM = os.environ.get("PAGEDLLM_GUIDELLM")


@pytest.fixture(scope="module")
def server():
    from pagedllm.default_model import default_model_path

    settings = ServerSettings(served_model_name="default_model")
    with serve_tiny_model(default_model_path(), settings, num_kv_blocks=128) as s:
        yield s


def test_guidellm_benchmark_runs_clean(server, tmp_path):
    from pagedllm.default_model import default_model_path

    if not GUIDELLM:
        if os.environ.get("CI"):
            pytest.fail("PAGEDLLM_GUIDELLM is not set: tests/run_all.sh installs guidellm")
        pytest.skip("set PAGEDLLM_GUIDELLM to a guidellm executable (tests/run_all.sh does)")
    out = tmp_path / "report.json"
    cmd = [GUIDELLM, "run", "--backend", f"kind=openai_http,target={server.url}",
           "--profile", "kind=concurrent,streams=4",
           "--constraint", "kind=max_requests,count=12",
           "--data", "kind=synthetic_text,prompt_tokens=48,output_tokens=12",
           "--tokenizer", f"kind=hf_auto,model={default_model_path()}",
           "--output", f"kind=json,path={out}", "--disable-console-interactive"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    totals = report["benchmarks"][0]["metrics"]["request_totals"]
    assert totals["successful"] >= 12 and totals["errored"] == 0, totals
    assert totals["incomplete"] == 0, totals
