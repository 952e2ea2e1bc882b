#!/usr/bin/env bash
# Prompt (128 and 512 tokens) and generation (128 tokens) tokens/s of
# Switchyard and llama.cpp on the same GGUF, same prompt ids, 1 and 2
# threads, measured in one run. Prints a Markdown table for BENCHMARKS.md.
# Batched decode has no llama.cpp peer here: `cargo bench --bench batched_decode`.
#
# llama.cpp comes from llama-cpp-python, built from source with its AMX
# paths off (they die with SIGILL on these machines): see scripts/install-llama-cpp.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

# `compare_llama_cpp.sh gemma3` measures Gemma 3 270M Q4_K_M instead of SmolLM2.
case "${1:-smollm2}" in
  gemma3) model="${SWITCHYARD_GEMMA3:-$(scripts/fetch-gemma3.sh)}"; label=gemma3-q4_k_m ;;
  *) model="${SWITCHYARD_MODEL:-$(scripts/fetch-model.sh)}"; label=smollm2-q4_1 ;;
esac
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target"
scripts/install-llama-cpp.sh
SWITCHYARD_MODEL="$model" SWITCHYARD_BENCH_LABEL="$label" cargo bench --bench generation -- --noplot >&2
.venv/bin/python benches/llama_cpp_peer.py "$model" > "$target/llama_cpp_peer.jsonl"
.venv/bin/python benches/report.py "$target/criterion" "$target/llama_cpp_peer.jsonl" "$label"
