"""What keeps the reference fast without changing its numbers: the disk
cache (reference/cache.py), where a cached pass gives the numbers an
uncached one gives, a rerun does not run the layers again, and anything the
pass depends on changes the key; and the checkpoint's faster GGUF metadata
reader (reference/checkpoint.py:FastReader), which reads what the `gguf`
package's reader reads."""

from __future__ import annotations

import subprocess

import gguf

import numpy as np
import pytest

from reference import checkpoint, llama

PROMPT = [5, 17, 3, 99, 42, 7, 64, 1, 28, 11]
CONTINUATION = [9, 81, 33]


def synth(bin_path, seed, out):
    subprocess.run(
        [str(bin_path), "synth", "--preset", "llama", "--dtype", "q4_0", "--seed", str(seed),
         "--format", "gguf", "--out", str(out)],
        check=True, capture_output=True,
    )
    return checkpoint.load(out)


@pytest.fixture(scope="module")
def ckpt(switchyard_bin, tmp_path_factory):
    return synth(switchyard_bin, 11, tmp_path_factory.mktemp("ref-cache") / "model.gguf")


def passes(ref):
    """The prompt's logits, then the continuation's (the greedy check's two calls)."""
    ref.reset()
    return ref.forward(PROMPT), ref.forward(CONTINUATION)


def counting(ref):
    """`ref` with a count of its runs through the layers."""
    ref.runs = 0
    run = ref._run

    def counted(tokens, from_row):
        ref.runs += 1
        return run(tokens, from_row)

    ref._run = counted
    return ref


def test_a_rerun_is_answered_from_the_cache_with_the_same_numbers(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("SWITCHYARD_REFERENCE_CACHE", "0")
    uncached = passes(llama.Reference(ckpt))
    monkeypatch.setenv("SWITCHYARD_REFERENCE_CACHE", str(tmp_path))
    cold = counting(llama.Reference(ckpt))
    first = passes(cold)
    warm = counting(llama.Reference(ckpt))
    second = passes(warm)
    assert cold.runs == 2 and warm.runs == 0
    for a, b, c in zip(uncached, first, second):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    assert list(tmp_path.glob("*/*.npy")), "nothing was stored"


def test_a_miss_after_hits_runs_the_tokens_the_hits_skipped(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("SWITCHYARD_REFERENCE_CACHE", "0")
    _, want = passes(llama.Reference(ckpt))
    monkeypatch.setenv("SWITCHYARD_REFERENCE_CACHE", str(tmp_path))
    ref = llama.Reference(ckpt)
    ref.forward(PROMPT)  # stored
    ref.reset()
    ref = counting(ref)
    ref.forward(PROMPT)  # a hit: the KV caches stay empty
    assert ref.runs == 0 and ref.k_cache[0].shape[0] == 0
    got = ref.forward(CONTINUATION)  # a miss: the prompt runs first
    assert ref.runs == 2 and ref.k_cache[0].shape[0] == len(PROMPT) + len(CONTINUATION)
    assert np.array_equal(got, want)


def test_weights_and_settings_change_the_key(ckpt, switchyard_bin, tmp_path, monkeypatch):
    monkeypatch.setenv("SWITCHYARD_REFERENCE_CACHE", str(tmp_path / "cache"))
    passes(llama.Reference(ckpt))
    other = synth(switchyard_bin, 12, tmp_path / "other.gguf")
    variants = [
        llama.Reference(other),
        llama.Reference(ckpt, kv="f32"),
        llama.Reference(ckpt, act_quant=False),
        llama.Reference(ckpt, attention="bf16"),
    ]
    for ref in variants:
        ref = counting(ref)
        ref.forward(PROMPT)
        assert ref.runs == 1


def test_a_subclass_that_watches_the_pass_always_runs_it(ckpt, tmp_path, monkeypatch):
    """scripts/train-lora.py reads a layer's activations from a subclass."""

    class Watching(llama.Reference):
        def rms_norm(self, x, name):
            self.seen = True
            return super().rms_norm(x, name)

    monkeypatch.setenv("SWITCHYARD_REFERENCE_CACHE", str(tmp_path))
    llama.Reference(ckpt).forward(PROMPT)  # stored
    ref = Watching(ckpt)
    ref.seen = False
    ref.forward(PROMPT)
    assert ref.seen


def test_the_fast_reader_reads_what_the_package_reads(smollm2_path):
    theirs, ours = gguf.GGUFReader(str(smollm2_path)), checkpoint.FastReader(str(smollm2_path))
    assert list(ours.fields) == list(theirs.fields)
    for name, field in theirs.fields.items():
        assert ours.fields[name].types == field.types, name
        assert ours.fields[name].contents() == field.contents(), name
    assert len(ours.tensors) == len(theirs.tensors)
    for a, b in zip(ours.tensors, theirs.tensors):
        assert (a.name, a.tensor_type, a.data_offset, a.n_bytes) == (b.name, b.tensor_type, b.data_offset, b.n_bytes)
        assert np.array_equal(a.data, b.data), a.name
