"""Gemma 3 270M (real Q4_K_M weights: Q5_0, Q4_K, Q6_K, Q8_0 matrices): the
engine against the NumPy reference.

The reference reads the file with the `gguf` package (its dequantizers) and
implements Gemma 3 on its own (reference/llama.py): √d embeddings, norms
before and after attention and MLP with the GGUF's stored (1 + w) weights,
per-head query/key norms, GeGLU, five local layers (window 512, RoPE base
10 000) per global one (base 1 000 000). The long prompt passes the window,
so local layers attend to the last 512 positions only, from a ring of slots
in the engine's KV cache. The long prompt runs again over a Q8_0 KV cache
(rings included) against the reference rounding K and V the same way.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from conftest import engine_logits, greedy_gaps, run_json
from reference import checkpoint, llama

# Gemma 3 270M's logits span roughly [-25, 25]. As for SmolLM2 (see
# test_smollm2_numerics.py), the two sides agree to float rounding until an
# activation rounds to the other int8 neighbour in float32 and float64; each
# such flip moves later logits by tenths (the float64 reference with and
# without int8 activations differs by 0.10 mean, 0.65 max on "capital").
# Logits are compared after subtracting each row's mean: Gemma's tied
# embeddings share a large common component, so a small change of the final
# state along it shifts a whole row of logits by the same amount (up to 0.94
# on "turns", 2026-12-04), which the softmax ignores and would otherwise
# dominate the mean. Observed on the prompts below (2026-12-04, raw and
# centred): max 0.71-1.53, mean of centred differences <= 0.19 (raw 0.11-0.30).
LOGIT_ATOL = 3.0  # max |engine - reference| of centred logits, every compared row and entry
LOGIT_MEAN_ATOL = 0.3  # mean |engine - reference| of centred logits
# A greedy step may pick a token whose reference logit is at most this far
# below the reference's best (a near-tie broken the other way).
GREEDY_GAP = 1.0
KL_MEAN_MAX = 0.02  # mean KL(reference || engine) of next-token distributions, nats
GREEDY_STEPS = 24
# Rows compared on the long prompt: its last ones (all 262k logits of 700
# rows in float64 would take gigabytes).
LONG_ROWS = 48

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
    "capital": "The capital of France is",
    "story": "Once upon a time, in a small village at the edge of a forest, there lived",
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "list": "Three facts about the Moon:\n1.",
    "multilingual": "Le chat est sur la table. Die Katze ist auf dem Tisch. El gato",
    "turns": "<start_of_turn>user\nWhat is 2 + 2?<end_of_turn>\n<start_of_turn>model\n",
    # Past the 512-position window of the local layers.
    "long": LONG_TEXT * 7 + "In summary, the most important idea is",
}


def centred(logits):
    """Each row minus its mean: the softmax-invariant part of the logits."""
    return logits - logits.mean(axis=1, keepdims=True)


def kl_divergence(p_logits, q_logits):
    def log_softmax(x):
        x = x - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=1)


@pytest.fixture(scope="module")
def reference(gemma3_path):
    return llama.Reference(checkpoint.load(gemma3_path), act_quant=True)


def test_reference_reads_gemma3(reference):
    c = reference.c
    assert (c.arch, c.layers, c.hidden, c.heads, c.kv_heads, c.head_dim) == ("gemma3", 18, 640, 4, 1, 256)
    assert (c.window, c.swa_pattern, c.local_theta, c.theta) == (512, 6, 10000.0, 1000000.0)
    assert [c.local(i) for i in range(12)] == [True] * 5 + [False] + [True] * 5 + [False]
    # The converter stores Gemma's (1 + w): norm gains sit near and above 1.
    assert reference.w["blk.0.attn_q_norm.weight"].mean() > 0.5


@pytest.fixture(scope="module")
def reference_q8_0(reference):
    # The same weights (read and widened once, ~1.3 GB of float64) with a Q8_0 cache.
    q8_0 = copy.copy(reference)
    q8_0.kv = "q8_0"
    q8_0.reset()
    return q8_0


@pytest.mark.parametrize("name", list(PROMPTS))
def test_logits_and_greedy_match_reference(name, switchyard_bin, gemma3_path, reference, tmp_path):
    check_prompt(name, "f16", switchyard_bin, gemma3_path, reference, tmp_path)


def test_long_prompt_over_a_q8_0_cache_matches_reference(switchyard_bin, gemma3_path, reference_q8_0,
                                                         tmp_path):
    """Q8_0 keys and values, local layers' rings included, at the F16 case's
    tolerances (see test_long_context_numerics.py for why they carry over).
    Observed (2026-12-04, 744 tokens): centred max 1.00, mean 0.112, KL mean
    0.0005, greedy 24/24 on the reference's argmax; the F16 run alongside
    0.93, 0.099, 0.0004, 23/24 (a near-tie, gap 0.15)."""
    check_prompt("long", "q8_0", switchyard_bin, gemma3_path, reference_q8_0, tmp_path)


def test_long_prompt_with_bf16_attention_matches_reference(switchyard_bin, gemma3_path, reference,
                                                           tmp_path):
    """`--attention-precision bf16` against the reference rounding queries,
    keys, values and probabilities to BF16 the same way (reference/llama.py),
    at the F16 case's tolerances: the rounding is the same on both sides but
    for the probabilities' (relative to the engine's running maximum, not
    the row's: at most 2^-9 of each weight either way), which the int8
    activation flips dwarf. Observed (2026-12-06): centred max 0.87, mean
    0.094, KL mean 0.0005, greedy 24/24 on the reference's argmax; the f32
    run beside it against the f32 reference: 0.94, 0.098, 0.0003, 24/24."""
    reference.attention = "bf16"
    try:
        check_prompt("long", "f16", switchyard_bin, gemma3_path, reference, tmp_path, attention="bf16")
    finally:
        reference.attention = "f32"


def test_long_prompt_with_bf16_prompt_attention_matches_reference(switchyard_bin, gemma3_path,
                                                                  reference, tmp_path):
    """`--attention-precision bf16-prompt` (BF16 products for the rows of a
    prompt chunk on AMX, f32 for decode and every row elsewhere) against
    the f32 reference at the F16 case's tolerances: on a host with AMX the
    prompt's rows carry bf16's rounding (which the bf16 test above bounds
    against its own reference) and the greedy steps f32's; elsewhere it is
    the f32 engine. Observed (2026-12-07, Xeon with AMX, 744 tokens):
    centred max 0.95, mean 0.099, KL mean 0.00035, greedy 24/24 on the
    reference's argmax."""
    check_prompt("long", "f16", switchyard_bin, gemma3_path, reference, tmp_path,
                 attention="bf16-prompt")


def test_long_prompt_with_bf16x3_attention_matches_reference(switchyard_bin, gemma3_path, reference,
                                                             tmp_path):
    """`--attention-precision bf16x3` (bf16-prompt's rows with each operand
    split in two BF16 parts, three products summed: about 16 bits of a
    query or probability, all of an F16 key or value) against the f32
    reference at the f32 engine's own tolerances (the F16 case's): on a
    host with AMX the prompt's rows take the split products, elsewhere it
    is the f32 engine."""
    check_prompt("long", "f16", switchyard_bin, gemma3_path, reference, tmp_path,
                 attention="bf16x3")


def check_prompt(name, kv, switchyard_bin, gemma3_path, reference, tmp_path, attention="f32"):
    ids = run_json(switchyard_bin, "tokenize", "--model", gemma3_path, "--text", PROMPTS[name])["ids"]
    long = name == "long"
    if long:
        assert len(ids) > 640, f"the long prompt must pass window + ring slack, got {len(ids)}"
    got_logits, got_tokens = engine_logits(switchyard_bin, gemma3_path, ids, tmp_path, greedy=GREEDY_STEPS,
                                           kv=kv, attention=attention)
    from_row = len(ids) - LONG_ROWS if long else 0
    got_logits = got_logits[from_row:].astype(np.float64)
    reference.reset()
    want_logits = reference.forward(ids, from_row=from_row)
    assert got_logits.shape == want_logits.shape
    raw = np.abs(got_logits - want_logits)
    diff = np.abs(centred(got_logits) - centred(want_logits))

    # Teacher-forced: the reference over prompt + generated, one row per step
    # (going on from the prompt it holds).
    gaps = greedy_gaps(reference, ids, got_tokens)
    kl = kl_divergence(want_logits, got_logits)
    print(
        f"NUMERICS gemma3 {name} kv={kv} attention={attention}: {len(ids)} tokens, centred logits max |diff| {diff.max():.4f} "
        f"mean {diff.mean():.5f} (raw max {raw.max():.4f} mean {raw.mean():.5f}); "
        f"greedy {int((gaps == 0).sum())}/{GREEDY_STEPS} steps pick the reference's argmax, "
        f"max gap {gaps.max():.4f}; KL mean {kl.mean():.5f} max {kl.max():.5f}"
    )
    assert diff.max() <= LOGIT_ATOL, f"max |diff| {diff.max()} at {np.unravel_index(diff.argmax(), diff.shape)}"
    assert diff.mean() <= LOGIT_MEAN_ATOL
    assert kl.mean() <= KL_MEAN_MAX
    assert gaps.max() <= GREEDY_GAP, f"greedy step {gaps.argmax()} picked a token {gaps.max()} below the best"
