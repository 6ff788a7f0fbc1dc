#!/usr/bin/env bash
# Creates (once) the virtual environment in which the llama.cpp peer runs: llama-cpp-python,
# which compiles llama.cpp from source on install (CPU only, AVX2/FMA/F16C baseline, no tools),
# plus gguf (to write the benchmark checkpoint as GGUF), safetensors and numpy. About 30 minutes
# on 2 busy cores the first time; later calls reuse it.
#   LLAMACPP_VENV   where to put it (default: ~/.cache/pagedllm/llamacpp-venv)
# Prints the venv's python on the last line.
set -euo pipefail
VENV="${LLAMACPP_VENV:-$HOME/.cache/pagedllm/llamacpp-venv}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
check() { "$VENV/bin/python" -c "import llama_cpp, gguf, safetensors, numpy" >/dev/null 2>&1; }
if [ -x "$VENV/bin/python" ] && check; then
  echo "$VENV/bin/python"
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
  "$VENV/bin/python" -m pip install -q --no-cache-dir "llama-cpp-python==$VERSION"
"$VENV/bin/python" -m pip install -q "gguf>=0.10" "safetensors>=0.4" "numpy>=1.26"
check
echo "$VENV/bin/python"
