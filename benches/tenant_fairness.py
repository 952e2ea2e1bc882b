"""Noisy neighbour: a light tenant's time to first token alone, then while a
heavy tenant runs many streams, through a policy of two tenants (issue 37).

The light tenant sends one short streamed chat at a time; the heavy tenant
keeps `--heavy` streams busy (each asks for `--heavy-tokens` tokens and is
sent again when it ends). Each binary given is measured with each
`--speculate` mode, alone and beside, and the configurations take turns for
`--rounds` rounds on the same machine (interleaved, so that a loaded machine
weighs on each alike); the figures are over all rounds.

Usage:
  python benches/tenant_fairness.py [--model GGUF] [--switchyard BIN ...]
      [--speculate off ngram] [--rounds 2] [--threads 2] [--heavy 48]
      [--heavy-tokens 32] [--light 30] [--serve-arg=--max-step-tokens=128 ...]
Prints one JSON line per configuration and a summary table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"light": "sk-bench-light", "heavy": "sk-bench-heavy"}
HEAVY_PROMPT = "Write a long story about a lighthouse keeper and the sea. " * 4


def policy() -> str:
    tenants = "".join(
        f'\n[[tenants]]\nname = "{name}"\napi_keys = ["sha256:{hashlib.sha256(key.encode()).hexdigest()}"]\n'
        for name, key in KEYS.items())
    return ('[[models]]\nname = "smol"\nversion = "v1"\ncost_per_1k_input = 0.0\n'
            'cost_per_1k_output = 0.0\nquality = 0.5\ncontext_limit = 8192\n' + tenants)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary: Path, model: Path, threads: int, tmp: Path,
          extra: list[str]) -> tuple[subprocess.Popen, int]:
    (tmp / "policy.toml").write_text(policy())
    (tmp / "serve.toml").write_text(
        f'threads = {threads}\n[[models]]\npath = "{model}"\nname = "smol"\nversion = "v1"\n')
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), "serve", "--config", str(tmp / "serve.toml"), "--policy", str(tmp / "policy.toml"),
         "--listen", f"127.0.0.1:{port}", "--drain-seconds", "1", "--state-dir", str(tmp / "state"),
         *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{binary} exited: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    sys.exit(f"{binary} did not become ready")


def client(port: int, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEYS[tenant], max_retries=0,
                         timeout=120)


def ttft(c: openai.OpenAI, text: str, max_tokens: int) -> float:
    started = time.perf_counter()
    stream = c.chat.completions.create(model="smol", max_tokens=max_tokens, temperature=0, stream=True,
                                       messages=[{"role": "user", "content": text}])
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
    return first if first is not None else time.perf_counter() - started


def counters(port: int) -> tuple[float, float, float]:
    """Tokens generated so far (all tenants), and the steps' rows and count, from `/metrics`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + " ") or line.startswith(name + "{"))
    return (total("switchyard_generated_tokens_total"), total("switchyard_step_rows_sum"),
            total("switchyard_step_rows_count"))


def light_run(port: int, n: int, tag: str) -> list[float]:
    c = client(port, "light")
    return [ttft(c, f"{tag} question {i}: what is {i} plus {i * 3}?", 4) * 1000 for i in range(n)]


def heavy_streams(port: int, streams: int, tokens: int, stop: threading.Event) -> list[threading.Thread]:
    def loop(k: int):
        c = client(port, "heavy")
        i = 0
        while not stop.is_set():
            try:
                ttft(c, f"{k}.{i} {HEAVY_PROMPT}", tokens)
            except openai.APIError:
                time.sleep(0.05)
            i += 1
    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(streams)]
    for t in threads:
        t.start()
    return threads


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure_once(binary: Path, speculate: str, model: Path,
                 args) -> tuple[list[float], list[float], float, float]:
    """One round of one configuration: the light tenant's TTFTs (ms) alone, then
    beside; while beside, the tokens per second generated (nearly all the heavy
    tenant's: the light one asks for 4 a request) and the mean rows of a step
    (the step a newcomer may find running: load does not change it)."""
    extra = ["--speculate", speculate, *args.serve_arg]
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start(binary, model, args.threads, Path(tmp), extra)
        try:
            light_run(port, 3, "warm")
            alone = light_run(port, args.light, "alone")
            # The heavy streams run in a process of their own: in this one,
            # their 48 threads would hold the interpreter lock while the light
            # client's first chunk waits to be read.
            heavy = subprocess.Popen([sys.executable, __file__, "--heavy-load", str(port),
                                      "--heavy", str(args.heavy), "--heavy-tokens", str(args.heavy_tokens)])
            time.sleep(3.0)
            before, started = counters(port), time.perf_counter()
            beside = light_run(port, args.light, "beside")
            after = counters(port)
            rate = (after[0] - before[0]) / (time.perf_counter() - started)
            rows = (after[1] - before[1]) / max(1.0, after[2] - before[2])
            heavy.terminate()
            heavy.wait(timeout=60)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    return alone, beside, rate, rows


def summarize(binary: Path, speculate: str, alone: list[float], beside: list[float], rates: list[float],
              rows: list[float], args) -> dict:
    result = {"binary": str(binary), "speculate": speculate, "serve_args": args.serve_arg,
              "heavy_streams": args.heavy, "heavy_tokens": args.heavy_tokens, "rounds": args.rounds,
              "alone_p50_ms": statistics.median(alone), "alone_p99_ms": pct(alone, 0.99),
              "beside_p50_ms": statistics.median(beside), "beside_p99_ms": pct(beside, 0.99)}
    result["ratio_p50"] = result["beside_p50_ms"] / result["alone_p50_ms"]
    result["ratio_p99"] = result["beside_p99_ms"] / result["alone_p99_ms"]
    result["beside_tokens_per_s"] = statistics.mean(rates)
    result["beside_rows_per_step"] = statistics.mean(rows)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--switchyard", type=Path, nargs="+",
                        default=[ROOT / "target" / "release" / "switchyard"])
    parser.add_argument("--speculate", nargs="+", default=["off", "ngram"], choices=["off", "ngram"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="an extra argument for every server (repeat; write --serve-arg=--flag=value)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--heavy", type=int, default=48)
    parser.add_argument("--heavy-tokens", type=int, default=32)
    parser.add_argument("--light", type=int, default=30)
    parser.add_argument("--heavy-load", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.heavy_load:
        heavy_streams(args.heavy_load, args.heavy, args.heavy_tokens, threading.Event())
        threading.Event().wait()
        return
    model = args.model or Path(subprocess.run([str(ROOT / "scripts" / "fetch-model.sh")], check=True,
                                              capture_output=True, text=True).stdout.strip().splitlines()[-1])
    configs = [(binary, speculate) for binary in args.switchyard for speculate in args.speculate]
    samples: dict[tuple[Path, str], tuple[list[float], ...]] = {c: ([], [], [], []) for c in configs}
    for round_ in range(args.rounds):
        for binary, speculate in configs:
            alone, beside, rate, rows = measure_once(binary, speculate, model, args)
            samples[(binary, speculate)][0].extend(alone)
            samples[(binary, speculate)][1].extend(beside)
            samples[(binary, speculate)][2].append(rate)
            samples[(binary, speculate)][3].append(rows)
            print(f"round {round_ + 1}: {binary} --speculate {speculate}: alone p50 "
                  f"{statistics.median(alone):.0f} ms, beside p50 {statistics.median(beside):.0f} ms, "
                  f"{rate:.0f} tok/s and {rows:.0f} rows a step beside", file=sys.stderr, flush=True)
    results = [summarize(binary, speculate, *samples[(binary, speculate)], args) for binary, speculate in configs]
    for r in results:
        print(json.dumps(r))
    print(f"\n| binary | speculate | alone p50 / p99 ms | beside {args.heavy} heavy streams p50 / p99 ms "
          f"| ratio p50 / p99 | tok/s beside | rows a step beside |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['binary']} | {r['speculate']} | {r['alone_p50_ms']:.0f} / {r['alone_p99_ms']:.0f} | "
              f"{r['beside_p50_ms']:.0f} / {r['beside_p99_ms']:.0f} | "
              f"{r['ratio_p50']:.2f}x / {r['ratio_p99']:.2f}x | {r['beside_tokens_per_s']:.0f} | "
              f"{r['beside_rows_per_step']:.0f} |")


if __name__ == "__main__":
    main()
