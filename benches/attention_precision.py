"""Accuracy of `--attention-precision bf16` against f32 on real models: the
same prompts through `switchyard logits` with each precision, compared on
their logits (max and mean |Δ|, KL of the next-token distributions) and
their greedy continuations (how many steps agree before they part, and
whether the whole continuation is identical).

Prompts: the Gemma 3 numerics test's seven (short, code, chat, one past the
512-position window) and a long one at `--long` tokens (default 4096: the
global layers attend over all of it). Speed is measured separately by
`benches/long_context.py --attention f32,bf16`.

`--speed 4096,16384` instead times a whole prompt of that many tokens
(Gemma 3 by default, `--models`) through `switchyard generate` with each
precision and through llama.cpp (llama-cpp-python) on the same ids, in one
run, in turns: a quick look that needs only the release binary (the
per-depth figures are `benches/long_context.py --attention f32,bf16`).
Prompts past ~28k tokens do not fit one command-line argument.

`--against bf16-prompt` compares that precision (BF16 only for the rows of
prompt chunks that AMX takes) with f32 instead of bf16; `--against bf16x3`
the same rows with split operands (three BF16 products each).

Usage: .venv/bin/python benches/attention_precision.py [--models gemma3,smollm2]
  [--long 4096] [--greedy 32] [--threads 2] [--speed N,N...] [--repeats 1]
  [--against bf16|bf16-prompt|bf16x3]
Prints a Markdown table; JSON lines on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests/python"))
from test_gemma3_numerics import LONG_TEXT, PROMPTS  # noqa: E402

BIN = os.environ.get("SWITCHYARD_BIN", str(ROOT / "target/release/switchyard"))
# Rows compared per prompt (the last ones): a 262k vocabulary makes rows
# costly, so a prompt longer than ALL_ROWS_UP_TO compares its last row only.
ROWS = 64
ALL_ROWS_UP_TO = 256


def model_path(name: str) -> str:
    script = {"gemma3": "scripts/fetch-gemma3.sh", "smollm2": "scripts/fetch-model.sh"}.get(name)
    if script is None:
        return name
    return subprocess.run([str(ROOT / script)], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]


def run(model: str, ids: list[int], attention: str, greedy: int, threads: int,
        work: Path) -> tuple[np.ndarray, list[int]]:
    ids_file, out = work / "ids.json", work / f"logits_{attention}.npy"
    ids_file.write_text(json.dumps(ids))
    info = subprocess.run(
        [BIN, "logits", "--model", model, "--tokens-file", str(ids_file), "--out", str(out),
         "--positions", "all" if len(ids) <= ALL_ROWS_UP_TO else "last", "--greedy", str(greedy), "--threads", str(threads),
         "--attention-precision", attention],
        check=True, capture_output=True, text=True).stdout
    return np.load(out)[-ROWS:].astype(np.float64), json.loads(info)["greedy"]


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    def log_softmax(x):
        x = x - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=1)


def speed(model: str, lengths: list[int], threads: int, repeats: int) -> None:
    """Prompt tok/s of whole prompts: f32, bf16, llama.cpp, in turns."""
    import re
    import time

    from llama_cpp import Llama

    rows = []
    for n in lengths:
        text = LONG_TEXT * (n // 90 + 1)
        ids = json.loads(subprocess.run([BIN, "tokenize", "--model", model, "--text", text],
                                        check=True, capture_output=True, text=True).stdout)["ids"]
        while len(ids) > n:
            text = text[: int(len(text) * n / len(ids)) - 1]
            ids = json.loads(subprocess.run([BIN, "tokenize", "--model", model, "--text", text],
                                            check=True, capture_output=True, text=True).stdout)["ids"]
        best = {}
        for _ in range(repeats):
            for attention in ("f32", "bf16"):
                out = subprocess.run(
                    [BIN, "generate", "--model", model, "--prompt", text, "--max-tokens", "1",
                     "--temperature", "0", "--speculate", "off", "--threads", str(threads),
                     "--attention-precision", attention],
                    check=True, capture_output=True, text=True)
                got = re.search(r"prompt: (\d+) tokens, ([\d.]+) tokens/s", out.stdout + out.stderr)
                best[attention] = max(best.get(attention, 0.0), float(got.group(2)))
            llm = Llama(model_path=model, n_ctx=len(ids) + 8, n_threads=threads,
                        n_threads_batch=threads, n_batch=512, n_ubatch=512, verbose=False,
                        swa_full=False)
            start = time.perf_counter()
            llm.eval(ids)
            best["llama.cpp"] = max(best.get("llama.cpp", 0.0),
                                    len(ids) / (time.perf_counter() - start))
            del llm
        row = {"tokens": len(ids), **{k: round(v, 1) for k, v in best.items()}}
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    load = os.getloadavg()[0]
    print(f"Whole-prompt tok/s, {threads} threads, best of {repeats} (load average {load:.1f})")
    print()
    print("| prompt tokens | f32 | bf16 | bf16 / f32 | llama.cpp | f32 / llama.cpp | bf16 / llama.cpp |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['tokens']} | {r['f32']} | {r['bf16']} | {r['bf16'] / r['f32']:.2f}× | "
              f"{r['llama.cpp']} | {r['f32'] / r['llama.cpp']:.2f}× | {r['bf16'] / r['llama.cpp']:.2f}× |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gemma3,smollm2")
    ap.add_argument("--long", type=int, default=4096)
    ap.add_argument("--greedy", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--speed", default=None, help="prompt lengths to time instead")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--against", default="bf16",
                    help="the precision compared with f32: bf16, bf16-prompt (BF16 for the "
                         "rows of prompt chunks on AMX, f32 for the rest) or bf16x3 (those "
                         "rows with split operands)")
    args = ap.parse_args()
    if args.speed:
        model = model_path(args.models.split(",")[0] if "," not in args.models else "gemma3")
        speed(model, [int(n) for n in args.speed.split(",")], args.threads, args.repeats)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            model = model_path(name)
            prompts = dict(PROMPTS)
            prompts[f"long{args.long}"] = LONG_TEXT * (args.long // 100)
            for label, text in prompts.items():
                ids = json.loads(subprocess.run(
                    [BIN, "tokenize", "--model", model, "--text", text],
                    check=True, capture_output=True, text=True).stdout)["ids"]
                if label.startswith("long"):
                    ids = (ids * (args.long // max(len(ids), 1) + 1))[: args.long]
                f32, g32 = run(model, ids, "f32", args.greedy, args.threads, work)
                b16, g16 = run(model, ids, args.against, args.greedy, args.threads, work)
                diff = np.abs(b16 - f32)
                agree = next((i for i, (a, b) in enumerate(zip(g32, g16)) if a != b), len(g32))
                row = {"model": name, "prompt": label, "tokens": len(ids),
                       "max_abs": round(float(diff.max()), 4),
                       "mean_abs": round(float(diff.mean()), 5),
                       "kl_mean": float(f"{kl(f32, b16).mean():.2e}"),
                       "argmax_rows_equal": int((f32.argmax(1) == b16.argmax(1)).sum()),
                       "rows": len(f32), "greedy_agree": agree, "greedy": len(g32)}
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
    load = os.getloadavg()[0]
    print(f"{args.against} against f32 attention products, {args.threads} threads, the last {ROWS} rows "
          f"of each prompt (the last row past {ALL_ROWS_UP_TO} tokens), greedy {args.greedy} "
          f"steps (load average {load:.1f})")
    print()
    print("| model | prompt | tokens | max abs Δlogit | mean abs Δlogit | KL mean | "
          "argmax equal (rows) | greedy steps equal |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['prompt']} | {r['tokens']} | {r['max_abs']} | {r['mean_abs']} | "
              f"{r['kl_mean']} | {r['argmax_rows_equal']}/{r['rows']} | "
              f"{r['greedy_agree']}/{r['greedy']} |")


if __name__ == "__main__":
    main()
