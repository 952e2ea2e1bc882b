#!/usr/bin/env bash
# Which of the workspace's source files one streamed chat request runs, socket to
# tokens and back: counted by callgrind on a release binary (it carries debug info)
# serving the real test model (SmolLM2-135M, `scripts/fetch-model.sh`) under a
# one-model policy with one tenant. Startup and a first, warm-up request are not
# counted; collection is on only while the measured request runs, so what the server's
# other threads do meanwhile (the executor's loop, timers) counts too. Inlined code
# counts for the file it was written in.
#
# Usage: scripts/request-path-files.sh [BINARY]   (default target/release/switchyard)
# Prints the count, the count per folder and the files; the callgrind output and the
# server's log stay in $OUT_DIR (default a new temporary folder). Takes a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$(realpath "${1:-target/release/switchyard}")"
model="$(scripts/fetch-model.sh)"
out="${OUT_DIR:-$(mktemp -d)}"
mkdir -p "$out"
port=$((20000 + RANDOM % 20000))
key="sk-request-path"
cat >"$out/policy.toml" <<EOF
[[models]]
name = "smol"
version = "v1"
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0002
quality = 0.5
context_limit = 8192

[[tenants]]
name = "walker"
api_keys = ["sha256:$(printf '%s' "$key" | sha256sum | cut -d' ' -f1)"]
EOF
cat >"$out/serve.toml" <<EOF
threads = 1
[[models]]
path = "$model"
name = "smol"
version = "v1"
EOF
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out/callgrind.out" \
  "$bin" serve --config "$out/serve.toml" --policy "$out/policy.toml" \
  --listen "127.0.0.1:$port" --drain-seconds 1 >"$out/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break
  kill -0 "$server" 2>/dev/null || { cat "$out/server.log" >&2; exit 1; }
  sleep 1
done
ask() {
  curl -sfN "http://127.0.0.1:$port/v1/chat/completions" \
    -H "authorization: Bearer $key" -H 'content-type: application/json' \
    -d '{"model": "smol", "stream": true, "max_tokens": 4, "temperature": 0,
         "messages": [{"role": "user", "content": "Name a colour."}]}' >"$out/answer.$1.txt"
}
ask warm-up
callgrind_control -i on "$server" >/dev/null
ask measured
callgrind_control -i off "$server" >/dev/null
grep -q '\[DONE\]' "$out/answer.measured.txt" || { echo "the measured request did not finish" >&2; exit 1; }
kill -TERM "$server"
wait "$server" || true
trap - EXIT
# Every function that ran, `file:function`; keep the workspace's own files.
callgrind_annotate --inclusive=no --threshold=100 "$out/callgrind.out" 2>/dev/null \
  | grep -vE '[ (]/rust/|/rustc/|/\.cargo/|/\.rustup/' \
  | grep -oE '(^|[ /])(router|engine|seam|policies|kernels|src)/[A-Za-z0-9_/.-]+\.rs:' \
  | sed -E 's/^[ /]//; s/:$//' | sort -u >"$out/files.txt" || true
[[ -s "$out/files.txt" ]] || { echo "callgrind recorded no workspace file ($out)" >&2; exit 1; }
echo "$(wc -l <"$out/files.txt") workspace files ran for one streamed chat request ($bin)"
cut -d/ -f1-3 "$out/files.txt" | sed -E 's#/[^/]+\.rs$##' | sort | uniq -c | sort -rn
echo "files: $out/files.txt"
