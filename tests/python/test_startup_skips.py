"""A bad version in a repository at startup (issue 17 case 5, issue 36 case 3).

Without `--allow-partial-start` the server refuses to start, naming the version once
(it started without it before, and `switchyard models` said nothing was wrong); with
the flag it serves the rest, and the console and `GET /ready` say what is missing."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

from first_hour_server import run_to_exit
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


def repo_with_a_bad_default(switchyard_bin: Path, tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    synth(switchyard_bin, "smollm2", repo / "m" / "1" / "model.gguf")
    # Version 2, the default (the highest), parses but its weights are NaN.
    synth(switchyard_bin, "smollm2", repo / "m" / "2" / "model.gguf")
    poison(repo / "m" / "2" / "model.gguf")
    (repo / "m" / "model.toml").write_text("[version_policy]\nall = true\n")
    return repo


def test_a_version_that_fails_to_load_stops_startup(switchyard_bin: Path, tmp_path: Path):
    repo = repo_with_a_bad_default(switchyard_bin, tmp_path)
    port = free_port()
    done = run_to_exit([switchyard_bin, "serve", "--repo", repo, "--listen", f"127.0.0.1:{port}"])
    assert done.returncode != 0, done.stderr
    assert "did not start" in done.stderr and "--allow-partial-start" in done.stderr, done.stderr
    # Named once, with its file; no "cannot read P: cannot read P" chains.
    assert done.stderr.count("m@2:") == 1, done.stderr
    assert "serving OpenAI-compatible API" not in done.stderr


def test_a_version_that_fails_to_load_is_skipped_when_allowed(switchyard_bin: Path, tmp_path: Path):
    repo = repo_with_a_bad_default(switchyard_bin, tmp_path)
    port = free_port()
    args = [str(switchyard_bin), "serve", "--repo", str(repo), "--listen", f"127.0.0.1:{port}",
            "--drain-seconds", "2", "--allow-partial-start"]
    with running_server(args, port, ready_within=60) as proc:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            ids = [m["id"] for m in json.loads(r.read())["data"]]
        assert "m" in ids and "m@1" in ids and "m@2" not in ids, ids
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=10) as r:
            missing = json.loads(r.read())["missing"]
        assert any("m@2" in item for item in missing), missing
    stderr = proc.stderr.read()
    assert "--allow-partial-start" in stderr and "m@2" in stderr, stderr
    assert "`m@1` is active instead of the default `m@2`" in stderr, stderr
