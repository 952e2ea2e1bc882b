"""Prompt caching: time to first token with a ~1,500-token shared system
prompt, cold (first request) against warm (later requests, other user
turns), for switchyard and, in the same run, a peer's prompt cache:
llama-server's (`cache_prompt`, one slot) when the binary exists, else
llama-cpp-python's `LlamaRAMCache` (said in the output).

Also checks that switchyard's greedy answers with the cache equal those of
the same binary with `--no-prompt-cache`.

Usage:
  python benches/prompt_cache.py [--model GGUF] [--switchyard BIN]
      [--llama-server BIN] [--threads 2] [--rounds 3] [--turns 4] [--kv-block N]
Prints one JSON line per server and a summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LLAMA_SERVER = Path("/work/main/target/llama-server/build/bin/llama-server")
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
QUESTIONS = ["What is rule 3?", "Who reviews the gamma reports?", "Say hello.",
             "Which rule mentions kappa?", "How often does the delta team meet?",
             "Summarise rule 10.", "Name two teams."]
MAX_TOKENS = 16


def system_prompt(round_: int) -> str:
    """~1,500 tokens; each round's differs from the first token on, so its
    first request is cold in every cache."""
    return f"Handbook edition {round_}. " + " ".join(
        f"Rule {i}: the {WORDS[(i + round_) % 12]} team reviews {WORDS[(i * 7) % 12]} reports "
        f"every {i % 5 + 1} days." for i in range(88))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], port: int, ready_path: str) -> subprocess.Popen:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{args[0]} exited: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{ready_path}", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    sys.exit(f"{args[0]} did not become ready")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def ask(client: openai.OpenAI, system: str, question: str, extra: dict | None = None):
    """Streams one greedy answer: (seconds to the first content, text, cached tokens)."""
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model="smollm2", max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=extra or {},
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
    first, text, cached = None, "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter() - started
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage and chunk.usage.prompt_tokens_details:
            cached = chunk.usage.prompt_tokens_details.cached_tokens
    return first if first is not None else time.perf_counter() - started, text, cached


def session(port: int, rounds: int, turns: int, extra: dict | None = None) -> dict:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    ask(client, "Warm up.", "Hi")  # first-request costs that are not the prompt's
    cold, warm, answers, cached = [], [], {}, []
    for r in range(rounds):
        system = system_prompt(r)
        seconds, text, _ = ask(client, system, QUESTIONS[0], extra)
        cold.append(seconds)
        answers[(r, QUESTIONS[0])] = text
        for q in QUESTIONS[1:turns + 1]:
            seconds, text, hit = ask(client, system, q, extra)
            warm.append(seconds)
            answers[(r, q)] = text
            cached.append(hit)
    return {"cold_ttft_s": statistics.median(cold), "warm_ttft_s": statistics.median(warm),
            "ratio": statistics.median(cold) / statistics.median(warm),
            "cached_tokens": cached, "answers": answers}


def switchyard(bin_path: Path, model: Path, threads: int, rounds: int, turns: int, cache: bool,
               kv_block: int | None) -> dict:
    port = free_port()
    args = [str(bin_path), "serve", "--model", str(model), "--model-name", "smollm2",
            "--listen", f"127.0.0.1:{port}", "--threads", str(threads)]
    if kv_block:
        args += ["--kv-block", str(kv_block)]
    if not cache:
        args.append("--no-prompt-cache")
    proc = start(args, port, "/ready")
    try:
        return session(port, rounds, turns)
    finally:
        stop(proc)


def llama_server(bin_path: Path, model: Path, threads: int, rounds: int, turns: int) -> dict:
    port = free_port()
    args = [str(bin_path), "-m", str(model), "--port", str(port), "--host", "127.0.0.1",
            "-t", str(threads), "-tb", str(threads), "-c", "4096", "-np", "1", "--log-disable"]
    proc = start(args, port, "/health")
    try:
        return session(port, rounds, turns, {"cache_prompt": True})
    finally:
        stop(proc)


def llama_cpp_python(model: Path, threads: int, rounds: int, turns: int) -> dict:
    """The fallback peer: llama-cpp-python with its RAM prompt cache."""
    from llama_cpp import Llama, LlamaRAMCache
    llm = Llama(model_path=str(model), n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                verbose=False)
    llm.set_cache(LlamaRAMCache())
    cold, warm = [], []
    for r in range(rounds):
        system = system_prompt(r)
        for i, q in enumerate(QUESTIONS[:turns + 1]):
            started = time.perf_counter()
            for _ in llm.create_chat_completion(
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": q}],
                    max_tokens=1, temperature=0, stream=True):
                break
            (cold if i == 0 else warm).append(time.perf_counter() - started)
    return {"cold_ttft_s": statistics.median(cold), "warm_ttft_s": statistics.median(warm),
            "ratio": statistics.median(cold) / statistics.median(warm)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--switchyard", type=Path, default=ROOT / "target" / "release" / "switchyard")
    ap.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--kv-block", type=int, default=None,
                    help="switchyard's --kv-block (positions per KV block: the prompt cache's unit)")
    args = ap.parse_args()
    model = args.model or Path(subprocess.run(
        [str(ROOT / "scripts" / "fetch-model.sh")], check=True, capture_output=True,
        text=True).stdout.strip().splitlines()[-1])

    uncached = switchyard(args.switchyard, model, args.threads, args.rounds, args.turns, cache=False,
                          kv_block=args.kv_block)
    cached = switchyard(args.switchyard, model, args.threads, args.rounds, args.turns, cache=True,
                        kv_block=args.kv_block)
    identical = cached["answers"] == uncached["answers"]
    if args.llama_server.exists():
        peer_name = "llama-server (cache_prompt, 1 slot)"
        peer = llama_server(args.llama_server, model, args.threads, args.rounds, args.turns)
    else:
        peer_name = "llama-cpp-python LlamaRAMCache (llama-server binary not found)"
        peer = llama_cpp_python(model, args.threads, args.rounds, args.turns)

    rows = [("switchyard --no-prompt-cache", uncached), ("switchyard (prompt cache)", cached),
            (peer_name, peer)]
    for name, result in rows:
        line = {k: v for k, v in result.items() if k != "answers"}
        print(json.dumps({"server": name, "threads": args.threads, **line}))
    print(json.dumps({"greedy_answers_identical_with_and_without_cache": identical}))
    print()
    print(f"| server ({args.threads} threads) | cold TTFT | warm TTFT | cold / warm |")
    print("|---|---:|---:|---:|")
    for name, result in rows:
        print(f"| {name} | {result['cold_ttft_s'] * 1000:.0f} ms | {result['warm_ttft_s'] * 1000:.0f} ms "
              f"| {result['ratio']:.1f}x |")
    if not identical:
        sys.exit("greedy answers differ with the prompt cache")


if __name__ == "__main__":
    os.environ.setdefault("NO_PROXY", "127.0.0.1")
    main()
