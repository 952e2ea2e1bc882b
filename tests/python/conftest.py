"""Shared fixtures: the switchyard binary, the real test model, synthetic checkpoints.

Environment:
  SWITCHYARD_BIN    the binary (default: target/release/switchyard)
  SWITCHYARD_MODEL  the SmolLM2 GGUF (default: fetched by scripts/fetch-model.sh)
  SWITCHYARD_GEMMA3 the Gemma 3 270M GGUF (default: fetched by scripts/fetch-gemma3.sh)
  SWITCHYARD_REFERENCE_CACHE  where the NumPy reference keeps its hidden states
                    (default: $SWITCHYARD_CACHE/reference, else ~/.cache/switchyard/reference;
                    0: off, every pass computed; reference/cache.py)

Markers:
  slow  a soak, a benchmark or a long variant. scripts/test.sh leaves these out and
        runs the rest in parallel (pytest-xdist, a file per worker); `scripts/test.sh
        --all` (CI) runs them afterwards, one at a time; `pytest -m slow` runs only them.
  serial  asserts wall-clock latency bounds: scripts/test.sh runs these after the
        parallel phase, one at a time, so that no other worker shares the cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: a soak, a benchmark or a long variant: not in scripts/test.sh's "
        "default run; `scripts/test.sh --all` (CI) runs it")
    config.addinivalue_line(
        "markers", "serial: asserts wall-clock latency bounds; scripts/test.sh runs it after "
        "the parallel phase, with no other worker beside it")


# The files that take longest, longest first. scripts/test.sh hands whole files to
# its workers in collection order (`--dist loadfile --no-loadscope-reorder`):
# starting these first keeps one worker from running a long file alone at the end.
LONGEST_FIRST = [
    "test_cache_scopes.py",
    "test_embeddings.py",
    "test_console_browser.py",
    "test_cascade.py",
    "test_first_hour.py",
    "test_lora_serving.py",
    "test_hostile.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # A stable sort: each file's tests stay together and in their order.
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def switchyard_bin() -> Path:
    path = Path(os.environ.get("SWITCHYARD_BIN", ROOT / "target" / "release" / "switchyard"))
    if not path.exists():
        pytest.fail(f"{path} does not exist: run `cargo build --release` first")
    return path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    env = os.environ.get("SWITCHYARD_MODEL")
    if env:
        return Path(env)
    out = subprocess.run(
        [str(ROOT / "scripts" / "fetch-model.sh")], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Gemma 3 270M Q4_K_M (SentencePiece, 262k vocabulary), fetched and
    verified by scripts/fetch-gemma3.sh (or SWITCHYARD_GEMMA3)."""
    env = os.environ.get("SWITCHYARD_GEMMA3")
    if env:
        return Path(env)
    out = subprocess.run(
        [str(ROOT / "scripts" / "fetch-gemma3.sh")], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def run_json(*args) -> dict:
    """Runs the binary and parses the JSON it prints last on stdout."""
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def engine_logits(bin_path, model, tokens, tmp_path, greedy=0, positions="all", kv="f16",
                  attention="f32"):
    """The engine's logits for `tokens` ([rows, vocab]) and its greedy
    continuation, with a KV cache of type `kv` and attention's products in
    `attention` (`--attention-precision`)."""
    ids_file = tmp_path / "ids.json"
    ids_file.write_text(json.dumps(tokens))
    out = tmp_path / "logits.npy"
    info = run_json(
        bin_path, "logits", "--model", model, "--tokens-file", ids_file, "--out", out,
        "--positions", positions, "--greedy", greedy, "--threads", "2", "--kv-type", kv,
        "--attention-precision", attention,
    )
    return np.load(out), info["greedy"]


def greedy_gaps(reference, prompt, generated):
    """Teacher-forced check of a greedy continuation: runs the reference once
    over prompt + generated (going on from the prompt where the reference
    already holds it) and returns, per generated token, how far its
    logit lies below the reference's best logit at that step (0 where the
    reference picks the same token).

    Two correct implementations may break a near-tie differently (a logit
    error of a fraction of a unit flips a choice whose margin is smaller);
    after that the sequences legitimately part. Bounding every gap by the
    logit tolerance allows exactly that and nothing more: any step where the
    reference's winner leads by more than the bound must agree."""
    prompt, generated = [int(t) for t in prompt], [int(t) for t in generated]
    if reference.tokens == prompt and reference.last_logits is not None:
        # The reference holds the prompt and its last row's logits (the caller
        # just checked the prompt's logits): append the continuation only. The
        # same rows as running prompt + continuation from the start (the
        # reference's caches hold what a longer run would have written).
        first = reference.last_logits[None]
        rest = [reference.forward(generated[:-1])] if len(generated) > 1 else []
        logits = np.vstack([first, *rest])
    else:
        reference.reset()
        logits = reference.forward(prompt + generated[:-1], from_row=len(prompt) - 1)
    chosen = logits[np.arange(len(generated)), generated]
    return logits.max(axis=1) - chosen
