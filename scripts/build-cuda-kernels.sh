#!/usr/bin/env bash
# Compiles every CUDA kernel (kernels/cuda/*.cu) to CUBINs for sm_80
# (A100), sm_89 (L4, RTX 40) and sm_90 (H100, H200), plus PTX for
# compute_90 (what newer GPUs JIT), then runs the compile gate
# (scripts/cuda-ptxas-gate.py against kernels/cuda/budgets.txt).
#
# usage: scripts/build-cuda-kernels.sh [OUT_DIR]   (default target/cuda-kernels)
# Writes OUT_DIR/<module>.sm_XX.cubin, <module>.compute_90.ptx and the
# ptxas logs; the kernels crate's build.rs embeds them (feature `cuda`).
# Needs the toolkit of scripts/install-cuda-toolchain.sh, or
# SWITCHYARD_CUDA_ROOT pointing at one (a folder with bin/nvcc).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$repo/target/cuda-kernels}
root=${SWITCHYARD_CUDA_ROOT:-$("$repo/scripts/install-cuda-toolchain.sh")}
nvcc="$root/bin/nvcc"
[[ -x $nvcc ]] || { echo "build-cuda-kernels: no nvcc at $nvcc" >&2; exit 1; }
mkdir -p "$out"
src="$repo/kernels/cuda"

# One job per module and target; two at a time (CI has two cores).
jobs=()
for cu in "$src"/*.cu; do
  m=$(basename "$cu" .cu)
  for arch in sm_80 sm_89 sm_90; do jobs+=("$m $arch"); done
  jobs+=("$m compute_90")
done
compile() {
  local m=$1 arch=$2 kind=cubin
  [[ $arch == compute_* ]] && kind=ptx
  # -Xptxas -v makes ptxas report registers, spills and shared memory per
  # kernel (the PTX job runs no ptxas: the sm_90 CUBIN is the same code).
  if ! "$nvcc" -"$kind" -arch="$arch" -O3 -std=c++17 -Xptxas -v -I"$src" \
      -o "$out/$m.$arch.$kind" "$src/$m.cu" >"$out/$m.$arch.ptxas.log" 2>&1; then
    cat "$out/$m.$arch.ptxas.log" >&2
    echo "build-cuda-kernels: $m.cu failed for $arch" >&2
    return 1
  fi
}
export -f compile
export nvcc src out
printf '%s\n' "${jobs[@]}" | xargs -P "${SWITCHYARD_CUDA_JOBS:-2}" -L 1 bash -c 'compile $0 $1'

python3 "$repo/scripts/cuda-ptxas-gate.py" "$src/budgets.txt" "$out"/*.sm_*.ptxas.log
