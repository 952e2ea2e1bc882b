"""Prompt and decode tokens/s against context depth: Switchyard
(`cargo bench --bench long_context`) and llama.cpp (llama-cpp-python) on the
same GGUF, at the same KV type (`--kv f16`, both defaults, or `--kv q8_0`:
llama.cpp's `type_k = type_v = GGML_TYPE_Q8_0`, which needs its flash
attention; `--kv f32` runs llama.cpp at f16, its nearest), the same token ids and thread count, depth
after depth in one run (each depth measures Switchyard, then llama.cpp, so
that both see the same load on a shared machine).

At depth d: d tokens already in the cache, then PROMPT more prompt tokens
timed as one call (prompt tok/s at that depth), then DECODE greedy tokens
one call each (decode tok/s; greedy ids in Switchyard, fixed ids in
llama.cpp, the same work). Best of REPEATS for both engines.

Usage: .venv/bin/python benches/long_context.py [MODEL.gguf]
  [--depths 0,1024,4096,8000] [--threads 2] [--repeats 2] [--kv f16|f32|q8_0]
  [--svg docs/long_context.svg]
Prints a Markdown table and JSON lines (stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROMPT = 128
DECODE = 32
REPEATS = 2
# llama.cpp's ggml type ids for its KV cache (`type_k`/`type_v`).
GGML_TYPES = {"f16": 1, "q8_0": 8}


def ids(start: int, n: int) -> list[int]:
    """The ids benches/long_context.rs feeds."""
    return [100 + (i * 7919) % 48000 for i in range(start, start + n)]


def switchyard(model: str, depth: int, threads: int, kv: str) -> dict:
    env = dict(os.environ, SWITCHYARD_MODEL=model, LC_DEPTHS=str(depth), LC_THREADS=str(threads),
               LC_KV=kv, LC_PROMPT=str(PROMPT), LC_DECODE=str(DECODE), LC_REPEATS=str(REPEATS))
    out = subprocess.run(["cargo", "bench", "-q", "--bench", "long_context"], cwd=ROOT, env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def llama_kv(kv: str) -> str:
    """The KV type llama.cpp runs for Switchyard's `kv`."""
    return kv if kv in GGML_TYPES else "f16"


def llama_cpp(model: str, depth: int, threads: int, kv: str) -> dict:
    from llama_cpp import Llama

    kv = llama_kv(kv)
    # A quantized V cache needs llama.cpp's flash attention; F16 keeps
    # llama-cpp-python's default (off), as the earlier tables ran it.
    quantized = {"type_k": GGML_TYPES[kv], "type_v": GGML_TYPES[kv], "flash_attn": True} \
        if kv != "f16" else {}
    llm = Llama(model_path=model, n_ctx=depth + PROMPT + DECODE + 16, n_threads=threads,
                n_threads_batch=threads, n_batch=512, n_ubatch=512, verbose=False, **quantized)
    best_prompt = best_decode = 0.0
    for _ in range(REPEATS):
        llm.reset()
        if depth:
            llm.eval(ids(0, depth))
        start = time.perf_counter()
        llm.eval(ids(depth, PROMPT))
        best_prompt = max(best_prompt, PROMPT / (time.perf_counter() - start))
        start = time.perf_counter()
        # Fixed ids rather than greedy ones: llama-cpp-python keeps only
        # n_batch logit rows, and the ids do not change the work.
        for nxt in ids(depth + PROMPT, DECODE):
            llm.eval([nxt])
        best_decode = max(best_decode, DECODE / (time.perf_counter() - start))
    del llm
    return {"engine": "llama.cpp", "kv": kv, "threads": threads, "depth": depth,
            "prompt": PROMPT, "decode": DECODE,
            "prompt_tok_s": round(best_prompt, 2), "decode_tok_s": round(best_decode, 2)}


def svg(rows: list[tuple[dict, dict]], path: Path, title: str) -> None:
    """Two panels (decode, prompt): tokens/s against depth, both engines."""
    width, height, pad = 860, 360, 60
    panel = (width - 3 * pad) // 2
    depths = [s["depth"] for s, _ in rows]
    xmax = max(depths) or 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<text x="{width // 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    colors = {"switchyard": "#1f77b4", "llama.cpp": "#d62728"}
    for p, key in enumerate(["decode_tok_s", "prompt_tok_s"]):
        x0, y0, h = pad + p * (panel + pad), height - pad, height - 2 * pad - 10
        ymax = max(max(s[key], l[key]) for s, l in rows) * 1.1
        parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x0 + panel}" y2="{y0}" stroke="black"/>')
        parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 - h}" stroke="black"/>')
        label = "decode tok/s" if key == "decode_tok_s" else f"prompt tok/s ({PROMPT} tokens)"
        parts.append(f'<text x="{x0 + panel // 2}" y="{y0 - h - 8}" text-anchor="middle">{label}</text>')
        parts.append(f'<text x="{x0 + panel // 2}" y="{y0 + 35}" text-anchor="middle">context depth (tokens)</text>')
        for t in range(5):
            v = ymax * t / 4
            y = y0 - h * t / 4
            parts.append(f'<text x="{x0 - 6}" y="{y + 4:.0f}" text-anchor="end">{v:.0f}</text>')
            parts.append(f'<line x1="{x0}" y1="{y:.0f}" x2="{x0 + panel}" y2="{y:.0f}" stroke="#ddd"/>')
        for d in depths:
            x = x0 + panel * d / xmax
            parts.append(f'<text x="{x:.0f}" y="{y0 + 16}" text-anchor="middle">{d}</text>')
        for i, engine in enumerate(["switchyard", "llama.cpp"]):
            pts = [(x0 + panel * r[i]["depth"] / xmax, y0 - h * r[i][key] / ymax) for r in rows]
            path_d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            parts.append(f'<polyline points="{path_d}" fill="none" stroke="{colors[engine]}" stroke-width="2"/>')
            for x, y in pts:
                parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colors[engine]}"/>')
            parts.append(f'<text x="{x0 + panel - 4}" y="{y0 - h + 14 + 14 * i}" text-anchor="end" '
                         f'fill="{colors[engine]}">{engine}</text>')
    parts.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?",
                    default=str(Path.home() / ".cache/switchyard/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--depths", default="0,1024,4096,8000")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--svg", default=str(ROOT / "docs/long_context.svg"))
    ap.add_argument("--repeats", type=int, default=REPEATS)
    args = ap.parse_args()
    globals()["REPEATS"] = args.repeats
    rows = []
    for depth in (int(d) for d in args.depths.split(",")):
        s = switchyard(args.model, depth, args.threads, args.kv)
        l = llama_cpp(args.model, depth, args.threads, args.kv)
        print(json.dumps(s), file=sys.stderr)
        print(json.dumps(l), file=sys.stderr)
        rows.append((s, l))
    name = Path(args.model).name
    print(f"| depth | Switchyard decode | llama.cpp decode | ratio | Switchyard prompt | llama.cpp prompt | ratio | Switchyard KV MB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for s, l in rows:
        print(f"| {s['depth']} | {s['decode_tok_s']:.1f} | {l['decode_tok_s']:.1f} | "
              f"{s['decode_tok_s'] / l['decode_tok_s']:.2f}× | {s['prompt_tok_s']:.1f} | "
              f"{l['prompt_tok_s']:.1f} | {s['prompt_tok_s'] / l['prompt_tok_s']:.2f}× | "
              f"{s['kv_bytes'] / 1e6:.1f} |")
    svg(rows, Path(args.svg), f"{name}, {args.threads} threads, KV {args.kv} (Switchyard) / "
        f"{llama_kv(args.kv)} (llama.cpp)")


if __name__ == "__main__":
    main()
