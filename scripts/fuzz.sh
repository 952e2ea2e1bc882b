#!/usr/bin/env bash
# Fuzzes the GGUF reader (fuzz/fuzz_targets/gguf_reader.rs) for a bounded time.
#
#   scripts/fuzz.sh [SECONDS]      (default 60)
#
# Installs cargo-fuzz when missing. Crashes land in fuzz/artifacts/gguf_reader/;
# the corpus grows in fuzz/corpus/gguf_reader/ (both git-ignored).
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
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

corpus=fuzz/corpus/gguf_reader
mkdir -p "$corpus"
[ -e "$corpus/seed.gguf" ] || make_seed "$corpus/seed.gguf"

# cargo-fuzz passes nightly-only flags (-Zsanitizer=address, ...); the stable
# toolchain accepts them when RUSTC_BOOTSTRAP is set.
RUSTC_BOOTSTRAP=1 cargo fuzz run gguf_reader "$corpus" -- \
    -max_total_time="$seconds" -max_len=65536
