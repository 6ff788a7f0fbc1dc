"""`_core.token_rows` (a step's embedding and RoPE rows in one call, model/llama.py's decoder
stack path) and `_core.packed_rows`: the rows of the tables bit for bit, from a dense or a packed
embedding; a too-short table answered with the rows it needs; bad input refused unwritten."""

import pytest
import torch

from pagedllm import _core
from pagedllm.model import packed_linear

VOCAB, HIDDEN, HEAD_DIM, ROWS = 37, 24, 8, 50


def _tables(dtype):
    g = torch.Generator().manual_seed(1)
    cos = torch.randn(ROWS, 1, HEAD_DIM, generator=g).to(dtype)
    sin = torch.randn(ROWS, 1, HEAD_DIM, generator=g).to(dtype)
    return cos, sin


def _outputs(n, dtype):
    return (torch.full((n, HIDDEN), 7.0, dtype=dtype), torch.full((n, 1, HEAD_DIM), 7.0, dtype=dtype),
            torch.full((n, 1, HEAD_DIM), 7.0, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("packed", [False, True])
def test_rows_of_the_tables(dtype, packed):
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(VOCAB, HIDDEN, generator=g).to(dtype)
    table = packed_linear.pack(weight, "pagedllm").data if packed else weight
    cos_t, sin_t = _tables(dtype)
    ids = torch.tensor([0, 36, 5, 5, 16, 17])
    pos = torch.tensor([0, 49, 3, 3, 20, 1])
    x, cos, sin = _outputs(len(ids), dtype)
    assert _core.token_rows(x, cos, sin, ids, pos, table, VOCAB, packed, cos_t, sin_t) == 0
    assert torch.equal(x, weight[ids])
    assert torch.equal(cos, cos_t[pos]) and torch.equal(sin, sin_t[pos])
    # no tokens: nothing to do
    e = _outputs(0, dtype)
    assert _core.token_rows(*e, ids[:0], pos[:0], table, VOCAB, packed, cos_t, sin_t) == 0


def test_a_short_table_gets_the_rows_it_needs_and_nothing_is_written():
    weight = torch.randn(VOCAB, HIDDEN)
    cos_t, sin_t = _tables(torch.float32)
    x, cos, sin = _outputs(3, torch.float32)
    ids, pos = torch.tensor([1, 2, 3]), torch.tensor([4, 80, 50])
    assert _core.token_rows(x, cos, sin, ids, pos, weight, VOCAB, False, cos_t, sin_t) == 81
    assert bool((x == 7).all() and (cos == 7).all() and (sin == 7).all())


def test_bad_input_is_refused_unwritten():
    weight = torch.randn(VOCAB, HIDDEN)
    cos_t, sin_t = _tables(torch.float32)
    ids, pos = torch.tensor([1, 2]), torch.tensor([3, 4])

    def call(**change):
        x, cos, sin = _outputs(2, torch.float32)
        args = dict(x=x, cos=cos, sin=sin, ids=ids, positions=pos, embedding=weight, vocab=VOCAB,
                    packed=False, cos_table=cos_t, sin_table=sin_t)
        args.update(change)
        try:
            return _core.token_rows(**args)
        finally:
            assert bool((x == 7).all() and (cos == 7).all() and (sin == 7).all())

    with pytest.raises(IndexError, match=r"embedding id 37 at token 1: expected ids in \[0, 37\)"):
        call(ids=torch.tensor([1, 37]))
    with pytest.raises(IndexError, match="embedding id -1"):
        call(ids=torch.tensor([-1, 2]))
    with pytest.raises(IndexError, match="position -2 at token 0"):
        call(positions=torch.tensor([-2, 4]))
    with pytest.raises(ValueError, match="ids"):
        call(ids=ids.int())
    with pytest.raises(ValueError, match="positions"):
        call(positions=torch.tensor([3]))
    with pytest.raises(ValueError, match="embedding"):
        call(embedding=weight[:30])
    with pytest.raises(ValueError, match="embedding must have 1 dimensions"):
        call(packed=True)  # a dense matrix is not a packed weight
    with pytest.raises(ValueError, match="bfloat16|float32"):
        call(cos_table=cos_t.bfloat16())
    with pytest.raises(ValueError, match="cos"):
        call(cos=torch.full((2, 1, 4), 7.0))


def test_packed_rows_refuses_an_id_out_of_range():
    packed = packed_linear.pack(torch.randn(20, 8), "pagedllm")
    out = torch.full((2, 8), 7.0)
    with pytest.raises(IndexError, match=r"expected ids in \[0, 20\)"):
        _core.packed_rows(out, packed.data, 20, torch.tensor([0, 20]))
    assert bool((out == 7).all())
