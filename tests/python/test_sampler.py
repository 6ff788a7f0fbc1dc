"""Sampler units: logit penalties against a direct computation, logprobs of a batch."""

import torch

from pagedllm.engine.sampler import Sampler, SampleTarget
from pagedllm.engine.sequence import Request
from pagedllm.sampling_params import SamplingParams


def target(row, prompt, output, **params):
    req = Request(str(row), None, prompt, SamplingParams(**params))
    seq = req.seqs[0]
    seq.token_ids.extend(output)
    return SampleTarget(row, seq, req.params)


def test_penalties_match_their_definition():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 12, generator=g) * 3
    prompt, output = [1, 2, 2, 11], [3, 3, 5]
    params = dict(temperature=0.0, repetition_penalty=1.7, frequency_penalty=0.4,
                  presence_penalty=0.25)
    targets = [target(0, prompt, output, **params), target(1, [4], [], temperature=0.0)]
    got = Sampler._apply_penalties(logits, targets)
    want = logits.clone()
    row = want[0]
    for t in set(prompt + output):  # repetition: prompt and output tokens alike
        row[t] = row[t] / 1.7 if row[t] > 0 else row[t] * 1.7
    for t in set(output):           # frequency / presence: output tokens only
        row[t] -= 0.4 * output.count(t) + 0.25
    assert torch.allclose(got, want)
    assert torch.equal(got[1], logits[1])  # no penalty asked: untouched
    # the prompt mask is made once per request and reused
    mask = targets[0].seq.request.prompt_token_mask
    Sampler._apply_penalties(logits, targets)
    assert targets[0].seq.request.prompt_token_mask is mask


def test_batch_logprobs_ranks_and_top_k():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 1.0, 2.0]])
    targets = [target(0, [0], [], temperature=0.0, logprobs=2),
               target(1, [0], [], temperature=0.0, logprobs=0)]
    a, b = Sampler(eos_token_ids=[]).sample(logits, targets)
    lp = torch.log_softmax(logits, dim=-1)
    assert a.token_id == 1 and a.rank == 1 and abs(a.logprob - float(lp[0, 1])) < 1e-6
    assert [t for t, _ in a.top] == [1, 2]
    assert b.token_id == 0 and b.rank == 1 and b.top is None


def test_top_k_keeps_the_tokens_tied_with_the_kth_value():
    # top_k cut by sorted position, so which of two tied tokens survived top_k=2 depended on
    # the sort order; transformers' TopKLogitsWarper and vLLM keep every token tied with the
    # k-th largest value (top-p then cuts ties by sort order, in both).
    from transformers import TopKLogitsWarper

    x = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0], [0.5, 0.5, 0.5, 0.5, -1.0]])
    for top_k in (1, 2, 3, 10):
        targets = [target(r, [1], [], temperature=1.0, top_k=top_k) for r in (0, 1)]
        got = Sampler._probs(x.clone(), targets) > 0
        want = TopKLogitsWarper(min(top_k, 5))(None, x.clone()) > -1e30
        assert torch.equal(got, want), (top_k, got, want)
