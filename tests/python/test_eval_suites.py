"""The shipped suites (`evals/`): what the generator writes, and the sentence suites.

- `python3 evals/generate.py --check`: every committed suite is what the generator
  writes from its seed and the Debian data it reads (tzdata, iso-codes);
- `country-sentence-gen` and `letter-sentence-gen` ask their short twins' questions
  (`country-gen`, `letter-gen`: the same items in the same order) and carry the twin's
  answer in their sentence;
- SmolLM2 (`switchyard eval`, greedy) answers the first items of each sentence suite in
  the taught form, so the suite scores the fact, not the form; and the eval's verdict on
  each item is the documented normalization applied here independently.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ITEMS = 8
TWINS = {"country-sentence-gen": "country-gen", "letter-sentence-gen": "letter-gen"}
# The words every answer of a sentence suite has before its fact.
FORM = {"country-sentence-gen": " is a city in ", "letter-sentence-gen": " starts with the letter "}


def load(name: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / "evals" / f"{name}.jsonl").read_text().splitlines()]


def normalize(text: str) -> str:
    """docs/EVALS.md: the first line after leading whitespace, trimmed, whitespace runs
    folded, lowercased, one trailing `.` removed."""
    text = " ".join(text.lstrip().split("\n", 1)[0].split()).lower()
    return text[:-1] if text.endswith(".") else text


def test_the_committed_suites_are_what_the_generator_writes():
    proc = subprocess.run([sys.executable, str(ROOT / "evals" / "generate.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("suite", sorted(TWINS))
def test_a_sentence_suite_asks_its_twins_questions(suite):
    items, twins = load(suite), load(TWINS[suite])
    assert len(items) == len(twins) >= 100
    for item, twin in zip(items, twins):
        question = lambda prompt: prompt.rsplit("Question: ", 1)[1]
        assert question(item["prompt"]) == question(twin["prompt"])
        assert item["answer"].endswith(f" {twin['answer']}."), (item, twin)
        # The shots teach the sentence: each shot's answer has the item's form.
        shots = item["prompt"].split("\n\n")[:-1]
        assert FORM[suite] in item["answer"] and shots
        assert all(FORM[suite] in shot.split("\nAnswer: ")[1] for shot in shots), shots


@pytest.fixture(scope="module")
def smol_answers(switchyard_bin, smollm2_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sentence-suites")
    args = [str(switchyard_bin), "eval", "--model", str(smollm2_path), "--json",
            "--per-item", str(tmp / "items.jsonl"), "--threads", "2"]
    for suite in sorted(TWINS):
        subset = tmp / f"{suite}.jsonl"
        subset.write_text("".join(json.dumps(item) + "\n" for item in load(suite)[:ITEMS]))
        args += ["--suite", str(subset)]
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    summaries = {s["suite"]: s for s in map(json.loads, proc.stdout.splitlines())}
    items = [json.loads(line) for line in (tmp / "items.jsonl").read_text().splitlines()]
    return summaries, items


@pytest.mark.parametrize("suite", sorted(TWINS))
def test_smollm2_answers_in_the_sentence_and_is_scored_as_documented(smol_answers, suite):
    summaries, items = smol_answers
    mine = [item for item in items if item["suite"] == suite]
    assert summaries[suite]["n"] == len(mine) == ITEMS
    for item in mine:
        said = normalize(item["output"])
        # The sentence up to the fact: `lusaka is a city in`, `the word "garden" starts
        # with the letter`.
        form = normalize(item["answer"]).split(FORM[suite])[0] + FORM[suite].rstrip()
        assert said.startswith(form), (said, item["answer"])
        assert item["correct"] == (said == normalize(item["answer"])), item
    assert summaries[suite]["acc"] == sum(item["correct"] for item in mine) / ITEMS
