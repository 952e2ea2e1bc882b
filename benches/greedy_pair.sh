#!/bin/bash
# Greedy continuations of long prompts by two switchyard binaries, compared:
# prompts past Gemma 3's 512-position window (3,000 and 7,000 characters of
# four docs), 40 tokens, no speculation, 2 threads. Prints each prompt that
# differs and the count. Usage: benches/greedy_pair.sh OLD_BIN NEW_BIN [MODEL]
set -euo pipefail
old=$1 new=$2
model=${3:-$HOME/.cache/switchyard/models/gemma-3-270m-q4_k_m.gguf}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
same=0 differ=0
for doc in README.md docs/ARCHITECTURE.md docs/bench/roofline.md docs/bench/long_context.md; do
  for chars in 3000 7000; do
    prompt="$(head -c "$chars" "$root/$doc")

In summary,"
    for side in old new; do
      bin=$old
      [ "$side" = new ] && bin=$new
      "$bin" generate --model "$model" --prompt "$prompt" --temperature 0 --max-tokens 40 \
        --threads 2 --speculate off > "$work/$side.out" 2>/dev/null
    done
    if cmp -s "$work/old.out" "$work/new.out"; then
      same=$((same + 1))
    else
      differ=$((differ + 1))
      echo "differs: $doc, $chars characters"
    fi
  done
done
echo "identical: $same, different: $differ"
rm -rf "$work"
