#!/usr/bin/env python3
"""Cost against quality: the cascade and routing against each single model.

Serves SmolLM2-135M Q4_1 (cheap, `smol`) and Gemma 3 270M Q4_K_M (strong,
`gemma`) from one `switchyard serve` with a `[cascade]` policy whose
threshold accepts everything, and for every item of the shipped generation
suites asks

- `model: "auto"`: SmolLM2's answer and the engine's confidence in it
  (`x-switchyard-cascade`: the 10% quantile of its token log-probabilities);
- `model: "gemma"`: Gemma's answer.

Both are scored by exact match after the normalization of docs/EVALS.md.
The cascade at threshold t answers with SmolLM2 when its confidence is at
least t and with Gemma otherwise: the verdict the server makes (same
greedy answers, same number), so a sweep over t gives the cascade's whole
curve from one pass. `--live T` also runs the real cascade at threshold T
and reports its accuracy beside the sweep's prediction.

Routers compared, as RouteLLM (Ong et al. 2024) does: always-cheap,
always-strong, random mix (a fraction p of requests to Gemma), declared
quality (the policy's typed figures pick one model for everything),
measured quality (the suite's measured accuracy picks one model per suite)
and the cascade. Metrics:

- PGR(router) = (acc - acc_cheap) / (acc_strong - acc_cheap);
- APGR: the area under PGR against the share of calls to the strong model
  (0..1), the router's curve made monotone as RouteLLM does;
- CPT(95%): the smallest share of strong calls with PGR >= 0.95;
- cost: generated and prompt tokens priced per model (Gemma 2x SmolLM2,
  their parameter ratio); the cascade pays SmolLM2 for every request and
  Gemma for the deferred ones.

Output: a table (stdout, Markdown) and an SVG plot (accuracy against cost)
per suite. Usage:

    python3 benches/cost_quality.py [--suite geo-gen --suite arith-gen] [--count N]
        [--live -1.5] [--out benches/results]

Speed figures are not measured here; on a loaded machine only the run time
grows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
PRICE = {"smol": 1.0, "gemma": 2.0}  # per 1k tokens, prompt and output alike
DECLARED = {"smol": 0.4, "gemma": 0.6}  # what a policy author would type (bigger is better)
MAX_TOKENS = 8
CONFIDENCE = re.compile(r"p10 (-?\d+\.\d+|-?inf|NaN) ")


def fetch(script: str) -> Path:
    out = subprocess.run([str(ROOT / "scripts" / script)], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def normalize(text: str) -> str:
    """docs/EVALS.md: first line after leading whitespace, trimmed, spaces folded,
    lowercased, one trailing `.` removed."""
    text = text.lstrip().split("\n", 1)[0]
    text = " ".join(text.split()).lower()
    return text[:-1] if text.endswith(".") else text


def policy(min_confidence: float) -> str:
    models = ""
    for name in ("smol", "gemma"):
        models += (f'[[models]]\nname = "{name}"\nversion = "1"\n'
                   f"cost_per_1k_input = {PRICE[name] / 1000}\ncost_per_1k_output = {PRICE[name] / 1000}\n"
                   f"quality = {DECLARED[name]}\ncontext_limit = 2048\n\n")
    return (f"[routing]\nallow_anonymous = true\n\n{models}"
            f'[cascade]\nmodels = ["smol", "gemma"]\nconfidence = "p10"\nmin_confidence = {min_confidence!r}\n')


class Server:
    def __init__(self, binary: Path, tmp: Path, min_confidence: float):
        self.policy = tmp / "policy.toml"
        self.policy.write_text(policy(min_confidence))
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

    def complete(self, model: str, prompt: str) -> tuple[str, dict, dict]:
        body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stop": ["\n"]}
        request = urllib.request.Request(self.base + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as r:
            headers = {k.lower(): v for k, v in r.headers.items()}
            reply = json.load(r)
        return reply["choices"][0]["text"], reply["usage"], headers

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def cost(model: str, usage: dict) -> float:
    return PRICE[model] * (usage["prompt_tokens"] + usage["completion_tokens"]) / 1000


def confidence_of(headers: dict) -> float:
    m = CONFIDENCE.search(headers.get("x-switchyard-cascade", ""))
    return float(m.group(1)) if m else float("-inf")


def collect(server: Server, items: list[dict]) -> list[dict]:
    rows = []
    for i, item in enumerate(items):
        smol_text, smol_usage, headers = server.complete("auto", item["prompt"])
        assert headers["x-switchyard-model"] == "smol", headers
        gemma_text, gemma_usage, _ = server.complete("gemma", item["prompt"])
        answer = normalize(item["answer"])
        rows.append({
            "smol": normalize(smol_text) == answer, "gemma": normalize(gemma_text) == answer,
            "confidence": confidence_of(headers),
            "cost_smol": cost("smol", smol_usage), "cost_gemma": cost("gemma", gemma_usage),
        })
        if (i + 1) % 25 == 0:
            print(f"  {i + 1}/{len(items)}", file=sys.stderr)
    return rows


def cascade_point(rows: list[dict], threshold: float) -> dict:
    deferred = [r["confidence"] < threshold for r in rows]
    n = len(rows)
    correct = sum(r["gemma"] if d else r["smol"] for r, d in zip(rows, deferred))
    spend = sum(r["cost_smol"] + (r["cost_gemma"] if d else 0.0) for r, d in zip(rows, deferred))
    return {"threshold": threshold, "strong_share": sum(deferred) / n, "acc": correct / n, "cost": spend / n}


def cascade_curve(rows: list[dict]) -> list[dict]:
    levels = sorted({r["confidence"] for r in rows})
    thresholds = [float("-inf")] + [x + 1e-9 for x in levels]
    return [cascade_point(rows, t) for t in thresholds]


def pgr(acc: float, weak: float, strong: float) -> float:
    return (acc - weak) / (strong - weak) if strong != weak else float("nan")


def apgr_and_cpt(curve: list[tuple[float, float]], target: float = 0.95) -> tuple[float, float | None]:
    """curve: (strong share, PGR) points. As RouteLLM: the best PGR reachable at or below
    each share (a router can always call the strong model less), integrated over 0..1."""
    points = sorted(curve)
    grid = [i / 1000 for i in range(1001)]
    best = []
    for x in grid:
        reachable = [p for s, p in points if s <= x + 1e-12]
        best.append(max(reachable) if reachable else 0.0)
    apgr = sum((a + b) / 2 for a, b in zip(best, best[1:])) / (len(grid) - 1)
    cpt = next((x for x, p in zip(grid, best) if p >= target), None)
    return apgr, cpt


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
        for x, y in pts if len(pts) <= 3 else pts[:: max(1, len(pts) // 12)]:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{c}"/>')
        out.append(f'<text x="{w - m - 150}" y="{m + 15 * k}" fill="{c}">{name}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def report(suite: str, rows: list[dict], out: Path, rng: random.Random) -> list[str]:
    n = len(rows)
    weak = sum(r["smol"] for r in rows) / n
    strong = sum(r["gemma"] for r in rows) / n
    cost_weak = sum(r["cost_smol"] for r in rows) / n
    cost_strong = sum(r["cost_gemma"] for r in rows) / n
    curve = cascade_curve(rows)
    random_pts = []
    for p in [i / 10 for i in range(11)]:
        picks = [rng.random() < p for _ in rows]
        acc = sum(r["gemma"] if g else r["smol"] for r, g in zip(rows, picks)) / n
        spend = sum(r["cost_gemma"] if g else r["cost_smol"] for r, g in zip(rows, picks)) / n
        random_pts.append({"strong_share": sum(picks) / n, "acc": acc, "cost": spend})
    declared = "gemma" if DECLARED["gemma"] > DECLARED["smol"] else "smol"
    measured = "gemma" if strong > weak else "smol"
    single = {"smol": (weak, cost_weak, 0.0), "gemma": (strong, cost_strong, 1.0)}
    lines = [f"### `{suite}` ({n} items)", "",
             "| router | accuracy | cost / request | strong share | APGR | CPT(95%) |",
             "| --- | --- | --- | --- | --- | --- |"]

    def row(name, acc, spend, share, apgr="", cpt=""):
        lines.append(f"| {name} | {acc:.3f} | {spend:.4f} | {share:.2f} | {apgr} | {cpt} |")

    row("always SmolLM2 (cheap)", weak, cost_weak, 0.0)
    row("always Gemma (strong)", strong, cost_strong, 1.0)
    rp = [(p["strong_share"], pgr(p["acc"], weak, strong)) for p in random_pts]
    ra, rc = apgr_and_cpt(rp)
    row("random mix (p = 0.5)", random_pts[5]["acc"], random_pts[5]["cost"], random_pts[5]["strong_share"],
        f"{ra:.3f}", "-" if rc is None else f"{rc:.2f}")
    acc, spend, share = single[declared]
    row(f"declared quality (picks {declared})", acc, spend, share)
    acc, spend, share = single[measured]
    row(f"measured quality (picks {measured})", acc, spend, share)
    cp = [(p["strong_share"], pgr(p["acc"], weak, strong)) for p in curve]
    ca, cc = apgr_and_cpt(cp)
    # The cheapest cascade point at >= 95% of always-strong accuracy.
    good = [p for p in curve if p["acc"] >= 0.95 * strong]
    best = min(good, key=lambda p: p["cost"]) if good else max(curve, key=lambda p: p["acc"])
    row(f"cascade, p10 >= {best['threshold']:.2f}", best["acc"], best["cost"], best["strong_share"],
        f"{ca:.3f}", "-" if cc is None else f"{cc:.2f}")
    top = max(curve, key=lambda p: (p["acc"], -p["cost"]))
    row(f"cascade, most accurate (p10 >= {top['threshold']:.2f})", top["acc"], top["cost"], top["strong_share"])
    lines.append("")
    if strong < weak:
        lines.append("Here the larger, dearer Gemma is *less* accurate than SmolLM2: PGR, APGR and CPT "
                     "(defined for a strong model that is better) say little; read the accuracy and cost.")
    lines.append(f"Cascade at {best['acc'] / strong:.0%} of always-strong accuracy for "
                 f"{best['cost'] / cost_strong:.0%} of its cost ({best['strong_share']:.0%} deferred)."
                 if strong > 0 else "Gemma answers nothing right here.")
    lines.append("")
    svg(out / f"cost_quality_{suite}.svg", f"{suite}: accuracy against cost",
        {"cascade (threshold sweep)": [(p["cost"], p["acc"]) for p in curve],
         "random mix": [(p["cost"], p["acc"]) for p in random_pts],
         "always SmolLM2": [(cost_weak, weak)], "always Gemma": [(cost_strong, strong)]})
    (out / f"cost_quality_{suite}.json").write_text(json.dumps({"rows": rows, "cascade": curve}, indent=1))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", action="append", help="generation suite name (default: geo-gen, arith-gen)")
    parser.add_argument("--count", type=int, help="first N items of each suite")
    parser.add_argument("--live", type=float, help="also run the real cascade at this threshold")
    parser.add_argument("--out", type=Path, default=ROOT / "benches" / "results")
    parser.add_argument("--from-json", action="store_true",
                        help="report from the answers a previous run saved under --out, without a server")
    parser.add_argument("--bin", type=Path, default=Path(os.environ.get("SWITCHYARD_BIN", ROOT / "target/release/switchyard")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        rng, lines = random.Random(0), []
        for suite in args.suite or ["geo-gen", "arith-gen"]:
            rows = json.loads((args.out / f"cost_quality_{suite}.json").read_text())["rows"]
            lines += report(suite, rows, args.out, rng)
        print("\n".join(lines))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="cost-quality-"))
    server = Server(args.bin, tmp, -1000.0)
    rng = random.Random(0)
    lines = []
    try:
        for suite in args.suite or ["geo-gen", "arith-gen"]:
            items = [json.loads(l) for l in (ROOT / "evals" / f"{suite}.jsonl").read_text().splitlines() if l.strip()]
            items = items[: args.count] if args.count else items
            print(f"{suite}: {len(items)} items", file=sys.stderr)
            started = time.time()
            rows = collect(server, items)
            lines += report(suite, rows, args.out, rng)
            if args.live is not None:
                server.policy.write_text(policy(args.live))
                time.sleep(3)  # the policy watcher's interval, twice
                live = [server.complete("auto", item["prompt"]) for item in items]
                correct = sum(normalize(t) == normalize(i["answer"]) for (t, _, _), i in zip(live, items))
                deferred = sum(h["x-switchyard-cascade"].startswith("deferred") for _, _, h in live)
                predicted = cascade_point(rows, args.live)
                lines.append(f"Live cascade at p10 >= {args.live}: accuracy {correct / len(items):.3f}, "
                             f"{deferred / len(items):.0%} deferred (the sweep predicts "
                             f"{predicted['acc']:.3f}, {predicted['strong_share']:.0%}).\n")
                server.policy.write_text(policy(-1000.0))
                time.sleep(3)
            print(f"  {time.time() - started:.0f} s", file=sys.stderr)
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
