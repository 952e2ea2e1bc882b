#!/usr/bin/env bash
# Fuzzes every parser a stranger can feed, each for a bounded time:
#   gguf_reader        GGUF files (models from a repository or an admin load)
#   safetensors_shard  safetensors headers and offsets
#   policy_toml        routing policy files (hot-reloaded)
#   openai_request     chat and completions request bodies
#   chat_template      chat-template input (client conversations, checkpoint templates)
#   structured_schema  response_format / tools schemas (limits, then the grammar compile)
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (default 60, every target)
#
# With cargo-fuzz installed (`cargo install cargo-fuzz --locked`; it builds libFuzzer
# with the nightly flags, RUSTC_BOOTSTRAP=1 lets stable accept them) each target runs
# under libFuzzer, coverage-guided. Without it (or with SWITCHYARD_FUZZ_ENGINE=replay)
# the same checks (fuzz-targets/) run on the stable toolchain as a blind mutation replay
# of the seeds, corpus and regressions: weaker, but it needs nothing beyond cargo, so CI
# always fuzzes. A crash stops the script with a non-zero status and lands in
# fuzz/artifacts/<target>/; copy it into fuzz-targets/regressions/<target>/ to make it
# a regression test (see RELIABILITY.md). Corpora grow in fuzz/corpus/<target>/.
set -euo pipefail

seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(gguf_reader safetensors_shard policy_toml openai_request chat_template
        structured_schema)
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

if [ "${SWITCHYARD_FUZZ_ENGINE:-}" = replay ] || ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: cargo-fuzz not in use: blind mutation replay on the stable toolchain"
    exec cargo run --release --locked -q -p switchyard-fuzz-targets --bin fuzz-replay -- \
        "$seconds" "${targets[@]}"
fi

# Little-endian writers for a hand-made seed file.
le32() {
    local v=$1
    printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((v & 255)) $((v >> 8 & 255)) \
        $((v >> 16 & 255)) $((v >> 24 & 255)))"
}
le64() { le32 $(($1 & 0xffffffff)); le32 $(($1 >> 32)); }
gguf_str() { le64 "${#1}"; printf '%s' "$1"; }

# A small valid GGUF v3 file: typed metadata (string, u32, nested string
# array, f32) and two tensors (Q8_0 matrix, F32 vector). Giving libFuzzer
# a real file lets it mutate a structure instead of discovering one.
make_seed() {
    local out=$1
    {
        printf 'GGUF'; le32 3; le64 2; le64 4
        gguf_str general.architecture; le32 8; gguf_str llama
        gguf_str general.alignment; le32 4; le32 32
        gguf_str tokenizer.ggml.tokens; le32 9; le32 8; le64 2; gguf_str a; gguf_str b
        gguf_str llama.attention.layer_norm_rms_epsilon; le32 6; le32 0x3727c5ac
        gguf_str token_embd.weight; le32 2; le64 32; le64 2; le32 8; le64 0
        gguf_str output_norm.weight; le32 1; le64 32; le32 0; le64 96
    } >"$out"
    local len padded
    len=$(wc -c <"$out")
    padded=$(((len + 31) / 32 * 32 + 96 + 128))
    head -c $((padded - len)) /dev/zero >>"$out"
}

# Seeds: real inputs give libFuzzer structure to mutate instead of discover.
seed_corpora() {
    local c=fuzz/corpus
    mkdir -p "$c"/{gguf_reader,safetensors_shard,policy_toml,openai_request,chat_template}
    mkdir -p "$c"/structured_schema
    [ -e "$c/gguf_reader/seed.gguf" ] || make_seed "$c/gguf_reader/seed.gguf"
    local header='{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    if [ ! -e "$c/safetensors_shard/seed.safetensors" ]; then
        { le64 "${#header}"; printf '%s' "$header"; head -c 8 /dev/zero; } \
            >"$c/safetensors_shard/seed.safetensors"
    fi
    for example in examples/*.toml; do
        [ -e "$example" ] && cp -n "$example" "$c/policy_toml/"
    done
    printf '%s' '{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"n":2,"stop":["x"],"logit_bias":{"5":1},"logprobs":true,"top_logprobs":3,"stream":true,"stream_options":{"include_usage":true}}' \
        >"$c/openai_request/chat.json"
    printf '%s' '{"model":"m","prompt":["a",[1,2]],"n":3,"max_tokens":5,"temperature":0.5,"seed":-1,"user":"u"}' \
        >"$c/openai_request/completions.json"
    printf '\x00system\x00Be brief.\x00user\x00Hello {{ x }}\x00assistant\x00' \
        >"$c/chat_template/conversation"
    printf '\x03{%% for m in messages %%}{{ m.role }}{%% endfor %%}' >"$c/chat_template/template"
    printf '%s' '{"$defs":{"node":{"type":"object","properties":{"value":{"type":"number"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}}}},"$ref":"#/$defs/node"}' \
        >"$c/structured_schema/tree.json"
}
seed_corpora

# cargo-fuzz passes nightly-only flags (-Zsanitizer=address, ...); the stable
# toolchain accepts them when RUSTC_BOOTSTRAP is set.
for target in "${targets[@]}"; do
    echo "fuzz.sh: $target for ${seconds} s"
    RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048
done
