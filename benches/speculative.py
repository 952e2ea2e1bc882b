"""Speculative decoding (n-gram drafts, `--speculate ngram`) against plain
decoding (`--speculate off`), and llama.cpp's own prompt-lookup
speculation (llama-cpp-python's `LlamaPromptLookupDecoding`, which drafts
from the prompt's n-grams and verifies in one llama.cpp batch) against
plain llama.cpp, all in one run on the same GGUF and thread count.

Workloads (greedy chat completions of MAX_TOKENS tokens):
  quote      a document quoted back;
  code       a code edit that returns the function;
  retrieval  an answer that repeats its sources (asked to quote them; a
             model may paraphrase instead);
  extract    an extractive answer: the sources' sentences copied out;
  chat       free-form chat (speculation must cost nothing here).
Single stream: decode tokens/s from the first streamed token to the last.
The four engines take turns request by request, round after round, so
that load on a shared machine hits them alike; the summary gives medians
and each engine's ratio to its own plain decoding.
Then 16 clients at once (quote, code, retrieval and chat, four clients each),
speculation on and off in alternating rounds: total completion tokens/s.

With --baseline BIN (e.g. main's binary), a third Switchyard engine, that
binary with n-gram speculation, takes its turn beside the others (and in
the many-client rounds), so a change is compared in the same run.

With --draft-model PATH (a checkpoint of the same tokenizer, e.g. one made by
`switchyard layer-draft`), two more Switchyard engines take their turns:
`--speculate draft` (the draft model's tokens only) and `ngram` with the
draft model behind the lookup; the summary adds their acceptance.

Usage:
  python benches/speculative.py [--model smollm2|gemma3|GGUF ...]
      [--switchyard BIN] [--baseline BIN] [--threads 2] [--rounds 3] [--max-tokens 128]
      [--clients 16] [--no-llama] [--no-load | --load-only] [--draft-model GGUF]
      [--svg docs/bench/speculative.svg] [--json OUT]
Prints one JSON line per measurement and a summary table per model.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]

DOCUMENT = (
    "The city council met on Tuesday to discuss the new budget. The mayor proposed "
    "increasing funding for public libraries by ten percent, citing a rise in visitors "
    "over the past three years. Several council members raised concerns about the cost "
    "of repairing the old bridge on Mill Street, which engineers say must be closed for "
    "six months next spring. The council agreed to hold a public hearing on both issues "
    "before the final vote, which is expected at the end of the month. Residents may "
    "submit written comments until the twentieth."
)
CODE = '''def summarize(orders):
    result = {}
    for order in orders:
        if order.status != "paid":
            continue
        key = order.customer_id
        if key not in result:
            result[key] = 0
        result[key] = result[key] + order.total
    return result


def top_customers(orders, count):
    result = summarize(orders)
    ranked = sorted(result.items(), key=lambda pair: pair[1], reverse=True)
    return ranked[:count]
'''
SOURCES = (
    "[1] The Amazon river carries more water than any other river in the world, about one "
    "fifth of all river water that flows into the oceans.\n"
    "[2] The Nile is about 6,650 kilometres long and flows north through eleven countries "
    "before reaching the Mediterranean Sea.\n"
    "[3] The Yangtze is the longest river in Asia and the third longest in the world."
)
WORKLOADS = {
    "quote": f"Repeat the following article exactly, word for word.\n\n{DOCUMENT}",
    "code": "Rename the variable `result` to `totals` in this code and return the whole "
            f"code.\n\n{CODE}",
    "retrieval": f"Sources:\n{SOURCES}\n\nQuestion: What do the sources say about the Nile and "
                 "the Amazon? Answer by quoting the sources exactly, with their numbers.",
    "extract": f"Sources:\n{SOURCES}\n\nQuestion: What do the sources say about the Nile and "
               "the Amazon? Answer with the sentences of the sources about them, copied word "
               "for word, each with its number.",
    "chat": "Tell me a short story about a lighthouse keeper who finds a message in a bottle.",
}
COPY_HEAVY = ("quote", "code", "retrieval", "extract")
# The many-client rounds' mix, as it was before `extract` came, so that
# their figures stay comparable.
LOAD_WORKLOADS = ("quote", "code", "retrieval", "chat")


def model_path(name: str) -> Path:
    scripts = {"smollm2": "fetch-model.sh", "gemma3": "fetch-gemma3.sh"}
    if name in scripts:
        out = subprocess.run([str(ROOT / "scripts" / scripts[name])], check=True,
                             capture_output=True, text=True)
        return Path(out.stdout.strip().splitlines()[-1])
    return Path(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `switchyard serve` with speculation `mode`."""

    def __init__(self, binary: Path, model: Path, threads: int, mode: str,
                 draft: Path | None = None):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [str(binary), "serve", "--model", str(model), "--model-name", "m",
             "--listen", f"127.0.0.1:{self.port}", "--threads", str(threads),
             "--speculate", mode, "--no-prompt-cache"]
            + (["--draft-model", str(draft)] if draft else []),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 180
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"switchyard serve exited: {self.proc.stderr.read()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/ready", timeout=1):
                    break
            except OSError:
                if time.time() > deadline:
                    sys.exit("switchyard serve did not become ready")
                time.sleep(0.3)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1",
                                    api_key="unused", max_retries=0, timeout=600)

    def stream(self, prompt: str, max_tokens: int) -> dict:
        started = time.perf_counter()
        first = last = None
        text, usage = "", None
        for chunk in self.client.chat.completions.create(
                model="m", max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "user", "content": prompt}]):
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                first = first or now
                last = now
            if chunk.usage:
                usage = chunk.usage
        tokens = usage.completion_tokens if usage else 0
        return timing(started, first, last, tokens, text)

    def complete(self, prompt: str, max_tokens: int) -> int:
        reply = self.client.chat.completions.create(
            model="m", max_tokens=max_tokens, temperature=0,
            messages=[{"role": "user", "content": prompt}])
        return reply.usage.completion_tokens

    def metrics(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            text = r.read().decode()
        found = {}
        for line in text.splitlines():
            for name in ("draft_tokens_total", "accepted_tokens_total"):
                if line.startswith(f"switchyard_speculative_{name}"):
                    found[name] = found.get(name, 0) + float(line.split()[-1])
        return found

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


class LlamaPeer:
    """llama.cpp through llama-cpp-python, with prompt-lookup speculation or without."""

    def __init__(self, model: Path, threads: int, lookup: bool):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        draft = LlamaPromptLookupDecoding(num_pred_tokens=10) if lookup else None
        self.llm = Llama(model_path=str(model), n_ctx=2048, n_threads=threads,
                         n_threads_batch=threads, verbose=False, draft_model=draft)

    def stream(self, prompt: str, max_tokens: int) -> dict:
        started = time.perf_counter()
        first = last = None
        text, tokens = "", 0
        for chunk in self.llm.create_chat_completion(
                messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                temperature=0, stream=True):
            now = time.perf_counter()
            content = chunk["choices"][0]["delta"].get("content")
            if content:
                text += content
                tokens += 1
                first = first or now
                last = now
        return timing(started, first, last, tokens, text)


def timing(started, first, last, tokens, text) -> dict:
    decode = (last - first) if first and last else 0.0
    return {"tokens": tokens, "ttft_s": (first - started) if first else None,
            "decode_tok_s": (tokens - 1) / decode if decode > 0 and tokens > 1 else None,
            "text": text}


def throughput(server: Server, clients: int, max_tokens: int) -> float:
    prompts = [WORKLOADS[name] for name in LOAD_WORKLOADS] * (clients // len(LOAD_WORKLOADS) + 1)
    barrier = threading.Barrier(clients)

    def one(prompt: str) -> int:
        barrier.wait()
        return server.complete(prompt, max_tokens)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one, prompts[:clients]))
    return tokens / (time.perf_counter() - started)


def bench_model(args, name: str) -> dict:
    path = model_path(name)
    engines = {"switchyard ngram": Server(args.switchyard, path, args.threads, "ngram"),
               "switchyard off": Server(args.switchyard, path, args.threads, "off")}
    if args.baseline:
        engines["baseline ngram"] = Server(args.baseline, path, args.threads, "ngram")
    if args.draft_model:
        engines["switchyard draft"] = Server(args.switchyard, path, args.threads, "draft",
                                             args.draft_model)
        engines["switchyard ngram+draft"] = Server(args.switchyard, path, args.threads,
                                                   "ngram", args.draft_model)
    if not args.no_llama:
        engines["llama.cpp lookup"] = LlamaPeer(path, args.threads, lookup=True)
        engines["llama.cpp plain"] = LlamaPeer(path, args.threads, lookup=False)
    rates = {(e, w): [] for e in engines for w in WORKLOADS}
    texts = {}
    for round_ in range(0 if args.load_only else args.rounds):
        # Odd rounds take the engines in reverse order, so that no engine
        # always runs right after the same one.
        turns = list(engines.items())
        for workload, prompt in WORKLOADS.items():
            for engine, runner in turns if round_ % 2 == 0 else turns[::-1]:
                got = runner.stream(prompt, args.max_tokens)
                rates[(engine, workload)].append(got["decode_tok_s"])
                texts[(engine, workload)] = got["text"]
                print(json.dumps({"model": name, "round": round_, "engine": engine,
                                  "workload": workload, "tokens": got["tokens"],
                                  "decode_tok_s": got["decode_tok_s"]}),
                      flush=True)
    spoken = [e for e in engines if isinstance(engines[e], Server) and e != "switchyard off"]
    same = (None if args.load_only else
            all(texts[(e, w)] == texts[("switchyard off", w)] for e in spoken for w in WORKLOADS))
    spec = {e: engines[e].metrics() for e in spoken}
    order = ["switchyard ngram", "switchyard off"] + (["baseline ngram"] if args.baseline else [])
    load = {engine: [] for engine in order}
    for round_ in range(0 if args.no_load else args.rounds):
        for engine in order if round_ % 2 == 0 else order[::-1]:
            tok_s = throughput(engines[engine], args.clients, args.max_tokens // 2)
            load[engine].append(tok_s)
            print(json.dumps({"model": name, "round": round_, "engine": engine,
                              "clients": args.clients, "total_tok_s": tok_s}), flush=True)
    for engine in engines.values():
        if isinstance(engine, Server):
            engine.stop()
    median = {k: statistics.median([r for r in v if r]) if any(v) else None
              for k, v in rates.items()}
    return {"model": name, "median": median, "rates": rates, "load": {k: statistics.median(v)
                                                       for k, v in load.items() if v},
            "greedy_same": same, "speculation": spec, "engines": list(engines),
            "clients": args.clients}


def summary(result: dict) -> None:
    median = result["median"]
    print(f"\n{result['model']}: single-stream decode tok/s (median); load average at the "
          f"end {open('/proc/loadavg').read().split()[0]}")
    spoken = [e for e in result["engines"]
              if not e.startswith("llama.cpp") and e != "switchyard off"]
    print(f"{'workload':<10}" + "".join(f"{e:>24}" for e in result["engines"])
          + "".join(f"{e.replace('switchyard ', '') + ' ratio':>18}" for e in spoken)
          + f"{'llama ratio':>12}")
    for w in WORKLOADS:
        row = f"{w:<10}" + "".join(f"{median[(e, w)] or 0:>24.1f}" for e in result["engines"])
        off = median[("switchyard off", w)]
        for e in spoken:
            on = median[(e, w)]
            row += f"{(on / off if on and off else 0):>18.2f}"
        if ("llama.cpp lookup", w) in median:
            lo, lp = median[("llama.cpp lookup", w)], median[("llama.cpp plain", w)]
            row += f"{(lo / lp if lo and lp else 0):>12.2f}"
        print(row)
    paired(result)
    load = result["load"]
    if load:
        print(f"{result['clients']}-client total tok/s: ngram "
              f"{load['switchyard ngram']:.1f}, off {load['switchyard off']:.1f} "
              f"(ratio {load['switchyard ngram'] / load['switchyard off']:.2f})"
              + (f", baseline ngram {load['baseline ngram']:.1f}"
                 if "baseline ngram" in load else ""))
    for engine, spec in result["speculation"].items():
        if spec.get("draft_tokens_total"):
            print(f"{engine}: drafted {spec['draft_tokens_total']:.0f}, accepted "
                  f"{spec.get('accepted_tokens_total', 0):.0f} "
                  f"({spec.get('accepted_tokens_total', 0) / spec['draft_tokens_total']:.0%})")
    print(f"greedy output identical with and without speculation: {result['greedy_same']}")


def paired(result: dict) -> None:
    """Per-round ratios (each round's engines ran minutes apart at most):
    n-gram over off, and over the baseline binary's n-gram where there is one."""
    rates = result["rates"]
    pairs = [("switchyard ngram", "switchyard off")]
    if "baseline ngram" in result["engines"]:
        pairs += [("switchyard ngram", "baseline ngram"), ("baseline ngram", "switchyard off")]
    for on, off in pairs:
        cells = []
        for w in WORKLOADS:
            ratios = sorted(a / b for a, b in zip(rates[(on, w)], rates[(off, w)]) if a and b)
            if ratios:
                cells.append(f"{w} {statistics.median(ratios):.2f} "
                             f"({ratios[0]:.2f}-{ratios[-1]:.2f})")
        print(f"{on} / {off}, median of rounds (range): " + ", ".join(cells))


def svg(results: list[dict], path: Path) -> None:
    """Speedup over each engine's own plain decoding, per model and workload."""
    bars = [(r["model"], w, "switchyard",
             r["median"][("switchyard ngram", w)], r["median"][("switchyard off", w)])
            for r in results for w in WORKLOADS]
    bars += [(r["model"], w, "llama.cpp",
              r["median"].get(("llama.cpp lookup", w)), r["median"].get(("llama.cpp plain", w)))
             for r in results for w in WORKLOADS]
    groups = [(r["model"], w) for r in results for w in WORKLOADS]
    width, height, pad = 120 + 70 * len(groups), 360, 60
    top = 3.0
    y = lambda v: height - pad - (height - 2 * pad) * min(v, top) / top  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="11">',
             f'<text x="{width // 2}" y="18" text-anchor="middle" font-size="14">Speculative '
             'decoding: single-stream decode speed over plain decoding</text>']
    for tick in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0):
        parts.append(f'<line x1="{pad}" x2="{width - 20}" y1="{y(tick):.0f}" y2="{y(tick):.0f}" '
                     f'stroke="{"#888" if tick == 1.0 else "#ddd"}"/>'
                     f'<text x="{pad - 6}" y="{y(tick) + 4:.0f}" text-anchor="end">{tick}×</text>')
    colors = {"switchyard": "#1f77b4", "llama.cpp": "#d62728"}
    for g, (model, workload) in enumerate(groups):
        x0 = pad + 10 + 70 * g
        for k, engine in enumerate(colors):
            bar = next((b for b in bars if b[:3] == (model, workload, engine)), None)
            if bar and bar[3] and bar[4]:
                ratio = bar[3] / bar[4]
                parts.append(f'<rect x="{x0 + 26 * k}" y="{y(ratio):.0f}" width="24" '
                             f'height="{y(0) - y(ratio):.0f}" fill="{colors[engine]}"/>'
                             f'<text x="{x0 + 26 * k + 12}" y="{y(ratio) - 3:.0f}" '
                             f'text-anchor="middle" font-size="9">{ratio:.2f}</text>')
        parts.append(f'<text x="{x0 + 25}" y="{height - pad + 14}" text-anchor="middle">'
                     f'{workload}</text><text x="{x0 + 25}" y="{height - pad + 28}" '
                     f'text-anchor="middle" fill="#555">{model}</text>')
    for k, (engine, color) in enumerate(colors.items()):
        parts.append(f'<rect x="{pad + 160 * k}" y="30" width="12" height="12" fill="{color}"/>'
                     f'<text x="{pad + 160 * k + 16}" y="40">{engine} n-gram / plain</text>')
    parts.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", default=None)
    parser.add_argument("--switchyard", type=Path,
                        default=ROOT / "target" / "release" / "switchyard")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another switchyard binary (e.g. main's) run with n-gram "
                             "speculation beside the others")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--no-llama", action="store_true")
    parser.add_argument("--no-load", action="store_true",
                        help="single stream only (skip the many-client rounds)")
    parser.add_argument("--load-only", action="store_true",
                        help="the many-client rounds only (skip the single streams)")
    parser.add_argument("--draft-model", type=Path, default=None,
                        help="a draft checkpoint of the same tokenizer: adds the "
                             "`draft` and `ngram`+draft engines")
    parser.add_argument("--svg", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = [bench_model(args, name) for name in (args.model or ["smollm2", "gemma3"])]
    for result in results:
        summary(result)
    if args.svg:
        svg(results, args.svg)
    if args.json:
        args.json.write_text(json.dumps([
            {**r, "median": {f"{e}|{w}": v for (e, w), v in r["median"].items()},
             "rates": {f"{e}|{w}": v for (e, w), v in r["rates"].items()}}
            for r in results], indent=1))


if __name__ == "__main__":
    main()
