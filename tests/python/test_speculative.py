"""Speculative decoding (n-gram drafts verified in one forward pass) changes
speed, never output: the real binary and both real models.

- `generate`: greedy output with `--speculate ngram` (the default) equals
  `--speculate off` on the reference prompts of scripts/compare-greedy.sh
  and on copy-heavy prompts, for SmolLM2 and Gemma 3 (a sliding-window
  model: rejected drafts are written into its rings and rolled back), and
  on the copy-heavy prompts most drafts are kept;
- `serve`: two servers, speculation on and off, answer alike: greedy,
  seeded sampling (the sampler draws once per emitted token either way),
  penalties and logit bias, log-probabilities, structured output (the
  grammar only ever sees emitted tokens), several clients at once;
- the drafted/accepted counters and the acceptance rate are exported;
- a draft checkpoint (`--draft-model`, `--speculate draft`): SmolLM2
  drafting for itself (real weights; the drafts are nearly all kept) gives
  the same answers to every request above, in `generate` and `serve`;
  `--speculate draft` without a draft model is refused at startup. A pairing
  of different weights (many drafts refused) is
  `engine/tests/draft_model.rs`.

Speed is measured in `benches/speculative.py`, not here.
SWITCHYARD_SPECULATIVE_LONG=1 adds chat-template runs of the reference
prompts and the code edit to the `generate` comparison.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from serve_process import free_port, running_server

REFERENCE = ["The capital of France is", "Write a haiku about the sea.", "def fibonacci(n):"]
QUOTE = ("The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor "
         "jugs. How vexingly quick daft zebras jump! The five boxing wizards jump quickly. "
         "Sphinx of black quartz, judge my vow.")
CODE = '''def total(items):
    result = 0
    for item in items:
        if item.price > 0:
            result = result + item.price * item.count
    return result
'''
COPY_HEAVY = [
    f"Repeat the following text exactly, word for word.\n\n{QUOTE}",
    f"Rename the variable `result` to `amount` in this function and show the whole function.\n\n{CODE}",
]
MAX_TOKENS = 48


def generate(bin_path: Path, model: Path, prompt: str, speculate: str, *extra: str):
    proc = subprocess.run(
        [str(bin_path), "generate", "--model", str(model), "--prompt", prompt, "--temperature", "0",
         "--max-tokens", str(MAX_TOKENS), "--threads", "2", "--speculate", speculate, *extra],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


def accepted_share(stderr: str) -> float:
    found = re.search(r"speculation: (\d+) of (\d+) drafted tokens accepted", stderr)
    return int(found.group(1)) / int(found.group(2)) if found else 0.0


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_generate_greedy_output_is_the_same_with_speculation(switchyard_bin, smollm2_path,
                                                             gemma3_path, model):
    path = smollm2_path if model == "smollm2" else gemma3_path
    runs = [(p, ["--kv-type", "q8_0"]) for p in REFERENCE] + [(COPY_HEAVY[0], ["--chat"])]
    if os.environ.get("SWITCHYARD_SPECULATIVE_LONG"):
        runs += [(p, ["--chat"]) for p in REFERENCE + COPY_HEAVY[1:]]
    for prompt, mode in runs:
        plain, _ = generate(switchyard_bin, path, prompt, "off", *mode)
        fast, stderr = generate(switchyard_bin, path, prompt, "ngram", *mode)
        assert fast == plain, (model, prompt, mode)
        if prompt == COPY_HEAVY[0]:
            assert accepted_share(stderr) > 0.5, (model, prompt, stderr)
        elif prompt in COPY_HEAVY:
            # The small models rewrite the code rather than edit it: fewer kept.
            assert accepted_share(stderr) > 0, (model, prompt, stderr)


def serve_args(bin_path: Path, model: Path, port: int, speculate: str,
               *extra: str) -> list[str]:
    return [str(bin_path), "serve", "--model", str(model), "--model-name", "smollm2",
            "--listen", f"127.0.0.1:{port}", "--drain-seconds", "5", "--threads", "2",
            "--speculate", speculate, *extra]


def client_for(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                         max_retries=0, timeout=300)


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["sentences"],
          "properties": {"sentences": {"type": "array", "items": {"type": "string"},
                                       "maxItems": 5}}}


def requests() -> list[tuple[str, dict]]:
    """Requests whose answers must not depend on speculation: (name, create kwargs)."""
    quote = [{"role": "user", "content": COPY_HEAVY[0]}]
    code = [{"role": "user", "content": COPY_HEAVY[1]}]
    free = [{"role": "user", "content": "Tell me about your favourite season."}]
    return [
        ("greedy quote", dict(messages=quote, temperature=0)),
        ("greedy code", dict(messages=code, temperature=0)),
        ("greedy free", dict(messages=free, temperature=0)),
        ("seeded quote", dict(messages=quote, temperature=0.8, top_p=0.95, seed=7)),
        ("seeded code", dict(messages=code, temperature=1.0, seed=11)),
        ("penalties", dict(messages=quote, temperature=0.7, seed=3, frequency_penalty=0.4,
                           presence_penalty=0.3, logit_bias={"13": -2.0})),
        ("logprobs", dict(messages=quote, temperature=0, logprobs=True, top_logprobs=3)),
        ("structured", dict(messages=[{"role": "user", "content":
                                       f"List the sentences of this text as JSON.\n\n{QUOTE}"}],
                            temperature=0,
                            response_format={"type": "json_schema", "json_schema": {
                                "name": "sentences", "strict": True, "schema": SCHEMA}})),
        ("structured seeded", dict(messages=[{"role": "user", "content":
                                              f"List the sentences of this text as JSON.\n\n{QUOTE}"}],
                                   temperature=1.0, seed=5,
                                   response_format={"type": "json_object"})),
    ]


def answer(client, kwargs: dict):
    reply = client.chat.completions.create(model="smollm2", max_tokens=MAX_TOKENS * 2, **kwargs)
    choice = reply.choices[0]
    logprobs = None
    if choice.logprobs and choice.logprobs.content:
        logprobs = [(t.token, round(t.logprob, 3), [a.token for a in t.top_logprobs])
                    for t in choice.logprobs.content]
    return choice.message.content, choice.finish_reason, reply.usage.completion_tokens, logprobs


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in
               re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE))


@pytest.fixture(scope="module")
def plain_answers(switchyard_bin, smollm2_path) -> dict:
    port = free_port()
    with running_server(serve_args(switchyard_bin, smollm2_path, port, "off"), port):
        client = client_for(port)
        answers = {name: answer(client, kwargs) for name, kwargs in requests()}
        exported = metrics(port)
    assert metric(exported, "switchyard_speculative_draft_tokens_total") == 0
    return answers


@pytest.fixture(scope="module")
def speculating(switchyard_bin, smollm2_path):
    port = free_port()
    with running_server(serve_args(switchyard_bin, smollm2_path, port, "ngram"), port):
        yield port


def test_served_answers_are_the_same_with_speculation(plain_answers, speculating):
    client = client_for(speculating)
    for name, kwargs in requests():
        assert answer(client, kwargs) == plain_answers[name], name
    # The structured answers still follow their format.
    text = plain_answers["structured"][0]
    assert isinstance(json.loads(text)["sentences"], list), text
    exported = metrics(speculating)
    drafted = metric(exported, "switchyard_speculative_draft_tokens_total")
    accepted = metric(exported, "switchyard_speculative_accepted_tokens_total")
    assert drafted > 0 and 0 < accepted <= drafted, exported
    rate = metric(exported, "switchyard_speculative_acceptance_rate")
    assert rate == pytest.approx(accepted / drafted, abs=1e-6)


def test_answers_under_concurrency_are_the_same(plain_answers, speculating):
    """Four clients at once: the executor stops drafting while more than
    two sequences decode and starts again as they end; answers stay equal."""
    client = client_for(speculating)
    chosen = [(n, k) for n, k in requests() if n.startswith(("greedy", "seeded"))]
    with ThreadPoolExecutor(len(chosen)) as pool:
        got = list(pool.map(lambda nk: (nk[0], answer(client, nk[1])), chosen))
    for name, result in got:
        assert result == plain_answers[name], name


def test_generate_with_a_draft_model_gives_the_plain_output(switchyard_bin, smollm2_path):
    prompt = REFERENCE[1]
    plain, _ = generate(switchyard_bin, smollm2_path, prompt, "off", "--chat")
    fast, stderr = generate(switchyard_bin, smollm2_path, prompt, "draft", "--chat",
                            "--draft-model", str(smollm2_path))
    assert fast == plain
    # The model drafting for itself: its drafts are its own greedy tokens.
    assert accepted_share(stderr) > 0.8, stderr


def test_speculate_draft_without_a_draft_model_is_refused(switchyard_bin, smollm2_path):
    proc = subprocess.run(serve_args(switchyard_bin, smollm2_path, free_port(), "draft"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "--speculate draft needs a --draft-model" in proc.stderr, proc.stderr


def test_served_answers_are_the_same_with_a_draft_model(switchyard_bin, smollm2_path,
                                                       plain_answers):
    port = free_port()
    args = serve_args(switchyard_bin, smollm2_path, port, "draft",
                      "--draft-model", str(smollm2_path))
    with running_server(args, port):
        client = client_for(port)
        for name, kwargs in requests():
            assert answer(client, kwargs) == plain_answers[name], name
        exported = metrics(port)
    drafted = metric(exported, "switchyard_speculative_draft_tokens_total")
    accepted = metric(exported, "switchyard_speculative_accepted_tokens_total")
    # Greedy requests keep nearly every draft; sampled ones fewer.
    assert drafted > 0 and accepted > 0.5 * drafted, exported
