"""A disk cache of the reference's hidden states, so a rerun of the numerics
tests does not redo float64 forward passes whose inputs did not change.

An entry is the final hidden states (after the output norm) that one
`Reference.hidden` call returns, keyed by everything they depend on:
- this folder's `llama.py` (the forward pass itself),
- the weights as the reference holds them (a digest of the dequantized
  tensors, their storage types and the config: a new dequantizer, another
  file or a synthetic checkpoint with other seeds all give another key),
- the LoRA updates, the activation rounding, the KV type and the attention
  precision,
- the tokens the sequence already holds, the new tokens and the first row
  returned,
- NumPy's version and the machine (BLAS may sum in another order elsewhere).

Hidden states are small (rows x hidden width); the logits are projected
again from them on every run (the vocabulary makes logits too large to
keep), so the output projection and what follows it are always computed.

The engine's side of a test is never cached: a change to the engine is
checked against the same reference numbers as before. A change to the
reference's source makes new keys; entries of an older source are removed
after PRUNE_AFTER_DAYS unused.

Where: $SWITCHYARD_REFERENCE_CACHE, else $SWITCHYARD_CACHE/reference, else
~/.cache/switchyard/reference (beside the test models).
SWITCHYARD_REFERENCE_CACHE=0 turns it off (every pass computed).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

PRUNE_AFTER_DAYS = 14
_SOURCE = Path(__file__).with_name("llama.py")


def folder() -> Path | None:
    """This source's cache folder, or None when the cache is off."""
    setting = os.environ.get("SWITCHYARD_REFERENCE_CACHE")
    if setting == "0":
        return None
    if setting:
        root = Path(setting)
    else:
        base = os.environ.get("SWITCHYARD_CACHE") or Path.home() / ".cache" / "switchyard"
        root = Path(base) / "reference"
    source = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:16]
    env = f"numpy-{np.__version__}-{platform.machine()}"
    here = root / f"{source}-{env}"
    if not here.is_dir():
        here.mkdir(parents=True, exist_ok=True)
        _prune(root, keep=here)
    return here


def _prune(root: Path, keep: Path) -> None:
    """Removes the folders of other sources not used for PRUNE_AFTER_DAYS."""
    cutoff = time.time() - PRUNE_AFTER_DAYS * 86400
    for other in root.iterdir():
        if other != keep and other.is_dir() and other.stat().st_mtime < cutoff:
            shutil.rmtree(other, ignore_errors=True)


def weights_digest(ckpt) -> str:
    """A digest of the checkpoint as the reference reads it, computed once per
    checkpoint object (shallow copies of a reference share it)."""
    known = getattr(ckpt, "_reference_digest", None)
    if known is not None:
        return known
    h = hashlib.sha256(repr(ckpt.config).encode())
    for name in sorted(ckpt.tensors):
        tensor = np.ascontiguousarray(ckpt.tensors[name])
        h.update(f"{name}:{ckpt.types[name]}:{tensor.dtype}:{tensor.shape}".encode())
        h.update(memoryview(tensor).cast("B"))
    ckpt._reference_digest = h.hexdigest()
    return ckpt._reference_digest


def lora_digest(updates: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(updates):
        a, b, scale = updates[name]
        h.update(f"{name}:{a.shape}:{b.shape}:{scale!r}".encode())
        h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        h.update(np.ascontiguousarray(b, dtype=np.float64).tobytes())
    return h.hexdigest()


def key(parts: list) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def load(here: Path, name: str) -> np.ndarray | None:
    path = here / f"{name}.npy"
    try:
        rows = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        # Absent, or cut short by a run that died mid-write: computed again.
        return None
    os.utime(here)
    return rows


def store(here: Path, name: str, rows: np.ndarray) -> None:
    """Writes atomically: two test workers may compute the same entry."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=here, suffix=".tmp")
        with os.fdopen(fd, "wb") as out:
            np.save(out, rows, allow_pickle=False)
        os.replace(tmp, here / f"{name}.npy")
    except OSError:
        # A full disk costs the next run the pass again, nothing else.
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
