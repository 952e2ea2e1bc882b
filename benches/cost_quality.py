#!/usr/bin/env python3
"""Cost against quality: the cascade and routing against each single model.

Serves SmolLM2-135M Q4_1 (cheap, `smol`) and Gemma 3 270M Q4_K_M (strong,
`gemma`) from one `switchyard serve` with a `[cascade]` policy, and for every
item of the shipped generation suites asks

- `model: "auto"` under a threshold that accepts everything: SmolLM2's answer,
  its token log-probabilities, and the engine's confidence in it
  (`x-switchyard-confidence`: every statistic a cascade may compare, the
  quantiles of the token log-probabilities and the first token's top-2 margin
  and entropy);
- `model: "gemma"`: Gemma's answer.

Both are scored by exact match after the normalization of docs/EVALS.md
(greedy, at most 8 tokens, 24 for the sentence suites, stop at a line break, as
a cascade client would ask). SmolLM2 is asked once more for its first token
only: what an attempt the cascade stops early costs. Under `min_margin` the
engine stops SmolLM2 at its first token whose top-2 margin is below the
threshold: a deferred attempt is priced as its first-token cost plus the share
of its decode steps up to that token (each token's margin from the two top
log-probabilities the client gets).

Unit costs (printed first; `--unit-costs` alone): per model, the engine time of
one decode step with one sequence and with four at once (a 33-token counting
answer against a 1-token one, the difference over the steps between them) and
of one prompt token (a ~300-token uncached prompt): the two models differ per
generated token, not per prompt token, so the answer's length decides what a
cascade can save.

Cost (`--cost`). What a request costs is what the engine spent making its
tokens, measured where they are made: the executor times every forward step
per checkpoint (`switchyard_step_seconds`), and the bench reads that counter
before and after each request (requests go one at a time). That is the
default, `engine` (engine milliseconds a request). Two other views are
reported beside it: `bytes`, forward steps times the weight bytes a step
streams (each step reads every weight once: the memory-bound model of a
decode, independent of load), and `tokens`, tokens at a declared price
(`--price-ratio`, default 2, the parameter ratio), RouteLLM's view of two
API models. Each pass over a suite has its own prompt-cache scope
(`cache_salt`), so the few-shot prefix every item of a suite shares is
computed once per pass and model, as a deployment's prompt cache would, and
no pass finds another pass's copy of the same prompt. Engine times are
clean only at top priority: run it through `/work/briefs/quiet-run` on a
shared host, one suite a call (`--suite`), and `--from-json` to re-report.

Routers compared, as RouteLLM (Ong et al. 2024) does: always-cheap,
always-strong, random mix (a share p of requests to Gemma, its expected
accuracy), declared quality (the policy's typed figures, bigger model better,
pick one model for everything), measured quality (each suite's measured
accuracy picks one model for that suite) and the cascade: SmolLM2 answers,
and the least sure share q of its answers go to Gemma, by each statistic
(its separation of SmolLM2's right answers from its wrong ones, AUROC,
reported for every statistic).

Held-out calibration: a suite's items are split once, by a shuffle from a
fixed seed (benches/cascade_signals.py), into a calibration half and a test
half (runs saved before the split used the even and the odd items).
`switchyard calibrate --answers` picks, for each confidence
statistic, the threshold deferring least while the cascade stays at >= 95%
of Gemma's accuracy on the calibration half; the statistic whose threshold
makes the cascade cheapest there is written into the server's policy (under
a first-token statistic a deferral costs SmolLM2 one step, so the fewest
deferrals is not always the cheapest); the real cascade then answers the
held-out half (`model: "auto"`), and its accuracy, deferrals and cost are
what it did and what the engine measured.

Every deferral signal is judged the same way, held out (benches/cascade_signals.py:
the engine's statistics, client-side ones from the per-token log-probabilities
and margins, and a logistic combination fitted on the calibration half): AUROC
on the test half, the cascade there with the threshold chosen on the
calibration half, the same with the halves swapped, and the cheapest threshold
in hindsight.

The handoff (`--handoff`, on a run saved under --out): the server's
`handoff = true` under `min_margin` (a deferral stops SmolLM2 at its first
token below the threshold and Gemma continues SmolLM2's tokens before it),
live on the held-out half. Its threshold is calibrated for the handoff on the
calibration half: for every place a threshold can stop a calibration answer
(the tokens whose margin is below every earlier one's), Gemma is asked to
continue SmolLM2's answer from there (the text the server would hand it),
scored and priced by the engine; the cheapest threshold at >= 95% of Gemma's
accuracy there goes into the policy. The live run with the threshold
calibrated for plain deferrals is measured beside it, and the test half's
SmolLM2 and Gemma answers are asked again in the same pass so the costs
compare.

Metrics (RouteLLM's evaluate.py): the router's accuracy at strong-call shares
0, 0.05, ..., 1; PGR = (acc - acc_cheap) / (acc_strong - acc_cheap); APGR =
(area under accuracy - area under acc_cheap) / (area under acc_strong - area
under acc_cheap) over the share, trapezoids; CPT(95%): the share of strong calls
where PGR first reaches 0.95 (linear between points). Both are defined only
where the strong model is the better one. The bound: a cascade with a
perfect deferral signal (it defers exactly the answers SmolLM2 gets wrong and
Gemma right, as few as reach the goal, each stopped after one token), its
cost, and how many times dearer Gemma would have to be for it to cost <= 60%
of always-Gemma.

Output: Markdown (stdout), an SVG plot per suite (accuracy against cost as a
share of always-Gemma's: the cascade swept over thresholds, the perfect-signal
curve, the random mix, both models, the live held-out cascade, the goal's
corner) and the per-item answers and costs under --out. Usage:

    python3 benches/cost_quality.py [--suite country-gen ...] [--count N] [--out DIR]
    python3 benches/cost_quality.py --unit-costs                        # per-token costs only
    python3 benches/cost_quality.py --from-json [--cost bytes|tokens]  # re-report, no server
    python3 benches/cost_quality.py --handoff --suite letter-sentence-gen  # after a run of that suite

Accuracy does not depend on the machine's load; only the run time does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import cascade_signals as cs

ROOT = Path(__file__).resolve().parents[1]
DECLARED = {"smol": 0.4, "gemma": 0.6}  # what a policy author would type (bigger is better)
MAX_TOKENS = 8  # the shipped one-to-three-token suites
# Suites whose answers are sentences: room for the whole answer.
LONG_ANSWERS = {"country-sentence-gen": 24, "letter-sentence-gen": 24}
STOP = ["\n"]
STATISTICS = ["mean", "min", "p05", "p10", "p25", "p50", "margin", "neg_entropy", "min_margin"]
FIRST_TOKEN = {"margin", "neg_entropy"}  # known after one token: a deferred attempt costs its prompt + 1
# The engine stops the first model at its first token below the threshold: a deferred
# attempt costs its prompt and the tokens up to that one.
EVERY_TOKEN = {"min_margin"}
GOAL = 0.95  # of always-strong accuracy
SUITES = ["country-gen", "letter-gen", "geo-gen", "arith-gen", "country-sentence-gen", "letter-sentence-gen"]
# Parts of a suite reported apart (where the two models differ most): name, items [lo, hi).
GROUPS = {s: [("Common words (the first 118 items)", 0, 118), ("iso-codes words (the rest)", 118, None)]
          for s in ("letter-gen", "letter-sentence-gen")}
SPENT = re.compile(r"\((\d+) prompt \+ (\d+) generated tokens\)")
HANDOFF = re.compile(r"\bkept=(\d+)\b")
STEP_METRIC = re.compile(r'^switchyard_step_seconds_(sum|count)\{model="([^"]+)",version="[^"]*"\} (\S+)$')


def fetch(script: str) -> Path:
    out = subprocess.run([str(ROOT / "scripts" / script)], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def normalize(text: str) -> str:
    """docs/EVALS.md: first line after leading whitespace, trimmed, spaces folded,
    lowercased, one trailing `.` removed."""
    text = text.lstrip().split("\n", 1)[0]
    text = " ".join(text.split()).lower()
    return text[:-1] if text.endswith(".") else text


def policy(statistic: str, min_confidence: float, handoff: bool = False) -> str:
    models = ""
    for name in ("smol", "gemma"):
        models += (f'[[models]]\nname = "{name}"\nversion = "1"\n'
                   f"cost_per_1k_input = 0.001\ncost_per_1k_output = 0.001\n"
                   f"quality = {DECLARED[name]}\ncontext_limit = 2048\n\n")
    return (f"[routing]\nallow_anonymous = true\n\n{models}"
            f'[cascade]\nmodels = ["smol", "gemma"]\nconfidence = "{statistic}"\nmin_confidence = {min_confidence!r}\n'
            + ("handoff = true\n" if handoff else ""))


class Server:
    def __init__(self, binary: Path, tmp: Path):
        self.policy = tmp / "policy.toml"
        self.policy.write_text(policy("p10", -1000.0))
        settings = tmp / "serve.toml"
        self.paths = {"smol": fetch("fetch-model.sh"), "gemma": fetch("fetch-gemma3.sh")}
        settings.write_text(
            "max_batch = 4\n"
            f'[[models]]\npath = "{self.paths["smol"]}"\nname = "smol"\nversion = "1"\n'
            f'[[models]]\npath = "{self.paths["gemma"]}"\nname = "gemma"\nversion = "1"\n')
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        env = {**os.environ, "SWITCHYARD_STATE_DIR": str(tmp / "state")}
        self.proc = subprocess.Popen([str(binary), "serve", "--config", str(settings), "--policy",
                                      str(self.policy), "--listen", f"127.0.0.1:{port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"switchyard serve exited: {self.proc.stderr.read()}")
            try:
                with urllib.request.urlopen(self.base + "/ready", timeout=1):
                    break
            except OSError:
                if time.time() > deadline:
                    sys.exit("switchyard serve was not ready within 300 s")
                time.sleep(0.5)
        # One answer from each model first, so no measured request pays a first step's
        # one-off setup (scratch buffers, page faults on the weights).
        for model in ("smol", "gemma"):
            self.complete(model, "Question: What is one plus one?\nAnswer:", "warm-up")

    def complete(self, model: str, prompt: str, salt: str = "collect",
                 max_tokens: int = MAX_TOKENS, stop: list[str] | None = None
                 ) -> tuple[str, dict, dict, list[float], list[float | None], str]:
        # `cache_salt`: each pass over a suite has its own prompt-cache scope, so a pass
        # finds cached only what its own earlier requests computed (the few-shot prefix
        # the suite's prompts share), never the same prompt asked in another pass.
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "stop": STOP if stop is None else stop, "logprobs": 2, "cache_salt": salt}
        request = urllib.request.Request(self.base + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as r:
            headers = {k.lower(): v for k, v in r.headers.items()}
            reply = json.load(r)
        choice = reply["choices"][0]
        logprobs = [x for x in (choice.get("logprobs") or {}).get("token_logprobs") or [] if x is not None]
        # Each token's top-2 margin, as the engine compares it (None where the two best
        # tokens decode to the same text, so the client sees one).
        margins = [top[0] - top[1] if len(top) > 1 else None
                   for top in (sorted((entry or {}).values(), reverse=True)
                               for entry in (choice.get("logprobs") or {}).get("top_logprobs") or [])]
        return choice["text"], reply["usage"], headers, logprobs, margins, choice.get("finish_reason") or ""

    def engine(self) -> dict[str, tuple[float, int]]:
        """Per model: the engine's forward-step seconds and steps so far
        (`switchyard_step_seconds`, measured on the executor thread around each step)."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as r:
            text = r.read().decode()
        out: dict[str, list] = {}
        for line in text.splitlines():
            found = STEP_METRIC.match(line)
            if found:
                entry = out.setdefault(found.group(2), [0.0, 0])
                if found.group(1) == "sum":
                    entry[0] += float(found.group(3))
                else:
                    entry[1] += int(float(found.group(3)))
        return {k: (v[0], v[1]) for k, v in out.items()}

    def measured(self, model: str, prompt: str, salt: str = "collect", max_tokens: int = MAX_TOKENS,
                 stop: list[str] | None = None):
        """`complete`, with what the engine spent on it per model: {model: (seconds, steps)}
        (requests go one at a time, so every step between the two readings is this one's)."""
        before = self.engine()
        reply = self.complete(model, prompt, salt, max_tokens, stop)
        after = self.engine()
        spent = {m: (after[m][0] - before.get(m, (0.0, 0))[0], after[m][1] - before.get(m, (0.0, 0))[1])
                 for m in after}
        return reply, {m: v for m, v in spent.items() if v[1] > 0}

    def wait_for_policy(self, statistic: str, threshold: float, prompt: str, max_tokens: int) -> None:
        """Until an `auto` answer's verdict shows the policy just written."""
        deadline = time.time() + 30
        while True:
            verdict = self.complete("auto", prompt, max_tokens=max_tokens)[2].get("x-switchyard-cascade", "")
            if f": {statistic} " in verdict and f" {threshold:.2f} " in verdict:
                return
            if time.time() > deadline:
                sys.exit(f"the server did not take the new policy ({statistic} {threshold}): {verdict}")
            time.sleep(0.5)

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


# The unit costs' probes: a prompt every model continues for long (counting), and a long
# prompt (about 300 tokens) for the prompt's cost per token.
COUNTING = "Count from one to one hundred in words: one, two, three, four, five, six,"
LONG_PROMPT = "".join(f"Question: What is {a} plus {b}?\nAnswer: {a + b}\n\n" for a, b in zip(range(3, 40, 2), range(50, 11, -2)))


def unit_costs(server: Server, reps: int = 3, decode: int = 33) -> dict:
    """Per model, from the engine's step times: the milliseconds one decode step takes
    with one sequence (a request alone, as the suites are asked) and with four at once
    (`max_batch`), and what one prompt token costs (a ~300-token prompt, uncached).
    A decode step's cost is the difference between a request for `decode` tokens and
    one for a single token (same prompt, each in a fresh prompt-cache scope), over the
    steps between them; medians of `reps` rounds."""
    import concurrent.futures
    import statistics

    def spent_on(model: str, prompts: list[tuple[str, str, int]]) -> tuple[float, int, int]:
        before = server.engine()
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            replies = list(pool.map(lambda p: server.complete(model, p[0], p[1], p[2], []), prompts))
        after = server.engine()
        seconds = after[model][0] - before.get(model, (0.0, 0))[0]
        steps = after[model][1] - before.get(model, (0.0, 0))[1]
        return seconds, steps, sum(r[1]["completion_tokens"] for r in replies)

    out = {}
    for model in ("smol", "gemma"):
        figures: dict[str, list[float]] = {"decode_1": [], "decode_4": [], "prompt": [], "generated": []}
        for r in range(reps):
            for width in (1, 4):
                one = spent_on(model, [(COUNTING, f"unit-{r}-{width}-{j}-a", 1) for j in range(width)])
                many = spent_on(model, [(COUNTING, f"unit-{r}-{width}-{j}-b", decode) for j in range(width)])
                if many[1] > one[1]:
                    figures[f"decode_{width}"].append(1000 * (many[0] - one[0]) / (many[1] - one[1]))
                if width == 1:
                    figures["generated"].append(many[2])
            before = server.engine()
            usage = server.complete(model, LONG_PROMPT, f"unit-{r}-prompt", 1, [])[1]
            after = server.engine()
            figures["prompt"].append(1000 * (after[model][0] - before.get(model, (0.0, 0))[0]) / usage["prompt_tokens"])
        out[model] = {k: statistics.median(v) for k, v in figures.items() if v}
    return out


def unit_cost_lines(units: dict) -> list[str]:
    smol, gemma = units["smol"], units["gemma"]
    row = lambda name, key, unit: (f"| {name} | {smol[key]:.2f} {unit} | {gemma[key]:.2f} {unit} | "
                                   f"{smol[key] / gemma[key]:.0%} |")
    return ["### What a token costs each model (engine step times)", "",
            "| | SmolLM2 | Gemma 3 | SmolLM2 / Gemma |", "| --- | --- | --- | --- |",
            row("decode step, one sequence", "decode_1", "ms"),
            row("decode step, four sequences", "decode_4", "ms"),
            row("prompt token (~300-token prompt)", "prompt", "ms"), "",
            f"(median of rounds; {smol.get('generated', 0):.0f} / {gemma.get('generated', 0):.0f} tokens generated "
            "of 33 asked by one counting request.)", ""]


def tokens(usage: dict) -> int:
    return usage["prompt_tokens"] + usage["completion_tokens"]


def statistics_of(confidence: str) -> dict[str, float]:
    """Every statistic of the engine's `x-switchyard-confidence` (higher is surer for
    each; an answer without one is -inf everywhere: always deferred)."""
    fields = dict(pair.split("=", 1) for pair in confidence.split())
    values = {k: float(v) for k, v in fields.items()}
    out = {s: values.get(s, float("-inf")) for s in STATISTICS if s != "neg_entropy"}
    out["neg_entropy"] = -values["entropy"] if "entropy" in values else float("-inf")
    return out


def auroc(rows: list[dict], statistic: str) -> float | None:
    """P(a right answer's statistic > a wrong one's), ties counting half: how well the
    statistic separates SmolLM2's right answers from its wrong ones (0.5 = not at all)."""
    right = [r["stats"][statistic] for r in rows if r["smol"]]
    wrong = [r["stats"][statistic] for r in rows if not r["smol"]]
    if not right or not wrong:
        return None
    wins = sum((a > b) + 0.5 * (a == b) for a in right for b in wrong)
    return wins / (len(right) * len(wrong))


def spent(engine: dict[str, tuple[float, int]], model: str, token_count: int) -> list:
    """[engine seconds, forward steps, tokens] one model spent on one request."""
    seconds, steps = engine.get(model, (0.0, 0))
    return [seconds, steps, token_count]


def collect(server: Server, items: list[dict], max_tokens: int) -> list[dict]:
    """Both models' answers to every item, and what each cost the engine. SmolLM2 is
    asked twice: its whole answer (what an accepted cascade answer costs), and its first
    token only (what an attempt stopped early costs: the prompt and one step), each pass
    in its own prompt-cache scope."""
    rows = []
    for i, item in enumerate(items):
        (smol_text, smol_usage, headers, logprobs, margins, finish), smol_engine = server.measured(
            "auto", item["prompt"], max_tokens=max_tokens)
        assert headers["x-switchyard-model"] == "smol", headers
        (_, first_usage, _, _, _, _), first_engine = server.measured("smol", item["prompt"], "first", 1)
        (gemma_text, gemma_usage, _, _, _, _), gemma_engine = server.measured(
            "gemma", item["prompt"], max_tokens=max_tokens)
        answer = normalize(item["answer"])
        confidence = headers.get("x-switchyard-confidence", "")
        rows.append({
            "smol": normalize(smol_text) == answer, "gemma": normalize(gemma_text) == answer,
            "smol_text": smol_text, "gemma_text": gemma_text,
            "confidence": confidence, "stats": statistics_of(confidence), "logprobs": logprobs,
            "margins": margins, "finish_reason": finish,
            "spent": {"smol": spent(smol_engine, "smol", tokens(smol_usage)),
                      "smol_first": spent(first_engine, "smol", tokens(first_usage)),
                      "gemma": spent(gemma_engine, "gemma", tokens(gemma_usage))},
            "cached": {"smol": smol_usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
                       "gemma": gemma_usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)},
        })
        if (i + 1) % 25 == 0:
            print(f"  {i + 1}/{len(items)}", file=sys.stderr)
    return rows


class Pricing:
    """What a request costs, from what it spent ([seconds, steps, tokens] per model):

    - `engine` (default): the engine's forward-step milliseconds, measured where the
      tokens were made (`switchyard_step_seconds`): what the machine spent;
    - `bytes`: forward steps times the weight bytes a step streams (each step reads every
      weight once; the memory-bound view of a decode, load-independent);
    - `tokens`: tokens at a declared price, Gemma `ratio` times SmolLM2 (RouteLLM's view
      of two API models)."""

    UNITS = {"engine": "engine ms", "bytes": "MB read", "tokens": "price units"}

    def __init__(self, mode: str, ratio: float, step_bytes: dict[str, float] | None):
        if mode == "bytes" and not step_bytes:
            sys.exit("--cost bytes needs the models' step bytes (the gguf package; run with .venv/bin/python)")
        self.mode, self.ratio, self.step_bytes = mode, ratio, step_bytes or {}
        self.unit = self.UNITS[mode]

    def of(self, model: str, used: list) -> float:
        seconds, steps, token_count = used
        if self.mode == "engine":
            return 1000 * seconds
        if self.mode == "bytes":
            return steps * self.step_bytes[model] / 1e6
        return token_count * (self.ratio if model == "gemma" else 1.0) / 1000

    def cheap(self, row: dict, deferred: bool, statistic: str, threshold: float | None = None) -> float:
        """SmolLM2's cost on an item: its whole answer, or for an item deferred under a
        first-token statistic its prompt and first token (the engine stops it there), or
        under an every-token statistic with its `threshold`, its prompt and the tokens up
        to the first one below it (the first-token cost plus that share of the rest, each
        decode step costing the same)."""
        if deferred and statistic in FIRST_TOKEN:
            return self.of("smol", row["spent"]["smol_first"])
        whole = self.of("smol", row["spent"]["smol"])
        margins = row.get("margins") or []
        if not (deferred and statistic in EVERY_TOKEN and threshold is not None and len(margins) > 1):
            return whole
        at = next((i for i, m in enumerate(margins) if m is not None and m < threshold), len(margins) - 1)
        first = self.of("smol", row["spent"]["smol_first"])
        return first + (whole - first) * at / (len(margins) - 1)

    def strong(self, row: dict) -> float:
        return self.of("gemma", row["spent"]["gemma"])


def p10(logprobs: list[float]) -> float:
    """A cross-check only: the nearest-rank 10% quantile, as the header's figure is made."""
    if not logprobs:
        return float("-inf")
    ordered = sorted(logprobs)
    return ordered[max(1, -(-len(ordered) // 10)) - 1]


def cascade_with(rows: list[dict], deferred: set[int], pricing: Pricing, statistic: str,
                 threshold: float | None = None) -> dict:
    """The cascade deferring the items `deferred` (by `statistic` below `threshold`):
    accuracy and cost per request (and each model's part of the cost)."""
    n = len(rows)
    correct = sum(rows[i]["gemma"] if i in deferred else rows[i]["smol"] for i in range(n))
    cheap = sum(pricing.cheap(rows[i], i in deferred, statistic, threshold) for i in range(n)) / n
    strong = sum(pricing.strong(rows[i]) for i in deferred) / n
    return {"strong_share": len(deferred) / n, "acc": correct / n, "cost": cheap + strong,
            "cheap_cost": cheap, "strong_cost": strong}


def cascade_at(rows: list[dict], share: float, pricing: Pricing, statistic: str) -> dict:
    """The cascade deferring its least sure `share` of answers (lowest `statistic` first)."""
    order = sorted(range(len(rows)), key=lambda i: rows[i]["stats"][statistic])
    k = round(share * len(rows))
    # The threshold deferring exactly these: the least sure answer kept.
    threshold = rows[order[k]]["stats"][statistic] if k < len(rows) else float("inf")
    return cascade_with(rows, set(order[:k]), pricing, statistic, threshold)


def oracle_curve(rows: list[dict], pricing: Pricing) -> list[dict]:
    """A cascade with a perfect deferral signal: it defers only answers SmolLM2 got wrong
    and Gemma right (the dearest to SmolLM2 last), each stopped after one token, 0, 1,
    ... of them: the best accuracy any signal reaches at each cost."""
    fixable = sorted((i for i, r in enumerate(rows) if r["gemma"] and not r["smol"]),
                     key=lambda i: pricing.strong(rows[i]) - pricing.cheap(rows[i], False, "margin"))
    return [cascade_with(rows, set(fixable[:k]), pricing, "margin") for k in range(len(fixable) + 1)]


def perfect_signal(rows: list[dict], strong_acc: float, pricing: Pricing) -> dict | None:
    """The cheapest perfect-signal cascade at >= 95% of Gemma's accuracy, and
    `gemma_factor`: how many times dearer Gemma would have to be (all else as measured)
    for it to cost <= 60% of always-Gemma (None: at no factor)."""
    strong_all = sum(pricing.strong(r) for r in rows) / len(rows)
    for point in oracle_curve(rows, pricing):
        if point["acc"] >= GOAL * strong_acc - 1e-9:
            return {**point, "gemma_factor": breakeven(point, strong_all)}
    return None


def breakeven(point: dict, strong_all: float) -> float | None:
    """The factor k by which Gemma's costs would have to grow for a cascade `point` to
    cost <= 60% of always-Gemma: cheap + k * strong <= 0.6 * k * strong_all."""
    room = 0.6 * strong_all - point["strong_cost"]
    return point["cheap_cost"] / room if room > 0 else None


def apgr_cpt(points: list[tuple[float, float]], weak: float, strong: float, target: float = GOAL):
    """RouteLLM: points (strong share, accuracy) sorted by share. APGR by trapezoids over
    the share; CPT: the share where PGR first reaches `target`, linear between points."""
    if strong <= weak:
        return None, None
    points = sorted(points)
    area = sum((x1 - x0) * (a0 + a1) / 2 for (x0, a0), (x1, a1) in zip(points, points[1:]))
    width = points[-1][0] - points[0][0]
    apgr = (area - weak * width) / ((strong - weak) * width)
    goal = weak + target * (strong - weak)
    cpt = None
    for (x0, a0), (x1, a1) in zip(points, points[1:]):
        if a0 >= goal:
            cpt = x0
            break
        if a1 >= goal:
            cpt = x0 + (x1 - x0) * (goal - a0) / (a1 - a0)
            break
    return apgr, cpt


def calibrate(binary: Path, rows: list[dict], work: Path, policy_file: Path | None,
              pricing: Pricing) -> dict | None:
    """`switchyard calibrate --answers` on `rows` for every statistic; the one whose
    threshold makes the cascade cheapest on these rows wins (a first-token statistic's
    deferrals cost SmolLM2 one step, so the fewest deferrals is not always the cheapest),
    and is written into `policy_file`."""
    answers = work / "calibration-answers.jsonl"
    answers.write_text("".join(json.dumps({"correct": r["smol"], "confidence": r["confidence"] or None,
                                           "logprobs": r["logprobs"],
                                           "strong_correct": r["gemma"]}) + "\n" for r in rows))
    results = {}
    for statistic in STATISTICS:
        out = subprocess.run([str(binary), "calibrate", "--answers", str(answers), "--statistic", statistic,
                              "--of-strong", str(GOAL), "--json"], capture_output=True, text=True)
        if out.returncode == 0:
            found = json.loads(out.stdout)
            deferred = {i for i, r in enumerate(rows) if not r["stats"][statistic] >= found["min_confidence"]}
            found["cost"] = cascade_with(rows, deferred, pricing, statistic, found["min_confidence"])["cost"]
            results[statistic] = found
    if not results:
        return None
    # Cheapest; among equals the fewest deferred, then file order.
    best = min(results, key=lambda s: (round(results[s]["cost"], 9), results[s]["deferred_share"],
                                       STATISTICS.index(s)))
    if policy_file is not None:
        subprocess.run([str(binary), "calibrate", "--answers", str(answers), "--statistic", best,
                        "--of-strong", str(GOAL), "--policy", str(policy_file)],
                       capture_output=True, text=True, check=True)
    return {"statistic": best, **results[best],
            "by_statistic": {s: {"deferred": results[s]["deferred_share"], "cost": results[s]["cost"]}
                             for s in results}}


def live_cascade(server: Server, items: list[dict], max_tokens: int, salt: str = "live") -> list[dict]:
    """The real cascade on `items`, in a prompt-cache scope of its own: per item, right or
    not, deferred or not, stopped early or not, handed off or not (and how many of
    SmolLM2's tokens were kept, `x-switchyard-handoff`), and what each model spent on it
    (measured by the engine; tokens as `usage` and `x-switchyard-cascade` report them)."""
    out = []
    for item in items:
        (text, usage, headers, _, _, _), engine = server.measured("auto", item["prompt"], salt, max_tokens)
        verdict = headers["x-switchyard-cascade"]
        handoff = HANDOFF.search(headers.get("x-switchyard-handoff", ""))
        record = {"correct": normalize(text) == normalize(item["answer"]),
                  "deferred": verdict.startswith("deferred"),
                  "early": "the attempt stopped" in verdict, "verdict": verdict, "text": text,
                  "kept": int(handoff.group(1)) if handoff else None}
        if record["deferred"]:
            attempt = SPENT.search(verdict)
            assert attempt, verdict
            record["spent"] = {"smol": spent(engine, "smol", int(attempt.group(1)) + int(attempt.group(2))),
                               "gemma": spent(engine, "gemma", tokens(usage))}
        else:
            record["spent"] = {"smol": spent(engine, "smol", tokens(usage))}
        out.append(record)
    return out


def live_summary(live: list[dict], pricing: Pricing) -> dict:
    n = len(live)
    cost = sum(pricing.of(m, used) for r in live for m, used in r["spent"].items())
    deferred = sum(r["deferred"] for r in live)
    return {"acc": sum(r["correct"] for r in live) / n, "strong_share": deferred / n, "deferred": deferred,
            "stopped_early": sum(r["early"] for r in live), "cost": cost / n,
            "cheap_cost": sum(pricing.of("smol", r["spent"]["smol"]) for r in live) / n,
            "strong_cost": sum(pricing.of("gemma", r["spent"]["gemma"]) for r in live if "gemma" in r["spent"]) / n}


def single(rows: list[dict], pricing: Pricing) -> dict:
    n = len(rows)
    return {"weak": sum(r["smol"] for r in rows) / n, "strong": sum(r["gemma"] for r in rows) / n,
            "cost_weak": sum(pricing.cheap(r, False, "p10") for r in rows) / n,
            "cost_strong": sum(pricing.strong(r) for r in rows) / n}


def svg(path: Path, title: str, strong_acc: float, strong_cost: float,
        series: dict[str, list[tuple[float, float]]]) -> None:
    """Accuracy against cost as a share of always-Gemma's, with the goal's corner (>= 95%
    of Gemma's accuracy for <= 60% of its cost) shaded."""
    series = {k: [(100 * x / strong_cost, y) for x, y in pts] for k, pts in series.items()}
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    x0, x1 = 0.0, max(110.0, max(xs) * 1.05)
    y0, y1 = max(0.0, min(ys) - 0.05), min(1.0, max(ys) + 0.05)
    w, h, m = 680, 440, 60
    sx = lambda x: m + (x - x0) / (x1 - x0) * (w - 2 * m)
    sy = lambda y: h - m - (y - y0) / (y1 - y0) * (h - 2 * m)
    colours = ["#1f77b4", "#17becf", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"]
    goal_y = GOAL * strong_acc
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<rect x="{sx(0):.1f}" y="{sy(y1):.1f}" width="{sx(60) - sx(0):.1f}" height="{sy(goal_y) - sy(y1):.1f}" '
           'fill="#2ca02c" fill-opacity="0.08"/>',
           f'<text x="{sx(2):.1f}" y="{sy(y1) + 14:.1f}" fill="#2ca02c">goal: &gt;= 95% of Gemma, &lt;= 60% of its cost</text>',
           f'<line x1="{sx(60):.1f}" y1="{sy(y0):.1f}" x2="{sx(60):.1f}" y2="{sy(y1):.1f}" stroke="#2ca02c" stroke-dasharray="4 3"/>',
           f'<line x1="{sx(x0):.1f}" y1="{sy(goal_y):.1f}" x2="{sx(x1):.1f}" y2="{sy(goal_y):.1f}" stroke="#2ca02c" stroke-dasharray="4 3"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
           f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 15}" text-anchor="middle">cost per request, % of always-Gemma</text>',
           f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">accuracy</text>']
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        xv = x0 + (x1 - x0) * i / 4
        out.append(f'<text x="{m - 5}" y="{sy(yv) + 4}" text-anchor="end">{yv:.2f}</text>')
        out.append(f'<text x="{sx(xv)}" y="{h - m + 15}" text-anchor="middle">{xv:.0f}%</text>')
    for k, (name, pts) in enumerate(series.items()):
        c = colours[k % len(colours)]
        pts = sorted(pts)
        if len(pts) > 1:
            out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                       + " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts) + '"/>')
        radius = 2.5 if len(pts) > 1 else 5
        for x, y in pts:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{radius}" fill="{c}"/>')
        out.append(f'<text x="{w - m - 230}" y="{m + 30 + 15 * k}" fill="{c}">{name}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def report(suite: str, result: dict, out: Path, pricing: Pricing, views: dict[str, Pricing]) -> list[str]:
    rows = result["rows"]
    n = len(rows)
    s = single(rows, pricing)
    weak, strong = s["weak"], s["strong"]
    shares = [i / 20 for i in range(21)]
    separation = {st: auroc(rows, st) for st in STATISTICS}
    ranked = [st for st in STATISTICS if separation[st] is not None]
    best = max(ranked, key=lambda st: (separation[st], st == "p10")) if ranked else "p10"
    held = result.get("held_out")
    shown = ["p10", best] + ([held["calibration"]["statistic"]] if held else [])
    curves = {st: [cascade_at(rows, q, pricing, st) for q in shares] for st in dict.fromkeys(shown)}
    random_pts = [{"strong_share": p, "acc": weak + p * (strong - weak),
                   "cost": s["cost_weak"] + p * (s["cost_strong"] - s["cost_weak"])} for p in shares]
    declared = "gemma" if DECLARED["gemma"] > DECLARED["smol"] else "smol"
    measured = "gemma" if strong > weak else "smol"
    pick = {"smol": (weak, s["cost_weak"], 0.0), "gemma": (strong, s["cost_strong"], 1.0)}
    cached = sum(r["cached"]["smol"] for r in rows) / n
    prompt = sum(r["spent"]["smol"][2] for r in rows) / n
    lines = [f"### `{suite}` ({n} items; SmolLM2 {weak:.3f}, Gemma {strong:.3f}; cost: {pricing.unit})", "",
             "How well each statistic separates SmolLM2's right answers from its wrong ones (AUROC, "
             "0.5 = not at all): " + ", ".join(f"{st} {separation[st]:.3f}" for st in ranked) + ".", "",
             f"What one answer costs, always-SmolLM2 over always-Gemma, by cost model: "
             + ", ".join(f"{mode} {single(rows, view)['cost_weak'] / single(rows, view)['cost_strong']:.0%}"
                         for mode, view in views.items())
             + f"; SmolLM2 stopped after its first token: "
             + ", ".join(f"{mode} {sum(view.cheap(r, True, 'margin') for r in rows) / n / single(rows, view)['cost_strong']:.0%}"
                         for mode, view in views.items())
             + f" (SmolLM2 {prompt:.0f} tokens a request, {cached:.0f} of them from the prompt cache).", "",
             "| router | accuracy | cost / request | of always-Gemma's cost | strong share | APGR | CPT(95%) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]

    def row(name, acc, cost, share, points=None):
        apgr, cpt = apgr_cpt([(p["strong_share"], p["acc"]) for p in points], weak, strong) if points else (None, None)
        a = "" if points is None else ("n/a" if apgr is None else f"{apgr:.3f}")
        c = "" if points is None else ("n/a" if apgr is None else ("not reached" if cpt is None else f"{cpt:.2f}"))
        lines.append(f"| {name} | {acc:.3f} | {cost:.3f} | {cost / s['cost_strong']:.0%} | {share:.2f} | {a} | {c} |")

    row("always SmolLM2 (cheap)", weak, s["cost_weak"], 0.0)
    row("always Gemma (strong)", strong, s["cost_strong"], 1.0)
    row("random mix, p = 0.5 (expected)", random_pts[10]["acc"], random_pts[10]["cost"], 0.5, random_pts)
    row(f"declared quality (picks {declared})", *pick[declared])
    row(f"measured quality (picks {measured})", *pick[measured])
    for st, curve in curves.items():
        row(f"cascade by {st}, least sure half deferred", curve[10]["acc"], curve[10]["cost"],
            curve[10]["strong_share"], curve)
        good = [p for p in curve if p["acc"] >= GOAL * strong]
        if good:
            p = min(good, key=lambda p: p["cost"])
            row(f"cascade by {st}, cheapest at >= 95% of Gemma (in-sample, q = {p['strong_share']:.2f})",
                p["acc"], p["cost"], p["strong_share"])
    oracle = perfect_signal(rows, strong, pricing) if strong > weak else None
    if oracle:
        row("cascade with a perfect signal (the bound for any signal)", oracle["acc"], oracle["cost"],
            oracle["strong_share"])
        factor = oracle["gemma_factor"]
        lines += ["", f"Bound: a perfect deferral signal reaches 95% of always-Gemma accuracy for "
                      f"{oracle['cost'] / s['cost_strong']:.0%} of its cost ({pricing.unit}); "
                      + (f"<= 60% if Gemma cost {factor:.2f}x what it was measured to cost against SmolLM2."
                         if factor and factor > 1 else ("<= 60% as measured." if factor else "above 60% at any price."))]
    live = None
    cal_idx, test_idx = halves(result)
    cal_rows, test_rows = [rows[i] for i in cal_idx], [rows[i] for i in test_idx]
    if strong > weak and single(cal_rows, pricing)["strong"] > single(cal_rows, pricing)["weak"]:
        lines += signal_lines(suite, rows, cal_rows, test_rows, pricing)
    if result.get("handoff") and "live" in result["handoff"]:
        lines += handoff_lines(test_rows, result, pricing)
    if held:
        h = single(test_rows, pricing)
        cal = held["calibration"]
        live = live_summary(held["live"], pricing)
        held_oracle = perfect_signal(test_rows, h["strong"], pricing) if h["strong"] > h["weak"] else None
        lines += ["", f"Live cascade, held out ({held['n']} test items; calibrated on the {cal['n']} calibration items: "
                      f"`{cal['statistic']} >= {cal['min_confidence']}`, deferring "
                      f"{cal['deferred_share']:.0%} there; per statistic, deferred and cost there: "
                      + ", ".join(f"{k} {v['deferred']:.0%} / {v['cost'] / single(cal_rows, pricing)['cost_strong']:.0%}"
                                  for k, v in cal["by_statistic"].items()) + "):", "",
                  "| held-out half | accuracy | cost / request | of always-Gemma's cost | strong share |",
                  "| --- | --- | --- | --- | --- |",
                  f"| always SmolLM2 | {h['weak']:.3f} | {h['cost_weak']:.3f} | {h['cost_weak'] / h['cost_strong']:.0%} | 0.00 |",
                  f"| always Gemma | {h['strong']:.3f} | {h['cost_strong']:.3f} | 100% | 1.00 |",
                  f"| **live cascade** | **{live['acc']:.3f}** | **{live['cost']:.3f}** | "
                  f"**{live['cost'] / h['cost_strong']:.0%}** | {live['strong_share']:.2f} |"]
        if held_oracle:
            lines.append(f"| perfect signal (bound) | {held_oracle['acc']:.3f} | {held_oracle['cost']:.3f} | "
                         f"{held_oracle['cost'] / h['cost_strong']:.0%} | {held_oracle['strong_share']:.2f} |")
        lines.append("")
        if h["strong"] > 0:
            factor = breakeven(live, h["cost_strong"])
            by_view = ", ".join(f"{mode} {live_summary(held['live'], view)['cost'] / single(test_rows, view)['cost_strong']:.0%}"
                                for mode, view in views.items())
            lines.append(f"Live cascade on held-out items: {live['acc'] / h['strong']:.0%} of always-Gemma "
                         f"accuracy for {live['cost'] / h['cost_strong']:.0%} of its cost ({by_view} by cost model; "
                         f"{live['strong_share']:.0%} deferred, {live['stopped_early']} of {live['deferred']} "
                         f"stopped early (at SmolLM2's first token, or its first unsure one); goal >= 95% for <= 60%). It would cost <= 60% "
                         + (f"if Gemma cost {factor:.1f}x what it was measured to cost against SmolLM2."
                            if factor else "at no price of Gemma (it defers too many)."))
    same = sum(abs(p10(r["logprobs"]) - r["stats"]["p10"]) < 1e-5 for r in rows)
    lines.append("")
    lines.append(f"The p10 of the log-probabilities returned to the client matches the engine's "
                 f"`x-switchyard-confidence` on {same} of {n} answers.")
    if strong <= weak:
        lines.append("")
        lines.append("Here the larger, dearer Gemma is *not* more accurate than SmolLM2: APGR and CPT "
                     "(defined for a better strong model) do not apply; read accuracy and cost.")
    lines.append("")
    plot = {f"cascade by {st}, threshold swept": [(p["cost"], p["acc"]) for p in curve] for st, curve in curves.items()}
    if strong > weak:
        plot["perfect signal (bound)"] = [(p["cost"], p["acc"]) for p in oracle_curve(rows, pricing)]
    plot["random mix"] = [(p["cost"], p["acc"]) for p in random_pts]
    plot["always SmolLM2"] = [(s["cost_weak"], weak)]
    plot["always Gemma"] = [(s["cost_strong"], strong)]
    if live:
        # Held-out items, placed on the whole suite's always-Gemma cost by their own ratio.
        h = single(test_rows, pricing)
        plot["live cascade, held out"] = [(live["cost"] / h["cost_strong"] * s["cost_strong"],
                                           live["acc"] / h["strong"] * strong if h["strong"] else live["acc"])]
    if result.get("handoff") and "live" in result["handoff"]:
        # Its own pass's costs, placed on the whole suite's always-Gemma cost by their ratio.
        run = result["handoff"]
        hh = single(run["rows"], pricing)
        for name, live_run in run["live"].items():
            summary = live_summary(live_run, pricing)
            plot[f"handoff, held out ({name})"] = [
                (summary["cost"] / hh["cost_strong"] * s["cost_strong"],
                 summary["acc"] / hh["strong"] * strong if hh["strong"] else summary["acc"])]
    svg(out / f"cost_quality_{suite}.svg", f"{suite}: accuracy against cost ({pricing.unit})",
        strong, s["cost_strong"], plot)
    return lines


def halves(result: dict) -> tuple[list[int], list[int]]:
    """The calibration and test items of a run: the seeded split (benches/cascade_signals.py),
    or for a run saved before it, the even and the odd items."""
    n = len(result["rows"])
    if result.get("split") == cs.SPLIT_SEED:
        return cs.split(n)
    return list(range(0, n, 2)), list(range(1, n, 2))


def by_signal(rows: list[dict], signal: str, threshold: float, pricing: Pricing) -> dict:
    """The cascade deferring every answer whose `signal` is below `threshold`."""
    deferred = {i for i, r in enumerate(rows) if not r["signals"][signal] >= threshold}
    return cascade_with(rows, deferred, pricing, signal, threshold)


def cheapest_threshold(rows: list[dict], values: list[float], point_at) -> tuple[float, dict] | None:
    """The threshold (halfway between neighbouring `values`, or below or above them all)
    whose cascade `point_at(threshold)` is cheapest on `rows` while it stays at >= 95% of
    Gemma's accuracy there (ties: the fewest deferred); None if none does."""
    strong = sum(r["gemma"] for r in rows) / len(rows)
    values = sorted({v for v in values if math.isfinite(v)})
    candidates = [float("-inf")] + [(a + b) / 2 for a, b in zip(values, values[1:])]
    candidates += [values[-1] + 1.0] if values else []
    best = None
    for t in candidates:
        point = point_at(t)
        if point["acc"] >= GOAL * strong - 1e-9:
            key = (round(point["cost"], 9), point["strong_share"])
            if best is None or key < best[0]:
                best = (key, t, point)
    return (best[1], best[2]) if best else None


def pick_threshold(rows: list[dict], signal: str, pricing: Pricing) -> tuple[float, dict] | None:
    """The threshold on `signal` that makes the cascade cheapest on `rows` while it stays
    at >= 95% of Gemma's accuracy there, as `switchyard calibrate --of-strong` chooses."""
    return cheapest_threshold(rows, [r["signals"][signal] for r in rows],
                              lambda t: by_signal(rows, signal, t, pricing))


def signal_lines(suite: str, rows: list[dict], cal_rows: list[dict], test_rows: list[dict],
                 pricing: Pricing) -> list[str]:
    """Every deferral signal judged held out: fitted and thresholded on the calibration
    half, measured on the test half (AUROC for "SmolLM2 right", and the cascade's
    accuracy and cost there), beside the perfect signal's bound on the test half."""
    model = cs.Logistic(cal_rows)
    cal, test = cs.with_signals(cal_rows, model), cs.with_signals(test_rows, model)
    h = single(test, pricing)
    right = [r["smol"] for r in test]
    both = sum(r["smol"] and r["gemma"] for r in test)
    only_smol = sum(r["smol"] and not r["gemma"] for r in test)
    only_gemma = sum(r["gemma"] and not r["smol"] for r in test)
    lines = ["", f"Deferral signals, held out: fitted and thresholded on the {len(cal)} calibration items "
                 f"(split from the seed `{cs.SPLIT_SEED}`), measured on the {len(test)} test items "
                 f"(SmolLM2 {h['weak']:.3f}, Gemma {h['strong']:.3f}; both right {both}, only SmolLM2 "
                 f"{only_smol}, only Gemma {only_gemma}, neither {len(test) - both - only_smol - only_gemma}). "
                 f"Logistic on the calibration half: bias {model.bias:.3f}, "
                 + ", ".join(f"{k} {v:+.3f}" for k, v in model.weights.items()) + ".", "",
             "| signal | AUROC (test) | threshold (calibration) | deferred (test) | accuracy of Gemma's (test) "
             "| cost of Gemma's (test) | halves swapped: accuracy, cost | best threshold in-sample on test: "
             "cost at >= 95% |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    # The same with the halves' roles swapped (fitted and thresholded on the test half,
    # measured on the calibration half): how much a threshold moves between two halves.
    swapped_model = cs.Logistic(test_rows)
    cal_b, test_b = cs.with_signals(test_rows, swapped_model), cs.with_signals(cal_rows, swapped_model)
    h_b = single(test_b, pricing)

    def held(fit: list[dict], judge: list[dict], signal: str, base: dict) -> dict | None:
        picked = pick_threshold(fit, signal, pricing)
        if picked is None:
            return None
        point = by_signal(judge, signal, picked[0], pricing)
        return {**point, "threshold": picked[0], "acc_of": point["acc"] / base["strong"],
                "cost_of": point["cost"] / base["cost_strong"]}

    for signal in cs.SIGNALS:
        area = cs.auroc([r["signals"][signal] for r in test], right)
        hindsight = pick_threshold(test, signal, pricing)
        hind = f"{hindsight[1]['cost'] / h['cost_strong']:.0%}" if hindsight else "not reached"
        other = held(cal_b, test_b, signal, h_b)
        swap = f"{other['acc_of']:.0%}, {other['cost_of']:.0%}" if other else "none reaches 95%"
        point = held(cal, test, signal, h)
        if point is None:
            lines.append(f"| {signal} | {area:.3f} | none reaches 95% | | | | {swap} | {hind} |")
            continue
        lines.append(f"| {signal} | {area:.3f} | {point['threshold']:.4g} | {point['strong_share']:.0%} | "
                     f"{point['acc_of']:.0%} | {point['cost_of']:.0%} | {swap} | {hind} |")
    for name, lo, hi in GROUPS.get(suite, []):
        part = rows[lo:hi]
        if part:
            lines += ["", f"{name}: SmolLM2 {sum(r['smol'] for r in part) / len(part):.3f}, Gemma "
                          f"{sum(r['gemma'] for r in part) / len(part):.3f}, only Gemma right "
                          f"{sum(r['gemma'] and not r['smol'] for r in part) / len(part):.0%} ({len(part)} items, both halves)."]
    bound = perfect_signal(test, h["strong"], pricing)
    if bound:
        lines += ["", f"Perfect signal on the test half: {bound['acc'] / h['strong']:.0%} of Gemma's accuracy "
                      f"for {bound['cost'] / h['cost_strong']:.0%} of its cost ({bound['strong_share']:.0%} deferred). "
                      f"A SmolLM2 answer costs {h['cost_weak'] / h['cost_strong']:.0%} of Gemma's, so at <= 60% the "
                      f"cascade may add about {max(0.0, 0.6 - h['cost_weak'] / h['cost_strong']):.0%} of always-Gemma's "
                      f"cost in deferrals, and needs {max(0, math.ceil((GOAL * h['strong'] - h['weak']) * len(test)))} "
                      f"of the {only_gemma} answers only Gemma gets right."]
    return lines


def smol_pieces(server: Server, prompt: str, max_tokens: int) -> list[str]:
    """SmolLM2's greedy answer to `prompt`, token by token (each token's text)."""
    body = {"model": "smol", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stop": STOP,
            "logprobs": 1, "cache_salt": "handoff-pieces"}
    request = urllib.request.Request(server.base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.load(r)["choices"][0]["logprobs"]["tokens"]


def stop_points(margins: list[float | None]) -> list[int]:
    """Where a `min_margin` threshold can stop an answer: the tokens whose margin is
    below every earlier one's (a threshold stops at the first token below it, always one
    of these; a margin the client cannot see, None, is passed over)."""
    out, low = [], float("inf")
    for i, m in enumerate(margins):
        if m is not None and m < low:
            out.append(i)
            low = m
    return out


def handoff_outcomes(server: Server, items: list[dict], rows: list[dict], max_tokens: int) -> list[dict]:
    """Per calibration item, for every place a threshold can stop SmolLM2's answer
    (`stop_points`, past the first token), what a handoff there gives: Gemma asked for
    the prompt and SmolLM2's tokens before that point (the text the server would hand
    it, with what is left of `max_tokens`), right or not, and what Gemma's part cost
    the engine. A stop at the first token keeps nothing: Gemma's own answer."""
    out = []
    for i, (item, row) in enumerate(zip(items, rows)):
        points = [j for j in stop_points(row.get("margins") or []) if j > 0]
        pieces = smol_pieces(server, item["prompt"], max_tokens) if points else []
        by_point = {}
        for j in points:
            prefix = "".join(pieces[:j])
            (text, usage, _, _, _, _), engine = server.measured(
                "gemma", item["prompt"] + prefix, "handoff-calibration", max_tokens - j)
            by_point[str(j)] = {"correct": normalize(prefix + text) == normalize(item["answer"]),
                                "spent": spent(engine, "gemma", tokens(usage))}
        out.append(by_point)
        if (i + 1) % 50 == 0:
            print(f"  handoff calibration {i + 1}/{len(items)}", file=sys.stderr)
    return out


def handoff_point(rows: list[dict], outcomes: list[dict], threshold: float, pricing: Pricing) -> dict:
    """The cascade with a handoff at `threshold` on calibration rows whose handoffs were
    measured (`handoff_outcomes`): each answer whose engine `min_margin` is below it is
    stopped at its first token below it and continued by Gemma from there."""
    correct, cost, deferred = 0, 0.0, 0
    for row, outcome in zip(rows, outcomes):
        if row["stats"]["min_margin"] >= threshold:
            correct += row["smol"]
            cost += pricing.cheap(row, False, "min_margin")
            continue
        deferred += 1
        margins = row.get("margins") or []
        at = next((i for i, m in enumerate(margins) if m is not None and m < threshold), 0)
        measured = outcome.get(str(at))
        if measured is None:  # stopped at the first token (or unseen): Gemma from scratch
            correct += row["gemma"]
            strong = pricing.strong(row)
        else:
            correct += measured["correct"]
            strong = pricing.of("gemma", measured["spent"])
        cost += pricing.cheap(row, True, "min_margin", threshold) + strong
    n = len(rows)
    return {"acc": correct / n, "cost": cost / n, "strong_share": deferred / n}


def pick_handoff_threshold(rows: list[dict], outcomes: list[dict], pricing: Pricing) -> tuple[float, dict] | None:
    """The `min_margin` threshold that makes the cascade with a handoff cheapest on the
    calibration rows while it stays at >= 95% of Gemma's accuracy there, as
    `pick_threshold` chooses for plain deferrals."""
    return cheapest_threshold(rows, [r["stats"]["min_margin"] for r in rows],
                              lambda t: handoff_point(rows, outcomes, t, pricing))


def handoff_live(server: Server, items: list[dict], threshold: float, max_tokens: int) -> list[dict]:
    """The live cascade with the server's handoff (`handoff = true` under `min_margin`)
    at `threshold` on `items`, in its own prompt-cache scope."""
    server.policy.write_text(policy("min_margin", threshold, handoff=True))
    server.wait_for_policy("min_margin", threshold, items[0]["prompt"], max_tokens)
    try:
        return live_cascade(server, items, max_tokens, f"handoff-{threshold:.4f}")
    finally:
        server.policy.write_text(policy("p10", -1000.0))
        server.wait_for_policy("p10", -1000.0, items[0]["prompt"], max_tokens)


def handoff_lines(first: list[dict], result: dict, pricing: Pricing) -> list[str]:
    """The live handoff runs on the test half, beside SmolLM2 and Gemma alone measured in
    the same pass (`first`: the test half's rows from the main run)."""
    run = result["handoff"]
    test_rows = run["rows"]
    h = single(test_rows, pricing)
    n = len(test_rows)
    cal = run["calibration"]
    lines = ["", f"Handoff, live (the server's `handoff = true` under `min_margin`), held out on the {n} test "
                 f"items: a deferral stops SmolLM2 at its first token below the threshold and Gemma continues "
                 f"its tokens before that one. Thresholds from the calibration half: calibrated for the handoff "
                 f"(each place a threshold can stop a calibration answer handed to Gemma and scored: "
                 f"{cal['asked']} Gemma continuations; cheapest at >= 95% of Gemma there: "
                 f"`min_margin >= {cal['threshold']:.4g}`, {cal['acc_of']:.0%} for {cal['cost_of']:.0%}, "
                 f"{cal['strong_share']:.0%} deferred), and calibrated for plain deferrals "
                 f"(`min_margin >= {run['plain_threshold']:.4g}`, as the live cascade above). SmolLM2 and "
                 f"Gemma alone asked again in this pass (always-SmolLM2 {h['cost_weak'] / h['cost_strong']:.0%} "
                 f"of always-Gemma; the same answers as the first pass on "
                 f"{sum(a['smol'] == b['smol'] and a['gemma'] == b['gemma'] for a, b in zip(first, test_rows))} "
                 f"of {n} items).", "",
             "| threshold | accuracy, of Gemma's | cost, of Gemma's (engine) | deferred | tokens kept, mean | "
             "deferred items right: handoff / Gemma alone |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, live in run["live"].items():
        summary = live_summary(live, pricing)
        deferred = [(row, r) for row, r in zip(test_rows, live) if r["deferred"]]
        kept = [r["kept"] for _, r in deferred if r["kept"] is not None]
        lines.append(f"| {name} | **{summary['acc'] / h['strong']:.0%}** | **{summary['cost'] / h['cost_strong']:.0%}** | "
                     f"{len(deferred)} of {n} | {sum(kept) / max(1, len(kept)):.1f} | "
                     f"{sum(r['correct'] for _, r in deferred)} / {sum(row['gemma'] for row, _ in deferred)} |")
    return lines


def run_suite(binary: Path, server: Server, suite: str, count: int | None, work: Path, pricing: Pricing) -> dict:
    items = [json.loads(l) for l in (ROOT / "evals" / f"{suite}.jsonl").read_text().splitlines() if l.strip()]
    items = items[:count] if count else items
    print(f"{suite}: {len(items)} items", file=sys.stderr)
    max_tokens = LONG_ANSWERS.get(suite, MAX_TOKENS)
    rows = collect(server, items, max_tokens)
    result = {"rows": rows, "step_bytes": pricing.step_bytes, "max_tokens": max_tokens}
    result["split"] = cs.SPLIT_SEED
    cal_idx, test_idx = cs.split(len(rows))
    calibration_rows, held_rows = [rows[i] for i in cal_idx], [rows[i] for i in test_idx]
    if single(calibration_rows, pricing)["strong"] > single(calibration_rows, pricing)["weak"]:
        cal = calibrate(binary, calibration_rows, work, server.policy, pricing)
        if cal is not None:
            server.wait_for_policy(cal["statistic"], cal["min_confidence"], items[test_idx[0]]["prompt"], max_tokens)
            result["held_out"] = {"n": len(held_rows),
                                  "calibration": {k: cal[k] for k in ("statistic", "min_confidence", "deferred_share",
                                                                      "n", "by_statistic")},
                                  "live": live_cascade(server, [items[i] for i in test_idx], max_tokens)}
        server.policy.write_text(policy("p10", -1000.0))
        server.wait_for_policy("p10", -1000.0, items[0]["prompt"], max_tokens)
    return result


def step_bytes(path: Path) -> float | None:
    """The weight bytes one forward step streams (every tensor, less an untied
    embedding gathered a row at a time), from the GGUF file; None without `gguf`."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(str(path)).tensors}
    total = sum(sizes.values())
    if "output.weight" in sizes:
        total -= sizes.get("token_embd.weight", 0)
    return float(total)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", action="append", help=f"generation suite name (default: {', '.join(SUITES)})")
    parser.add_argument("--count", type=int, help="first N items of each suite")
    parser.add_argument("--cost", choices=["engine", "bytes", "tokens"], default="engine",
                        help="what a request costs (default engine: measured forward-step time; see Pricing)")
    parser.add_argument("--price-ratio", type=float, default=2.0,
                        help="with --cost tokens: Gemma's price per token over SmolLM2's")
    parser.add_argument("--out", type=Path, default=ROOT / "benches" / "results")
    parser.add_argument("--unit-costs", action="store_true",
                        help="only measure what a decode step and a prompt token cost each model")
    parser.add_argument("--handoff", action="store_true",
                        help="with answers a previous run saved under --out: measure the held-out min_margin "
                             "cascade with the server's handoff (Gemma continues SmolLM2's answer), its threshold "
                             "calibrated for the handoff on the calibration half")
    parser.add_argument("--from-json", action="store_true",
                        help="report from the answers a previous run saved under --out, without a server")
    parser.add_argument("--bin", type=Path, default=Path(os.environ.get("SWITCHYARD_BIN", ROOT / "target/release/switchyard")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    suites = args.suite or SUITES
    load = os.getloadavg()[0]
    lines = []

    def pricings(sizes: dict | None) -> tuple[Pricing, dict[str, Pricing]]:
        views = {mode: Pricing(mode, args.price_ratio, sizes) for mode in ("engine", "bytes", "tokens")
                 if mode != "bytes" or sizes}
        return Pricing(args.cost, args.price_ratio, sizes), views

    if args.from_json:
        units = args.out / "cost_quality_unit_costs.json"
        if units.exists():
            lines += unit_cost_lines(json.loads(units.read_text()))
        for suite in suites:
            result = json.loads((args.out / f"cost_quality_{suite}.json").read_text())
            if result["rows"] and "spent" not in result["rows"][0]:
                sys.exit(f"cost_quality_{suite}.json predates the engine's measured costs "
                         "(switchyard_step_seconds): run the benchmark again")
            pricing, views = pricings(result.get("step_bytes"))
            lines += report(suite, result, args.out, pricing, views)
        print("\n".join(lines))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="cost-quality-"))
    server = Server(args.bin, tmp)
    sizes = {name: step_bytes(path) for name, path in server.paths.items()}
    pricing, views = pricings(sizes if all(sizes.values()) else None)
    started = time.time()
    try:
        units = unit_costs(server)
        (args.out / "cost_quality_unit_costs.json").write_text(json.dumps(units, indent=1))
        lines += unit_cost_lines(units)
        for suite in suites if args.handoff else []:
            path = args.out / f"cost_quality_{suite}.json"
            result = json.loads(path.read_text())
            items = [json.loads(l) for l in (ROOT / "evals" / f"{suite}.jsonl").read_text().splitlines() if l.strip()]
            rows = result["rows"]
            cal_idx, test_idx = halves(result)
            cal_rows = [rows[i] for i in cal_idx]
            plain = pick_threshold(cs.with_signals(cal_rows, cs.Logistic(cal_rows)), "min_margin", pricing)
            # Greedy answers: a previous pass's handoff outcomes on the calibration half are
            # the same (its engine costs are that pass's); asked again only when missing.
            outcomes = (result.get("handoff") or {}).get("calibration", {}).get("outcomes")
            if not outcomes or len(outcomes) != len(cal_rows):
                outcomes = handoff_outcomes(server, [items[i] for i in cal_idx], cal_rows, result["max_tokens"])
            picked = pick_handoff_threshold(cal_rows, outcomes, pricing)
            if picked is None or plain is None:
                continue
            cal_h = single(cal_rows, pricing)
            # The test half asked again in this run, so the handoff's costs compare with
            # SmolLM2's and Gemma's measured beside them (greedy: the same answers).
            test_items = [items[i] for i in test_idx]
            fresh = collect(server, test_items, result["max_tokens"])
            live = {"calibrated for the handoff": handoff_live(server, test_items, picked[0], result["max_tokens"])}
            if abs(plain[0] - picked[0]) > 1e-9:
                live["calibrated for plain deferrals"] = handoff_live(server, test_items, plain[0], result["max_tokens"])
            result["handoff"] = {
                "threshold": picked[0], "plain_threshold": plain[0], "rows": fresh, "live": live,
                "calibration": {"threshold": picked[0], "outcomes": outcomes,
                                "asked": sum(len(o) for o in outcomes),
                                "acc_of": picked[1]["acc"] / cal_h["strong"],
                                "cost_of": picked[1]["cost"] / cal_h["cost_strong"],
                                "strong_share": picked[1]["strong_share"]}}
            path.write_text(json.dumps(result, indent=1))
            lines += report(suite, result, args.out, pricing, views)
        for suite in [] if args.unit_costs or args.handoff else suites:
            t = time.time()
            result = run_suite(args.bin, server, suite, args.count, tmp, pricing)
            result["unit_costs"] = units  # this run's, for the estimates that need them
            (args.out / f"cost_quality_{suite}.json").write_text(json.dumps(result, indent=1))
            lines += report(suite, result, args.out, pricing, views)
            print(f"  {time.time() - t:.0f} s", file=sys.stderr)
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    load = max(load, os.getloadavg()[0])
    lines.append(f"Run time {time.time() - started:.0f} s, load average up to {load:.1f}"
                 + (" (under load: engine times are not clean figures unless run through quiet-run; "
                    "accuracy does not depend on load)." if load > 2 else "."))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
