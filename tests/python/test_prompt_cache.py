"""Prompt caching end to end: the real binary and SmolLM2, driven by the
official `openai` client.

- a ~1,500-token shared system prompt, then different user turns: greedy
  answers equal those of the same server with `--no-prompt-cache`, whole
  and streamed, chat and completions, and `usage.prompt_tokens_details.
  cached_tokens` says how much of the prompt the cache supplied;
- the hit/miss/eviction metrics are exported;
- a KV budget too small for a new prompt and the cached one together
  evicts the cached blocks instead of refusing or stalling the request;
- cached blocks never serve another version's weights, and go when their
  version unloads.

The time-to-first-token gain is measured in `benches/prompt_cache.py`, not
here (a timed assertion would be flaky on a shared machine).
"""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from serve_process import free_port, running_server

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
# About 1,500 SmolLM2 tokens (checked below through usage).
SYSTEM = " ".join(
    f"Rule {i}: the {WORDS[i % 12]} team reviews {WORDS[(i * 7) % 12]} reports every {i % 5 + 1} days."
    for i in range(88)
)
QUESTIONS = ["What is rule 3?", "Who reviews the gamma reports?", "Say hello.", "Which rule mentions kappa?"]
MAX_TOKENS = 16
ADMIN_TOKEN = "prompt-cache-test-admin-token"


def serve_args(bin_path: Path, model: Path, port: int, *extra: str) -> list[str]:
    return [str(bin_path), "serve", "--model", str(model), "--model-name", "smollm2",
            "--listen", f"127.0.0.1:{port}", "--drain-seconds", "5", *extra]


def client_for(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)


def chat(client, question: str, model: str = "smollm2"):
    reply = client.chat.completions.create(
        model=model, max_tokens=MAX_TOKENS, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    return reply.choices[0].message.content, reply.usage


def chat_streamed(client, question: str):
    stream = client.chat.completions.create(
        model="smollm2", max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    return text, usage


def complete(client, question: str):
    reply = client.completions.create(model="smollm2", prompt=f"{SYSTEM}\nQuestion: {question}\nAnswer:",
                                      max_tokens=MAX_TOKENS, temperature=0)
    return reply.choices[0].text, reply.usage


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def metric(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}(\{{[^}}]*{re.escape(labels)}[^}}]*\}})? (\S+)$"
    found = [float(m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)]
    return sum(found)


@pytest.fixture(scope="module")
def uncached(switchyard_bin, smollm2_path) -> dict:
    """Every answer from a server with the prompt cache off."""
    port = free_port()
    with running_server(serve_args(switchyard_bin, smollm2_path, port, "--no-prompt-cache"), port):
        client = client_for(port)
        answers = {}
        for q in QUESTIONS:
            answers[("chat", q)] = chat(client, q)
            answers[("completion", q)] = complete(client, q)
        return answers


def test_cached_prompts_answer_as_uncached_and_say_how_much_was_cached(
        switchyard_bin, smollm2_path, uncached):
    for (_, q), (_, usage) in uncached.items():
        assert usage.prompt_tokens_details.cached_tokens == 0, q
    prompt_tokens = uncached[("chat", QUESTIONS[0])][1].prompt_tokens
    assert 1400 <= prompt_tokens <= 1700, prompt_tokens
    port = free_port()
    with running_server(serve_args(switchyard_bin, smollm2_path, port), port):
        client = client_for(port)
        # The first request computes the whole prompt and leaves its blocks.
        text, usage = chat(client, QUESTIONS[0])
        assert usage.prompt_tokens_details.cached_tokens == 0
        assert text == uncached[("chat", QUESTIONS[0])][0]
        for q in QUESTIONS:
            text, usage = chat(client, q)
            assert text == uncached[("chat", q)][0], q
            cached = usage.prompt_tokens_details.cached_tokens
            # The shared part in whole key blocks of 32 (the first 1,024
            # positions shared, the rest copied from the first prompt's
            # tail), never the last token.
            assert cached % 32 == 0 and prompt_tokens - 64 <= cached < usage.prompt_tokens, (q, cached)
            text, usage = chat_streamed(client, q)
            assert text == uncached[("chat", q)][0], q
            # The same question again: its own full blocks are cached now too.
            assert usage.prompt_tokens_details.cached_tokens >= cached, q
        complete(client, QUESTIONS[0])
        for q in QUESTIONS:
            text, usage = complete(client, q)
            assert text == uncached[("completion", q)][0], q
            assert usage.prompt_tokens_details.cached_tokens >= prompt_tokens - 96, q

        exported = metrics(port)
        hits = metric(exported, "switchyard_prompt_cache_tokens_total", 'result="hit"')
        misses = metric(exported, "switchyard_prompt_cache_tokens_total", 'result="miss"')
        assert hits >= 8 * (prompt_tokens - 64), exported
        assert misses >= 2 * prompt_tokens, exported
        # The chat and completion prompts' first blocks, then a tail per
        # prompt that went on differently.
        assert metric(exported, "switchyard_prompt_cache_blocks") >= 2 + len(QUESTIONS)
        assert metric(exported, "switchyard_prompt_cache_bytes") > 0
        assert "switchyard_prompt_cache_evictions_total" in exported


def test_a_full_budget_evicts_cached_blocks_instead_of_refusing(switchyard_bin, smollm2_path, uncached):
    # SmolLM2's KV is ~23 KB a token in f16: with blocks of 32 positions one
    # ~1,550-token sequence reserves ~37 MB, so 56 MB holds one sequence and
    # part of a cached prompt.
    port = free_port()
    args = serve_args(switchyard_bin, smollm2_path, port, "--kv-budget-mb", "56", "--kv-block", "32")
    with running_server(args, port):
        client = client_for(port)
        chat(client, QUESTIONS[0])
        other = "Ignore the rules above. " * 3 + QUESTIONS[1]
        # Another system prompt: nothing cached matches, and its cache
        # needs the room the cached blocks hold.
        # max_tokens 200: a cache bigger than what the cached blocks leave free.
        reply = client.chat.completions.create(
            model="smollm2", max_tokens=200, temperature=0,
            messages=[{"role": "system", "content": SYSTEM.replace("Rule", "Law")},
                      {"role": "user", "content": other}])
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage.prompt_tokens_details.cached_tokens == 0
        assert metric(metrics(port), "switchyard_prompt_cache_evictions_total") > 0
        # And the first prompt still answers as uncached.
        assert chat(client, QUESTIONS[0])[0] == uncached[("chat", QUESTIONS[0])][0]


def test_cached_blocks_stay_with_their_weights_and_go_when_their_version_unloads(
        switchyard_bin, smollm2_path, tmp_path):
    repo = tmp_path / "repo"
    subprocess.run([str(switchyard_bin), "demo-repo", str(repo), "--base", str(smollm2_path)],
                   check=True, capture_output=True)
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--repo", str(repo), "--listen", f"127.0.0.1:{port}",
            "--admin-listen", f"127.0.0.1:{admin_port}", "--admin-token", ADMIN_TOKEN, "--drain-seconds", "5"]
    with running_server(args, port):
        client = client_for(port)
        _, usage = chat(client, QUESTIONS[0], model="smollm2@2")
        assert usage.prompt_tokens_details.cached_tokens == 0
        _, usage = chat(client, QUESTIONS[1], model="smollm2@2")
        # The shared ~1,500-token start: one block of 1,024 positions, then
        # whole key blocks of the first prompt's tail.
        cached = usage.prompt_tokens_details.cached_tokens
        assert cached % 32 == 0 and usage.prompt_tokens - 64 <= cached < usage.prompt_tokens, cached
        blocks = metric(metrics(port), "switchyard_prompt_cache_blocks")
        assert blocks > 0
        # smollm2@1 has other weights (Q4_1 against Q8_0): nothing shared.
        _, usage = chat(client, QUESTIONS[1], model="smollm2@1")
        assert usage.prompt_tokens_details.cached_tokens == 0
        assert metric(metrics(port), "switchyard_prompt_cache_blocks") > blocks
        request = urllib.request.Request(f"http://127.0.0.1:{admin_port}/admin/models/smollm2/versions/2/unload",
                                         method="POST", data=b"", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(request, timeout=60) as r:
            assert r.status == 200
        # The unloaded version's blocks go on the executor's time: polled, with a
        # deadline that only guards against a hang (a loaded machine can take seconds).
        deadline = time.time() + 120
        while metric(metrics(port), "switchyard_prompt_cache_blocks") > blocks and time.time() < deadline:
            time.sleep(0.1)
        # Only smollm2@1's blocks are left.
        left = metric(metrics(port), "switchyard_prompt_cache_blocks")
        assert left <= blocks + 1 and left > 0, (left, blocks)
        _, usage = chat(client, QUESTIONS[2], model="smollm2@1")
        assert usage.prompt_tokens_details.cached_tokens > 1000
