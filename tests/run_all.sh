#!/usr/bin/env bash
# Installs pagedllm and its test dependencies into the current Python environment, then runs
# the whole test suite:
#   1. C++ unit tests under CTest (Release build),
#   2. the same tests built with -fsanitize=address,undefined,
#   3. a consumer project built against the installed CMake package (find_package(pagedllm)),
#   4. the Python tests (pytest), against the installed wheel.
# Usage: bash tests/run_all.sh        (PYTHON=/path/to/python to pick an interpreter)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
BUILD="${PAGEDLLM_TEST_BUILD_DIR:-$ROOT/build/tests}"
JOBS="${JOBS:-$(nproc)}"
step() { printf '\n=== %s ===\n' "$*"; }

step "system packages"
# GoogleTest for the C++ tests; RocksDB so that the block store's rocksdb backend is built and
# tested (the wheel and the core build without it: PAGEDLLM_ROCKSDB=AUTO).
if [ ! -e /usr/include/gtest/gtest.h ] || [ ! -e /usr/include/rocksdb/db.h ]; then
  if command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libgtest-dev librocksdb-dev >/dev/null
  elif [ ! -e /usr/include/gtest/gtest.h ]; then
    echo "GoogleTest is missing: install libgtest-dev (or your OS's googletest package)" >&2
    exit 1
  else
    echo "RocksDB is missing: the rocksdb block store backend is not built or tested" >&2
  fi
fi

step "python packages (torch pinned to the CPU wheel)"
"$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q "$ROOT[test]"

step "C++ unit tests (Release)"
cmake -S "$ROOT" -B "$BUILD/release" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPAGEDLLM_BUILD_TESTS=ON -DPAGEDLLM_CUDA=OFF >/dev/null
cmake --build "$BUILD/release" -j "$JOBS"
ctest --test-dir "$BUILD/release" --output-on-failure -j "$JOBS"

step "C++ unit tests (AddressSanitizer + UBSan)"
cmake -S "$ROOT" -B "$BUILD/asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPAGEDLLM_SANITIZE=ON \
  -DPAGEDLLM_BUILD_TESTS=ON -DPAGEDLLM_CUDA=OFF >/dev/null
cmake --build "$BUILD/asan" -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$BUILD/asan" --output-on-failure -j "$JOBS"

step "block store backends compiled into the wheel"
"$PY" -c "import pagedllm._core as c; print(c.build_info()['block_store_backends'])"
if [ -e /usr/include/rocksdb/db.h ]; then
  "$PY" -c "import pagedllm._core as c; b = c.build_info()['block_store_backends']; assert 'rocksdb' in b, b"
fi

step "CUDA build path (compiled when nvcc is present; nothing runs it without a GPU)"
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then
  # The wheel above was built with PAGEDLLM_CUDA=AUTO: it must contain the CUDA code and still
  # import here, where there is no driver (cudart is linked statically).
  "$PY" -c "import pagedllm._core as c; i = c.build_info(); assert i['cuda_compiled'], i; print('CUDA compiled in; GPUs visible:', i['gpu_count'])"
else
  echo "nvcc not found: the CUDA build path is not exercised on this machine"
fi

step "CMake package consumer (find_package(pagedllm))"
rm -rf "$BUILD/prefix"
cmake --install "$BUILD/release" --component dev --prefix "$BUILD/prefix" >/dev/null
cmake -S "$ROOT/tests/cmake_consumer" -B "$BUILD/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$BUILD/prefix" >/dev/null
cmake --build "$BUILD/consumer"
"$BUILD/consumer/consumer"

step "guidellm in a virtual environment of its own (its dependencies would change ours)"
GUIDELLM_VENV="$BUILD/guidellm-venv"
if [ ! -x "$GUIDELLM_VENV/bin/guidellm" ]; then
  "$PY" -m venv "$GUIDELLM_VENV"
  "$GUIDELLM_VENV/bin/python" -m pip install -q "torch==2.13.0" "guidellm==0.8.1"
fi
export PAGEDLLM_GUIDELLM="$GUIDELLM_VENV/bin/guidellm"

step "Python tests"
cd "$ROOT"
"$PY" -m pytest tests/python -q
