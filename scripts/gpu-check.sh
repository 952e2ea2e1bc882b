#!/usr/bin/env bash
# The prepared GPU check of the CUDA backend (issue 34): one command that
# verifies and times on a GPU what cannot be checked here, and writes one
# report file.
#
#   scripts/gpu-check.sh prepare     # here (cargo): build the carried binary
#                                    # into target/gpu-check/
#   scripts/gpu-check.sh run [OUT]   # on the GPU machine (nvcc 13, PyTorch,
#                                    # no cargo): report in OUT (default
#                                    # $OUT, else target/gpu-check/out)
#   scripts/gpu-check.sh --dry-run   # here: prepare, then run until the first
#                                    # GPU step, which must stop cleanly
#
# To run it on a lent machine, carry target/gpu-check (prepare refuses a
# carry over 64 MiB, the most that travels) and run
# `scripts/gpu-check.sh run "$OUT"`: one command, at most 10 minutes (each
# step has its own time limit, GPU_CHECK_*_S below; a step that runs out
# is reported as such and fails the check). The steps, each timed in the
# report:
#   0. same_weights_cpu (no GPU, so also in the dry run): the tiny Llama of
#      `cuda_check --cpu-reference` run on the CPU backend through the
#      Backend trait and exported as F16 safetensors; NumPy's Hugging Face
#      Llama forward over the exported file gives the same logits
#      (scripts/gpu_check_reference.py): the export and the decode run's
#      layout are right before a GPU sees them;
#   1. cuda_check: every kernel against the CPU oracle per tensor type at
#      small and Llama-7B shapes (decoders and F16 decoders bit for bit,
#      decode matmuls max abs/rel error), the per-layer kernels (norms,
#      RoPE, gated activations, softmax, paged attention) against the CPU
#      or an f64 reference, CudaBackend against CpuBackend through the
#      Backend trait (matmul paths, attention over block tables), 10,000
#      pointer-table swaps with
#      outputs checked (swap p50/p99), decode GB/s against the copy rate,
#      a Llama-7B Q4_K decode step captured as a CUDA graph and replayed
#      after each of 10,000 swaps between two checkpoints (outputs equal
#      to the eager step's, swap p50/p99, weight GB/s), step graphs as the
#      serving path uses them (a small model stepped through the trait on
#      the CPU, the GPU eagerly and the GPU keyed: keyed logits equal to
#      eager ones bit for bit, both within a written tolerance of the
#      CPU's), F16 weights in steps of 48 rows (cuBLAS's batched GEMM)
#      alternating two checkpoints under one key (`f16_swaps_over_32_rows`:
#      one capture, no divergence, keyed outputs equal to eager ones after
#      every swap, within a tolerance of the CPU's; also in --quick, so
#      under memcheck), and the backend's Llama-7B F16 decode tokens/s at
#      batch 1/16/64, eager and with step graphs (the Backend trait), its
#      logits for a fixed prompt into GPU_CHECK_WEIGHTS;
#      1b. the CUDA arms of the carried tests (`on_each_device!`: the
#      kernels' lib tests, and the engine tests named in
#      GPU_CHECK_ENGINE_TESTS at prepare), with SWITCHYARD_REQUIRE_GPU=1 so
#      that none skips; cuda_check also moves a checkpoint down to pinned
#      memory and up again on the copy stream beside running matmuls
#      (`copy_up`: swap refused until the copy lands, outputs right);
#   2. compute-sanitizer memcheck on cuda_check --quick (kernels, layers,
#      the backend against the CPU at small shapes);
#   3. the same Llama-7B weights step 1 ran exported as F16 safetensors
#      (`cuda_check --export`, 13.5 GB into GPU_CHECK_WEIGHTS, by default a
#      folder in /dev/shm, removed after), then PyTorch: F16 GEMV GB/s at
#      the same shapes, `transformers` loading that folder, its logits for
#      step 1's prompt against the backend's (same_weights_gpu) and its
#      decode tokens/s at batch 1/16/64, then one line per batch comparing
#      the backend's tokens/s with it.
# Every numeric check states its tolerance in its report line ("tolerance"
# or "tol"); the last line of the report sums up which checks failed.
# Exit: 0 passed (or a dry run stopped where it should), 1 a check failed,
# 3 no usable GPU on a real run.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
carry="$repo/target/gpu-check"
bin="$carry/cuda_check"

# The test binaries of `crate` (cargo test ARGS --no-run) into $carry/tests.
carry_tests() {
  local name=$1; shift
  local exe
  exe=$(cargo test --release --locked "$@" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        print(m["executable"])' | tail -1)
  [[ -n $exe ]] || { echo "gpu-check: no test binary for $*" >&2; return 1; }
  cp "$exe" "$carry/tests/$name"
  strip --strip-debug "$carry/tests/$name" 2>/dev/null || true
}

prepare() {
  cargo build --release --locked -p switchyard-kernels --features cuda --example cuda_check || return 1
  mkdir -p "$carry/tests"
  cp "${CARGO_TARGET_DIR:-$repo/target}/release/examples/cuda_check" "$bin"
  # Line tables only matter for panics here; halve what travels.
  strip --strip-debug "$bin" 2>/dev/null || true
  # The kernels' tests with the feature (scripts/test.sh builds them
  # anyway): their `on_each_device!` CUDA arms run on the GPU.
  carry_tests kernels -p switchyard-kernels --features cuda --lib || return 1
  # Engine tests' CUDA arms, by name (GPU_CHECK_ENGINE_TESTS="engine_front_door
  # multi_checkpoint"): each is a build of the engine with the feature.
  for t in ${GPU_CHECK_ENGINE_TESTS:-}; do
    carry_tests "engine-$t" -p switchyard-engine --features switchyard-kernels/cuda --test "$t" || return 1
  done
  # What travels to a GPU machine is at most 64 MiB: the run tool carries
  # this folder (the scripts travel with the work tree).
  local bytes limit=$((64 << 20))
  bytes=$(du -sb "$carry" | cut -f1)
  echo "gpu-check: carry $carry ($((bytes >> 20)) MiB of the $((limit >> 20)) MiB that travel)"
  if ((bytes > limit)); then
    echo "gpu-check: $carry is over the 64 MiB that travel to a GPU machine: drop GPU_CHECK_ENGINE_TESTS or the old dry-run/out folders in it" >&2
    return 1
  fi
}

# run OUT DRY: the report is OUT/gpu-check-report.jsonl.
run() {
  local out=$1 dry=$2
  mkdir -p "$out"
  local report="$out/gpu-check-report.jsonl"
  : >"$report"
  note() { printf '%s\n' "$1" >>"$report"; }
  note "{\"check\":\"start\",\"date\":\"$(date -u +%FT%TZ)\",\"host\":\"$(hostname)\"}"
  [[ -x $bin ]] || { echo "gpu-check: no $bin: run 'scripts/gpu-check.sh prepare' where cargo is and carry target/gpu-check" >&2; return 1; }
  if command -v nvidia-smi >/dev/null; then
    note "{\"check\":\"nvidia-smi\",\"gpus\":\"$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tr '\n' ';')\"}"
  fi

  local py=python3
  [[ -x $repo/.venv/bin/python ]] && py=$repo/.venv/bin/python
  local failed=0 t0=$SECONDS rc

  # Step 0, no GPU: the decode run's Llama on the CPU against NumPy's
  # Hugging Face forward over its exported safetensors.
  if "$bin" --cpu-reference "$out/tiny-llama" >>"$report" 2>"$out/cpu_reference.stderr" &&
    "$py" "$repo/scripts/gpu_check_reference.py" "$out/tiny-llama" >>"$report" 2>>"$out/cpu_reference.stderr"; then
    rc=0
  else
    rc=$?
    failed=1
  fi
  note "{\"check\":\"same_weights_cpu\",\"exit\":$rc,\"seconds\":$((SECONDS - t0))}"
  [[ $rc -eq 0 ]] || echo "gpu-check: same_weights_cpu failed: $out/cpu_reference.stderr, $report" >&2

  # Step 1, the first GPU step: the kernel checks (cuda_check opens the GPU first).
  local weights=${GPU_CHECK_WEIGHTS:-}
  if [[ -z $weights ]]; then
    weights=/tmp/switchyard-gpu-check-llama7b
    [[ -w /dev/shm ]] && weights=/dev/shm/switchyard-gpu-check-llama7b
  fi
  t0=$SECONDS
  timeout "${GPU_CHECK_KERNELS_S:-240}" "$bin" --weights "$weights" >>"$report" 2>"$out/cuda_check.stderr"
  rc=$?
  if [[ $rc -eq 3 ]]; then
    local why
    why=$(tail -1 "$out/cuda_check.stderr")
    note "{\"check\":\"stopped\",\"step\":\"cuda_check\",\"reason\":$(printf '%s' "$why" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}"
    if [[ $dry == 1 ]]; then
      echo "gpu-check: dry run stopped at the first GPU step (cuda_check): $why"
      echo "gpu-check: report $report"
      return $failed
    fi
    echo "gpu-check: no usable GPU: $why" >&2
    return 3
  fi
  [[ $dry == 1 ]] && { echo "gpu-check: --dry-run found a GPU; run 'scripts/gpu-check.sh run' instead" >&2; return 1; }
  [[ $rc -eq 0 ]] || failed=1
  [[ $rc -eq 124 ]] && note '{"check":"cuda_check","pass":false,"error":"ran past GPU_CHECK_KERNELS_S"}'
  note "{\"check\":\"cuda_check\",\"exit\":$rc,\"seconds\":$((SECONDS - t0))}"

  # Step 1b: the CUDA arms of the carried tests (`on_each_device!`), with a
  # GPU required: a test that cannot open it fails instead of skipping.
  for t in "$carry"/tests/*; do
    [[ -x $t ]] || continue
    t0=$SECONDS
    SWITCHYARD_REQUIRE_GPU=1 timeout "${GPU_CHECK_TESTS_S:-60}" "$t" ::cuda --test-threads 1 \
      >"$out/tests-$(basename "$t").log" 2>&1
    rc=$?
    note "{\"check\":\"device_tests\",\"name\":\"$(basename "$t")\",\"exit\":$rc,\"result\":\"$(grep -E '^test result' "$out/tests-$(basename "$t").log" | tail -1)\",\"pass\":$([[ $rc -eq 0 ]] && echo true || echo false),\"seconds\":$((SECONDS - t0))}"
    [[ $rc -eq 0 ]] || failed=1
  done

  # Step 2: memcheck on the quick variant.
  t0=$SECONDS
  if command -v compute-sanitizer >/dev/null; then
    timeout "${GPU_CHECK_MEMCHECK_S:-90}" compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$bin" --quick >"$out/memcheck.log" 2>&1
    rc=$?
    note "{\"check\":\"memcheck\",\"exit\":$rc,\"summary\":\"$(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)\",\"seconds\":$((SECONDS - t0))}"
    [[ $rc -eq 0 ]] || failed=1
  else
    note '{"check":"memcheck","skipped":"compute-sanitizer not found"}'
  fi

  # Step 3: the weights step 1 ran, exported for transformers, and the
  # PyTorch baseline on them.
  t0=$SECONDS
  if python3 -c 'import torch' 2>/dev/null; then
    timeout "${GPU_CHECK_EXPORT_S:-60}" "$bin" --export "$weights" >>"$report" 2>"$out/export.stderr"
    rc=$?
    note "{\"check\":\"export_safetensors\",\"exit\":$rc,\"pass\":$([[ $rc -eq 0 ]] && echo true || echo false),\"seconds\":$((SECONDS - t0))}"
    [[ $rc -eq 0 ]] || failed=1
    t0=$SECONDS
    timeout "${GPU_CHECK_TORCH_S:-140}" python3 "$repo/scripts/gpu_check_torch.py" --weights "$weights" >>"$report" 2>"$out/torch.stderr"
    note "{\"check\":\"torch\",\"exit\":$?,\"seconds\":$((SECONDS - t0))}"
  else
    note '{"check":"torch","skipped":"PyTorch not installed"}'
  fi
  [[ -n ${GPU_CHECK_KEEP_WEIGHTS:-} ]] || rm -rf "$weights"
  # The comparison: switchyard's decode tokens/s over transformers', per batch.
  python3 - "$report" >>"$report" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
ours = {r["batch"]: r["tokens_per_s"] for r in rows if r.get("check") == "switchyard_llama7b_decode" and "batch" in r}
theirs = {r["batch"]: r["tokens_per_s"] for r in rows if r.get("check") == "torch_llama7b_decode" and "batch" in r}
for b in sorted(set(ours) & set(theirs)):
    same = all(r.get("same_weights") for r in rows if r.get("batch") == b and "same_weights" in r)
    print(json.dumps({"check": "decode_vs_transformers", "batch": b, "same_weights": same, "switchyard_tokens_per_s": ours[b],
                      "transformers_tokens_per_s": theirs[b], "ratio": round(ours[b] / theirs[b], 3)}))
failed = sorted({r.get("name") or r.get("op") or r.get("dtype") or r["check"]
                 for r in rows if r.get("pass") is False})
print(json.dumps({"check": "summary", "lines": len(rows), "failed": failed}))
PY
  # A check line that failed (the torch step's logits among them) fails the run.
  grep -Eq '"pass": ?false' "$report" && failed=1
  echo "gpu-check: report $report"
  return $failed
}

case "${1:-}" in
  prepare) prepare ;;
  run) run "${2:-${OUT:-$carry/out}}" 0 ;;
  --dry-run) prepare && run "${2:-$carry/dry-run}" 1 ;;
  *) sed -n '2,64p' "$0"; exit 2 ;;
esac
