"""Paired speed runs of two switchyard binaries (see scripts/paired-speed.sh).

Each round runs every measure on OLD then NEW then NEW then OLD (an ABBA
order, so a drift of the machine's load during a round cancels), and the
report gives each side's median and the ratio NEW / OLD per measure:

- decode tok/s: `generate --chat`, 128 greedy tokens after a short prompt;
- prompt-512 tok/s: `generate`, a prompt of about 512 tokens, 1 token out;
- 16 clients tok/s: `serve`, 16 concurrent streaming completions of 64
  tokens each, generated tokens over the wall time;
- warm TTFT ms: `serve`, a ~1,000-token prompt sent once to fill the
  prompt cache, then the median time to first streamed token of 5 repeats.

Only the standard library: it runs from any Python 3.
"""

import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

THREADS = os.environ.get("SWITCHYARD_BENCH_THREADS", "2")
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 3
OLD, NEW, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]

WORDS = (
    "the quick brown fox jumps over the lazy dog while a river runs past old "
    "stone walls and children count the boats that sail toward the harbour "
).split()


def text(words):
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def generate(binary, prompt, max_tokens, chat=False):
    """(prompt tok/s, generation tok/s) as `generate` reports them."""
    out = subprocess.run(
        [binary, "generate", "--model", MODEL, "--prompt", prompt, "--temperature", "0",
         "--max-tokens", str(max_tokens), "--threads", THREADS] + (["--chat"] if chat else []),
        capture_output=True, text=True, check=True,
    )
    m = re.search(r"prompt: \d+ tokens, ([\d.]+) tokens/s; generation: \d+ tokens, ([\d.]+)",
                  out.stderr)
    if not m:
        raise RuntimeError(f"{binary}: no speed line in {out.stderr[-400:]}")
    return float(m.group(1)), float(m.group(2))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", MODEL, "--model-name", "m", "--threads", THREADS,
             "--listen", f"127.0.0.1:{self.port}", "--max-batch", "16"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/ready")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{binary} serve did not become ready")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def stream(self, prompt, max_tokens):
        """(seconds to the first token, tokens streamed, seconds in all)."""
        body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens,
                           "temperature": 0, "stream": True})
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        start = time.perf_counter()
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
        first, tokens = None, 0
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            event = json.loads(line[5:])
            if any(ch.get("text") for ch in event.get("choices", [])):
                tokens += 1
                if first is None:
                    first = time.perf_counter() - start
        return first or 0.0, tokens, time.perf_counter() - start


def serve_measures(binary):
    """(16 clients tok/s, warm TTFT ms) on one server."""
    server = Server(binary)
    try:
        results = [None] * 16

        def client(i):
            results[i] = server.stream(f"Client {i} says: " + text(40 + i), 64)

        start = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        clients = sum(r[1] for r in results if r) / wall
        shared = text(750)
        server.stream(shared, 1)
        ttft = statistics.median(server.stream(shared, 1)[0] for _ in range(5)) * 1e3
        return clients, ttft
    finally:
        server.stop()


def measure(binary):
    # A chat request, so that the model writes all 128 tokens.
    decode = generate(binary, "Write a story about the sea.", 128, chat=True)[1]
    prompt = generate(binary, text(470), 1)[0]
    clients, ttft = serve_measures(binary)
    return {"decode tok/s": decode, "prompt-512 tok/s": prompt,
            "16 clients tok/s": clients, "warm TTFT ms": ttft}


def main():
    runs = {OLD: [], NEW: []}
    for r in range(ROUNDS):
        for binary in (OLD, NEW, NEW, OLD):
            m = measure(binary)
            runs[binary].append(m)
            print(f"round {r + 1} {'new' if binary == NEW else 'old'}: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in m.items()), flush=True)
    print(f"\n{'measure':<18} {'old (median)':>13} {'new (median)':>13} {'new/old':>8}")
    for key in runs[OLD][0]:
        old = statistics.median(m[key] for m in runs[OLD])
        new = statistics.median(m[key] for m in runs[NEW])
        print(f"{key:<18} {old:>13.1f} {new:>13.1f} {new / old:>8.3f}")
    print("(TTFT: lower is better; a ratio below 1 is faster. Load average at end: "
          f"{os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
