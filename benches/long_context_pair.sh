#!/bin/bash
# Prompt tok/s of built long_context executables, alternated at one depth
# group so that the host's drift falls on each alike (two rounds).
# Usage: benches/long_context_pair.sh BIN[:AMX] ...   e.g.
#   LC_DEPTHS=0,1024 benches/long_context_pair.sh /tmp/main:1 /tmp/new:1 /tmp/new:0
# AMX is SWITCHYARD_AMX for that run (1: as detected, 0: off). Model:
# SWITCHYARD_MODEL (default: the cached Gemma 3 270M Q4_K_M).
set -euo pipefail
export SWITCHYARD_MODEL=${SWITCHYARD_MODEL:-$HOME/.cache/switchyard/models/gemma-3-270m-q4_k_m.gguf}
export LC_DECODE=${LC_DECODE:-4} LC_REPEATS=${LC_REPEATS:-3} LC_DEPTHS=${LC_DEPTHS:-0,1024}
for round in 1 2; do
  for spec in "$@"; do
    bin=${spec%%:*}
    amx=1
    [[ $spec == *:* ]] && amx=${spec##*:}
    SWITCHYARD_AMX=$amx "$bin" --bench 2>/dev/null | python3 -c "
import json, sys
for line in sys.stdin:
    if line.startswith('{'):
        d = json.loads(line)
        print(f\"round $round $bin AMX=$amx depth {d['depth']} {d['attention']}: prompt {d['prompt_tok_s']} tok/s\")"
  done
done
