#!/usr/bin/env bash
# Installs a CUDA 13.0 compiler from PyPI wheels, no GPU and no driver needed:
# nvcc, ptxas, nvlink, fatbinary (nvidia-cuda-nvcc), their headers (-crt,
# -runtime, -cccl), NVVM, and NVRTC (for the run-time fallback and its
# tests). Versions are pinned to 13.0: the GPU machines this project may get
# run driver 580 / CUDA 13.0, which loads CUBINs and PTX of 13.0 but not of
# later toolkits.
#
# Installs into $SWITCHYARD_CUDA_HOME (default ~/.cache/switchyard/cuda-13.0)
# once; later runs only print the path. Prints the toolkit root (the folder
# holding bin/nvcc) on stdout; scripts/cuda-env.sh derives the rest.
set -euo pipefail
cd "$(dirname "$0")/.."

home=${SWITCHYARD_CUDA_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard/cuda-13.0}
root="$home/nvidia/cu13"
stamp="$home/.installed-13.0.88"

if [[ ! -f $stamp ]]; then
  python=.venv/bin/python
  [[ -x $python ]] || python=python3
  # --target keeps the toolkit out of the venv; one folder per toolkit version.
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$home" \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88 >&2
  touch "$stamp"
fi
[[ -x $root/bin/nvcc ]] || { echo "install-cuda-toolchain: no nvcc under $root" >&2; exit 1; }
echo "$root"
