#!/usr/bin/env python3
"""Sets a cascade's `min_confidence` from measured answers.

Asks a running server for the first (cheap) model's answer to every item of
a generation suite (`{"prompt", "answer"}` JSONL), greedy, with log-probabilities:
a completion of the prompt as written (`/v1/completions`, as the shipped
few-shot suites are), or with `--chat` the prompt as a chat message. Ask
as the cascade's clients will (the same endpoint and `--max-tokens`): the
confidence covers every generated token. Each answer is
scored by exact match after the normalization of docs/EVALS.md, and its
confidence computed from the returned token log-probabilities exactly as
the engine does (`TokenConfidence` in seam/src/confidence.rs: mean, min, or
the nearest-rank quantile).

The threshold chosen is the lowest one at which the answers the cascade
would keep (confidence >= threshold) are correct at least `--target` of
the time, with at least `--min-kept` of them: the most answers kept for
the accuracy asked. It is placed halfway to the next lower confidence seen,
so a rounding difference between the engine's figure and the client's does
not move an answer across it. The report gives, at that threshold, the
share deferred and the kept answers' accuracy with its 95% Wilson interval.

    scripts/calibrate-cascade.py --base http://127.0.0.1:8080 --model smollm2 \\
        --suite evals/geo-gen.jsonl --target 0.8 [--statistic p10] [--count N] \\
        [--max-tokens 8] [--chat] [--policy policy.toml] [--json]

`--policy FILE` writes the threshold (and the statistic) into the file's
`[cascade]` table; a server watching the file picks it up without a
restart. Exit status 1 when no threshold reaches the target.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import urllib.request
from pathlib import Path

QUANTILES = {"p05": 0.05, "p10": 0.1, "p25": 0.25, "p50": 0.5}
STATISTICS = ["mean", "min", *QUANTILES]


def normalize(text: str) -> str:
    """docs/EVALS.md: first line after leading whitespace, trimmed, spaces folded,
    lowercased, one trailing `.` removed."""
    text = text.lstrip().split("\n", 1)[0]
    text = " ".join(text.split()).lower()
    return text[:-1] if text.endswith(".") else text


def statistic(name: str, logprobs: list[float]) -> float:
    """As the engine computes it; an answer without tokens has none (-inf: deferred)."""
    if not logprobs:
        return float("-inf")
    ordered = sorted(logprobs)
    if name == "mean":
        return sum(ordered) / len(ordered)
    if name == "min":
        return ordered[0]
    rank = max(1, math.ceil(QUANTILES[name] * len(ordered)))
    return ordered[rank - 1]


def wilson95(correct: int, n: int) -> list[float]:
    if n == 0:
        return [0.0, 1.0]
    z, p = 1.96, correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def ask(args, prompt: str) -> tuple[str, list[float]]:
    """The answer's text and its tokens' log-probabilities."""
    body = {"model": args.model, "max_tokens": args.max_tokens, "temperature": 0}
    if args.chat:
        body.update(logprobs=True, messages=[{"role": "user", "content": prompt}])
    else:
        body.update(logprobs=1, prompt=prompt)
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    path = "/v1/chat/completions" if args.chat else "/v1/completions"
    request = urllib.request.Request(args.base.rstrip("/") + path, data=json.dumps(body).encode(),
                                     headers=headers)
    with urllib.request.urlopen(request, timeout=600) as r:
        choice = json.load(r)["choices"][0]
    if args.chat:
        content = (choice.get("logprobs") or {}).get("content") or []
        return choice["message"]["content"] or "", [t["logprob"] for t in content]
    return choice["text"], list((choice.get("logprobs") or {}).get("token_logprobs") or [])


def measure(args) -> list[dict]:
    items = [json.loads(line) for line in Path(args.suite).read_text().splitlines() if line.strip()]
    items = [i for i in items if "prompt" in i][: args.count or None]
    if not items:
        sys.exit(f"{args.suite}: no generation items ({{\"prompt\", \"answer\"}} lines)")
    rows = []
    for item in items:
        text, logprobs = ask(args, item["prompt"])
        rows.append({"correct": normalize(text) == normalize(str(item["answer"])),
                     "confidence": statistic(args.statistic, logprobs)})
    return rows


def calibrate(rows: list[dict], target: float, min_kept: int) -> dict | None:
    """The lowest threshold whose kept answers reach `target`, or None."""
    ordered = sorted(rows, key=lambda r: r["confidence"], reverse=True)
    best = None
    correct = 0
    for kept, row in enumerate(ordered, start=1):
        correct += row["correct"]
        # Ties are kept or deferred together: decide only after the last of a level.
        if kept < len(ordered) and ordered[kept]["confidence"] == row["confidence"]:
            continue
        if kept >= min_kept and correct / kept >= target and math.isfinite(row["confidence"]):
            lower = ordered[kept]["confidence"] if kept < len(ordered) else row["confidence"] - 0.02
            lower = lower if math.isfinite(lower) else row["confidence"] - 0.02
            best = {"min_confidence": round((row["confidence"] + lower) / 2, 4), "kept": kept,
                    "kept_correct": correct}
    if best is None:
        return None
    n = len(rows)
    return {**best, "n": n, "deferred_share": (n - best["kept"]) / n,
            "kept_acc": best["kept_correct"] / best["kept"],
            "kept_ci95": wilson95(best["kept_correct"], best["kept"]),
            "overall_acc": sum(r["correct"] for r in rows) / n}


def write_policy(path: Path, statistic_name: str, threshold: float) -> None:
    """Sets `confidence` and `min_confidence` in the `[cascade]` table of `path`."""
    text = path.read_text()
    table = re.search(r"(?ms)^\[cascade\][ \t]*\n.*?(?=^\[|\Z)", text)
    if not table:
        sys.exit(f"{path}: no [cascade] table to set min_confidence in")
    body = table.group(0)
    body = re.sub(r"(?m)^(min_confidence|confidence)\s*=.*\n?", "", body).rstrip("\n")
    body += f'\nconfidence = "{statistic_name}"\nmin_confidence = {threshold!r}\n'
    rest = text[table.end():]
    path.write_text(text[: table.start()] + body + ("\n" + rest if rest.strip() else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the server, e.g. http://127.0.0.1:8080")
    parser.add_argument("--model", required=True, help="the cascade's first model, as a request names it")
    parser.add_argument("--suite", required=True, help="a generation suite (JSONL)")
    parser.add_argument("--target", type=float, required=True, help="accuracy the kept answers must reach (0..1)")
    parser.add_argument("--statistic", default="p10", choices=STATISTICS)
    parser.add_argument("--count", type=int, default=0, help="first N items only")
    parser.add_argument("--max-tokens", type=int, default=8,
                        help="as the cascade's requests will ask (the confidence covers every token)")
    parser.add_argument("--chat", action="store_true",
                        help="send each prompt as a chat message (default: a completion of the prompt as is)")
    parser.add_argument("--min-kept", type=int, default=5, help="fewest kept answers a threshold may rest on")
    parser.add_argument("--api-key", help="a tenant key, when the policy needs one")
    parser.add_argument("--policy", type=Path, help="write the threshold into this policy's [cascade]")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not 0.0 < args.target <= 1.0:
        sys.exit("--target must be in (0, 1]")
    rows = measure(args)
    result = calibrate(rows, args.target, args.min_kept)
    report = {"model": args.model, "suite": args.suite, "statistic": args.statistic, "target": args.target,
              "items": rows, **(result or {"n": len(rows), "min_confidence": None})}
    if args.json:
        print(json.dumps(report))
    if result is None:
        print(f"no threshold keeps {args.min_kept}+ answers at accuracy >= {args.target} "
              f"(overall {sum(r['correct'] for r in rows)}/{len(rows)})", file=sys.stderr)
        return 1
    if not args.json:
        print(f"{args.statistic} min_confidence = {result['min_confidence']}: keeps {result['kept']} of "
              f"{result['n']} answers (defers {result['deferred_share']:.0%}), kept accuracy "
              f"{result['kept_acc']:.3f} [{result['kept_ci95'][0]:.3f}, {result['kept_ci95'][1]:.3f}] "
              f"against {result['overall_acc']:.3f} for all")
    if args.policy:
        write_policy(args.policy, args.statistic, result["min_confidence"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
