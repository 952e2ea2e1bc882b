"""Where the server's decode and verify steps spend their time, stage by
stage: a `switchyard serve` with `SWITCHYARD_STEP_PROFILE=1`
(`engine/src/serving/step_profile.rs`) answers a few streamed greedy
requests of one `benches/speculative.py` workload, once per speculation
mode, one server at a time; then its profile is printed.

Each line of the profile is one row count (1: a plain step of one
sequence; `k + 1`: a verify step of `k` drafts) with its steps, the
tokens they emitted and microseconds per step for each stage: between
steps, draft lookup, plan, chunks (KV blocks), forward, finish
(sampling, acceptance, rollback, controller, streaming).

Usage:
  python benches/step_profile.py [--model smollm2|gemma3|GGUF]
      [--switchyard BIN] [--workload chat] [--requests 4]
      [--speculate off --speculate ngram] [--threads 2] [--max-tokens 128]
The server's stderr goes to target/step-profile-MODE-WORKLOAD.err.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import openai

from speculative import ROOT, WORKLOADS, free_port, model_path


def profile(args, mode: str) -> None:
    port = free_port()
    log = ROOT / "target" / f"step-profile-{mode}-{args.workload}.err"
    log.parent.mkdir(exist_ok=True)
    env = dict(os.environ, SWITCHYARD_STEP_PROFILE="1")
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [str(args.switchyard), "serve", "--model", str(model_path(args.model)),
             "--model-name", "m", "--listen", f"127.0.0.1:{port}", "--threads",
             str(args.threads), "--speculate", mode, "--no-prompt-cache"],
            stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            rates = run_requests(args, port)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"{mode}, {args.workload}: decode tok/s per request {rates}")
    lines = [line.rstrip() for line in open(log) if line.startswith("step profile")]
    # The server prints its totals so far each time it runs out of work:
    # the last report starts at the last plain-step line.
    starts = [i for i, line in enumerate(lines) if " rows 1 " in line]
    for line in lines[starts[-1]:] if starts else lines:
        print(line)


def run_requests(args, port: int) -> list[float]:
    deadline = time.time() + 180
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1):
                break
        except OSError:
            if time.time() > deadline:
                raise SystemExit("switchyard serve did not become ready")
            time.sleep(0.3)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                           max_retries=0, timeout=600)
    rates = []
    for _ in range(args.requests):
        first = last = None
        tokens = 0
        for chunk in client.chat.completions.create(
                model="m", max_tokens=args.max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "user", "content": WORKLOADS[args.workload]}]):
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or now
                last = now
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        decode = (last - first) if first and last else 0.0
        rates.append(round((tokens - 1) / decode, 1) if decode > 0 and tokens > 1 else None)
    # Let the executor run out of work and print its totals.
    time.sleep(0.5)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--switchyard", type=Path,
                        default=ROOT / "target" / "release" / "switchyard")
    parser.add_argument("--workload", default="chat", choices=sorted(WORKLOADS))
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--speculate", action="append", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    for mode in args.speculate or ["off", "ngram"]:
        profile(args, mode)


if __name__ == "__main__":
    main()
