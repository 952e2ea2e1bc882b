"""Prompt and decode tokens/s against context depth: Switchyard
(`cargo bench --bench long_context`) and llama.cpp (llama-cpp-python) on the
same GGUF, at the same KV type (`--kv f16`, both defaults, or `--kv q8_0`:
llama.cpp's `type_k = type_v = GGML_TYPE_Q8_0`, which needs its flash
attention; `--kv f32` runs llama.cpp at f16, its nearest), the same token ids
and thread count, depth
after depth in one run (each depth measures Switchyard, then llama.cpp, so
that both see the same load on a shared machine).

At depth d: d tokens already in the cache, then PROMPT more prompt tokens
timed as one call (prompt tok/s at that depth), then DECODE tokens one call
each (decode tok/s). Both engines get exactly the same ids, and no BOS:
neither `Session::feed` nor `Llama.eval` adds one (the ids are not text).
Best of REPEATS for both engines; depths from DEEP on take `--deep-repeats`
(default 1), since filling 16k-32k tokens dominates the run (there the fill
warms both engines up; at depth 0, `--repeats 1` times a cold first call,
llama.cpp's several times slower than its warm ones).

Models (`--model`, or a path as the first argument):
  smollm2  SmolLM2-135M Q4_1 (8k context): depths 0,1024,4096,8000,
           plot docs/long_context.svg (the default, as before)
  gemma3   Gemma 3 270M Q4_K_M (32k context, `scripts/fetch-gemma3.sh`):
           depths 0,1024,4096,16384,32000, plot docs/long_context_gemma3.svg
  PATH     any GGUF: depths 0,1024,4096, plot docs/long_context_<stem>.svg

llama.cpp keeps only the window of sliding-window layers (`swa_full=False`,
llama-server's default; llama-cpp-python's own default is the full-size
cache), as Switchyard does; its KV size is read from its log.

`--attention f32,bf16` measures Switchyard once per attention precision
(`--attention-precision`, docs/ATTENTION_PRECISION.md) at every depth, each
beside the same llama.cpp run; the plot draws the first. `bf16-noamx` is
bf16 with `SWITCHYARD_AMX=0`: on a CPU with AMX, the products on
`vdpbf16ps` instead of AMX tiles (the same bits, to compare speed).

Usage: .venv/bin/python benches/long_context.py [--model gemma3|smollm2|PATH]
  [--depths ...] [--threads 2] [--repeats 2] [--deep-repeats 1] [--kv f16|f32|q8_0]
  [--attention f32[,bf16][,bf16-noamx]] [--bench BIN [--bench BIN2]] [--svg ...]
Prints a Markdown table and JSON lines (stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = 128
DECODE = 32
REPEATS = 2
# Depths from here on are measured `--deep-repeats` times: one fill of 32k
# tokens takes minutes in each engine on two cores.
DEEP = 16384
# llama.cpp's ggml type ids for its KV cache (`type_k`/`type_v`).
GGML_TYPES = {"f16": 1, "q8_0": 8}


@dataclass
class Model:
    label: str
    path: str
    depths: str
    svg: Path


def resolve(model: str) -> Model:
    """A model name or GGUF path, with its default depths and plot."""
    if model == "smollm2":
        path = Path.home() / ".cache/switchyard/models/SmolLM2-135M-Instruct.Q4_1.gguf"
        return Model("SmolLM2-135M Q4_1", str(path), "0,1024,4096,8000",
                     ROOT / "docs/long_context.svg")
    if model == "gemma3":
        # Prints the cached path; touches the network only when not cached.
        path = subprocess.run([str(ROOT / "scripts/fetch-gemma3.sh")], check=True,
                              capture_output=True, text=True).stdout.strip()
        # 32000 + 128 + 32 stays inside the 32768 the model was trained for.
        return Model("Gemma 3 270M Q4_K_M", path, "0,1024,4096,16384,32000",
                     ROOT / "docs/long_context_gemma3.svg")
    if Path(model).name == "SmolLM2-135M-Instruct.Q4_1.gguf":
        return resolve("smollm2")
    stem = Path(model).stem
    return Model(Path(model).name, model, "0,1024,4096", ROOT / f"docs/long_context_{stem}.svg")


def ids(start: int, n: int) -> list[int]:
    """The ids benches/long_context.rs feeds (below every vocabulary here)."""
    return [100 + (i * 7919) % 48000 for i in range(start, start + n)]


def switchyard(model: str, depth: int, threads: int, kv: str, repeats: int,
               attention: str = "f32", bench: str | None = None) -> dict:
    # `bf16-noamx`: BF16 products on `vdpbf16ps` even where AMX is present.
    # `bf16-prompt` is a precision of its own (BF16 for AMX's rows only).
    variant = "noamx" if attention.endswith("-noamx") else ""
    precision = attention.removesuffix("-noamx")
    env = dict(os.environ, SWITCHYARD_MODEL=model, LC_DEPTHS=str(depth), LC_THREADS=str(threads),
               LC_KV=kv, LC_PROMPT=str(PROMPT), LC_DECODE=str(DECODE), LC_REPEATS=str(repeats),
               SWITCHYARD_BENCH_ATTENTION=precision)
    if variant == "noamx":
        env["SWITCHYARD_AMX"] = "0"
    # A built executable (`--bench BIN`) runs as it is: no build inside a
    # measurement, and two builds can be compared in one run.
    command = [bench, "--bench"] if bench else ["cargo", "bench", "-q", "--bench", "long_context"]
    out = subprocess.run(command, cwd=ROOT, env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# llama.cpp's log, kept to read the KV size it allocates (one line per
# cache: Gemma 3 has one for the global layers and one for the windowed).
_LOG: list[str] = []
_KV_LINE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB")


def _keep_log() -> None:
    import ctypes

    import llama_cpp

    @llama_cpp.llama_log_callback
    def keep(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        _LOG.append(text.decode("utf-8", "replace"))

    globals()["_log_callback"] = keep  # ctypes calls it: keep it alive
    llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))


def llama_kv(kv: str) -> str:
    """The KV type llama.cpp runs for Switchyard's `kv`."""
    return kv if kv in GGML_TYPES else "f16"


def llama_cpp(model: str, depth: int, threads: int, repeats: int, flash_attn: bool,
              kv: str) -> dict:
    from llama_cpp import Llama

    if "_log_callback" not in globals():
        _keep_log()
    _LOG.clear()
    kv = llama_kv(kv)
    # A quantized V cache needs llama.cpp's flash attention; F16 keeps
    # llama-cpp-python's default (off) unless asked.
    kv_options = {"flash_attn": flash_attn}
    if kv != "f16":
        kv_options = {"type_k": GGML_TYPES[kv], "type_v": GGML_TYPES[kv], "flash_attn": True}
    llm = Llama(model_path=model, n_ctx=depth + PROMPT + DECODE + 16, n_threads=threads,
                n_threads_batch=threads, n_batch=512, n_ubatch=512, verbose=False,
                swa_full=False, **kv_options)
    kv_mib = sum(float(m.group(1)) for m in _KV_LINE.finditer("".join(_LOG)))
    best_prompt = best_decode = 0.0
    for _ in range(repeats):
        llm.reset()
        if depth:
            llm.eval(ids(0, depth))
        start = time.perf_counter()
        llm.eval(ids(depth, PROMPT))
        best_prompt = max(best_prompt, PROMPT / (time.perf_counter() - start))
        start = time.perf_counter()
        for nxt in ids(depth + PROMPT, DECODE):
            llm.eval([nxt])
        best_decode = max(best_decode, DECODE / (time.perf_counter() - start))
    del llm
    return {"engine": "llama.cpp", "kv": kv, "threads": threads, "depth": depth,
            "prompt": PROMPT, "decode": DECODE, "flash_attn": kv_options["flash_attn"],
            "prompt_tok_s": round(best_prompt, 2), "decode_tok_s": round(best_decode, 2),
            "kv_bytes": round(kv_mib * 2**20)}


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
    ap.add_argument("path", nargs="?", help="a GGUF (as --model PATH)")
    ap.add_argument("--model", default=None, help="gemma3, smollm2 (default) or a GGUF path")
    ap.add_argument("--depths", default=None, help="the model's own by default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--svg", default=None, help="the model's own by default")
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--deep-repeats", type=int, default=1, help=f"repeats at depths >= {DEEP}")
    ap.add_argument("--flash-attn", action="store_true", help="llama.cpp with flash attention")
    ap.add_argument("--bench", action="append", default=None, metavar="BIN",
                    help="run this built long_context executable (`cargo bench --no-run "
                         "--bench long_context` prints its path) instead of `cargo bench`; "
                         "given twice or more, each is measured with every --attention")
    ap.add_argument("--attention", default="f32",
                    help="Switchyard's attention precisions, comma-separated (f32, bf16, bf16-prompt, "
                         "bf16-noamx: BF16 on vdpbf16ps where AMX is present)")
    args = ap.parse_args()
    # Every (executable, precision) pair is one Switchyard column.
    benches = args.bench or [None]
    attentions = [(b, a) for b in benches for a in args.attention.split(",")]
    model = resolve(args.model or args.path or "smollm2")
    depths = [int(d) for d in (args.depths or model.depths).split(",")]
    rows, began = [], time.perf_counter()
    for depth in depths:
        repeats = args.deep_repeats if depth >= DEEP else args.repeats
        start = time.perf_counter()
        ours = []
        for bench, attention in attentions:
            ours.append(switchyard(model.path, depth, args.threads, args.kv, repeats, attention,
                                   bench))
            print(json.dumps(ours[-1]), file=sys.stderr)
        l = llama_cpp(model.path, depth, args.threads, repeats, args.flash_attn, args.kv)
        seconds = time.perf_counter() - start
        print(json.dumps(l), file=sys.stderr)
        print(f"depth {depth}: {seconds:.0f} s for both engines, best of {repeats}", file=sys.stderr)
        rows.append((ours, l))
    load = os.getloadavg()[0]
    minutes = (time.perf_counter() - began) / 60
    fa = ", flash attention" if args.flash_attn or llama_kv(args.kv) != "f16" else ""
    print(f"**{model.label}** (`{Path(model.path).name}`), {args.threads} threads, KV {args.kv} "
          f"(Switchyard) / {llama_kv(args.kv)}{fa} (llama.cpp), prompt {PROMPT}, decode {DECODE}, "
          f"best of {args.repeats} (of {args.deep_repeats} from depth {DEEP}); "
          f"{minutes:.1f} minutes in all; load average {load:.1f} at the end")
    print()
    for a, (bench, attention) in enumerate(attentions):
        if len(attentions) > 1:
            which = f" ({bench})" if bench and len(benches) > 1 else ""
            print(f"Switchyard attention {attention}{which}:")
            print()
        print("| depth | Switchyard decode | llama.cpp decode | ratio | Switchyard prompt | "
              "llama.cpp prompt | ratio | Switchyard KV MB (windowed layers) | llama.cpp KV MB |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for ours, l in rows:
            s = ours[a]
            print(f"| {s['depth']} | {s['decode_tok_s']:.1f} | {l['decode_tok_s']:.1f} | "
                  f"{s['decode_tok_s'] / l['decode_tok_s']:.2f}× | {s['prompt_tok_s']:.1f} | "
                  f"{l['prompt_tok_s']:.1f} | {s['prompt_tok_s'] / l['prompt_tok_s']:.2f}× | "
                  f"{s['kv_bytes'] / 1e6:.1f} ({s.get('kv_windowed_bytes', 0) / 1e6:.1f}) | "
                  f"{l['kv_bytes'] / 1e6:.1f} |")
        print()
    rows = [(ours[0], l) for ours, l in rows]
    # Another KV type draws beside the model's plot, not over it.
    default_svg = model.svg if args.kv == "f16" else \
        model.svg.with_name(f"{model.svg.stem}_{args.kv}{model.svg.suffix}")
    svg(rows, Path(args.svg) if args.svg else default_svg,
        f"{model.label}, {args.threads} threads, KV {args.kv} (Switchyard) / "
        f"{llama_kv(args.kv)}{fa} (llama.cpp)")


if __name__ == "__main__":
    main()
