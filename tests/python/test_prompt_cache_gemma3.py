"""Prompt caching of a sliding-window checkpoint end to end: the real
Gemma 3 270M (five local layers of window 512 per global one) behind the
real binary, driven by the official `openai` client.

A ~1,500-token shared system prompt, then different user turns: every
greedy answer, and its log-probabilities (the chosen token's and the top
five at every step), equal the same server's with `--no-prompt-cache`, and
every request after the first reports
`usage.prompt_tokens_details.cached_tokens` > 0: the global layers' blocks
and a copy of the local layers' rings where the first prompt ended
(docs/SLIDING_WINDOW_PROMPT_CACHE.md). Run with f32 attention and with
`--attention-precision bf16-prompt`, whose prompt rows take BF16 on AMX
tiles in any chunk, the warm request's short tail included, and with
`bf16x3` (the same rows with split operands) (docs/ATTENTION_PRECISION.md). The warm time to first token is measured in
`benches/prompt_cache.py --model gemma3`.
"""

from __future__ import annotations

import functools
import os

import pytest
from serve_process import free_port, running_server
from test_prompt_cache import SYSTEM, client_for

QUESTIONS = ["What is rule 3?", "Who reviews the gamma reports?", "Say hello."]
MAX_TOKENS = 12
PRECISIONS = ["f32", "bf16-prompt", "bf16x3"]


def serve(bin_path, model, port, precision, *extra):
    return [str(bin_path), "serve", "--model", str(model), "--model-name", "gemma3",
            "--listen", f"127.0.0.1:{port}", "--drain-seconds", "5", "--threads", "2",
            "--attention-precision", precision, *extra]


def chat(client, question: str):
    """The answer, its usage, and per step the chosen token's
    log-probability with the top five."""
    reply = client.chat.completions.create(
        model="gemma3", max_tokens=MAX_TOKENS, temperature=0, logprobs=True, top_logprobs=5,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    choice = reply.choices[0]
    steps = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
             for t in choice.logprobs.content]
    return choice.message.content, reply.usage, steps


@functools.cache
def cold(bin_path, model, precision: str) -> dict:
    """Every question's answer from a server without a prompt cache."""
    port = free_port()
    with running_server(serve(bin_path, model, port, precision, "--no-prompt-cache"), port):
        client = client_for(port)
        return {q: chat(client, q) for q in QUESTIONS}


def amx_host() -> bool:
    """Whether the server's BF16 prompt rows take AMX tiles here."""
    if os.environ.get("SWITCHYARD_AMX", "").strip() == "0":
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return " amx_bf16" in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("precision", PRECISIONS)
def test_gemma3_warm_requests_reuse_the_cache_and_answer_as_cold_ones(switchyard_bin, gemma3_path,
                                                                        precision):
    uncached = cold(switchyard_bin, gemma3_path, precision)
    prompt_tokens = uncached[QUESTIONS[0]][1].prompt_tokens
    assert 1200 <= prompt_tokens <= 1900, prompt_tokens
    for q, (_, usage, steps) in uncached.items():
        assert usage.prompt_tokens_details.cached_tokens == 0, q
        assert len(steps) > 0, q
    port = free_port()
    with running_server(serve(switchyard_bin, gemma3_path, port, precision), port):
        client = client_for(port)
        text, usage, steps = chat(client, QUESTIONS[0])
        assert usage.prompt_tokens_details.cached_tokens == 0
        assert (text, steps) == (uncached[QUESTIONS[0]][0], uncached[QUESTIONS[0]][2])
        for q in QUESTIONS:
            text, usage, steps = chat(client, q)
            assert text == uncached[q][0], q
            # Bit for bit: the same log-probabilities at every step.
            assert steps == uncached[q][2], q
            cached = usage.prompt_tokens_details.cached_tokens
            # The shared system prompt in whole units of 32, never the last token.
            assert cached % 32 == 0 and prompt_tokens - 96 <= cached < usage.prompt_tokens, (q, cached)


def test_bf16_prompt_rows_take_other_products_than_f32_on_an_amx_host(switchyard_bin, gemma3_path):
    """Else the bf16-prompt case above could pass with AMX never running."""
    if not amx_host():
        pytest.skip("no AMX-BF16 here (or SWITCHYARD_AMX=0): bf16-prompt is f32 for every row")
    f32 = cold(switchyard_bin, gemma3_path, "f32")
    bf16 = cold(switchyard_bin, gemma3_path, "bf16-prompt")
    assert any(f32[q][2] != bf16[q][2] for q in QUESTIONS)


def test_bf16x3_prompt_rows_take_other_products_than_f32_on_an_amx_host(switchyard_bin, gemma3_path):
    """Else the bf16x3 case above could pass with AMX never running: its
    log-probabilities are close to f32's but not their bits."""
    if not amx_host():
        pytest.skip("no AMX-BF16 here (or SWITCHYARD_AMX=0): bf16x3 is f32 for every row")
    f32 = cold(switchyard_bin, gemma3_path, "f32")
    split = cold(switchyard_bin, gemma3_path, "bf16x3")
    assert any(f32[q][2] != split[q][2] for q in QUESTIONS)
