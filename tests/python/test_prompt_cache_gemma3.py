"""Prompt caching of a sliding-window checkpoint end to end: the real
Gemma 3 270M (five local layers of window 512 per global one) behind the
real binary, driven by the official `openai` client.

A ~1,500-token shared system prompt, then different user turns: every
greedy answer equals the same server's with `--no-prompt-cache`, and every
request after the first reports `usage.prompt_tokens_details.cached_tokens`
> 0: the global layers' blocks and a copy of the local layers' rings where
the first prompt ended (docs/SLIDING_WINDOW_PROMPT_CACHE.md). The warm time
to first token is measured in `benches/prompt_cache.py --model gemma3`.
"""

from __future__ import annotations

import pytest
from serve_process import free_port, running_server
from test_prompt_cache import SYSTEM, client_for

QUESTIONS = ["What is rule 3?", "Who reviews the gamma reports?", "Say hello."]
MAX_TOKENS = 12


def serve(bin_path, model, port, *extra):
    return [str(bin_path), "serve", "--model", str(model), "--model-name", "gemma3",
            "--listen", f"127.0.0.1:{port}", "--drain-seconds", "5", "--threads", "2", *extra]


def chat(client, question: str):
    reply = client.chat.completions.create(
        model="gemma3", max_tokens=MAX_TOKENS, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    return reply.choices[0].message.content, reply.usage


@pytest.fixture(scope="module")
def uncached(switchyard_bin, gemma3_path) -> dict:
    port = free_port()
    with running_server(serve(switchyard_bin, gemma3_path, port, "--no-prompt-cache"), port):
        client = client_for(port)
        return {q: chat(client, q) for q in QUESTIONS}


def test_gemma3_warm_requests_reuse_the_cache_and_answer_as_cold_ones(switchyard_bin, gemma3_path,
                                                                        uncached):
    prompt_tokens = uncached[QUESTIONS[0]][1].prompt_tokens
    assert 1200 <= prompt_tokens <= 1900, prompt_tokens
    for q, (_, usage) in uncached.items():
        assert usage.prompt_tokens_details.cached_tokens == 0, q
    port = free_port()
    with running_server(serve(switchyard_bin, gemma3_path, port), port):
        client = client_for(port)
        text, usage = chat(client, QUESTIONS[0])
        assert usage.prompt_tokens_details.cached_tokens == 0
        assert text == uncached[QUESTIONS[0]][0]
        for q in QUESTIONS:
            text, usage = chat(client, q)
            assert text == uncached[q][0], q
            cached = usage.prompt_tokens_details.cached_tokens
            # The shared system prompt in whole units of 32, never the last token.
            assert cached % 32 == 0 and prompt_tokens - 96 <= cached < usage.prompt_tokens, (q, cached)
