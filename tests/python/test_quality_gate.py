"""Measured quality and quality-gated rollouts, end to end on the real SmolLM2.

A repository from `switchyard demo-repo` holds the base (v1) and its
faithful Q8_0 re-quantization (v2); the test adds v3, the base with
Gaussian noise (50% relative) multiplied into every attention and MLP norm
weight through the `gguf` package. `model.toml` names a quality gate (the
first 100 items of evals/geo.jsonl, max_drop 0.02):

- `switchyard eval --save` stores a measurement that `switchyard models`
  shows with n and interval, and marks stale when the suite changes;
- activating the degraded v3 is refused with a 409 naming both figures,
  the active version unchanged; the re-quantized v2 is accepted;
  `?force=true` overrides the refusal.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from serve_process import free_port, running_server

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "quality-gate-admin-token"
GATE_ITEMS = 100


def degrade(path: Path) -> None:
    """Noise into every norm weight (f32) of the GGUF at `path`, in place."""
    reader = GGUFReader(path, "r+")
    rng = np.random.default_rng(0)
    for tensor in reader.tensors:
        if tensor.name.endswith(("attn_norm.weight", "ffn_norm.weight")):
            data = tensor.data
            data[:] = data * (1 + 0.5 * rng.standard_normal(data.shape)).astype(np.float32)


@pytest.fixture(scope="module")
def repo(switchyard_bin: Path, smollm2_path: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gated")
    subprocess.run([str(switchyard_bin), "demo-repo", str(out), "--base", str(smollm2_path), "--derived", "0"],
                   check=True, capture_output=True)
    model = out / "smollm2"
    (model / "3").mkdir()
    shutil.copy(model / "1" / smollm2_path.name, model / "3" / "degraded.gguf")
    degrade(model / "3" / "degraded.gguf")
    lines = (ROOT / "evals" / "geo.jsonl").read_text().splitlines()[:GATE_ITEMS]
    (model / "gate.jsonl").write_text("\n".join(lines) + "\n")
    toml = (model / "model.toml").read_text()
    (model / "model.toml").write_text(toml + '\n[quality_gate]\nsuite = "gate.jsonl"\nmax_drop = 0.02\n')
    return out


def run(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_saved_measurements_show_in_models_and_go_stale(switchyard_bin, repo, tmp_path):
    suite = tmp_path / "mini.jsonl"
    suite.write_text("\n".join((ROOT / "evals" / "geo.jsonl").read_text().splitlines()[:20]) + "\n")
    out = run(switchyard_bin, "eval", "--repo", repo, "--model", "smollm2@2", "--suite", suite, "--json", "--save")
    measured = json.loads(out.stdout)
    listing = json.loads(run(switchyard_bin, "models", repo, "--json").stdout)
    model = next(m for m in listing["models"] if m["name"] == "smollm2")
    record = next(q for q in model["quality"] if q["suite"] == "mini")
    assert (record["version"], record["n"], record["acc"]) == ("2", 20, measured["acc"])
    assert record["ci95"] == measured["ci95"] and record["freshness"] == "fresh"
    table = run(switchyard_bin, "models", repo).stdout
    assert "smollm2@2  mini  acc" in table and "n 20  (fresh)" in table
    suite.write_text(suite.read_text() + suite.read_text().splitlines()[0] + "\n")
    table = run(switchyard_bin, "models", repo).stdout
    assert "n 20  (stale: the suite changed)" in table


POLICY = """
[routing]
allow_anonymous = true

[[models]]
name = "smollm2"
versions = ["1", "2"]
cost_per_1k_input = 0.00002
cost_per_1k_output = 0.00004
quality = 0.35
context_limit = 8192

[[models]]
name = "elsewhere"
version = "1"
cost_per_1k_input = 0.001
cost_per_1k_output = 0.002
quality = 0.9
context_limit = 8192
"""


def test_policy_explain_shows_measured_quality_beside_the_declared(switchyard_bin, repo, tmp_path):
    suite = tmp_path / "mini2.jsonl"
    suite.write_text("\n".join((ROOT / "evals" / "geo.jsonl").read_text().splitlines()[:10]) + "\n")
    measured = json.loads(run(switchyard_bin, "eval", "--repo", repo, "--model", "smollm2@1", "--suite", suite,
                              "--json", "--save").stdout)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}]}))
    out = json.loads(run(switchyard_bin, "policy", "explain", policy, "--request", request, "--repo", repo,
                         "--json").stdout)
    by_model = {m["model"]: m for m in out["measured_quality"]}
    record = next(r for r in by_model["smollm2"]["measured"] if r["suite"] == "mini2")
    assert (record["version"], record["n"], record["acc"], record["freshness"]) == ("1", 10, measured["acc"], "fresh")
    assert by_model["smollm2"]["declared_quality"] == 0.35
    assert "not in the repository" in by_model["elsewhere"]["note"]
    text = run(switchyard_bin, "policy", "explain", policy, "--request", request, "--repo", repo).stdout
    assert "measured quality (from the repository):" in text and "@1 mini2  acc" in text and "n 10  (fresh)" in text


@pytest.fixture(scope="module")
def server(switchyard_bin: Path, repo: Path):
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--repo", str(repo), "--listen", f"127.0.0.1:{port}",
            "--admin-listen", f"127.0.0.1:{admin_port}", "--admin-token", TOKEN]
    with running_server(args, port):
        yield f"http://127.0.0.1:{admin_port}"


def admin(base: str, method: str, path: str) -> tuple[int, dict]:
    request = urllib.request.Request(base + path, method=method, data=b"" if method == "POST" else None,
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=600) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def active(base: str) -> str:
    status, body = admin(base, "GET", "/admin/models")
    assert status == 200, body
    return next(m["active_version"] for m in body["models"] if m["name"] == "smollm2")


def gate_records(base: str) -> dict[str, dict]:
    _, body = admin(base, "GET", "/admin/models")
    return {q["version"]: q for q in body["quality"]["smollm2"] if q["suite"] == "gate"}


def test_a_degraded_version_is_refused_and_a_requantization_accepted(server):
    assert active(server) == "1"
    status, body = admin(server, "POST", "/admin/models/smollm2/versions/3/activate")
    assert status == 409, body
    message = body["error"]["message"]
    records = gate_records(server)
    base, degraded = records["1"], records["3"]
    print(f"\nGATE acc v1 {base['acc']:.3f} v3 {degraded['acc']:.3f} (n {base['n']})")
    assert base["n"] == degraded["n"] == GATE_ITEMS
    assert degraded["acc"] < base["acc"] - 0.02
    assert f"{degraded['acc']:.4f}" in message and f"{base['acc']:.4f}" in message, message
    assert "smollm2@3" in message and "smollm2@1" in message and "force" in message
    assert active(server) == "1"

    status, body = admin(server, "POST", "/admin/models/smollm2/versions/2/activate")
    assert status == 200, body
    gate = body["quality_gate"]
    assert gate["forced"] is False and gate["candidate"]["n"] == GATE_ITEMS
    assert gate["candidate"]["acc"] >= gate["active"]["acc"] - 0.02
    assert active(server) == "2"

    status, body = admin(server, "POST", "/admin/models/smollm2/versions/3/activate?force=true")
    assert status == 200, body
    assert body["quality_gate"]["forced"] is True
    assert active(server) == "3"
