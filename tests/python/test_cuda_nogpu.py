"""pagedllm._core.cuda where CUDA is compiled in, on any machine (GPU or not): the submodule
exists, reports its devices, and every entry point refuses CPU tensors with a clear ValueError;
without a GPU, the calls that need one raise RuntimeError (never a crash). Also pagedllm.ops
dispatching CPU tensors to the CPU kernels."""

from __future__ import annotations

import math

import pytest
import torch

from pagedllm import _core, ops

cuda_compiled = _core.build_info()["cuda_compiled"]
needs_cuda_build = pytest.mark.skipif(not cuda_compiled, reason="built without nvcc")
no_gpu = _core.build_info()["gpu_count"] == 0


def cpu_args(kv_heads=2, heads=4, head_dim=64, block_size=16, num_blocks=4):
    """A small valid set of CPU tensors for every kernel."""
    g = torch.Generator().manual_seed(0)
    kc = torch.randn(num_blocks, kv_heads, block_size, head_dim, generator=g)
    vc = torch.randn(num_blocks, kv_heads, block_size, head_dim, generator=g)
    return dict(
        key=torch.randn(3, kv_heads, head_dim, generator=g),
        value=torch.randn(3, kv_heads, head_dim, generator=g),
        key_cache=kc, value_cache=vc,
        slot_mapping=torch.tensor([0, 5, -1], dtype=torch.int64),
        query=torch.randn(2, heads, head_dim, generator=g),
        out=torch.empty(2, heads, head_dim),
        block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        context_lens=torch.tensor([20, 7], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32),
    )


@needs_cuda_build
def test_submodule_reports_devices():
    info = _core.build_info()
    assert _core.cuda.device_count() == info["gpu_count"]
    assert _core.cuda.attention_head_dims() == [64, 80, 96, 128, 256]
    assert _core.cuda.current_stream() == 0


@needs_cuda_build
def test_validation_mode_round_trip():
    assert _core.cuda.get_validation() == "sync"
    _core.cuda.set_validation("deferred")
    try:
        assert _core.cuda.get_validation() == "deferred"
    finally:
        _core.cuda.set_validation("sync")
    with pytest.raises(ValueError, match="'sync' or 'deferred'"):
        _core.cuda.set_validation("lazy")


@needs_cuda_build
@pytest.mark.parametrize("kernel", ["reshape_and_cache", "paged_attention_decode",
                                    "paged_attention_prefill", "copy_blocks"])
def test_cpu_tensors_are_refused(kernel):
    a = cpu_args()
    c = _core.cuda
    with pytest.raises(ValueError, match=r"is on cpu; pagedllm\._core\.cuda takes CUDA tensors"):
        if kernel == "reshape_and_cache":
            c.reshape_and_cache(a["key"], a["value"], a["key_cache"], a["value_cache"],
                                a["slot_mapping"])
        elif kernel == "paged_attention_decode":
            c.paged_attention_decode(a["out"], a["query"], a["key_cache"], a["value_cache"],
                                     a["block_tables"], a["context_lens"], 0.125)
        elif kernel == "paged_attention_prefill":
            c.paged_attention_prefill(a["out"], a["query"], a["key_cache"], a["value_cache"],
                                      a["block_tables"], a["cu_seqlens_q"], a["context_lens"],
                                      0.125)
        else:
            c.copy_blocks([a["key_cache"]], torch.tensor([[0, 1]]))


@needs_cuda_build
def test_swap_between_two_host_pools_is_refused():
    a = cpu_args()
    with pytest.raises(ValueError, match="both host memory: use pagedllm._core.swap_blocks"):
        _core.cuda.swap_blocks(a["key_cache"], a["value_cache"], torch.tensor([[0, 1]]))


@needs_cuda_build
def test_non_tensor_arguments_are_refused():
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        _core.cuda.reshape_and_cache([1.0], [1.0], [1.0], [1.0], [0])


@needs_cuda_build
@pytest.mark.skipif(not no_gpu, reason="a GPU is present")
def test_calls_needing_a_device_raise_without_one():
    c = _core.cuda
    with pytest.raises(RuntimeError, match="no CUDA device"):
        c.Streams()
    with pytest.raises(RuntimeError, match="no CUDA device"):
        c.mem_get_info(0)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        c.synchronize(0)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        c.check_errors(0)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        c.compute_capability(0)
    assert c.device_name(0) == ""


def test_ops_dispatches_cpu_tensors_to_the_cpu_kernels():
    a = cpu_args()
    kc, vc = a["key_cache"].clone(), a["value_cache"].clone()
    ops.reshape_and_cache(a["key"], a["value"], kc, vc, a["slot_mapping"])
    kc2, vc2 = a["key_cache"].clone(), a["value_cache"].clone()
    _core.reshape_and_cache(a["key"], a["value"], kc2, vc2, a["slot_mapping"])
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)

    out1, out2 = torch.empty_like(a["out"]), torch.empty_like(a["out"])
    scale = 1 / math.sqrt(64)
    ops.paged_attention_decode(out1, a["query"], kc, vc, a["block_tables"], a["context_lens"],
                               scale)
    _core.paged_attention_decode(out2, a["query"], kc, vc, a["block_tables"], a["context_lens"],
                                 scale)
    assert torch.equal(out1, out2)
    out1.fill_(float("nan"))
    ops.paged_attention_prefill(out1, a["query"], kc, vc, a["block_tables"], a["cu_seqlens_q"],
                                a["context_lens"], scale)
    assert torch.equal(out1, out2)  # one query token per sequence: prefill == decode

    ops.copy_blocks([kc], torch.tensor([[0, 3]]))
    assert torch.equal(kc[3], kc[0])
    host = torch.zeros_like(vc)
    ops.swap_blocks(vc, host, torch.tensor([[1, 2]]))
    assert torch.equal(host[2], vc[1])


def test_ops_reports_missing_cuda_build():
    if cuda_compiled:
        assert ops.cuda_available() == (not no_gpu)
    else:
        assert not ops.cuda_available()
        with pytest.raises(RuntimeError, match="no CUDA kernels"):
            ops._cuda()
