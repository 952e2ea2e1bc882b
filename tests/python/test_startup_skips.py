"""Issue 17, case 5: one bad version in a repository does not stop the server. It is
skipped with a warning naming it, and the rest serves (startup stopped altogether
before)."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

from serve_process import free_port, running_server


def synth(binary: Path, preset: str, out: Path):
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(binary), "synth", "--preset", preset, "--out", str(out)],
                   check=True, capture_output=True)


def poison(path: Path):
    """Overwrites the second half of a float checkpoint's tensor data with NaN: the file
    still parses (so the repository scan keeps it), its smoke forward fails."""
    data = bytearray(path.read_bytes())
    start = len(data) // 2 // 32 * 32
    nan = b"\x00\x00\xc0\x7f"
    data[start:] = (nan * ((len(data) - start) // 4 + 1))[: len(data) - start]
    path.write_bytes(bytes(data))


def test_a_version_that_fails_to_load_is_skipped(switchyard_bin: Path, tmp_path: Path):
    repo = tmp_path / "repo"
    synth(switchyard_bin, "smollm2", repo / "m" / "1" / "model.gguf")
    # Version 2, the default (the highest), parses but its weights are NaN.
    synth(switchyard_bin, "smollm2", repo / "m" / "2" / "model.gguf")
    poison(repo / "m" / "2" / "model.gguf")
    (repo / "m" / "model.toml").write_text("[version_policy]\nall = true\n")
    port = free_port()
    args = [str(switchyard_bin), "serve", "--repo", str(repo), "--listen", f"127.0.0.1:{port}",
            "--drain-seconds", "2"]
    with running_server(args, port, ready_within=60) as proc:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            ids = [m["id"] for m in json.loads(r.read())["data"]]
        assert "m" in ids and "m@1" in ids and "m@2" not in ids, ids
    stderr = proc.stderr.read()
    assert "warning: skipping `m@2`" in stderr, stderr
    assert "`m@1` is active instead of the default `m@2`" in stderr, stderr
