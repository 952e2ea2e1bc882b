"""Prompt matmuls on AMX-INT8 tiles give the VNNI kernels' bits.

On a CPU with AMX-INT8 (Intel Sapphire Rapids and later), a prompt of 64
rows or more takes the quantized matrix products in whole tiles of 16
rows on AMX (`tdpbssd`,
`kernels/src/cpu/packed/amx.rs`); `SWITCHYARD_AMX=0` keeps them on the
AVX-512 VNNI kernels. The integer block sums are exact and the f32 steps
the same, so the logits of every prompt row and the greedy continuation
must be identical, bit for bit, for both real models (Gemma 3: Q5_0, Q8_0,
Q4_K, Q6_K; SmolLM2: Q4_1). On other CPUs there is nothing to compare.
"""

from pathlib import Path

import numpy as np
import pytest

from conftest import engine_logits, run_json

TEXT = (
    "The history of computing is a story of abstraction. Early machines were programmed "
    "by rewiring panels and flipping switches; then came stored programs, assemblers, and "
    "compilers that let people describe what they wanted instead of how the hardware "
    "should do it. Each layer hid the one beneath it, and each made a new kind of program "
    "possible. "
) * 2 + "In summary, the most important idea is"
GREEDY_STEPS = 8


def has_amx_int8() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "amx_int8" in flags


@pytest.mark.skipif(not has_amx_int8(), reason="no AMX-INT8 on this CPU: the VNNI kernels are all that runs")
@pytest.mark.parametrize("model", ["gemma3", "smollm2"])
def test_amx_prompt_matmuls_give_the_vnni_bits(model, switchyard_bin, gemma3_path, smollm2_path, tmp_path,
                                               monkeypatch):
    path = gemma3_path if model == "gemma3" else smollm2_path
    ids = run_json(switchyard_bin, "tokenize", "--model", path, "--text", TEXT)["ids"]
    assert len(ids) >= 64, f"want several 16-row tiles, got {len(ids)} tokens"
    amx_logits, amx_tokens = engine_logits(switchyard_bin, path, ids, tmp_path, greedy=GREEDY_STEPS)
    monkeypatch.setenv("SWITCHYARD_AMX", "0")
    vnni_logits, vnni_tokens = engine_logits(switchyard_bin, path, ids, tmp_path, greedy=GREEDY_STEPS)
    print(f"AMX {model}: {len(ids)} tokens, greedy {amx_tokens} / VNNI {vnni_tokens}")
    assert amx_logits.shape == vnni_logits.shape
    differ = np.flatnonzero((amx_logits != vnni_logits).any(axis=1))
    assert differ.size == 0, f"{model}: rows {differ[:8].tolist()} differ between AMX and VNNI"
    assert amx_tokens == vnni_tokens
