"""SmolLM2 at a 4k-token context: the engine (F16 KV cache, its default, and
F32) against the NumPy reference rounding keys and values the same way
(reference/llama.py), on the last prompt position and a greedy continuation.

Tolerances are SmolLM2's (test_smollm2_numerics.py), for the same reasons:
int8 activation flips between float32 and float64 move later logits by
0.2-0.6. Rounding K/V to float16 adds no tolerance of its own: both sides
store the same float16 values, except an element that float32 and float64
put on either side of a float16 rounding boundary (one float16 step apart,
rare, like the int8 flips). Observed values: the NUMERICS lines (pytest -s).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_json
from reference import checkpoint, llama
from test_smollm2_numerics import GREEDY_GAP, LOGIT_ATOL, LONG_TEXT, kl_divergence

CONTEXT = 4096
GREEDY_STEPS = 8
# The mean over one row and the KL of one row are noisier than the
# SmolLM2 test's means over whole prompts: twice its bounds.
LOGIT_MEAN_ATOL = 0.6
KL_MAX = 0.02


@pytest.fixture(scope="module")
def prompt(switchyard_bin, smollm2_path):
    ids = run_json(switchyard_bin, "tokenize", "--model", smollm2_path, "--text", LONG_TEXT)["ids"]
    repeats = CONTEXT // len(ids) + 1
    return (ids * repeats)[:CONTEXT]


@pytest.mark.parametrize("kv", ["f16", "f32", "q8_0"])
def test_4k_context_matches_the_reference(kv, prompt, switchyard_bin, smollm2_path, tmp_path):
    ids_file = tmp_path / "ids.json"
    ids_file.write_text(str(prompt))
    out = tmp_path / "logits.npy"
    info = run_json(
        switchyard_bin, "logits", "--model", smollm2_path, "--tokens-file", ids_file, "--out", out,
        "--positions", "last", "--greedy", GREEDY_STEPS, "--threads", "2", "--kv-type", kv,
    )
    got = np.load(out)[-1]
    generated = info["greedy"]

    ref = llama.Reference(checkpoint.load(smollm2_path), act_quant=True, kv=kv)
    for start in range(0, CONTEXT - 512, 512):
        ref.forward(prompt[start : start + 512], from_row=511)  # one row: logits unused
    last = CONTEXT - (CONTEXT - 1) // 512 * 512
    want = ref.forward(prompt[CONTEXT - last :], from_row=last - 1)[-1]
    # Teacher-forced: the reference's logits at each step the engine took.
    steps = np.vstack([want, ref.forward(generated[:-1])])
    gaps = steps.max(axis=1) - steps[np.arange(len(generated)), generated]

    diff = np.abs(got - want)
    kl = kl_divergence(want[None], got[None])[0]
    print(f"NUMERICS 4k kv={kv}: max {diff.max():.3f} mean {diff.mean():.4f} kl {kl:.5f} "
          f"greedy gaps {np.round(gaps, 3).tolist()}")
    assert diff.max() <= LOGIT_ATOL
    assert diff.mean() <= LOGIT_MEAN_ATOL
    assert kl <= KL_MAX
    assert gaps.max() <= GREEDY_GAP, f"greedy step {gaps.argmax()} picked a token {gaps.max()} below the best"
