#!/usr/bin/env bash
# The project's test command: Rust unit and integration tests (the module-cycle
# check among them, tools/module-cycles/tests/workspace.rs), then the
# Python checks against the real binary (numerics against the NumPy
# reference, tokenization against an independent tokenizer).
# Run scripts/setup.sh once first.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked
cargo test --release --locked --workspace
# The CUDA backend without a GPU (issue 34): every kernel compiled for
# sm_80/89/90 under the ptxas gate, the cuda-feature tests (NVRTC fallback
# included), the binary type-checked with the feature, and the GPU check's
# dry run. The toolkit comes from PyPI (scripts/install-cuda-toolchain.sh).
cuda_root=$(scripts/install-cuda-toolchain.sh)
scripts/build-cuda-kernels.sh "${CARGO_TARGET_DIR:-$PWD/target}/cuda-kernels"
export SWITCHYARD_CUDA_KERNELS_DIR="${CARGO_TARGET_DIR:-$PWD/target}/cuda-kernels"
LD_LIBRARY_PATH="$cuda_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" SWITCHYARD_REQUIRE_NVRTC=1 \
  cargo test --release --locked -p switchyard-kernels --features cuda --lib cuda
cargo check --release --locked --features cuda
scripts/gpu-check.sh --dry-run
SWITCHYARD_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/switchyard" .venv/bin/python -m pytest -q tests/python "$@"
