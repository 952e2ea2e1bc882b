#!/usr/bin/env bash
# Builds llama-cpp-python (the benchmark peer) into ./.venv from source.
# GGML_NATIVE and the AMX paths are off: llama.cpp's AMX kernels die with
# SIGILL on these machines. AVX-512 (with VNNI) and AVX2 are on explicitly.
set -euo pipefail
cd "$(dirname "$0")/.."

if .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
  exit 0
fi
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
-DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON -DLLAMA_CURL=OFF" \
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  .venv/bin/python -m pip install --quiet numpy llama-cpp-python
