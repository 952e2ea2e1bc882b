"""Decode against the machine's streaming read: the roofline column of
BENCHMARKS.md.

A decode step of one sequence reads every weight once (a tied embedding
is the output matrix too; an untied one is only gathered, one row) and the
KV of every position its layers attend to (a sliding-window layer only its
window). Bytes per step times steps per second, over what a plain streaming
read gets on as many threads in the same run (`benches/machine_roofline.c`,
best of its rounds), is the share of the memory bound a decode reaches.

Two reads, two shares: of 512 MB (past the host's L3: the DRAM read) and of
as many bytes as the step reads (its footprint, read again and again as the
decode reads it step after step). The footprint read is the fair ceiling: a
footprint that a large L3 partly holds is judged against a read that the L3
serves the same way (docs/bench/roofline.md, "Which ceiling"). It is never
below the DRAM read but for noise, so the headline share is of the higher
of the two. Each read is
the best of READ_CALLS runs of the program on each side of the decode (the
host's other tenants move it from second to second).

For each model and depth the run measures, in turn: the reads, Switchyard's
decode (the `long_context` bench: the same ids as
`benches/long_context.py`, best of `--repeats`), the reads again.

Usage: .venv/bin/python benches/roofline.py [--models smollm2,gemma3]
  [--depths 0,4096] [--threads 1,2] [--repeats 2] [--kv f16] [--bench BIN]
`--bench` runs a prebuilt bench executable (`cargo bench --no-run --bench
long_context` prints its path) instead of `cargo bench`, so nothing is
compiled inside a quiet-run. On a shared host run it inside
`benches/own_autogroup.sh` (as `own_autogroup.sh .venv/bin/python
benches/roofline.py ...`): with autogroup scheduling, nice alone does not
keep other sessions off the CPUs (docs/bench/roofline.md).
Prints a Markdown table and JSON lines (stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from gguf import GGUFReader

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benches"))
import long_context  # noqa: E402  (its Switchyard runner and model paths)

ROOFLINE_BIN = Path("/tmp/switchyard-roofline")
KV_BYTES = {"f16": 2, "f32": 4, "q8_0": 34 / 32}
# The DRAM read: well past the host's 300 MB L3.
DRAM_MB = 512
# Runs of the read program on each side of a decode: this VM's two-thread
# read moves between ~15 and ~45 GB/s from second to second (other
# tenants), so one run often catches a slow moment (docs/bench/roofline.md).
READ_CALLS = 3
# Gemma 3: every sixth layer attends globally, the others over the window.
GEMMA3_GLOBAL_EVERY = 6


def build_roofline() -> None:
    """Compiles benches/machine_roofline.c (again: its source may have moved on)."""
    subprocess.run(["gcc", "-O3", "-funroll-all-loops", "-mavx512f", "-mfma",
                    str(ROOT / "benches/machine_roofline.c"), "-o", str(ROOFLINE_BIN),
                    "-lpthread"], check=True)


def read_bandwidth(threads: int, megabytes: float = DRAM_MB, calls: int = READ_CALLS) -> float:
    """GB/s of the streaming read of `megabytes` on `threads` threads: the best
    of `calls` runs of the program, each the best of its own rounds."""
    best = 0.0
    for _ in range(calls):
        out = subprocess.run([str(ROOFLINE_BIN), "read", f"{megabytes:.1f}"], check=True,
                             capture_output=True, text=True).stdout
        found = re.search(rf"read, {threads} thread\(s\): ([\d.]+) GB/s", out)
        if not found:
            raise SystemExit(f"no {threads}-thread read in:\n{out}")
        best = max(best, float(found.group(1)))
    return best


def step_bytes(path: str, depth: int, kv: str) -> tuple[int, int]:
    """(weight bytes, KV bytes) one decode step reads attending to `depth` positions."""
    reader = GGUFReader(path)

    def field(key: str, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.parts[f.data[0]].tolist()[0]

    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    weights = sum(sizes.values())
    if "output.weight" in sizes:
        # Untied: the embedding is gathered one row a token, not streamed.
        weights -= sizes.get("token_embd.weight", 0)
    layers = field(f"{arch}.block_count")
    heads = field(f"{arch}.attention.head_count")
    kv_heads = field(f"{arch}.attention.head_count_kv", heads)
    head_dim = field(f"{arch}.attention.key_length",
                     field(f"{arch}.embedding_length") // heads)
    window = field(f"{arch}.attention.sliding_window")
    per_position = 2 * kv_heads * head_dim * KV_BYTES[kv]
    positions = 0
    for layer in range(layers):
        local = window and arch == "gemma3" and (layer + 1) % GEMMA3_GLOBAL_EVERY != 0
        positions += min(depth, window) if local else depth
    return weights, int(positions * per_position)


def decode_run(bench: Path | None, model: str, depth: int, threads: int, kv: str,
               repeats: int) -> dict:
    """The long_context bench at one depth: by `cargo bench`, or `bench` run directly."""
    if bench is None:
        return long_context.switchyard(model, depth, threads, kv, repeats)
    env = dict(os.environ, SWITCHYARD_MODEL=model, LC_DEPTHS=str(depth),
               LC_THREADS=str(threads), LC_KV=kv, LC_PROMPT=str(long_context.PROMPT),
               LC_DECODE=str(long_context.DECODE), LC_REPEATS=str(repeats))
    out = subprocess.run([str(bench), "--bench"], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--depths", default="0,4096")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kv", default="f16", choices=sorted(KV_BYTES))
    parser.add_argument("--bench", type=Path, default=None,
                        help="a prebuilt long_context bench executable")
    args = parser.parse_args()
    build_roofline()
    rows = []
    for name in args.models.split(","):
        model = long_context.resolve(name)
        for threads in [int(t) for t in args.threads.split(",")]:
            for depth in [int(d) for d in args.depths.split(",")]:
                # The timed decode steps attend to the depth, the bench's
                # prompt and half its decode on average.
                attended = depth + long_context.PROMPT + long_context.DECODE // 2
                weights, kv_bytes = step_bytes(str(model.path), attended, args.kv)
                footprint = (weights + kv_bytes) / 1e6
                before = {mb: read_bandwidth(threads, mb) for mb in (DRAM_MB, footprint)}
                run = decode_run(args.bench, str(model.path), depth, threads, args.kv,
                                 args.repeats)
                after = {mb: read_bandwidth(threads, mb) for mb in (DRAM_MB, footprint)}
                decode = run["decode_tok_s"]
                achieved = (weights + kv_bytes) * decode / 1e9
                dram = max(before[DRAM_MB], after[DRAM_MB])
                sized = max(before[footprint], after[footprint])
                row = dict(model=name, threads=threads, depth=depth, decode_tok_s=decode,
                           weight_mb=weights / 1e6, kv_mb=kv_bytes / 1e6,
                           achieved_gb_s=achieved, read_gb_s=max(dram, sized),
                           share=achieved / max(dram, sized),
                           dram_read_gb_s=dram, share_dram=achieved / dram,
                           footprint_read_gb_s=sized, share_footprint=achieved / sized,
                           reads_512mb=[before[DRAM_MB], after[DRAM_MB]],
                           reads_step_sized=[before[footprint], after[footprint]])
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    print("| model | threads | depth | decode tok/s | MB a step (weights + KV) | "
          "GB/s read by decode | 512 MB read GB/s | share | step-sized read GB/s | share | "
          "share of the higher read |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['threads']} | {r['depth']} | {r['decode_tok_s']:.1f} | "
              f"{r['weight_mb']:.0f} + {r['kv_mb']:.1f} | {r['achieved_gb_s']:.1f} | "
              f"{r['dram_read_gb_s']:.1f} | {100 * r['share_dram']:.0f}% | "
              f"{r['footprint_read_gb_s']:.1f} | {100 * r['share_footprint']:.0f}% | "
              f"**{100 * r['share']:.0f}%** |")

if __name__ == "__main__":
    main()
