"""What n-gram speculation could reach on a workload: the ceiling of an
oracle drafter limited to the prompt and the text so far, and how near
the lookup policies come to it, on the model's own greedy answer.

Greedy decoding makes the answer known in advance, so a drafter can be
judged offline: at each step the decoder has emitted `t` answer tokens; a
drafter proposes tokens taken from the context (the prompt and the first
`t` answer tokens); a verify step keeps the drafted tokens that match the
answer and emits one more, for `cost(k)` of a plain step, where `k` is the
number of tokens drafted (measured by `cargo bench --bench verify_cost`,
given here with --cost, plus the server's own time per step: see
`Cost`). Tokens over total cost is the speedup that drafter implies
(decode only).

Drafters:
  oracle       the longest run of the answer's next tokens that occurs
               anywhere in the context, drafted exactly (no wasted row),
               at most 8 (the default longest draft) or 16 a step: the
               ceiling of any drafter that copies from the context;
  oracle-keyN  the best continuation among the places where the last N
               tokens occurred before (a lookup keyed by N tokens that
               always picks the right candidate);
  latest, kept part only
               the engine's lookup drafting exactly what will be kept;
  latest       the engine's lookup (`Ngram`: the longest suffix of 4 down
               to 2 tokens, its latest earlier occurrence) with the
               engine's draft-length control (`DraftControl`), as
               `speculate/` runs it; other lookups the same way.
Also: the share of answer tokens that continue an n-gram seen before, and
the lengths of the runs the oracle keeps.

With --history, the same again with the model's own answers to other
questions on the same sources put before the prompt: what drafts from the
model's earlier outputs on the same prompt family (a cross-request n-gram
cache, as llama.cpp's lookup cache keeps) could add.

Usage:
  python benches/speculation_ceiling.py --model smollm2 --workload retrieval
      --cost COST.md (`cargo bench --bench verify_cost > COST.md`) | --cost MS,MS,...
      [--switchyard BIN] [--overhead-ms MS]
      [--max-tokens 128] [--history] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speculative import ROOT, SOURCES, WORKLOADS, Server, model_path  # noqa: E402

# Other questions on the retrieval workloads' sources (--history).
FAMILY = [f"Sources:\n{SOURCES}\n\nQuestion: {question}" for question in (
    "Which river is the longest in Asia? Quote the source.",
    "Where does the Nile flow? Answer by quoting the sources exactly, with their numbers.",
    "What do the sources say about the Yangtze and the Amazon? Answer by quoting the "
    "sources exactly, with their numbers.",
)]

# `speculate/control.rs`: the pause threshold, its bound and the average's weight.
OFF_BELOW, MAX_PAUSE, SMOOTHING = 0.35, 64, 0.3


class Cost:
    """A verify step's cost over a plain step, by drafted tokens `k`.

    From the forward pass's measured times (`verify_cost`: ms by `k`,
    linear between points, past the last at the mean cost of a row) plus
    `overhead` ms of the server's own work per step (sampling, streaming, the executor's loop),
    counted once per step: the most favourable case for speculation, which
    shares it among the tokens a step emits; so the speedups are ceilings."""

    def __init__(self, ks: list[int], ms: list[float], overhead: float = 0.0):
        self.points = sorted(zip(ks, ms))
        self.overhead = overhead

    def forward_ms(self, k: int) -> float:
        pts = self.points
        for (k0, c0), (k1, c1) in zip(pts, pts[1:]):
            if k <= k1:
                return c0 + (c1 - c0) * (k - k0) / (k1 - k0)
        # Past the last point at the mean cost of a row (one noisy point
        # must not bend it down).
        (k0, c0), (k1, c1) = pts[0], pts[-1]
        return c1 + (c1 - c0) * (k - k1) / (k1 - k0)

    def __call__(self, k: int) -> float:
        return (self.forward_ms(k) + self.overhead) / (self.forward_ms(0) + self.overhead)


def parse_cost(text: str) -> Cost:
    """`verify_cost`'s Markdown table (its step ms medians), or ms by k = 0, 1, 2, ..."""
    path = Path(text)
    if path.exists():
        ks, ms = [], []
        for line in path.read_text().splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 4 and cells[0].isdigit():
                ks.append(int(cells[0]))
                ms.append(float(cells[2].split()[0]))
        return Cost(ks, ms)
    ms = [float(c) for c in text.split(",")]
    return Cost(list(range(len(ms))), ms)


def tokenize(binary: Path, model: Path, prompt: str, answers: list[str]) -> tuple[list, list]:
    """The chat prompt's ids (template rendered) and each answer's ids."""
    with tempfile.TemporaryDirectory(dir=ROOT / "target") as tmp:
        chat, texts = Path(tmp) / "chat.json", Path(tmp) / "texts.json"
        chat.write_text(json.dumps([{"role": "user", "content": prompt}]))
        texts.write_text(json.dumps(answers))
        run = lambda *a: json.loads(subprocess.run(  # noqa: E731
            [str(binary), "tokenize", "--model", str(model), *a],
            check=True, capture_output=True, text=True).stdout)
        prompt_ids = run("--chat", str(chat))["ids"]
        answer_ids = run("--input", str(texts), "--no-special")
    return prompt_ids, answer_ids


def common_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def copy_run(context: list, rest: list) -> int:
    """The longest prefix of `rest` that occurs in `context`."""
    best = 0
    for i in range(len(context)):
        if context[i] == (rest[0] if rest else None):
            best = max(best, common_prefix(context[i:], rest))
    return best


def continuations(context: list, n: int) -> list[int]:
    """Starts of the tokens that followed earlier occurrences of the last
    `n` tokens of `context`, latest first."""
    if len(context) <= n:
        return []
    key = context[-n:]
    return [i + n for i in range(len(context) - n - 1, -1, -1) if context[i:i + n] == key]


class Control:
    """`speculate/control.rs`'s `DraftControl`, step for step."""

    def __init__(self, max_draft: int):
        self.max_draft, self.length = max_draft, min(max_draft, 4)
        self.acceptance, self.paused, self.next_pause = 1.0, 0, 2

    def allows(self) -> bool:
        if self.paused > 0:
            self.paused -= 1
            return False
        return True

    def record(self, drafted: int, accepted: int) -> None:
        rate = accepted / drafted
        self.acceptance = SMOOTHING * rate + (1 - SMOOTHING) * self.acceptance
        self.length = (min(self.length * 2, self.max_draft) if accepted >= drafted
                       else min(accepted + 1, self.max_draft))
        if self.acceptance < OFF_BELOW:
            self.paused, self.next_pause = self.next_pause, min(self.next_pause * 2, MAX_PAUSE)
            self.acceptance = OFF_BELOW
        elif rate >= 0.5:
            self.next_pause = 2


def lookup_latest(context: list, limit: int, lo: int = 2, hi: int = 4) -> list:
    """`Ngram::draft`: the longest suffix of `hi` down to `lo` tokens, its latest occurrence."""
    for n in range(hi, lo - 1, -1):
        starts = continuations(context, n)
        if starts:
            return context[starts[0]:starts[0] + limit]
    return []


def simulate(prompt: list, answer: list, cost: Cost, drafter, max_draft: int = 8) -> dict:
    """Steps of a greedy decode of `answer` whose drafts come from
    `drafter(context, limit)` under the engine's controller."""
    control = Control(max_draft)
    # The prompt's pass samples the first answer token; decoding starts after it.
    t, total, drafted, kept, runs = 1, 0.0, 0, 0, []
    while t < len(answer):
        context = prompt + answer[:t]
        draft = drafter(context, control.length)
        if draft and not control.allows():
            draft = []
        accepted = common_prefix(draft, answer[t:])
        if draft:
            control.record(len(draft), accepted)
            runs.append(accepted)
        total += cost(len(draft))
        drafted += len(draft)
        kept += accepted
        t += accepted + 1
    return {"speedup": (len(answer) - 1) / total, "drafted": drafted, "kept": kept,
            "verify_steps": len(runs)}


def oracle(prompt: list, answer: list, cost: Cost, key: int | None, cap: int) -> dict:
    """Drafts exactly the tokens that will be kept (none when none would):
    the longest copy from the context (`key` None) or the best among the
    continuations of the last `key` tokens; at most `cap` tokens a step."""
    t, total, runs = 1, 0.0, []
    while t < len(answer):
        context, rest = prompt + answer[:t], answer[t:t + cap]
        if key is None:
            run = copy_run(context, rest)
        else:
            run = max((common_prefix(context[s:], rest) for s in continuations(context, key)),
                      default=0)
        total += cost(run)
        if run:
            runs.append(run)
        t += run + 1
    return {"speedup": (len(answer) - 1) / total, "kept": sum(runs), "verify_steps": len(runs),
            "runs": runs}


def exact_length(prompt: list, answer: list, cost: Cost, cap: int = 8) -> dict:
    """The engine's lookup, drafting exactly the part of its guess that will
    be kept (none when its first token misses): what knowing when to stop
    would add to the engine's choice of what to copy."""
    t, total, runs = 1, 0.0, []
    while t < len(answer):
        run = common_prefix(lookup_latest(prompt + answer[:t], cap), answer[t:])
        total += cost(run)
        if run:
            runs.append(run)
        t += run + 1
    return {"speedup": (len(answer) - 1) / total, "kept": sum(runs), "verify_steps": len(runs)}


def seen_share(prompt: list, answer: list, n: int) -> float:
    """Share of answer tokens whose preceding `n` tokens and itself occurred before."""
    hits = 0
    for t in range(len(answer)):
        context = prompt + answer[:t]
        if len(context) < n:
            continue
        gram = context[len(context) - n:] + [answer[t]]
        hits += any(context[i:i + n + 1] == gram for i in range(len(context) - n))
    return hits / len(answer)


def analyse(prompt: list, answer: list, cost: Cost) -> dict:
    out = {"prompt_tokens": len(prompt), "answer_tokens": len(answer),
           "seen": {n: seen_share(prompt, answer, n) for n in (1, 2, 3, 4)}}
    for cap in (8, 16):
        out[f"oracle cap {cap}"] = oracle(prompt, answer, cost, None, cap)
    for key in (1, 2, 3):
        out[f"oracle-key{key} cap 8"] = oracle(prompt, answer, cost, key, 8)
    out["latest 4..2, kept part only"] = exact_length(prompt, answer, cost)
    out["latest 4..2 (engine)"] = simulate(prompt, answer, cost, lookup_latest)
    out["latest 4..1"] = simulate(prompt, answer, cost,
                                  lambda c, k: lookup_latest(c, k, lo=1))
    return out


def report(name: str, result: dict) -> None:
    print(f"\n{name}: {result['prompt_tokens']} prompt tokens, "
          f"{result['answer_tokens']} answer tokens")
    print("share of answer tokens continuing an n-gram seen before: " + ", ".join(
        f"n={n} {share:.0%}" for n, share in result["seen"].items()))
    print("| drafter | speedup implied | tokens kept | verify steps |")
    print("| --- | --- | --- | --- |")
    for key, value in result.items():
        if isinstance(value, dict) and "speedup" in value:
            print(f"| {key} | {value['speedup']:.2f}x | {value['kept']} | "
                  f"{value['verify_steps']} |")
    runs = result["oracle cap 8"]["runs"]
    if runs:
        print(f"oracle's kept runs: {len(runs)}, median length "
              f"{statistics.median(runs)}, lengths {sorted(Counter(runs).items())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--workload", action="append", default=None)
    parser.add_argument("--switchyard", type=Path,
                        default=ROOT / "target" / "release" / "switchyard")
    parser.add_argument("--cost", required=True,
                        help="verify_cost's output (its Markdown table), or step ms "
                             "for k = 0, 1, ...")
    parser.add_argument("--overhead-ms", type=float, default=None,
                        help="the server's own time per step; default: measured, the "
                             "server's plain decode time per token less the forward's")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--history", action="store_true",
                        help="also draft from the model's answers to other questions "
                             "on the same sources")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    cost = parse_cost(args.cost)
    path = model_path(args.model)
    server = Server(args.switchyard, path, args.threads, "off")
    results = {}
    try:
        for workload in args.workload or ["retrieval"]:
            prompt_text = WORKLOADS[workload]
            runs = [server.stream(prompt_text, args.max_tokens) for _ in range(3)]
            answer_text = runs[-1]["text"]
            plain_ms = 1e3 / statistics.median(r["decode_tok_s"] for r in runs)
            cost.overhead = (args.overhead_ms if args.overhead_ms is not None
                             else max(plain_ms - cost.forward_ms(0), 0.0))
            print(f"\n{workload}: plain decode {plain_ms:.2f} ms a token (server), "
                  f"forward {cost.forward_ms(0):.2f} ms, overhead {cost.overhead:.2f} ms a step; "
                  "cost by k: " + ", ".join(f"{k}: {cost(k):.2f}" for k in (1, 2, 4, 8)))
            family = ([server.stream(p, args.max_tokens)["text"] for p in FAMILY]
                      if args.history and workload in ("retrieval", "extract") else [])
            prompt, (answer, *earlier) = tokenize(args.switchyard, path, prompt_text,
                                                  [answer_text, *family])
            results[workload] = {"answer": answer_text, "prompt_ids": prompt,
                                 "answer_ids": answer, "plain_ms": plain_ms,
                                 "overhead_ms": cost.overhead, **analyse(prompt, answer, cost)}
            report(f"{args.model} {workload}", results[workload])
            if earlier:
                history = [token for ids in earlier for token in ids]
                results[workload]["family"] = analyse(history + prompt, answer, cost)
                report(f"{args.model} {workload}, after {len(earlier)} answers on the same "
                       f"sources ({len(history)} tokens)", results[workload]["family"])
    finally:
        server.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
