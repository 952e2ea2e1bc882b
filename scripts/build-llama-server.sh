#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the peer of benches/multi_model.sh) from
# source, with the flags scripts/install-llama-cpp.sh gives llama-cpp-python:
# GGML_NATIVE and AMX off (llama.cpp's AMX kernels die with SIGILL on these
# machines), AVX-512 with VNNI and AVX2 on. Prints the binary's path.
#
#   scripts/build-llama-server.sh [LLAMA_CPP_SOURCE_DIR]
#
# Without a source directory it takes the llama.cpp that llama-cpp-python's
# source distribution vendors (the same code the other benchmarks' peer runs),
# fetched with pip. Slow (tens of minutes on two cores); not part of setup.sh
# or CI: the multi-model benchmark runs its llama-server rows only when the
# binary exists. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
root="${CARGO_TARGET_DIR:-$PWD/target}/llama-server"
bin="$root/build/bin/llama-server"
if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$root"

src="${1:-}"
if [[ -z "$src" ]]; then
  src="$root/src/llama.cpp"
  if [[ ! -f "$src/CMakeLists.txt" ]]; then
    # pip needs scikit-build-core to read the sdist's metadata; a throwaway
    # venv keeps it (and cmake, ninja) out of the project's .venv.
    [[ -x "$root/venv/bin/python" ]] || python3 -m venv "$root/venv"
    "$root/venv/bin/pip" install --quiet cmake ninja scikit-build-core
    "$root/venv/bin/pip" download --quiet --no-deps --no-build-isolation \
      --no-binary llama-cpp-python llama-cpp-python -d "$root/sdist" >&2
    mkdir -p "$root/src"
    tar -xzf "$root"/sdist/llama_cpp_python-*.tar.gz -C "$root/src"
    mv "$root"/src/llama_cpp_python-*/vendor/llama.cpp "$src"
  fi
fi

cmake_bin=cmake
if ! command -v cmake >/dev/null; then
  [[ -x "$root/venv/bin/cmake" ]] || {
    [[ -x "$root/venv/bin/python" ]] || python3 -m venv "$root/venv"
    "$root/venv/bin/pip" install --quiet cmake ninja
  }
  cmake_bin="$root/venv/bin/cmake"
  export PATH="$root/venv/bin:$PATH"
fi
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi

"$cmake_bin" -S "$src" -B "$root/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
  -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON >&2
"$cmake_bin" --build "$root/build" --target llama-server -j "$(nproc)" >&2
echo "$bin"
