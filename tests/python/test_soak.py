"""The soak of tests/python/soak.py for a short time, in the test command's slow set
(`scripts/test.sh --all`, CI; scripts/soak.sh runs it for ten minutes): zero failed or mixed requests while
versions flip, corrupt versions are refused and the policy reloads."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from soak import run

SECONDS = float(os.environ.get("SWITCHYARD_SOAK_SECONDS", "20"))


@pytest.mark.slow
def test_short_soak(switchyard_bin: Path, smollm2_path: Path):
    out = io.StringIO()
    summary = run(switchyard_bin, smollm2_path, SECONDS, out)
    print(out.getvalue())
    assert summary["requests"] > 0
    assert summary["failures"] == 0, summary["first_failures"]
    assert summary["version_flips"] > 0 and summary["corrupt_loads_refused"] > 0
    assert summary["policy_reloads"] > 0
    assert summary["memory_within_bound"], summary
