"""check_numerics per layer (issue 17): a NaN/Inf in one layer's output for one request fails
that request alone, naming the layer, the position and the request; nothing leaks; the other
requests' tokens equal a run without the fault."""

from __future__ import annotations

import logging

import pytest
import torch

from engine_fixtures import assert_pool_clean, engine_model_dir, mixed_prompts  # noqa: F401
from engine_fixtures import greedy, tok
from pagedllm import LLM
from pagedllm.engine.layer_probe import NumericsProbe
from pagedllm.engine.numerics import EMBEDDINGS

MARK = 511  # the token id whose row the hook poisons
MAX_TOKENS = 8


def _plain_first_bad_layers(layer_outputs, final):
    """The reference: {row: first layer index (-1 = embeddings) with a non-finite element},
    for rows whose final output row has one (plain Python over lists)."""
    found = {}
    for row in range(len(final)):
        if all(v == v and abs(v) != float("inf") for v in final[row]):
            continue
        for layer, out in enumerate(layer_outputs):
            if any(not (v == v and abs(v) != float("inf")) for v in out[row]):
                found[row] = layer - 1
                break
    return found


def test_probe_finds_the_first_bad_layer_of_each_row_like_a_plain_reference():
    gen = torch.Generator().manual_seed(0)
    num_layers, n, hidden = 4, 9, 16
    probe = NumericsProbe(num_layers, torch.device("cpu"))
    x = torch.randn(n, hidden, generator=gen)
    outs = []
    with torch.inference_mode():
        probe.start(n)
        for i in range(-1, num_layers):
            x = x + torch.randn(n, hidden, generator=gen)   # a residual update
            if i == 1:
                x[2, 3] = float("nan")
            if i == 2:
                x[5, 0] = float("inf")
                x[7, :] = 3e38  # finite, but its row sum overflows
            if i == 3:
                x[2, 4] = float("-inf")  # later again in an already bad row
            probe.after_layer(i, x)
            outs.append(x.tolist())
        final = x.clone()
        final[7] = 1.0  # the final norm of a finite row is finite
        faults = probe.faults(final)
    expected = _plain_first_bad_layers(outs, final.tolist())
    assert expected == {2: 1, 5: 2}
    assert dict(zip(faults.rows, faults.layers)) == expected
    # A step with nothing wrong: no finding; the buffer grows for a longer step.
    with torch.inference_mode():
        probe.start(200)
        y = torch.randn(200, hidden, generator=gen)
        for i in range(-1, num_layers):
            probe.after_layer(i, y)
        assert probe.faults(y) is None
    assert EMBEDDINGS == -1


def _poison_layer(llm, layer: int):
    """A hook that writes NaN into layer `layer`'s output rows of the tokens equal to MARK."""
    model = llm.engine.executor.worker.model
    seen = {}

    def remember_ids(module, args):
        seen["ids"] = args[0]

    def poison(module, args, output):
        output[seen["ids"] == MARK] = float("nan")
        return output
    return [model.register_forward_pre_hook(remember_ids),
            model.layers[layer].register_forward_hook(poison)]


@pytest.fixture(scope="module")
def prompts():
    good = mixed_prompts(3, seed=31, lo=10, hi=30)
    bad = mixed_prompts(1, seed=32, lo=20, hi=20)[0]
    bad[12] = MARK
    return good[:1] + [bad] + good[1:]


@pytest.fixture(scope="module")
def reference(engine_model_dir, prompts):
    ref = LLM(engine_model_dir, block_size=4, num_kv_blocks=96)
    return [o.outputs[0].token_ids for o in ref.generate(tok(prompts), greedy(MAX_TOKENS),
                                                         use_tqdm=False)]


@pytest.mark.parametrize("layer", [0, 1])
def test_nan_in_one_layer_fails_that_request_alone(engine_model_dir, prompts, reference, layer,
                                                   caplog):
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=96, check_numerics="fail")
    hooks = _poison_layer(llm, layer)
    with caplog.at_level(logging.ERROR, logger="pagedllm"):
        outs = llm.generate(tok(prompts), greedy(MAX_TOKENS), use_tqdm=False)
    for h in hooks:
        h.remove()
    failed = outs[1]
    assert failed.outputs[0].finish_reason == "error"
    # Named where it started, although a NaN in layer 0 spreads to layer 1 and the logits.
    assert (f"numeric check: NaN/Inf in the output of layer {layer} (model.layers.{layer}) at "
            f"position 12 of request {failed.request_id}") in failed.error, failed.error
    assert any(failed.request_id in r.getMessage() for r in caplog.records)
    others = [outs[0]] + outs[2:]
    assert [o.outputs[0].finish_reason for o in others] == ["length"] * 3
    assert [o.outputs[0].token_ids for o in others] == [reference[0]] + reference[2:]
    assert llm.kv_cache_stats()["num_numeric_errors"] == 1
    assert_pool_clean(llm)
    # Nothing poisoned is served from the prefix cache afterwards.
    (again,) = llm.generate(tok([prompts[1]]), greedy(MAX_TOKENS), use_tqdm=False)
    assert again.outputs[0].finish_reason == "length", again.error
    assert again.outputs[0].token_ids == reference[1]


def test_a_fault_the_logits_never_show_is_found_only_per_layer(engine_model_dir, prompts,
                                                               reference, caplog):
    """NaN in the last layer's output of a prompt token that is not sampled: the logits stay
    finite (check off: the request ends normally, with the reference's tokens); the per-layer
    probe still finds it (warn: logged, the request goes on)."""
    off = LLM(engine_model_dir, block_size=4, num_kv_blocks=96)
    hooks = _poison_layer(off, 1)
    outs = off.generate(tok(prompts), greedy(MAX_TOKENS), use_tqdm=False)
    for h in hooks:
        h.remove()
    assert [o.outputs[0].token_ids for o in outs] == reference
    warn = LLM(engine_model_dir, block_size=4, num_kv_blocks=96, check_numerics="warn")
    hooks = _poison_layer(warn, 1)
    with caplog.at_level(logging.WARNING, logger="pagedllm"):
        outs = warn.generate(tok(prompts), greedy(MAX_TOKENS), use_tqdm=False)
    for h in hooks:
        h.remove()
    warned = [r.getMessage() for r in caplog.records if "numeric check" in r.getMessage()]
    assert len(warned) == 1 and "layer 1 (model.layers.1) at position 12" in warned[0]
    assert f"request {outs[1].request_id}" in warned[0]
    assert [o.outputs[0].finish_reason for o in outs] == ["length"] * 4
    assert_pool_clean(warn)


def test_layer_faults_cross_the_tensor_parallel_reply():
    """Rank 0's reply carries the probe's findings to the engine (pickled, as the pipe does)."""
    import pickle

    from pagedllm.engine.model_runner import ModelOutput
    from pagedllm.engine.numerics import LayerFaults
    from pagedllm.engine.tp_worker import decode_output, encode_output

    faults = LayerFaults(rows=[3, 7], layers=[EMBEDDINGS, 2])
    logits = torch.zeros(2, 5)
    out = decode_output(pickle.loads(pickle.dumps(encode_output(
        ModelOutput(logits, {}, faults)))))
    assert out.layer_faults == faults
    torch.testing.assert_close(out.logits, logits)
    assert decode_output(encode_output(ModelOutput(None, {}))).layer_faults is None


def test_warn_names_each_request_once_whatever_the_steps(engine_model_dir, prompts, caplog):
    # A fault at every step (a layer whose output is always NaN) logged one warning per
    # request and step: a 1000-token run gave 1000 lines for one request.
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=96, check_numerics="warn")
    model = llm.engine.executor.worker.model

    def poison(module, args, output):
        output[:] = float("nan")
        return output
    hook = model.layers[0].register_forward_hook(poison)
    with caplog.at_level(logging.WARNING, logger="pagedllm"):
        outs = llm.generate(tok(prompts), greedy(MAX_TOKENS), use_tqdm=False)
    hook.remove()
    warned = [r.getMessage() for r in caplog.records if "numeric check" in r.getMessage()]
    assert sorted(w.split(" of request ")[1].split(" ")[0] for w in warned) == sorted(
        o.request_id for o in outs)
    assert all("further findings of this request are not logged" in w for w in warned)
    assert all(", step 0)" in w for w in warned)  # steps counted from 0, as the trace does
    assert llm.kv_cache_stats()["num_numeric_errors"] == llm.engine.num_steps > 1


def test_failed_requests_count_no_generated_token(engine_model_dir, prompts):
    # generation_tokens_total counted a token for every sampled row, those of requests the
    # step had just failed (which return no token) included.
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=96, check_numerics="fail")
    hook = llm.engine.executor.worker.model.layers[0].register_forward_hook(
        lambda module, args, output: output.fill_(float("nan")))
    outs = llm.generate(tok(prompts), greedy(MAX_TOKENS), use_tqdm=False)
    hook.remove()
    assert all(o.outputs[0].finish_reason == "error" and not o.outputs[0].token_ids for o in outs)
    assert llm.engine.num_generation_tokens == 0
    outs = llm.generate(tok(prompts), greedy(MAX_TOKENS), use_tqdm=False)
    assert llm.engine.num_generation_tokens == sum(len(o.outputs[0].token_ids) for o in outs)
