"""SmolLM2-135M-Instruct (real Q4_1 weights): the engine against the NumPy reference.

Both get the same token ids (tokenization is checked on its own in
test_tokenizer.py); the reference shares no code with the engine.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from conftest import engine_logits, greedy_gaps, run_json
from reference import checkpoint, llama

# Logits of SmolLM2 span roughly [-30, 30]. The engine computes in float32
# with ggml-style int8 activation quantization; the reference in float64 with
# the same quantization. Up to the first int8 rounding flip the two agree to
# float rounding (1e-5). SmolLM2 has outlier activations, so the int8 step of
# a block holding one is large: an activation that float32 and float64 round
# to neighbouring int8 values moves later logits by 0.2-0.6 (the float32 and
# float64 versions of the reference itself differ that much). Observed
# worst case over the prompts below: see the NUMERICS lines (pytest -s).
LOGIT_ATOL = 3.0  # max |engine - reference| over every position and vocab entry
LOGIT_MEAN_ATOL = 0.3  # mean |engine - reference| over every position and vocab entry
# A greedy step may pick a token whose reference logit is at most this far
# below the reference's best: a near-tie broken the other way (conftest.greedy_gaps).
GREEDY_GAP = 1.0
# Mean over positions of KL(reference || engine) of the next-token
# distributions, in nats: what the logit differences mean for sampling.
KL_MEAN_MAX = 0.01
GREEDY_STEPS = 64

LONG_TEXT = (
    "The history of computing is a story of abstraction. Early machines were programmed "
    "by rewiring panels and flipping switches; then came stored programs, assemblers, and "
    "compilers that let people describe what they wanted instead of how the hardware "
    "should do it. Each layer hid the one beneath it, and each made a new kind of program "
    "possible. Operating systems turned a single expensive computer into a shared "
    "resource; networks turned many computers into one system; and the web turned that "
    "system into a place where billions of people work, talk and learn. "
)

PROMPTS = {
    "plain-short": ("text", "The capital of France is"),
    "plain-long": ("text", LONG_TEXT * 4 + "In summary, the most important idea is"),
    "code": ("text", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    "chat-short": ("chat", [{"role": "user", "content": "What is 2 + 2?"}]),
    "chat-system": (
        "chat",
        [
            {"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
            {"role": "user", "content": "Why is the sky blue?"},
        ],
    ),
    "chat-long": (
        "chat",
        [{"role": "user", "content": LONG_TEXT * 3 + "\nSummarize the text above in two sentences."}],
    ),
}


def kl_divergence(p_logits, q_logits):
    """KL(p || q) per row of two logit matrices, in nats."""
    def log_softmax(x):
        x = x - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=1)


@pytest.fixture(scope="module")
def reference(smollm2_path):
    return llama.Reference(checkpoint.load(smollm2_path), act_quant=True)


def prompt_ids(bin_path, model, kind, prompt, tmp_path):
    if kind == "text":
        return run_json(bin_path, "tokenize", "--model", model, "--text", prompt)["ids"]
    messages = tmp_path / "messages.json"
    import json

    messages.write_text(json.dumps(prompt))
    return run_json(bin_path, "tokenize", "--model", model, "--chat", messages)["ids"]


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_logits_and_greedy_match_reference(name, switchyard_bin, smollm2_path, reference, tmp_path):
    kind, prompt = PROMPTS[name]
    ids = prompt_ids(switchyard_bin, smollm2_path, kind, prompt, tmp_path)
    if name.endswith("long"):
        assert len(ids) >= 300, f"{name} should be several hundred tokens, got {len(ids)}"

    got_logits, got_tokens = engine_logits(switchyard_bin, smollm2_path, ids, tmp_path, greedy=GREEDY_STEPS)
    reference.reset()
    want_logits = reference.forward(ids)

    assert got_logits.shape == want_logits.shape
    diff = np.abs(got_logits.astype(np.float64) - want_logits)
    gaps = greedy_gaps(reference, ids, got_tokens)
    kl = kl_divergence(want_logits, got_logits.astype(np.float64))
    print(
        f"NUMERICS {name}: {len(ids)} tokens, logits max |diff| {diff.max():.4f} mean {diff.mean():.5f}; "
        f"greedy {int((gaps == 0).sum())}/{GREEDY_STEPS} steps pick the reference's argmax, max gap {gaps.max():.4f}; KL mean {kl.mean():.5f} max {kl.max():.5f}"
    )
    assert kl.mean() <= KL_MEAN_MAX
    assert diff.max() <= LOGIT_ATOL, f"max |diff| {diff.max()} at {np.unravel_index(diff.argmax(), diff.shape)}"
    assert diff.mean() <= LOGIT_MEAN_ATOL
    assert gaps.max() <= GREEDY_GAP, f"greedy step {gaps.argmax()} picked a token {gaps.max()} below the best"


def test_plain_float_reference_is_close(switchyard_bin, smollm2_path, reference, tmp_path):
    """Without emulating activation quantization the reference is plain float64
    math; the engine must still be close to it (looser: int8 activations)."""
    # The module's reference without activation quantization (its weights are read
    # and widened to float64 once).
    ref = copy.copy(reference)
    ref.act_quant = False
    ref.reset()
    ids = run_json(switchyard_bin, "tokenize", "--model", smollm2_path, "--text", "The capital of France is")["ids"]
    got, _ = engine_logits(switchyard_bin, smollm2_path, ids, tmp_path)
    want = ref.forward(ids)
    diff = np.abs(got - want)
    # int8 activations perturb each logit by up to about a percent of its range
    # (the act-quant float64 reference is itself 0.96 from this one). Where an
    # activation sits near an int8 rounding boundary, f32 summation order
    # decides which way it rounds, and SmolLM2's outlier blocks make such a
    # flip move logits by tenths. Measured on this prompt (2026-12-03), with
    # kernels that compute the same exact-arithmetic terms in different f32
    # orders (kernels/src/cpu/packed/tests.rs checks the terms): scalar
    # per-row 1.034, AVX-512 per-row 0.980, AVX-512 VNNI 16-row groups 1.151.
    # 1.0 sat inside that spread; 1.25 bounds it and still fails on any real
    # error (a wrong block or scale moves logits by whole units).
    assert diff.max() <= 1.25, diff.max()
    assert np.argmax(got[-1]) == np.argmax(want[-1])
