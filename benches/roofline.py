"""Decode against the machine's streaming read: the roofline column of
BENCHMARKS.md.

A decode step of one sequence reads every weight once (a tied embedding
is the output matrix too; an untied one is only gathered, one row) and the
KV of every position its layers attend to (a sliding-window layer only its
window). Bytes per step times steps per second, over what a plain streaming
read gets on as many threads in the same run (`benches/machine_roofline.c`),
is the share of the memory bound a decode reaches.

A read point is two reads: of 512 MB (past the host's L3: the DRAM read)
and of as many bytes as the step reads (its footprint, read again and again
as the decode reads it step after step), each the best of READ_CALLS runs
of the program; its ceiling is the higher of the two (a footprint that a
large L3 partly holds is judged against a read the L3 serves the same way;
docs/bench/roofline.md, "Which ceiling").

The host's read moves by 2-3x between minutes (other tenants), so reads and
decodes alternate in short slices: read point, decode, read point, decode,
... (`--rounds` rounds, each running every `--bench` executable once), and
each decode's share is of the mean of the read points just before and just
after it. The summary gives each executable's median and range over the
rounds, and its decode over the first executable's in the same round.

The headline share is of the best read (the ceiling the memory reaches).
Each read run's median is kept too: on this VM two threads' median read
was at times half their best, and a decode of a hundred steps lives
through such moments as a median read does, so its share of the median
read is printed beside it.

Usage: .venv/bin/python benches/roofline.py [--models smollm2,gemma3]
  [--depths 0,4096] [--threads 2] [--rounds 3] [--decode 32] [--repeats 2]
  [--kv f16] [--bench BIN [--bench BIN2 ...] [--labels main,branch]]
`--bench` runs a prebuilt bench executable (`cargo bench --no-run --bench
long_context` prints its path) instead of `cargo bench`, so nothing is
compiled inside a quiet-run. On a shared host run it inside
`benches/own_autogroup.sh` (as `own_autogroup.sh .venv/bin/python
benches/roofline.py ...`): with autogroup scheduling, nice alone does not
keep other sessions off the CPUs (docs/bench/roofline.md).
Prints a Markdown table (stdout) and one JSON line per decode (stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from gguf import GGUFReader

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benches"))
import long_context  # noqa: E402  (its Switchyard runner and model paths)

# In this checkout's target/, not /tmp: two checkouts measuring at once
# would otherwise run each other's build of the program.
ROOFLINE_BIN = ROOT / "target" / "machine_roofline"
KV_BYTES = {"f16": 2, "f32": 4, "q8_0": 34 / 32}
# The DRAM read: well past the host's 300 MB L3.
DRAM_MB = 512
# Runs of the read program per read point. Since each of its timings reads
# at least 6 GB, one run's best and median mostly agree within 5-10%; two
# runs a point keep the point short.
READ_CALLS = 2
# Gemma 3: every sixth layer attends globally, the others over the window.
GEMMA3_GLOBAL_EVERY = 6


def build_roofline() -> None:
    """Compiles benches/machine_roofline.c (again: its source may have moved on)."""
    ROOFLINE_BIN.parent.mkdir(exist_ok=True)
    subprocess.run(["gcc", "-O3", "-funroll-all-loops", "-mavx512f", "-mfma",
                    str(ROOT / "benches/machine_roofline.c"), "-o", str(ROOFLINE_BIN),
                    "-lpthread"], check=True)


def read_bandwidth(threads: int, megabytes: float = DRAM_MB,
                   calls: int = READ_CALLS) -> tuple[float, float]:
    """GB/s of the streaming read of `megabytes` on `threads` threads: the best
    of `calls` runs of the program (each the best of its own rounds), and the
    median of their medians."""
    best, medians = 0.0, []
    for _ in range(calls):
        out = subprocess.run([str(ROOFLINE_BIN), "read", f"{megabytes:.1f}", str(threads)],
                             check=True, capture_output=True, text=True).stdout
        found = re.search(rf"read, {threads} thread\(s\): ([\d.]+) GB/s \(median ([\d.]+)\)",
                          out)
        if not found:
            raise SystemExit(f"no {threads}-thread read in:\n{out}")
        best = max(best, float(found.group(1)))
        medians.append(float(found.group(2)))
    return best, statistics.median(medians)


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
               repeats: int, decode: int) -> dict:
    """The long_context bench at one depth: `bench` run directly, or by `cargo bench`."""
    env = dict(os.environ, SWITCHYARD_MODEL=model, LC_DEPTHS=str(depth),
               LC_THREADS=str(threads), LC_KV=kv, LC_PROMPT=str(long_context.PROMPT),
               LC_DECODE=str(decode), LC_REPEATS=str(repeats))
    command = ([str(bench), "--bench"] if bench
               else ["cargo", "bench", "-q", "--bench", "long_context"])
    out = subprocess.run(command, cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def ceiling(threads: int, footprint_mb: float) -> dict:
    """One read point: the DRAM read and the footprint read (best and
    median), and the higher of each."""
    dram, dram_median = read_bandwidth(threads, DRAM_MB)
    sized, sized_median = read_bandwidth(threads, footprint_mb)
    return dict(dram=dram, footprint=sized, higher=max(dram, sized),
                dram_median=dram_median, footprint_median=sized_median,
                higher_median=max(dram_median, sized_median))


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, lowest, highest)."""
    return statistics.median(values), min(values), max(values)


def measure(args, benches: list[Path | None], name: str, threads: int, depth: int) -> list[dict]:
    """`--rounds` rounds of: for each bench, its decode between two read
    points (the read after one decode is the read before the next). A
    decode's share is of the mean of its two neighbouring reads, so a host
    that drifts over the run moves ceiling and decode together."""
    model = long_context.resolve(name)
    # The timed decode steps attend to the depth, the bench's prompt and
    # half its decode on average.
    attended = depth + long_context.PROMPT + args.decode // 2
    weights, kv_bytes = step_bytes(str(model.path), attended, args.kv)
    footprint = (weights + kv_bytes) / 1e6
    rows = []
    before = ceiling(threads, footprint)
    for round_ in range(args.rounds):
        for label, bench in zip(args.labels, benches):
            run = decode_run(bench, str(model.path), depth, threads, args.kv, args.repeats,
                             args.decode)
            after = ceiling(threads, footprint)
            decode = run["decode_tok_s"]
            achieved = (weights + kv_bytes) * decode / 1e9
            read = (before["higher"] + after["higher"]) / 2
            median = (before["higher_median"] + after["higher_median"]) / 2
            row = dict(model=name, threads=threads, depth=depth, round=round_, bench=label,
                       decode_tok_s=decode, weight_mb=weights / 1e6, kv_mb=kv_bytes / 1e6,
                       achieved_gb_s=achieved, read_gb_s=read, share=achieved / read,
                       median_read_gb_s=median, share_of_median=achieved / median,
                       reads_before=before, reads_after=after)
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
            before = after
    return rows


def summary(rows: list[dict], labels: list[str]) -> None:
    """Per model, depth, threads and bench: the median (range) of decode
    tok/s, of the read ceiling and of the share; with two or more benches,
    each one's decode over the first's in the same round (adjacent runs)."""
    print("| model | threads | depth | bench | decode tok/s | MB a step (weights + KV) | "
          "read GB/s | share of the read | median read GB/s | share of the median read | "
          "over the first bench |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    keys = sorted({(r["model"], r["threads"], r["depth"]) for r in rows},
                  key=lambda k: (k[0], k[1], k[2]))

    def fmt(values: list[float], scale: float = 1, digits: int = 1, unit: str = "") -> str:
        mid, low, high = spread([scale * v for v in values])
        return f"{mid:.{digits}f}{unit} ({low:.{digits}f}-{high:.{digits}f})"

    for model, threads, depth in keys:
        group = [r for r in rows if (r["model"], r["threads"], r["depth"]) == (model, threads, depth)]
        firsts = {r["round"]: r["decode_tok_s"] for r in group if r["bench"] == labels[0]}
        for label in labels:
            mine = [r for r in group if r["bench"] == label]
            ratio = "" if label == labels[0] else fmt(
                [r["decode_tok_s"] / firsts[r["round"]] for r in mine if r["round"] in firsts],
                digits=2, unit="×")
            print(f"| {model} | {threads} | {depth} | {label} | "
                  f"{fmt([r['decode_tok_s'] for r in mine])} | "
                  f"{mine[0]['weight_mb']:.0f} + {mine[0]['kv_mb']:.1f} | "
                  f"{fmt([r['read_gb_s'] for r in mine])} | "
                  f"**{fmt([r['share'] for r in mine], scale=100, digits=0, unit='%')}** | "
                  f"{fmt([r['median_read_gb_s'] for r in mine])} | "
                  f"{fmt([r['share_of_median'] for r in mine], scale=100, digits=0, unit='%')} | "
                  f"{ratio} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--depths", default="0,4096")
    parser.add_argument("--threads", default="2")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--decode", type=int, default=long_context.DECODE,
                        help="decode steps a run times")
    parser.add_argument("--kv", default="f16", choices=sorted(KV_BYTES))
    parser.add_argument("--bench", type=Path, action="append", default=None,
                        help="a prebuilt long_context bench executable; give it twice or "
                             "more to alternate executables within each round")
    parser.add_argument("--labels", default=None,
                        help="comma-separated names of the --bench executables")
    args = parser.parse_args()
    benches: list[Path | None] = args.bench or [None]
    args.labels = (args.labels.split(",") if args.labels
                   else [b.name if b else "cargo bench" for b in benches])
    if len(args.labels) != len(benches) or len(set(args.labels)) != len(benches):
        raise SystemExit("--labels: one distinct name per --bench")
    build_roofline()
    rows = []
    for name in args.models.split(","):
        for threads in [int(t) for t in args.threads.split(",")]:
            for depth in [int(d) for d in args.depths.split(",")]:
                rows += measure(args, benches, name, threads, depth)
    summary(rows, args.labels)


if __name__ == "__main__":
    main()
