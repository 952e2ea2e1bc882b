#!/usr/bin/env bash
# Greedy output of two switchyard binaries on the reference prompts, both real
# models, chat with F16 KV and plain with Q8_0 KV; exits non-zero on any
# difference. A refactor that must not change numerics runs it against the
# binary before it:
#
#   scripts/compare-greedy.sh OLD_BIN target/release/switchyard
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -eq 2 ]] || { echo "usage: $0 BIN_A BIN_B" >&2; exit 2; }
models=("$(scripts/fetch-model.sh)" "$(scripts/fetch-gemma3.sh)")
prompts=("The capital of France is" "Write a haiku about the sea." "def fibonacci(n):")
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
differ=0
runs=0
for model in "${models[@]}"; do
  for prompt in "${prompts[@]}"; do
    for mode in "--chat --kv-type f16" "--kv-type q8_0"; do
      runs=$((runs + 1))
      for side in a b; do
        bin=$1; [[ $side == b ]] && bin=$2
        # shellcheck disable=SC2086 # $mode is two flags
        "$bin" generate --model "$model" --prompt "$prompt" $mode --temperature 0 \
          --max-tokens 48 --threads 2 2>/dev/null | grep -v 'tok/s' > "$out/$runs.$side"
      done
      if ! cmp -s "$out/$runs.a" "$out/$runs.b"; then
        echo "differs: $(basename "$model") $mode: $prompt"
        differ=$((differ + 1))
      fi
    done
  done
done
echo "compare-greedy: $runs runs, $differ differ"
[[ $differ -eq 0 ]]
