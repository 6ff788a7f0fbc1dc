#!/usr/bin/env bash
# One call on a GPU device machine (issues 8 and 12's verification): builds pagedllm with the CUDA
# kernels for sm_90, runs the CUDA tests (and the CPU kernel tests they rely on), then the GPU
# benchmark. Everything is logged under $OUT:
#   env.txt        nvidia-smi, nvcc, python / torch versions
#   build.log      cmake configure + build (with ptxas resource usage of every kernel)
#   tests.log      pytest output; junit.xml its machine-readable result
#   bench.log      the benchmark tables; bench.json, cross_bench.json (cross-attention) their figures
#   sanitizer.log  compute-sanitizer memcheck / racecheck of a few cases (when available)
#   nsys.log       nsys capture of an engine step window and its NVTX summary (when available)
#   summary.txt    one line per step with its exit status
# Budget: ~8 minutes on a 16-core H200 machine (build ~30 s, tests ~2-4 min, bench ~1 min);
# each step has its own timeout and a failing step does not stop the later ones.
# Usage (repository root):  OUT=/some/dir bash benchmarks/gpu/run_on_device.sh
# SKIP="engine_bench cpu_kernel_tests" (step names, space-separated) leaves those steps out.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
cd "$ROOT"
PY="${PYTHON:-python3}"
BUILD="$ROOT/build/gpu"
export PYTHONUNBUFFERED=1
: >"$OUT/summary.txt"

step() {  # step NAME TIMEOUT_S LOG COMMAND... (skipped when NAME is in $SKIP)
  local name="$1" limit="$2" log="$3"
  shift 3
  if [[ " ${SKIP:-} " == *" $name "* ]]; then
    echo "$name: skipped" | tee -a "$OUT/summary.txt"
    return 0
  fi
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s)" | tee -a "$OUT/$log"
  timeout --signal=TERM --kill-after=15 "$limit" "$@" >>"$OUT/$log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
  tail -n 25 "$OUT/$log"
  return $rc
}

{
  nvidia-smi || true
  nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version || true
  "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
  "$PY" -m pip list 2>/dev/null | grep -iE "^(torch|numpy|pytest|hypothesis|pybind11|cmake|ninja) " || true
  nproc
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

build_ok=0
# (timeout runs programs, not shell functions: the configure command is spelled out here)
if step configure 120 build.log cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
     -DPAGEDLLM_BUILD_PYTHON=ON -DPAGEDLLM_DEV_INPLACE=ON -DPAGEDLLM_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90 -DPython_EXECUTABLE="$(command -v "$PY")" \
     -DCMAKE_CUDA_FLAGS="-Xptxas -v" && \
   step build 420 build.log cmake --build "$BUILD" -j "$(nproc)"; then
  build_ok=1
fi

if [ "$build_ok" = 1 ]; then
  export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
  # Test files spread over 8 workers where pytest-xdist is installed (one GPU serves them all).
  PAR=()
  if "$PY" -c "import xdist" 2>/dev/null; then
    PAR=(-n 8)
    # 2 CPU threads per worker for the tests' CPU references (torch would take every core in
    # each of the 8 processes); the steps after the tests set no such limit.
    TEST_ENV=(env OMP_NUM_THREADS=2 PAGEDLLM_NUM_THREADS=2)
  else
    TEST_ENV=(env)
  fi
  # A test that hangs fails alone (with its stack) where pytest-timeout is installed.
  if "$PY" -c "import pytest_timeout" 2>/dev/null; then
    PAR+=(--timeout 90 -o timeout_method=thread)
  fi
  step import 60 tests.log "$PY" -c "import pagedllm._core as c; i = c.build_info(); print(i); assert i['gpu_count'] > 0, 'no GPU visible'"
  # Which C++ runtime the process maps once torch, _core and a CUDA context are in, and an error
  # message with numbers from the CPU and the CUDA paths (each in its own process).
  step error_paths 60 tests.log "$PY" -c "
import re, torch, numpy as np
from pagedllm import _core
from pagedllm.engine.host_swap import HostSwapPool
torch.zeros(1, device='cuda')
print(sorted({l.split()[-1] for l in open('/proc/self/maps') if re.search('libstdc|libgcc_s', l)}))
try:
    HostSwapPool(torch.zeros(10, 2, 2, 4, 16, 8), 4).swap_in(np.array([[4, 0]]))
except (IndexError, ValueError) as e:
    print('cpu path:', e)
"
  step error_paths_cuda 60 tests.log "$PY" -c "
import torch
from pagedllm import ops
kc = torch.zeros(4, 2, 16, 72, dtype=torch.float16, device='cuda')
q = torch.zeros(2, 4, 72, dtype=torch.float16, device='cuda')
try:
    ops.paged_attention_decode(torch.empty_like(q), q, kc, kc,
                               torch.zeros(2, 4, dtype=torch.int32, device='cuda'),
                               torch.ones(2, dtype=torch.int32, device='cuda'), 0.1)
except ValueError as e:
    print('cuda path:', e)
"
  # The engine on the GPU (issue 12): parity with transformers, swap under pressure, the
  # swap copies on their own stream (chrome trace kept under $OUT/traces).
  PAGEDLLM_TRACE_DIR="$OUT/traces" step engine_tests 150 tests.log "${TEST_ENV[@]}" "$PY" -m pytest \
    -q -rfEs -p no:cacheprovider "${PAR[@]}" --junitxml="$OUT/junit_engine.xml" \
    tests/python/test_engine_gpu.py \
    tests/python/test_engine_device.py tests/python/test_diagnostics_gpu.py \
    tests/python/test_tensor_parallel_gpu.py tests/python/test_mllama_gpu.py
  # -v: each result on its own line as it comes (a run stopped by its limit still names them).
  step tests 300 tests.log "${TEST_ENV[@]}" "$PY" -m pytest -v -rfEs --durations=25 \
    -p no:cacheprovider "${PAR[@]}" \
    --junitxml="$OUT/junit.xml" tests/python/test_cuda_kernels.py tests/python/test_cuda_nogpu.py \
    tests/python/test_cuda_sparse.py tests/python/test_cuda_cross_attention.py
  # Issue 17: nsys records exactly the --profile-cuda-steps window (when nsys is installed).
  if command -v nsys >/dev/null; then
    step nsys_window 180 nsys.log nsys profile --capture-range=cudaProfilerApi \
      --capture-range-end=stop --trace=cuda,nvtx -o "$OUT/pagedllm-steps" --force-overwrite true \
      "$PY" -m pagedllm bench --device cuda --num-prompts 16 --input-len 64 --output-len 32 \
      --no-progress --profile-cuda-steps 10:15 --profile-layers
    step nsys_stats 120 nsys.log nsys stats --report nvtx_sum "$OUT/pagedllm-steps.nsys-rep"
  fi
  # Memory and shared-memory race checks of one case per kernel (Firecracker machines only).
  if command -v compute-sanitizer >/dev/null; then
    step memcheck 150 sanitizer.log compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$PY" -m pytest -q -x -p no:cacheprovider \
      "tests/python/test_cuda_kernels.py::test_decode_every_head_dim_and_dtype[f16-fp8-128]" \
      "tests/python/test_cuda_kernels.py::test_decode_long_contexts_split_k[group1-lens1]" \
      "tests/python/test_cuda_kernels.py::test_prefill_every_head_dim_and_dtype[g32x8-fp8-bf16-128]" \
      "tests/python/test_cuda_kernels.py::test_prefill_every_head_dim_and_dtype[g7x1-auto-bf16-80]" \
      "tests/python/test_cuda_kernels.py::test_prefill_every_head_dim_and_dtype[g64x1-auto-f32-64]" \
      "tests/python/test_cuda_kernels.py::test_reshape_and_cache_matches_cpu_bit_for_bit[i64-f16-fp8]" \
      "tests/python/test_cuda_kernels.py::test_copy_blocks_matches_torch" "tests/python/test_cuda_kernels.py::test_bad_block_id_raises_and_the_context_survives" \
      "tests/python/test_cuda_cross_attention.py::test_cross_ranges_in_one_tile" \
      "tests/python/test_cuda_cross_attention.py::test_cross_decode_and_long_contexts[fp8_e4m3]" \
      "tests/python/test_cuda_cross_attention.py::test_cross_bad_range_raises_and_the_context_survives[past_end-bf16]"
    step racecheck 120 sanitizer.log compute-sanitizer --tool racecheck --error-exitcode 9 \
      "$PY" -m pytest -q -x -p no:cacheprovider \
      "tests/python/test_cuda_kernels.py::test_decode_every_head_dim_and_dtype[bf16-auto-128]" \
      "tests/python/test_cuda_kernels.py::test_prefill_every_head_dim_and_dtype[g32x8-fp8-bf16-256]" \
      "tests/python/test_cuda_kernels.py::test_prefill_every_head_dim_and_dtype[g8x8-auto-f16-96]" \
      "tests/python/test_cuda_kernels.py::test_decode_every_group[8x8]" \
      "tests/python/test_cuda_kernels.py::test_decode_every_group[20x4]"
  fi
  step bench 240 bench.log "$PY" benchmarks/gpu/bench_cuda_attention.py --out "$OUT/bench.json"
  step cross_bench 120 bench.log "$PY" benchmarks/gpu/bench_cuda_cross_attention.py \
    --out "$OUT/cross_bench.json"
  step engine_bench 240 bench.log "$PY" benchmarks/gpu/bench_gpu_engine.py --quick \
    --out "$OUT/engine_bench.json"
  step cpu_kernel_tests 150 tests.log "$PY" -m pytest -q -x -p no:cacheprovider \
    tests/python/test_kernels_attention.py tests/python/test_kernels_cross_attention.py
fi
echo "--- summary"
cat "$OUT/summary.txt"
! grep -v ": exit 0 " "$OUT/summary.txt" | grep -q .
