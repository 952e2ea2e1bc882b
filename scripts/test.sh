#!/usr/bin/env bash
# The project's test command: Rust unit and integration tests (the module-cycle
# check among them, tools/module-cycles/tests/workspace.rs), then the
# Python checks against the real binary (numerics against the NumPy
# reference, tokenization against an independent tokenizer).
# Run scripts/setup.sh once first.
#
# usage: scripts/test.sh [--all] [PYTEST_ARGS...]
#   The Python tests run in parallel (pytest-xdist, one worker per core, a
#   file's tests on one worker so they share its server); the tests marked
#   `slow` (soaks, benchmarks, long variants: tests/python/conftest.py) are
#   left out. --all (or SWITCHYARD_TEST_ALL=1; .ci/run passes it) runs them
#   too, afterwards and one at a time, so their timings see a quiet machine.
#   Tests marked `serial` (latency bounds: the hostile battery) run after the
#   parallel phase, one at a time.
#   SWITCHYARD_TEST_JOBS sets the worker count (0: no workers, one process).
#   Each phase's wall time is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

all=${SWITCHYARD_TEST_ALL:-0}
if [[ ${1:-} == --all ]]; then
  all=1
  shift
fi
target=${CARGO_TARGET_DIR:-$PWD/target}

phases=()
phase() {
  local name=$1 t0=$SECONDS rc=0
  shift
  "$@" || rc=$?
  phases+=("$(printf '%5d s  %s' $((SECONDS - t0)) "$name")")
  return $rc
}
report() {
  local rc=$?
  # A run cut short leaves no CUDA check behind (their own process group).
  if [[ -n ${side_pid:-} ]] && ((!side_done)); then kill -- -"$side_pid" 2>/dev/null || true; fi
  printf 'test.sh: phase times (load average at the end: %s)\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
  printf '  %s\n' "${phases[@]}"
  return $rc
}
trap report EXIT

# One cargo invocation builds the binary and every test: `cargo build` of the
# root package alone resolves its dependencies' features apart from the
# workspace's tests (tokio's `process` from benches/loadgen, `test-util` from
# the router's tests), so tokio, hyper, axum, the router, the engine and the
# binary were compiled twice. Building the tests uplifts the binary to
# target/release/switchyard, which the Python tests run.
side_dir="$target/test-sh"
mkdir -p "$side_dir"
# The build's messages (JSON on stdout; progress and errors still rendered on
# stderr) name each test executable, so the kernels crate's tests below run
# from this very build.
phase "cargo test --no-run (binary and test binaries)" \
  cargo test --release --locked --workspace --no-run --message-format=json-render-diagnostics \
  >"$side_dir/build.jsonl"
# The kernels crate's tests run beside the Python phase (below); the rest of
# the workspace here, alone: some router tests bound wall time.
phase "cargo test (workspace but the kernels)" \
  cargo test --release --locked --workspace --exclude switchyard-kernels
# The CUDA backend without a GPU: every kernel compiled for sm_80/89/90
# under the ptxas gate, the cuda-feature tests (NVRTC fallback included),
# the binary type-checked with the feature, and the GPU check's dry run. The
# toolkit comes from PyPI (scripts/install-cuda-toolchain.sh). The kernel
# images are compiled again only where their sources changed (keyed by
# source hash in target/cuda-kernels).
#
# The kernels crate's tests: every SIMD kernel against its scalar twin and
# the attention kernels against their reference at up to 4k positions, on
# every ISA (about two CPU-minutes). They bound no wall time, so they join
# the CUDA checks beside the Python phase. Run as the build left them
# (`cargo test -p switchyard-kernels` would resolve features on its own and
# compile the crate again); its doc tests through the workspace's.
kernels_tests() {
  local exes exe
  # Read first, so a build that named none fails the phase.
  exes=$(.venv/bin/python scripts/test-executables.py "$PWD/kernels/Cargo.toml" <"$side_dir/build.jsonl") || return
  while IFS= read -r exe; do
    (cd kernels && "$exe") || return
  done <<<"$exes"
  cargo test --release --locked --workspace --doc -- kernels/src/
}

# These steps run beside the parallel Python phase, at the lowest CPU
# priority: the Python tests wait on servers, HTTP and subprocesses and leave
# part of the two cores idle, which these fill; where the Python tests keep
# both cores busy, these yield and finish after them. Nothing here touches
# target/release/switchyard (check and the kernels' own builds write
# elsewhere), and none of them asserts a wall-clock bound. Their output goes
# to $side_log, printed when they end. The serial phase waits for them.
cuda_checks() {
  local cuda_root
  cuda_root=$(scripts/install-cuda-toolchain.sh) || return
  phase "CUDA kernels (nvcc, ptxas gate)" scripts/build-cuda-kernels.sh "$target/cuda-kernels" || return
  export SWITCHYARD_CUDA_KERNELS_DIR="$target/cuda-kernels"
  phase "cargo test -p switchyard-kernels --features cuda" \
    env LD_LIBRARY_PATH="$cuda_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" SWITCHYARD_REQUIRE_NVRTC=1 \
    cargo test --release --locked -p switchyard-kernels --features cuda --lib cuda || return
  phase "cargo check --features cuda" cargo check --release --locked --features cuda || return
  phase "gpu-check --dry-run" scripts/gpu-check.sh --dry-run
}
side_log="$side_dir/cuda-checks.log" side_phases="$side_dir/cuda-checks.phases"
rm -f "$side_phases"
side_t0=$SECONDS
side_done=0
set -m # their own process group, so that report() can stop them all
(
  renice -n 19 -p $BASHPID >/dev/null || true
  phases=() rc=0
  phase "cargo test -p switchyard-kernels (the build's executables)" kernels_tests || rc=$?
  cuda_checks || rc=$?
  # The phase lines go back to the main shell through a file.
  printf '%s\n' "${phases[@]}" >"$side_phases"
  exit $rc
) >"$side_log" 2>&1 &
side_pid=$!
set +m
# Waits for the CUDA checks (once), prints their output and adds their phase
# times; fails the run if they failed.
wait_cuda_checks() {
  ((side_done)) && return 0
  local rc=0
  wait "$side_pid" || rc=$?
  side_done=1
  cat "$side_log"
  if [[ -f $side_phases ]]; then
    while IFS= read -r line; do phases+=("  (beside) $line"); done <"$side_phases"
  fi
  phases+=("$(printf '%5d s  %s' $((SECONDS - side_t0)) "kernels tests and CUDA checks, beside the parallel Python phase (end to end)")")
  if ((rc != 0)); then
    echo "test.sh: the kernels tests or CUDA checks failed (rc $rc): $side_log" >&2
    return "$rc"
  fi
}

export SWITCHYARD_BIN="$target/release/switchyard"
# Each pytest run starts by emptying its base folder, so a machine keeps one run's
# files at most (pytest's default keeps three runs under /tmp, gigabytes of model
# copies each, and a CI run once met a full disk); a passing test's own folder
# goes as soon as it ends.
pytest=(.venv/bin/python -m pytest -q tests/python --basetemp "$side_dir/pytest"
  -o tmp_path_retention_policy=failed)
# pytest exits 5 when the arguments select no test of a phase.
selected() { "$@" || [[ $? == 5 ]]; }
python_rc=0
phase "pytest (parallel, not slow)" selected \
  "${pytest[@]}" -n "${SWITCHYARD_TEST_JOBS:-auto}" --dist loadfile --no-loadscope-reorder \
  -m "not slow and not serial" "$@" || python_rc=$?
wait_cuda_checks
((python_rc == 0)) || exit "$python_rc"
# Tests that bound wall-clock latency (marker `serial`) run alone.
phase "pytest (serial: latency bounds)" selected "${pytest[@]}" -p no:xdist -m "serial and not slow" "$@"
if [[ $all == 1 ]]; then
  phase "pytest (slow, one at a time)" selected "${pytest[@]}" -p no:xdist -m slow "$@"
fi
