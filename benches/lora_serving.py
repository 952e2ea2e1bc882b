"""Serving many LoRA adapters on one base: 16 clients spread over 1, 4, 16
and 64 distinct adapters against the base alone, against llama.cpp with the
same adapters, and against one merged replica per adapter, in one run (one
command, every row interleaved with its peers so they see the same load).

- switchyard base: `serve --model smol`, every client asks `smol`;
- switchyard N adapters: `serve --model smol --lora a0=... --lora aN-1=...`,
  client i asks adapter i mod N: the base's products run once per step for
  every row, each adapter's update on its own rows (mixed batches);
- switchyard N merged replicas: the base with each adapter merged into its
  weights (W + scale * B A, requantized to the base's type), one checkpoint
  per adapter, `--model m0 ... --model mN-1`: what serving fine-tunes costs
  without adapters (N copies of the weights, rows of different replicas in
  different steps). Runs for N <= --merged-max (default 16; each replica is
  a full file on disk and in RAM, 98 MB for SmolLM2: pass --merged-max 64 on
  a machine with ~8 GB to spare);
- llama.cpp: `llama-server` when the binary exists (scripts/build-llama-server.sh;
  or --llama-server BIN): every adapter loaded with `--lora` and
  `--lora-init-without-apply`, 16 slots, each request naming its adapter
  (`"lora": [{"id": i, "scale": 1}]`); llama-server "does not batch requests
  with different LoRA configurations". Without the binary, llama-cpp-python
  with one context per adapter (each serving one request at a time), for
  N <= --llama-max (default 16; a context per adapter holds its own copy of
  the weights).

Adapters are random rank-8 PEFT adapters on all seven projections
(tests/python/reference/lora.py), the same files for both engines (GGUF
form for llama.cpp). Each configuration runs REQUESTS completions of
MAX_TOKENS greedy tokens after a warm-up round; throughput counts the
tokens returned. The load average is read before and after: above 2 the
table and plot say "under load".

Usage: .venv/bin/python benches/lora_serving.py [--adapters 1,4,16,64]
  [--requests 64] [--max-tokens 32] [--threads 2] [--merged-max 16] [--llama-max 16]
  [--llama-server BIN] [--no-llama] [--svg docs/bench/lora_serving.svg] [--perf FOLDER]
  [--work FOLDER] [--rows FILE.json] [--prepare] [--f32]

A long run splits into calls of a few minutes (e.g. under quiet-run): first
`--work W --prepare` (adapters and merged replicas, untimed), then
`--work W --rows R.json --adapters N` per N; the last call's table and plot
hold every row of R.json.
Prints a Markdown table; writes the SVG plot.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import openai  # noqa: E402
from reference import checkpoint, lora  # noqa: E402
from serve_process import free_port, running_server  # noqa: E402

CLIENTS = 16
PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "My favourite food is"]


def make_adapters(model: Path, n: int, folder: Path) -> list[tuple[Path, Path]]:
    """Adapter i in PEFT and GGUF form (random, seed 100 + i: the same files on
    every call, so those already in `folder` are kept)."""
    cfg = checkpoint.load(model, values=False).config
    out = []
    for i in range(n):
        peft = folder / f"a{i}"
        gguf_file = folder / f"a{i}.gguf"
        if not gguf_file.exists():
            tensors = lora.random_peft(cfg, 8, 16.0, 100 + i, 0.04)
            lora.write_peft(peft, tensors, 8, 16.0)
            part = gguf_file.with_suffix(".part")
            lora.write_gguf(part, tensors, cfg, 16.0)
            part.rename(gguf_file)
        out.append((peft, gguf_file))
    return out


def merge(model: Path, adapter_gguf: Path, out: Path) -> Path:
    """`model` with the GGUF adapter merged into its weights: W + scale * B A for
    every adapted weight, requantized to W's own type; the rest copied."""
    updates = lora.gguf_updates(adapter_gguf)
    reader = gguf.GGUFReader(str(model))
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    writer = gguf.GGUFWriter(str(out), arch=arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        if t.name in updates:
            a, b, scale = updates[t.name]
            w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
            merged = (w + scale * (b @ a)).astype(np.float32)
            data = gguf.quants.quantize(merged, t.tensor_type) if t.tensor_type not in (
                gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) else merged.astype(
                np.float16 if t.tensor_type == gguf.GGMLQuantizationType.F16 else np.float32)
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


# Free disk a merged replica run leaves to everyone else on the machine.
DISK_MARGIN = 15 << 30


def merged_replicas(model: Path, files: list[tuple[Path, Path]], work: Path) -> list[Path] | None:
    """One merged checkpoint per adapter in `work` (kept there for later N and
    later calls: each is deterministic), or None when writing the missing ones
    would leave less than DISK_MARGIN free."""
    out = [work / f"merged{i}.gguf" for i in range(len(files))]
    missing = [i for i, path in enumerate(out) if not path.exists()]
    if shutil.disk_usage(work).free - len(missing) * model.stat().st_size < DISK_MARGIN:
        return None
    for i in missing:
        part = out[i].with_suffix(".part")
        merge(model, files[i][1], part)
        part.rename(out[i])
    return out


def drive(ask, n_models: int, requests: int) -> tuple[float, int]:
    """Runs `requests` calls of ask(model_index, prompt) from CLIENTS threads;
    returns (seconds, tokens)."""
    tokens = 0
    lock = threading.Lock()

    def one(i: int) -> None:
        nonlocal tokens
        got = ask(i % n_models, PROMPTS[i % len(PROMPTS)])
        with lock:
            tokens += got

    start = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(one, range(requests)))
    return time.perf_counter() - start, tokens


def switchyard(bin_path: Path, model: Path, adapters: list[Path], args, replicas: list[Path] = (),
               f32: bool = False) -> float:
    """Tokens/s of the base with `adapters` (resident in BF16, or F32 with
    `f32`), or of the merged `replicas` alone."""
    port, admin_port = free_port(), free_port()
    cmd = [str(bin_path), "serve", "--listen", f"127.0.0.1:{port}", "--threads", str(args.threads),
           "--max-batch", str(CLIENTS), "--admin-listen", f"127.0.0.1:{admin_port}"]
    if replicas:
        for i, path in enumerate(replicas):
            cmd += ["--model", str(path), "--model-name", f"m{i}"]
        names = [f"m{i}" for i in range(len(replicas))]
    else:
        cmd += ["--model", str(model), "--model-name", "smol"]
        for i, path in enumerate(adapters):
            cmd += ["--lora", f"a{i}={path}"]
        names = [f"a{i}" for i in range(len(adapters))] or ["smol"]
    env = {"SWITCHYARD_LORA_F32": "1"} if f32 else {}
    env["SWITCHYARD_ADMIN_TOKEN"] = ADMIN_TOKEN
    with running_server(cmd, port, env=env, ready_within=600) as proc:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=600)

        def ask(i: int, prompt: str) -> int:
            r = client.completions.create(model=names[i], prompt=prompt, max_tokens=args.max_tokens, temperature=0)
            return r.usage.completion_tokens

        drive(ask, len(names), CLIENTS)  # warm-up
        label = "base"
        if replicas or adapters:
            label = f"{'merged' if replicas else 'adapters'}{len(names)}{'-f32' if f32 else ''}"
        before = probe(proc.pid, admin_port)
        with profiled(proc.pid, args.perf, label):
            seconds, tokens = drive(ask, len(names), args.requests)
        after = probe(proc.pid, admin_port)
    steps = after["steps"] - before["steps"]
    busy = {k: (after["cpu"].get(k, 0) - before["cpu"].get(k, 0)) / seconds for k in after["cpu"]}
    PROBES.append({"label": label, "seconds": seconds, "tokens": tokens, "steps": steps,
                   "tokens_per_step": tokens / max(steps, 1), "ms_per_step": 1e3 * seconds / max(steps, 1),
                   "cpu_share": {k: round(v, 2) for k, v in busy.items()}})
    print(PROBES[-1], file=sys.stderr, flush=True)
    return tokens / seconds


# The admin token the bench's servers take, to read their step counts.
ADMIN_TOKEN = "lora-bench-admin-token-0123456789"
# What each measured round saw inside the server (see `probe`).
PROBES: list[dict] = []


def probe(pid: int, port: int) -> dict:
    """The executor's step count (`/admin/status`) and the CPU seconds each
    of the server's named threads has used (executor, kernel workers, the
    rest summed), read before and after a measured round: tokens per step
    says whether steps ran full, a thread's CPU share whether it waited."""
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}/admin/status",
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        steps = json.load(r)["executor"]["steps"]
    tick = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / tick
            key = name if name.startswith("switchyard-") else "other"
            cpu[key] = cpu.get(key, 0.0) + seconds
    return {"steps": steps, "cpu": cpu}


@contextlib.contextmanager
def profiled(pid: int, folder: Path | None, label: str):
    """With --perf FOLDER: `perf record` of the server while the measured
    round runs (not the start or the warm-up), into FOLDER/LABEL.data; read
    with `perf report -i FOLDER/LABEL.data --no-children`."""
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    perf = subprocess.Popen(["perf", "record", "-F", "499", "-g", "-p", str(pid), "-o", str(folder / f"{label}.data")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=120)


def llama_server(bin_path: Path, model: Path, adapters: list[Path], args) -> float:
    """Tokens/s of llama-server with every adapter loaded, each request naming its own."""
    import urllib.request

    port = free_port()
    cmd = [str(bin_path), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(args.threads), "-tb", str(args.threads), "-np", str(CLIENTS),
           "-c", str(CLIENTS * 256), "--lora-init-without-apply", "--log-disable"]
    for path in adapters:
        cmd += ["--lora", str(path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"llama-server did not start: {' '.join(cmd[:8])} ...")
            time.sleep(0.5)

        def ask(i: int, prompt: str) -> int:
            # Every adapter named, its own at 1 and the others at 0: an
            # adapter a request leaves out keeps the server's own scale
            # (1 in GET /lora-adapters even with --lora-init-without-apply).
            # No prompt cache: llama-server reuses a cached prefix whatever
            # adapters computed it (seen here: an all-zero request answered
            # as the adapter of the slot's previous request).
            lora = [{"id": j, "scale": 1.0 if j == i else 0.0} for j in range(len(adapters))]
            body = {"prompt": prompt, "n_predict": args.max_tokens, "temperature": 0, "lora": lora,
                    "cache_prompt": False}
            request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=600) as r:
                return json.load(r)["tokens_predicted"]

        drive(ask, len(adapters), CLIENTS)  # warm-up
        seconds, tokens = drive(ask, len(adapters), args.requests)
        return tokens / seconds
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def llama_cpp(model: Path, adapters: list[Path], args) -> float:
    import llama_cpp

    contexts = [llama_cpp.Llama(str(model), lora_path=str(a), n_ctx=256, n_threads=args.threads, verbose=False)
                for a in adapters]
    locks = [threading.Lock() for _ in contexts]

    def ask(i: int, prompt: str) -> int:
        with locks[i]:
            r = contexts[i].create_completion(prompt, max_tokens=args.max_tokens, temperature=0)
        return r["usage"]["completion_tokens"]

    seconds, tokens = drive(ask, len(contexts), args.requests)
    return tokens / seconds


LOAD_NOTE = ""


def svg(rows: list[dict], path: Path) -> None:
    width, height, left, bottom = 660, 320, 60, 40
    top = max(max(r["switchyard"], r.get("llama_cpp") or 0, r.get("merged") or 0, r.get("f32") or 0, r["base"])
              for r in rows) * 1.15
    xs = {r["n"]: left + 40 + i * (width - left - 180) / max(len(rows) - 1, 1) for i, r in enumerate(rows)}
    y = lambda v: height - bottom - v / top * (height - bottom - 20)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
             f'<text x="{width / 2}" y="14" text-anchor="middle">16 clients over N adapters: completion tokens/s{LOAD_NOTE}</text>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - 10}" y2="{height - bottom}" stroke="black"/>',
             f'<line x1="{left}" y1="20" x2="{left}" y2="{height - bottom}" stroke="black"/>']
    for r in rows:
        parts.append(f'<text x="{xs[r["n"]]}" y="{height - bottom + 16}" text-anchor="middle">{r["n"]}</text>')
    parts.append(f'<text x="{width / 2}" y="{height - 6}" text-anchor="middle">distinct adapters</text>')
    peer = "llama-server" if any("server" in r.get("peer", "") for r in rows if r.get("llama_cpp")) else "llama.cpp"
    for key, color, label in (("base", "gray", "base alone"), ("switchyard", "steelblue", "adapters (BF16)"),
                              ("f32", "lightsteelblue", "adapters (F32)"), ("merged", "seagreen", "merged replicas"),
                              ("llama_cpp", "darkorange", peer)):
        pts = [(xs[r["n"]], y(r[key])) for r in rows if r.get(key)]
        if pts:
            parts.append('<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'.format(
                color, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
            parts.append(f'<text x="{pts[-1][0] + 4:.1f}" y="{pts[-1][1]:.1f}" fill="{color}">{label}</text>')
    for v in range(0, int(top) + 1, max(int(top / 5), 1)):
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>')
    parts.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts))


def default_llama_server() -> Path:
    for root in (ROOT, Path("/work/main")):
        candidate = root / "target/llama-server/build/bin/llama-server"
        if candidate.exists():
            return candidate
    return ROOT / "target/llama-server/build/bin/llama-server"


def main() -> int:
    global LOAD_NOTE
    p = argparse.ArgumentParser()
    p.add_argument("--adapters", default="1,4,16,64")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-max", type=int, default=16)
    p.add_argument("--llama-server", type=Path, default=default_llama_server())
    p.add_argument("--no-llama", action="store_true")
    p.add_argument("--merged-max", type=int, default=16)
    p.add_argument("--svg", type=Path, default=ROOT / "docs/bench/lora_serving.svg")
    p.add_argument("--bin", type=Path, default=ROOT / "target/release/switchyard")
    p.add_argument("--perf", type=Path, default=None,
                   help="folder: record each switchyard server's measured round with `perf record`")
    p.add_argument("--work", type=Path, default=None,
                   help="folder for the adapters and merged replicas, kept between calls (default: a temporary one)")
    p.add_argument("--f32", action="store_true",
                   help="also run the N adapters resident in F32 (SWITCHYARD_LORA_F32=1), the A/B of BF16")
    p.add_argument("--prepare", action="store_true",
                   help="only write the adapters and merged replicas into --work, then exit")
    p.add_argument("--rows", type=Path, default=None,
                   help="JSON file of rows: this call's rows replace those of the same N; the table and plot "
                        "show every row in it (a long run split into several calls)")
    args = p.parse_args()
    model = Path(subprocess.run([str(ROOT / "scripts/fetch-model.sh")], capture_output=True, text=True,
                                check=True).stdout.strip())
    counts = [int(n) for n in args.adapters.split(",")]
    use_server = args.llama_server.exists()
    peer = "llama-server" if use_server else "llama.cpp (llama-cpp-python, context per adapter)"
    load_before = os.getloadavg()[0]
    rows = []
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        files = make_adapters(model, max(counts), work)
        if args.prepare:
            # Files only (slow NumPy work, at the machine's normal priority),
            # so the timed calls spend their minutes measuring.
            n = min(max(counts), args.merged_max)
            made = merged_replicas(model, files[:n], work) if n > 0 else []
            print(f"{len(files)} adapters and {len(made or [])} merged replicas in {work}"
                  f"{'' if made is not None else ' (merged replicas skipped: disk)'}")
            return 0
        for n in counts:
            # Interleaved: the base alone, then N adapters, N merged replicas and
            # llama.cpp, so all see the same load on a shared machine.
            first_probe = len(PROBES)
            row = {"n": n, "base": switchyard(args.bin, model, [], args)}
            row["switchyard"] = switchyard(args.bin, model, [f[0] for f in files[:n]], args)
            if args.f32:
                row["f32"] = switchyard(args.bin, model, [f[0] for f in files[:n]], args, f32=True)
            row["merged"] = None
            if n <= args.merged_max:
                replicas = merged_replicas(model, files[:n], work)
                if replicas:
                    row["merged"] = switchyard(args.bin, model, [], args, replicas)
                else:
                    row["merged_skipped"] = "disk"
            row["llama_cpp"] = None
            if not args.no_llama and use_server:
                row["llama_cpp"] = llama_server(args.llama_server, model, [f[1] for f in files[:n]], args)
            elif not args.no_llama and n <= args.llama_max:
                row["llama_cpp"] = llama_cpp(model, [f[1] for f in files[:n]], args)
            row["probes"] = PROBES[first_probe:]
            row["load"] = os.getloadavg()[0]
            row["load_before"] = load_before
            row["peer"] = peer
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    if args.rows:
        # Rows kept from earlier calls (a long run split in parts), this
        # call's replacing those of the same N.
        kept = json.loads(args.rows.read_text()) if args.rows.exists() else []
        mine = {r["n"] for r in rows}
        rows = sorted([r for r in kept if r["n"] not in mine] + rows, key=lambda r: r["n"])
        args.rows.write_text(json.dumps(rows, indent=1))
    load_before = min(r.get("load_before", load_before) for r in rows)
    load = max([load_before] + [r["load"] for r in rows])
    if load > 2:
        LOAD_NOTE = f" (under load: load average up to {load:.1f})"
    peers = sorted({r.get("peer", peer) for r in rows if r["llama_cpp"]}) or [peer]
    print(f"16 clients, {args.requests} completions of {args.max_tokens} greedy tokens, --threads {args.threads}; "
          f"load average {load_before:.1f} before, up to {load:.1f}{' (UNDER LOAD)' if load > 2 else ''}")
    print()
    print(f"| adapters | base alone tok/s | switchyard N adapters tok/s | ratio | N merged replicas tok/s "
          f"| adapters / merged | {' / '.join(peers)} tok/s | adapters / llama.cpp |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r.get("f32"):
            print(f"| {r['n']} (adapters in F32) | {r['base']:.1f} | {r['f32']:.1f} | {r['f32'] / r['base']:.2f} "
                  f"| | | | |")
        lc = f"{r['llama_cpp']:.1f}" if r["llama_cpp"] else "not run"
        vl = f"{r['switchyard'] / r['llama_cpp']:.2f}" if r["llama_cpp"] else "-"
        mg = f"{r['merged']:.1f}" if r["merged"] else (
            "skipped (disk)" if r.get("merged_skipped") else "not run")
        vs = f"{r['switchyard'] / r['merged']:.2f}" if r["merged"] else "-"
        print(f"| {r['n']} | {r['base']:.1f} | {r['switchyard']:.1f} | {r['switchyard'] / r['base']:.2f} | {mg} "
              f"| {vs} | {lc} | {vl} |")
    svg(rows, args.svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
