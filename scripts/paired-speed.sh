#!/usr/bin/env bash
# Paired speed runs of two switchyard binaries on the test model: decode
# tok/s, a 512-token prompt, 16 streaming clients, and warm prompt-cache
# TTFT, in rounds of OLD NEW NEW OLD; prints each side's median and the
# ratio NEW/OLD. Run it on a quiet machine for numbers worth quoting:
#
#   scripts/paired-speed.sh /tmp/switchyard-before target/release/switchyard [ROUNDS=3]
#
# SWITCHYARD_BENCH_THREADS (default 2) sets --threads; SWITCHYARD_MODEL a
# model other than the one scripts/fetch-model.sh caches.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { echo "usage: $0 OLD_BIN NEW_BIN [ROUNDS]" >&2; exit 2; }
model="${SWITCHYARD_MODEL:-$(scripts/fetch-model.sh)}"
exec python3 scripts/paired_speed.py "$1" "$2" "$model" "${3:-3}"
