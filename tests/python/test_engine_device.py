"""Device selection, GPU KV budget arithmetic and the host swap pool (CPU paths; the GPU path of
HostSwapPool runs in test_cuda_kernels' stream tests' style on a GPU)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from pagedllm import ops
from pagedllm.engine.device import kv_budget_bytes, model_dtype_for, resolve_device
from pagedllm.engine.host_swap import HostSwapPool

GIB = 1 << 30


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    auto = resolve_device("auto")
    assert auto.type == ("cuda" if ops.cuda_available() and torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device must be one of"):
        resolve_device("tpu")
    if not (ops.cuda_available() and torch.cuda.is_available()):
        with pytest.raises(RuntimeError, match="use device='cpu'"):
            resolve_device("cuda")


def fake_gpus(monkeypatch, count: int, current: int = 0) -> None:
    """As on a machine with `count` visible GPUs and the CUDA kernels built in, `current` the
    current one (no GPU needed: the queries resolve_device makes are replaced)."""
    monkeypatch.setattr(ops, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)


def test_resolve_device_gives_cuda_an_index(monkeypatch):
    # torch >= 2.11's set_device refuses a device without an index.
    fake_gpus(monkeypatch, 2, current=1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    with pytest.raises(RuntimeError, match=r"only 2 CUDA GPU\(s\) are visible"):
        resolve_device("cuda:2")


def test_resolve_device_by_head_dim(monkeypatch, caplog):
    # A GPU with kernels for head dims 64 and 128.
    from pagedllm.engine import device as devices

    fake_gpus(monkeypatch, 1)
    monkeypatch.setattr(devices, "cuda_head_dims", lambda: (64, 128))
    assert resolve_device("auto", head_dim=128) == torch.device("cuda", 0)
    with caplog.at_level("INFO", logger="pagedllm"):
        assert resolve_device("auto", head_dim=32) == torch.device("cpu")
    assert "head_dim 32 is not compiled" in caplog.text
    with pytest.raises(RuntimeError, match=r"head_dim 32 is not compiled .*supported: 64, 128"):
        resolve_device("cuda", head_dim=32)
    assert resolve_device("cuda", head_dim=64) == torch.device("cuda", 0)
    assert resolve_device("cpu", head_dim=32) == torch.device("cpu")


def test_checkpoint_head_dim(tmp_path):
    from pagedllm.engine.device import checkpoint_head_dim

    def write(cfg):
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        return checkpoint_head_dim(tmp_path)

    assert write({"hidden_size": 256, "num_attention_heads": 4}) == 64
    assert write({"hidden_size": 256, "num_attention_heads": 4, "head_dim": 128}) == 128
    assert write({"text_config": {"hidden_size": 64, "num_attention_heads": 4}}) == 16  # Mllama
    assert write({"hidden_size": 256}) is None
    assert write({"hidden_size": 250, "num_attention_heads": 4}) is None  # not a multiple
    assert write([1, 2]) is None
    (tmp_path / "config.json").write_text("{not json")
    assert checkpoint_head_dim(tmp_path) is None
    assert checkpoint_head_dim(tmp_path / "missing") is None
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "config.json")  # refused, not waited on (as the loader does)
    assert checkpoint_head_dim(fifo) is None
    # The bundled model: 32, which the CUDA kernels do not have ("auto" keeps it on the CPU).
    from pagedllm.default_model import default_model_path

    assert checkpoint_head_dim(default_model_path()) == 32


def test_model_dtype():
    assert model_dtype_for(torch.device("cpu")) == torch.float32
    assert model_dtype_for(torch.device("cpu"), torch.bfloat16) == torch.bfloat16


def test_kv_budget():
    # 80 GiB card, 20 GiB in use, 90%: 72 - 20 = 52 GiB (minus 1 GiB reserve)
    assert kv_budget_bytes(60 * GIB, 80 * GIB, 0.9) == 52 * GIB
    assert kv_budget_bytes(60 * GIB, 80 * GIB, 0.9, reserve_bytes=GIB) == 51 * GIB
    with pytest.raises(ValueError, match="no GPU memory left for the KV cache"):
        kv_budget_bytes(10 * GIB, 80 * GIB, 0.5)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        kv_budget_bytes(10 * GIB, 80 * GIB, 1.5)


def test_host_swap_pool_round_trip_on_cpu():
    gen = torch.Generator().manual_seed(0)
    device_pool = torch.randn(10, 2, 2, 4, 16, 8, generator=gen)
    original = device_pool.clone()
    host = HostSwapPool(device_pool, 4)
    assert host.num_blocks == 4 and host.bytes_per_block == 2 * 2 * 4 * 16 * 8 * 4
    assert host.swap_out(np.array([[7, 0], [2, 3], [9, 1]])) == 0
    device_pool[[7, 2, 9]] = 0.0  # the device blocks are reused meanwhile
    assert host.swap_in(np.array([[0, 1], [3, 3], [1, 5]])) == 0
    assert torch.equal(device_pool[1], original[7])
    assert torch.equal(device_pool[3], original[2])
    assert torch.equal(device_pool[5], original[9])
    assert host.swap_out(np.zeros((0, 2), np.int64)) == 0  # nothing to move
    with pytest.raises((IndexError, ValueError)):
        host.swap_in(np.array([[4, 0]]))  # host block 4 is outside the pool of 4
    with pytest.raises(ValueError, match="num_host_blocks"):
        HostSwapPool(device_pool, 0)

@pytest.mark.gpu
def test_host_swap_pool_on_gpu_with_streams():
    from pagedllm import _core

    streams = _core.cuda.Streams()
    device_pool = torch.randn(10, 2, 2, 4, 16, 8, device="cuda")
    original = device_pool.cpu()
    host = HostSwapPool(device_pool, 4, streams)
    assert host.pool.is_pinned()
    t_out = host.swap_out(np.array([[7, 0], [2, 1]]), after=streams.record_compute())
    assert t_out > 0
    streams.compute_wait(t_out)
    with ops.cuda_stream(streams.compute_stream):
        device_pool[[7, 2]] = 0.0  # reuse only after the copy-out
    t_in = host.swap_in(np.array([[0, 1], [1, 3]]), after=streams.record_compute())
    streams.synchronize(t_in)
    assert torch.equal(device_pool[1].cpu(), original[7])
    assert torch.equal(device_pool[3].cpu(), original[2])
