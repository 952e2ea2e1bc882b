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
(greedy, at most 8 tokens, stop at a line break, as a cascade client would ask).

Routers compared, as RouteLLM (Ong et al. 2024) does: always-cheap,
always-strong, random mix (a share p of requests to Gemma, its expected
accuracy), declared quality (the policy's typed figures, bigger model better,
pick one model for everything), measured quality (each suite's measured
accuracy picks one model for that suite) and the cascade: SmolLM2 answers,
and the least sure share q of its answers go to Gemma, by the statistic that
separates SmolLM2's right answers from its wrong ones best on that suite
(AUROC, reported for every statistic).

Held-out calibration: the even items of a suite calibrate, the odd items
measure. `switchyard calibrate --answers` picks, for each confidence
statistic, the threshold deferring least while the cascade stays at >= 95%
of Gemma's accuracy on the calibration half, and writes the best statistic's
into the server's policy; the real cascade then answers the held-out half
(`model: "auto"`), and its accuracy, deferrals and cost are what it did
(a deferred attempt's tokens as `x-switchyard-cascade` reports them: under a
first-token statistic the engine stops SmolLM2 after one token).

Metrics (RouteLLM's evaluate.py): the router's accuracy at strong-call shares
0, 0.1, ..., 1; PGR = (acc - acc_cheap) / (acc_strong - acc_cheap); APGR =
(area under accuracy - area under acc_cheap) / (area under acc_strong - area
under acc_cheap) over the share, trapezoids; CPT(95%): the share of strong calls
where PGR first reaches 0.95 (linear between points). Both are defined only
where the strong model is the better one. Cost: prompt and generated tokens
priced per model, Gemma `--price-ratio` (default 2, the parameter ratio) times
SmolLM2; the cascade pays SmolLM2 for every request (for a deferred one under
a first-token statistic: its prompt and one token) and Gemma for the deferred.
The bound: a cascade with a perfect deferral signal (it defers exactly the
answers SmolLM2 gets wrong and Gemma right, as few as reach the goal, each
stopped after one token), its cost at the declared ratio, and the ratio from
which it costs <= 60% of always-Gemma.

Output: Markdown (stdout), an SVG plot (accuracy against cost) and the
per-item answers per suite under --out. Usage:

    python3 benches/cost_quality.py [--suite country-gen ...] [--count N] [--out DIR]
    python3 benches/cost_quality.py --from-json     # re-report a previous run, no server

Accuracy does not depend on the machine's load; only the run time does.
"""

from __future__ import annotations

import argparse
import json
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

ROOT = Path(__file__).resolve().parents[1]
DECLARED = {"smol": 0.4, "gemma": 0.6}  # what a policy author would type (bigger is better)
MAX_TOKENS = 8
STOP = ["\n"]
STATISTICS = ["mean", "min", "p05", "p10", "p25", "p50", "margin", "neg_entropy", "min_margin"]
FIRST_TOKEN = {"margin", "neg_entropy"}  # known after one token: a deferred attempt costs its prompt + 1
GOAL = 0.95  # of always-strong accuracy
SUITES = ["country-gen", "letter-gen", "geo-gen", "arith-gen"]
SPENT = re.compile(r"\((\d+) prompt \+ (\d+) generated tokens\)")


def fetch(script: str) -> Path:
    out = subprocess.run([str(ROOT / "scripts" / script)], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def normalize(text: str) -> str:
    """docs/EVALS.md: first line after leading whitespace, trimmed, spaces folded,
    lowercased, one trailing `.` removed."""
    text = text.lstrip().split("\n", 1)[0]
    text = " ".join(text.split()).lower()
    return text[:-1] if text.endswith(".") else text


def policy(statistic: str, min_confidence: float) -> str:
    models = ""
    for name in ("smol", "gemma"):
        models += (f'[[models]]\nname = "{name}"\nversion = "1"\n'
                   f"cost_per_1k_input = 0.001\ncost_per_1k_output = 0.001\n"
                   f"quality = {DECLARED[name]}\ncontext_limit = 2048\n\n")
    return (f"[routing]\nallow_anonymous = true\n\n{models}"
            f'[cascade]\nmodels = ["smol", "gemma"]\nconfidence = "{statistic}"\nmin_confidence = {min_confidence!r}\n')


class Server:
    def __init__(self, binary: Path, tmp: Path):
        self.policy = tmp / "policy.toml"
        self.policy.write_text(policy("p10", -1000.0))
        settings = tmp / "serve.toml"
        settings.write_text(
            "max_batch = 4\n"
            f'[[models]]\npath = "{fetch("fetch-model.sh")}"\nname = "smol"\nversion = "1"\n'
            f'[[models]]\npath = "{fetch("fetch-gemma3.sh")}"\nname = "gemma"\nversion = "1"\n')
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

    def complete(self, model: str, prompt: str) -> tuple[str, dict, dict, list[float]]:
        body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                "stop": STOP, "logprobs": 1}
        request = urllib.request.Request(self.base + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as r:
            headers = {k.lower(): v for k, v in r.headers.items()}
            reply = json.load(r)
        choice = reply["choices"][0]
        logprobs = [x for x in (choice.get("logprobs") or {}).get("token_logprobs") or [] if x is not None]
        return choice["text"], reply["usage"], headers, logprobs

    def wait_for_policy(self, statistic: str, threshold: float, prompt: str) -> None:
        """Until an `auto` answer's verdict shows the policy just written."""
        deadline = time.time() + 30
        while True:
            verdict = self.complete("auto", prompt)[2].get("x-switchyard-cascade", "")
            if verdict.startswith("accepted") and f"{statistic} " in verdict and f" {threshold:.2f} " in verdict:
                return
            if time.time() > deadline:
                sys.exit(f"the server did not take the new policy ({statistic} {threshold}): {verdict}")
            time.sleep(0.5)

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


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


def collect(server: Server, items: list[dict]) -> list[dict]:
    rows = []
    for i, item in enumerate(items):
        smol_text, smol_usage, headers, logprobs = server.complete("auto", item["prompt"])
        assert headers["x-switchyard-model"] == "smol", headers
        gemma_text, gemma_usage, _, _ = server.complete("gemma", item["prompt"])
        answer = normalize(item["answer"])
        confidence = headers.get("x-switchyard-confidence", "")
        rows.append({
            "smol": normalize(smol_text) == answer, "gemma": normalize(gemma_text) == answer,
            "smol_text": smol_text, "gemma_text": gemma_text,
            "confidence": confidence, "stats": statistics_of(confidence), "logprobs": logprobs,
            "tokens_smol": tokens(smol_usage), "prompt_smol": smol_usage["prompt_tokens"],
            "tokens_gemma": tokens(gemma_usage),
        })
        if (i + 1) % 25 == 0:
            print(f"  {i + 1}/{len(items)}", file=sys.stderr)
    return rows


def costs(rows: list[dict], ratio: float) -> tuple[list[float], list[float]]:
    """Per item: SmolLM2's price and Gemma's (price units: 1 per 1k SmolLM2 tokens)."""
    return [r["tokens_smol"] / 1000 for r in rows], [ratio * r["tokens_gemma"] / 1000 for r in rows]


def cheap_cost(row: dict, deferred: bool, statistic: str) -> float:
    """SmolLM2's price for an item: its whole answer, or for an item deferred under a
    first-token statistic its prompt and one token (the engine stops it there)."""
    if deferred and statistic in FIRST_TOKEN:
        return (row["prompt_smol"] + 1) / 1000
    return row["tokens_smol"] / 1000


def p10(logprobs: list[float]) -> float:
    """A cross-check only: the nearest-rank 10% quantile, as the header's figure is made."""
    if not logprobs:
        return float("-inf")
    ordered = sorted(logprobs)
    return ordered[max(1, -(-len(ordered) // 10)) - 1]


def cascade_at(rows: list[dict], share: float, ratio: float, statistic: str) -> dict:
    """The cascade deferring its least sure `share` of answers (lowest `statistic` first)."""
    n = len(rows)
    order = sorted(range(n), key=lambda i: rows[i]["stats"][statistic])
    deferred = set(order[: round(share * n)])
    _, strong = costs(rows, ratio)
    correct = sum(rows[i]["gemma"] if i in deferred else rows[i]["smol"] for i in range(n))
    spend = sum(cheap_cost(rows[i], i in deferred, statistic) + (strong[i] if i in deferred else 0)
                for i in range(n))
    return {"strong_share": len(deferred) / n, "acc": correct / n, "cost": spend / n}


def perfect_signal(rows: list[dict], strong: float, ratio: float) -> dict | None:
    """The cheapest cascade at >= 95% of Gemma's accuracy that knew which answers were
    wrong: it defers only answers SmolLM2 got wrong and Gemma right, as few as needed,
    each stopped after one token. `ratio_60`: the Gemma/SmolLM2 price ratio from which
    it costs <= 60% of always-Gemma (None: at no ratio)."""
    n = len(rows)
    fixable = [i for i, r in enumerate(rows) if r["gemma"] and not r["smol"]]
    correct = sum(r["smol"] for r in rows)
    for k in range(len(fixable) + 1):
        if correct + k >= GOAL * strong * n - 1e-9:
            deferred = set(fixable[:k])
            cheap = sum(cheap_cost(r, i in deferred, "margin") for i, r in enumerate(rows))
            strong_deferred = sum(rows[i]["tokens_gemma"] for i in deferred) / 1000
            strong_all = sum(r["tokens_gemma"] for r in rows) / 1000
            room = 0.6 * strong_all - strong_deferred
            return {"acc": (correct + k) / n, "strong_share": k / n,
                    "cost": (cheap + ratio * strong_deferred) / n,
                    "ratio_60": cheap / room if room > 0 else None}
    return None


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


def calibrate(binary: Path, rows: list[dict], work: Path, policy_file: Path | None) -> dict | None:
    """`switchyard calibrate --answers` on `rows` for every statistic; the one deferring
    least wins (and is written into `policy_file`)."""
    answers = work / "calibration-answers.jsonl"
    answers.write_text("".join(json.dumps({"correct": r["smol"], "confidence": r["confidence"] or None,
                                           "logprobs": r["logprobs"],
                                           "strong_correct": r["gemma"]}) + "\n" for r in rows))
    results = {}
    for statistic in STATISTICS:
        out = subprocess.run([str(binary), "calibrate", "--answers", str(answers), "--statistic", statistic,
                              "--of-strong", str(GOAL), "--json"], capture_output=True, text=True)
        if out.returncode == 0:
            results[statistic] = json.loads(out.stdout)
    if not results:
        return None
    # Least deferred; among equals the documented default, p10, then file order.
    best = min(results, key=lambda s: (results[s]["deferred_share"], s != "p10", STATISTICS.index(s)))
    if policy_file is not None:
        subprocess.run([str(binary), "calibrate", "--answers", str(answers), "--statistic", best,
                        "--of-strong", str(GOAL), "--policy", str(policy_file)],
                       capture_output=True, text=True, check=True)
    return {"statistic": best, **results[best],
            "by_statistic": {s: results[s]["deferred_share"] for s in results}}


def live_cascade(server: Server, items: list[dict], rows: list[dict], ratio: float) -> dict:
    """The real cascade on `items`: SmolLM2's tokens for an accepted answer from `rows`
    (the same greedy answer), for a deferred one as `x-switchyard-cascade` reports its
    attempt (stopped after one token under a first-token statistic)."""
    correct, deferred, early, cheap_tokens, strong_tokens = 0, 0, 0, 0, 0
    for item, row in zip(items, rows):
        text, usage, headers, _ = server.complete("auto", item["prompt"])
        correct += normalize(text) == normalize(item["answer"])
        verdict = headers["x-switchyard-cascade"]
        if verdict.startswith("deferred"):
            deferred += 1
            strong_tokens += tokens(usage)
            spent = SPENT.search(verdict)
            assert spent, verdict
            cheap_tokens += int(spent.group(1)) + int(spent.group(2))
            early += "stopped after its first token" in verdict
        else:
            cheap_tokens += row["tokens_smol"]
    n = len(items)
    return {"acc": correct / n, "strong_share": deferred / n, "stopped_early": early,
            "cheap_tokens": cheap_tokens, "strong_tokens": strong_tokens}


def single(rows: list[dict], ratio: float) -> dict:
    n = len(rows)
    cheap, strong = costs(rows, ratio)
    return {"weak": sum(r["smol"] for r in rows) / n, "strong": sum(r["gemma"] for r in rows) / n,
            "cost_weak": sum(cheap) / n, "cost_strong": sum(strong) / n}


def svg(path: Path, title: str, series: dict[str, list[tuple[float, float]]]) -> None:
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    x0, x1 = 0.0, max(xs) * 1.05
    y0, y1 = max(0.0, min(ys) - 0.05), min(1.0, max(ys) + 0.05)
    w, h, m = 640, 420, 60
    sx = lambda x: m + (x - x0) / (x1 - x0) * (w - 2 * m)
    sy = lambda y: h - m - (y - y0) / (y1 - y0) * (h - 2 * m)
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
           f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 15}" text-anchor="middle">cost per request (price units)</text>',
           f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">accuracy</text>']
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        xv = x0 + (x1 - x0) * i / 4
        out.append(f'<text x="{m - 5}" y="{sy(yv) + 4}" text-anchor="end">{yv:.2f}</text>')
        out.append(f'<text x="{sx(xv)}" y="{h - m + 15}" text-anchor="middle">{xv:.3f}</text>')
    for k, (name, pts) in enumerate(series.items()):
        c = colours[k % len(colours)]
        pts = sorted(pts)
        if len(pts) > 1:
            out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                       + " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts) + '"/>')
        for x, y in pts:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{c}"/>')
        out.append(f'<text x="{w - m - 190}" y="{m + 15 * k}" fill="{c}">{name}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def report(suite: str, result: dict, out: Path, ratio: float) -> list[str]:
    rows = result["rows"]
    n = len(rows)
    s = single(rows, ratio)
    weak, strong = s["weak"], s["strong"]
    shares = [i / 10 for i in range(11)]
    separation = {st: auroc(rows, st) for st in STATISTICS}
    ranked = [st for st in STATISTICS if separation[st] is not None]
    best = max(ranked, key=lambda st: separation[st]) if ranked else "p10"
    curves = {st: [cascade_at(rows, q, ratio, st) for q in shares] for st in dict.fromkeys(["p10", best])}
    random_pts = [{"strong_share": p, "acc": weak + p * (strong - weak),
                   "cost": s["cost_weak"] + p * (s["cost_strong"] - s["cost_weak"])} for p in shares]
    declared = "gemma" if DECLARED["gemma"] > DECLARED["smol"] else "smol"
    measured = "gemma" if strong > weak else "smol"
    pick = {"smol": (weak, s["cost_weak"], 0.0), "gemma": (strong, s["cost_strong"], 1.0)}
    lines = [f"### `{suite}` ({n} items; SmolLM2 {weak:.3f}, Gemma {strong:.3f}; Gemma priced x{ratio:g})", "",
             "How well each statistic separates SmolLM2's right answers from its wrong ones (AUROC, "
             "0.5 = not at all): " + ", ".join(f"{st} {separation[st]:.3f}" for st in ranked) + ".", "",
             "| router | accuracy | cost / request | strong share | APGR | CPT(95%) |",
             "| --- | --- | --- | --- | --- | --- |"]

    def row(name, acc, spend, share, points=None):
        apgr, cpt = apgr_cpt([(p["strong_share"], p["acc"]) for p in points], weak, strong) if points else (None, None)
        a = "" if points is None else ("n/a" if apgr is None else f"{apgr:.3f}")
        c = "" if points is None else ("n/a" if apgr is None else ("not reached" if cpt is None else f"{cpt:.2f}"))
        lines.append(f"| {name} | {acc:.3f} | {spend:.4f} | {share:.2f} | {a} | {c} |")

    row("always SmolLM2 (cheap)", weak, s["cost_weak"], 0.0)
    row("always Gemma (strong)", strong, s["cost_strong"], 1.0)
    row("random mix, p = 0.5 (expected)", random_pts[5]["acc"], random_pts[5]["cost"], 0.5, random_pts)
    row(f"declared quality (picks {declared})", *pick[declared])
    row(f"measured quality (picks {measured})", *pick[measured])
    for st, curve in curves.items():
        row(f"cascade by {st}, least sure half deferred", curve[5]["acc"], curve[5]["cost"],
            curve[5]["strong_share"], curve)
        good = [p for p in curve if p["acc"] >= GOAL * strong]
        if good:
            p = min(good, key=lambda p: p["cost"])
            row(f"cascade by {st}, cheapest at >= 95% of Gemma (in-sample, q = {p['strong_share']:.1f})",
                p["acc"], p["cost"], p["strong_share"])
    oracle = perfect_signal(rows, strong, ratio) if strong > weak else None
    if oracle:
        row("cascade with a perfect signal (the bound for any signal)", oracle["acc"], oracle["cost"],
            oracle["strong_share"])
        lines += ["", f"Bound: a perfect deferral signal reaches 95% of always-Gemma accuracy for "
                      f"{oracle['cost'] / s['cost_strong']:.0%} of its cost at the declared price ratio {ratio:g} "
                      f"(SmolLM2's own answer costs {s['cost_weak'] / s['cost_strong']:.0%} of Gemma's); "
                      + (f"<= 60% from a Gemma/SmolLM2 price ratio of {oracle['ratio_60']:.2f}."
                         if oracle["ratio_60"] else "above 60% at any price ratio.")]
    held = result.get("held_out")
    if held:
        h = single(rows[1::2], ratio)
        cal = held["calibration"]
        live = dict(held["live"])
        live["cost"] = (live["cheap_tokens"] + ratio * live["strong_tokens"]) / 1000 / held["n"]
        all_strong_tokens = sum(r["tokens_gemma"] for r in rows[1::2])
        room = 0.6 * all_strong_tokens - live["strong_tokens"]
        break_even = live["cheap_tokens"] / room if room > 0 else None
        held_oracle = perfect_signal(rows[1::2], h["strong"], ratio) if h["strong"] > h["weak"] else None
        lines += ["", f"Held out ({held['n']} odd items; calibrated on the {cal['n']} even items: "
                      f"`{cal['statistic']} >= {cal['min_confidence']}`, deferring "
                      f"{cal['deferred_share']:.0%} there; per statistic "
                      + ", ".join(f"{k} {v:.0%}" for k, v in cal["by_statistic"].items()) + "):", "",
                  "| held-out half | accuracy | cost / request | strong share |", "| --- | --- | --- | --- |",
                  f"| always SmolLM2 | {h['weak']:.3f} | {h['cost_weak']:.4f} | 0.00 |",
                  f"| always Gemma | {h['strong']:.3f} | {h['cost_strong']:.4f} | 1.00 |",
                  f"| **live cascade** | **{live['acc']:.3f}** | **{live['cost']:.4f}** | {live['strong_share']:.2f} |"]
        if held_oracle:
            lines.append(f"| perfect signal (bound) | {held_oracle['acc']:.3f} | {held_oracle['cost']:.4f} | "
                         f"{held_oracle['strong_share']:.2f} |")
        lines.append("")
        if h["strong"] > 0:
            deferred = round(live["strong_share"] * held["n"])
            lines.append(f"Live cascade on held-out items: {live['acc'] / h['strong']:.0%} of always-Gemma "
                         f"accuracy for {live['cost'] / h['cost_strong']:.0%} of its cost "
                         f"({live['strong_share']:.0%} deferred, {live.get('stopped_early', 0)} of {deferred} "
                         f"stopped after SmolLM2's first token; goal >= 95% for <= 60%). Its cost is "
                         + (f"<= 60% of always-Gemma's from a Gemma/SmolLM2 price ratio of {break_even:.1f}."
                            if break_even else "above 60% of always-Gemma's at any price ratio (too many deferred)."))
    same = sum(abs(p10(r["logprobs"]) - r["stats"]["p10"]) < 1e-5 for r in rows)
    lines.append("")
    lines.append(f"The p10 of the log-probabilities returned to the client matches the engine's "
                 f"`x-switchyard-confidence` on {same} of {n} answers.")
    if strong <= weak:
        lines.append("")
        lines.append("Here the larger, dearer Gemma is *not* more accurate than SmolLM2: APGR and CPT "
                     "(defined for a better strong model) do not apply; read accuracy and cost.")
    lines.append("")
    svg(out / f"cost_quality_{suite}.svg", f"{suite}: accuracy against cost (Gemma price x{ratio:g})",
        {**{f"cascade by {st} (least sure q deferred)": [(p["cost"], p["acc"]) for p in curve]
            for st, curve in curves.items()},
         "random mix": [(p["cost"], p["acc"]) for p in random_pts],
         "always SmolLM2": [(s["cost_weak"], weak)], "always Gemma": [(s["cost_strong"], strong)],
         **({"perfect signal (bound)": [(oracle["cost"], oracle["acc"])]} if oracle else {}),
         **({"live cascade, held out": [(live["cost"], live["acc"])]} if held else {})})
    return lines


def run_suite(binary: Path, server: Server, suite: str, count: int | None, work: Path, ratio: float) -> dict:
    items = [json.loads(l) for l in (ROOT / "evals" / f"{suite}.jsonl").read_text().splitlines() if l.strip()]
    items = items[:count] if count else items
    print(f"{suite}: {len(items)} items", file=sys.stderr)
    rows = collect(server, items)
    result = {"rows": rows}
    calibration_rows, held_rows = rows[0::2], rows[1::2]
    if single(calibration_rows, ratio)["strong"] > single(calibration_rows, ratio)["weak"]:
        cal = calibrate(binary, calibration_rows, work, server.policy)
        if cal is not None:
            server.wait_for_policy(cal["statistic"], cal["min_confidence"], items[1]["prompt"])
            live = live_cascade(server, items[1::2], held_rows, ratio)
            result["held_out"] = {"n": len(held_rows), "single": single(held_rows, ratio),
                                  "calibration": {k: cal[k] for k in ("statistic", "min_confidence", "deferred_share",
                                                                      "n", "by_statistic")},
                                  "live": live}
        server.policy.write_text(policy("p10", -1000.0))
        server.wait_for_policy("p10", -1000.0, items[0]["prompt"])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", action="append", help=f"generation suite name (default: {', '.join(SUITES)})")
    parser.add_argument("--count", type=int, help="first N items of each suite")
    parser.add_argument("--price-ratio", type=float, default=2.0, help="Gemma's price per token over SmolLM2's")
    parser.add_argument("--out", type=Path, default=ROOT / "benches" / "results")
    parser.add_argument("--from-json", action="store_true",
                        help="report from the answers a previous run saved under --out, without a server")
    parser.add_argument("--bin", type=Path, default=Path(os.environ.get("SWITCHYARD_BIN", ROOT / "target/release/switchyard")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    suites = args.suite or SUITES
    load = os.getloadavg()[0]
    lines = []
    if args.from_json:
        for suite in suites:
            result = json.loads((args.out / f"cost_quality_{suite}.json").read_text())
            if result["rows"] and "stats" not in result["rows"][0]:
                sys.exit(f"cost_quality_{suite}.json predates the engine's margins "
                         "(x-switchyard-confidence): run the benchmark again")
            lines += report(suite, result, args.out, args.price_ratio)
        print("\n".join(lines))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="cost-quality-"))
    server = Server(args.bin, tmp)
    started = time.time()
    try:
        for suite in suites:
            t = time.time()
            result = run_suite(args.bin, server, suite, args.count, tmp, args.price_ratio)
            (args.out / f"cost_quality_{suite}.json").write_text(json.dumps(result, indent=1))
            lines += report(suite, result, args.out, args.price_ratio)
            print(f"  {time.time() - t:.0f} s", file=sys.stderr)
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    load = max(load, os.getloadavg()[0])
    lines.append(f"Run time {time.time() - started:.0f} s, load average up to {load:.1f}"
                 + (" (under load: the time is not a clean figure; accuracy does not depend on it)." if load > 2 else "."))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
