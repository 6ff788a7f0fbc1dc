"""lm-evaluation-harness (the real library, pinned in the 'test' extra) against the server on the
bundled default model, with its ``local-completions`` model and the server's own tokenizer
routes (/tokenizer_info, /tokenize, /detokenize: lm-eval's "remote" tokenizer).

Two tiny local tasks, written by the test (no dataset download: ``dataset_path: json`` with
``data_files``): a multiple-choice task, scored with echo + logprobs (loglikelihood), and a
generate_until task. The right answers are made from the model's own greedy output, so a
correct server scores 1.0 on both; the distractors are strings the model never writes.
"""

import json
import textwrap

import httpx
import lm_eval  # noqa: F401  (pinned in the 'test' extra: a missing install fails, not skips)
import pytest

from pagedllm.server import ServerSettings
from server_fixtures import serve_tiny_model

pytestmark = pytest.mark.slow

QUESTIONS = ["The list type", "A tuple is", "The function", "To read a file,", "Python is a"]
DISTRACTORS = [" zqxj vvkw", " qqqq jjjj xxxx"]


@pytest.fixture(scope="module")
def server():
    from pagedllm.default_model import default_model_path

    settings = ServerSettings(served_model_name="default_model")
    with serve_tiny_model(default_model_path(), settings, num_kv_blocks=128) as s:
        yield s


def greedy(server, prompt: str, max_tokens: int, stop=None) -> str:
    """The model's greedy continuation of `prompt`, tokenized as lm-eval does (no bos)."""
    ids = httpx.post(server.url + "/tokenize", json={"prompt": prompt, "add_special_tokens": False},
                     timeout=30).json()["tokens"]
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stop": stop})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def write_tasks(tmp_path, server) -> None:
    mc, gen = [], []
    for q in QUESTIONS:
        right = greedy(server, q + " ", 3).strip()
        assert right, f"the model wrote nothing after {q!r}"
        mc.append({"question": q, "choices": [right] + [d.strip() for d in DISTRACTORS],
                   "answer": 0})
        answer = greedy(server, q, 8, stop=["\n"])
        assert answer, f"the model wrote nothing after {q!r}"
        gen.append({"question": q, "answer": answer})
    for name, rows in (("mc", mc), ("gen", gen)):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "pagedllm_tiny_mc.yaml").write_text(textwrap.dedent(f"""\
        task: pagedllm_tiny_mc
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {tmp_path / 'mc.jsonl'}
        test_split: test
        output_type: multiple_choice
        doc_to_text: "{{{{question}}}}"
        doc_to_choice: "{{{{choices}}}}"
        doc_to_target: "{{{{answer}}}}"
        metric_list:
          - metric: acc
        """))
    (tmp_path / "pagedllm_tiny_gen.yaml").write_text(textwrap.dedent(f"""\
        task: pagedllm_tiny_gen
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {tmp_path / 'gen.jsonl'}
        test_split: test
        output_type: generate_until
        doc_to_text: "{{{{question}}}}"
        doc_to_target: "{{{{answer}}}}"
        target_delimiter: ""
        generation_kwargs:
          until: ["\\n"]
          max_gen_toks: 8
          do_sample: false
          temperature: 0
        metric_list:
          - metric: exact_match
        """))


def test_lm_eval_multiple_choice_and_generate_until(server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    write_tasks(tmp_path, server)
    results = simple_evaluate(
        model="local-completions",
        model_args={"base_url": server.url + "/v1/completions", "model": "default_model",
                    "tokenizer_backend": "remote", "num_concurrent": 1, "max_retries": 1,
                    "max_length": 512},
        tasks=["pagedllm_tiny_mc", "pagedllm_tiny_gen"],
        task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=True, cache_requests=False)
    res = results["results"]
    assert res["pagedllm_tiny_mc"]["acc,none"] == 1.0
    assert res["pagedllm_tiny_gen"]["exact_match,none"] == 1.0
    # Every choice was scored with a finite loglikelihood (echo + logprobs worked).
    for sample in results["samples"]["pagedllm_tiny_mc"]:
        scores = [resp[0][0] for resp in sample["resps"]]
        assert len(scores) == 3 and all(-1e4 < s < 0 for s in scores)
