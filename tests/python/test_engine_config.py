"""EngineConfig refuses a bad value of any field where it enters, with a ValueError naming the
field and what was expected (a YAML `seed: abc` or `enable_prefix_caching: "no"` used to pass
`pagedllm info --config` and fail after the model loaded with an unrelated TypeError)."""

from __future__ import annotations

import pytest

from pagedllm.config import EngineConfig


@pytest.mark.parametrize("field,value", [
    ("seed", "abc"), ("seed", 1.5), ("seed", -1), ("seed", 10 ** 25), ("seed", True),
    ("enable_prefix_caching", "no"), ("enable_prefix_caching", None),
    ("enable_prefix_caching", 1),
    ("watermark", "0.1"), ("watermark", None), ("watermark", float("nan")), ("watermark", 1.0),
    ("k_scale", "x"), ("k_scale", float("inf")), ("v_scale", 0.0), ("v_scale", True),
    ("num_kv_blocks", True), ("num_kv_blocks", 2 ** 31), ("num_kv_blocks", 0),
    ("kv_cache_memory_bytes", True), ("kv_cache_memory_bytes", 2 ** 64),
    ("max_num_seqs", 2 ** 31), ("max_num_seqs", True),
    ("max_num_batched_tokens", 3_000_000_000),
    ("max_model_len", 2 ** 31), ("max_model_len", "1024"),
    ("num_threads", 5000), ("num_threads", 0),
    ("block_size", True), ("block_size", 512), ("expected_mean_seq_len", 0),
])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        EngineConfig(**{field: value})


@pytest.mark.parametrize("section,key,field,value", [
    ("runtime", "seed", "seed", "abc"),
    ("kv_cache", "enable_prefix_caching", "enable_prefix_caching", "no"),
    ("kv_cache", "watermark", "watermark", "0.1"),
    ("scheduler", "max_num_batched_tokens", "max_num_batched_tokens", 3_000_000_000),
])
def test_yaml_values_are_checked_before_any_model_loads(section, key, field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        EngineConfig.from_dict({section: {key: value}})


def test_boundary_values_pass():
    c = EngineConfig(seed=2 ** 63 - 1, watermark=0.0, k_scale=0.5, v_scale=2, num_kv_blocks=1,
                     max_num_seqs=1, max_num_batched_tokens=1 << 24, enable_prefix_caching=False,
                     num_threads=1024, max_model_len=2)
    assert c.seed == 2 ** 63 - 1 and c.max_num_batched_tokens == 1 << 24
    assert EngineConfig().max_num_batched_tokens == 2048


def test_the_package_exports_every_public_name():
    # EngineConfig (LLM.from_config's argument) was only importable from pagedllm.config.
    import pagedllm

    for name in pagedllm.__all__:
        assert getattr(pagedllm, name) is not None
    from pagedllm import BeamSearchParams, EngineConfig  # noqa: F401
