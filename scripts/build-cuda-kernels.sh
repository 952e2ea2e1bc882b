#!/usr/bin/env bash
# Compiles every CUDA kernel (kernels/cuda/*.cu) to CUBINs for sm_80
# (A100), sm_89 (L4, RTX 40) and sm_90 (H100, H200), plus PTX for
# compute_90 (what newer GPUs JIT), then runs the compile gate
# (scripts/cuda-ptxas-gate.py against kernels/cuda/budgets.txt).
#
# usage: scripts/build-cuda-kernels.sh [OUT_DIR]   (default target/cuda-kernels)
# Writes OUT_DIR/<module>.sm_XX.cubin, <module>.compute_90.ptx and the
# ptxas logs; the kernels crate's build.rs embeds them (feature `cuda`).
# A module and target is compiled again only when its key changed: the
# SHA-256 of its .cu, every header, the nvcc command and nvcc's version
# (OUT_DIR/<module>.<target>.key). An unchanged image keeps its mtime, so
# cargo does not rebuild the crates that embed it either.
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

# What every image depends on besides its own .cu: the headers, this script
# (the flags below) and the compiler.
common_key=$( { cat "$src"/*.cuh "$0"; "$nvcc" --version; } | sha256sum | cut -d' ' -f1)

# One job per module and target whose key changed; two at a time (CI has two cores).
jobs=()
reused=0
for cu in "$src"/*.cu; do
  m=$(basename "$cu" .cu)
  key=$( { echo "$common_key"; cat "$cu"; } | sha256sum | cut -d' ' -f1)
  for arch in sm_80 sm_89 sm_90 compute_90; do
    kind=cubin
    [[ $arch == compute_* ]] && kind=ptx
    if [[ -f $out/$m.$arch.$kind && -f $out/$m.$arch.ptxas.log \
          && $(cat "$out/$m.$arch.key" 2>/dev/null) == "$key" ]]; then
      reused=$((reused + 1))
    else
      jobs+=("$m $arch $key")
    fi
  done
done
compile() {
  local m=$1 arch=$2 key=$3 kind=cubin
  [[ $arch == compute_* ]] && kind=ptx
  rm -f "$out/$m.$arch.key"
  # -Xptxas -v makes ptxas report registers, spills and shared memory per
  # kernel (the PTX job runs no ptxas: the sm_90 CUBIN is the same code).
  if ! "$nvcc" -"$kind" -arch="$arch" -O3 -std=c++17 -Xptxas -v -I"$src" \
      -o "$out/$m.$arch.$kind" "$src/$m.cu" >"$out/$m.$arch.ptxas.log" 2>&1; then
    cat "$out/$m.$arch.ptxas.log" >&2
    echo "build-cuda-kernels: $m.cu failed for $arch" >&2
    return 1
  fi
  echo "$key" >"$out/$m.$arch.key"
}
export -f compile
export nvcc src out
echo "build-cuda-kernels: ${#jobs[@]} images to compile, $reused unchanged" >&2
if ((${#jobs[@]} > 0)); then
  printf '%s\n' "${jobs[@]}" | xargs -P "${SWITCHYARD_CUDA_JOBS:-2}" -L 1 bash -c 'compile $0 $1 $2'
fi

python3 "$repo/scripts/cuda-ptxas-gate.py" "$src/budgets.txt" "$out"/*.sm_*.ptxas.log
