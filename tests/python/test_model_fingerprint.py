"""The persistent tier's model fingerprint covers every byte of the weights (an edit the old
sampled fingerprint missed let a store serve another model's K/V), and its digest cache is
reused only while a file is unchanged."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from engine_fixtures import engine_model_dir, mixed_prompts, tok  # noqa: F401
from engine_fixtures import greedy as greedy_params
from pagedllm import LLM
from pagedllm.engine import model_fingerprint as mf


def _weights(d):
    return [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".safetensors")]


def _flip_weight_byte(path, frac=0.37):
    """Changes one byte of the tensor data (past the header), size kept."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        size = os.path.getsize(path)
        pos = 8 + n + int((size - 8 - n) * frac)
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))


@pytest.fixture
def model_copy(engine_model_dir, tmp_path):  # noqa: F811
    d = tmp_path / "model"
    shutil.copytree(engine_model_dir, d)
    return str(d)


class CountingCore:
    def __init__(self, core):
        self.core = core
        self.calls = []

    def file_digest(self, path):
        self.calls.append(path)
        return self.core.file_digest(path)


def test_one_byte_anywhere_in_the_weights_changes_it(tmp_path):
    """16 MiB of weights: the old fingerprint read 16 slices of 64 KiB and missed bytes between
    them (0.37 and 0.99 of the way lie between slices)."""
    import torch
    from safetensors.torch import save_file

    d = tmp_path / "big"
    d.mkdir()
    (d / "config.json").write_text('{"hidden_size": 8}')
    g = torch.Generator().manual_seed(0)
    save_file({"w": torch.randn(4 << 20, generator=g)}, str(d / "model.safetensors"))
    before = mf.model_fingerprint(str(d), ["a"])
    for frac in (0.37, 0.99):
        _flip_weight_byte(str(d / "model.safetensors"), frac)
        after = mf.model_fingerprint(str(d), ["a"])
        assert after != before
        before = after
    assert mf.model_fingerprint(str(d), ["b"]) != before  # the parts count too


def test_the_digest_cache_is_used_until_the_file_changes(model_copy, tmp_path, monkeypatch):
    cache = str(tmp_path / mf.DIGEST_CACHE_NAME)
    fp = mf.model_fingerprint(model_copy, ["x"], cache)
    counting = CountingCore(mf._core)
    monkeypatch.setattr(mf, "_core", counting)
    assert mf.model_fingerprint(model_copy, ["x"], cache) == fp
    assert counting.calls == []  # read from the cache
    # An edit that keeps the size and puts the mtime back still changes the ctime.
    w = _weights(model_copy)[0]
    st = os.stat(w)
    _flip_weight_byte(w)
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))
    fp2 = mf.model_fingerprint(model_copy, ["x"], cache)
    assert fp2 != fp and counting.calls == [os.path.realpath(w)]
    assert mf.model_fingerprint(model_copy, ["x"], None) == fp2  # the cache changes nothing


@pytest.mark.parametrize("content", ["not json", "[]", '{"version": 1, "files": []}',
                                     '{"version": 1, "files": {"/x": 3}}'])
def test_a_damaged_cache_is_ignored_and_rewritten(model_copy, tmp_path, content):
    cache = tmp_path / mf.DIGEST_CACHE_NAME
    want = mf.model_fingerprint(model_copy, ["x"])
    cache.write_text(content)
    assert mf.model_fingerprint(model_copy, ["x"], str(cache)) == want
    data = json.loads(cache.read_text())
    assert data["version"] == 1 and len(data["files"]) == len(_weights(model_copy))


def test_a_store_never_serves_an_edited_models_blocks(model_copy, tmp_path):
    """Two checkpoints equal but for one weight byte: the second gets no disk hit from the
    first's records, and its outputs are its own."""
    prompts = mixed_prompts(4, seed=21, lo=40, hi=90)
    store = str(tmp_path / "kv")
    params = greedy_params(6)

    def run(path, **kw):
        llm = LLM(path, block_size=8, num_kv_blocks=256, **kw)
        outs = [o.outputs[0].token_ids for o in llm.generate(tok(prompts), params,
                                                                 use_tqdm=False)]
        stats = llm.kv_cache_stats()
        if llm.engine.tier is not None:
            llm.engine.tier.flush()
        llm.engine.shutdown()
        return outs, stats

    run(model_copy, persistence={"storage_path": store})
    _flip_weight_byte(_weights(model_copy)[0])
    want, _ = run(model_copy, enable_prefix_caching=False)
    got, stats = run(model_copy, persistence={"storage_path": store})
    assert stats["disk_hit_tokens"] == 0, stats
    assert got == want
    assert os.path.exists(os.path.join(store, mf.DIGEST_CACHE_NAME))
