"""Joins criterion's estimates (Switchyard) with the peer's JSON lines into a Markdown table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

PROMPT_LENGTHS, GENERATED_TOKENS = (128, 512), 128


def criterion_tok_s(root: Path, group: str, threads: int, tokens: int) -> float:
    est = root / group / f"{threads}-threads" / "new" / "estimates.json"
    ns = json.loads(est.read_text())["median"]["point_estimate"]
    return tokens / (ns / 1e9)


def main():
    root, peer_file = Path(sys.argv[1]), Path(sys.argv[2])
    label = sys.argv[3] if len(sys.argv) > 3 else "smollm2-q4_1"
    peer = {p["threads"]: p for p in map(json.loads, peer_file.read_text().splitlines())}
    print("| threads | metric | Switchyard tok/s | llama.cpp tok/s | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for threads in (1, 2):
        rows = [(f"prompt ({n})", f"{label}_prompt{n}", n, f"prompt{n}_tok_s")
                for n in PROMPT_LENGTHS]
        rows.append((f"generate ({GENERATED_TOKENS})", f"{label}_generate",
                     GENERATED_TOKENS, "generate_tok_s"))
        for metric, group, tokens, key in rows:
            ours = criterion_tok_s(root, group, threads, tokens)
            theirs = peer[threads][key]
            print(f"| {threads} | {metric} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}× |")


if __name__ == "__main__":
    main()
