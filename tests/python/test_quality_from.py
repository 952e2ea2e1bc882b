"""`quality_from` in a routing policy, end to end on the real SmolLM2.

A policy model takes its quality from a suite's measurement stored with the
repository (`switchyard eval --save`) instead of a typed number:

- before any measurement, the declared figure routes and `/admin/policy`
  says the measurement is missing;
- storing one (while the server runs) is picked up without a restart: the
  model's quality becomes the measured accuracy, marked fresh with its n;
- editing the suite makes the record stale: the declared figure routes
  again, and `policy explain --repo` says why.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from serve_process import free_port, running_server

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "quality-from-admin-token"

POLICY = """
[routing]
allow_anonymous = true

[[models]]
name = "smollm2"
versions = ["1", "2"]
active_version = "1"
cost_per_1k_input = 0.00002
cost_per_1k_output = 0.00004
quality = 0.123
quality_from = "mini"
context_limit = 8192
"""


def run(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def setup(switchyard_bin: Path, smollm2_path: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("quality-from")
    repo = out / "repo"
    run(switchyard_bin, "demo-repo", repo, "--base", smollm2_path, "--derived", "0")
    suite = out / "mini.jsonl"
    suite.write_text("\n".join((ROOT / "evals" / "geo.jsonl").read_text().splitlines()[:10]) + "\n")
    policy = out / "policy.toml"
    policy.write_text(POLICY)
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--repo", str(repo), "--policy", str(policy),
            "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}",
            "--admin-token", TOKEN]
    with running_server(args, port):
        yield repo, suite, policy, f"http://127.0.0.1:{admin_port}"


def smollm2(admin: str) -> dict:
    request = urllib.request.Request(admin + "/admin/policy", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        body = json.load(r)
    return next(m for m in body["models"] if m["name"] == "smollm2")


def wait_for(admin: str, check, what: str, within: float = 20.0) -> dict:
    deadline = time.time() + within
    while True:
        model = smollm2(admin)
        if check(model):
            return model
        if time.time() > deadline:
            pytest.fail(f"{what} not seen within {within} s: {model}")
        time.sleep(0.25)


def test_measured_quality_routes_hot_reloads_and_goes_stale(switchyard_bin, setup, tmp_path):
    repo, suite, policy, admin = setup
    model = smollm2(admin)
    origin = model["quality_from"][0]
    assert model["quality"] == 0.123
    assert (origin["suite"], origin["version"], origin["basis"]) == ("mini", "1", "declared")
    assert origin["measurement"]["state"] == "missing" and "no measurement of smollm2@1" in origin["measurement"]["why"]

    measured = json.loads(run(switchyard_bin, "eval", "--repo", repo, "--model", "smollm2@1", "--suite", suite,
                              "--json", "--save").stdout)
    model = wait_for(admin, lambda m: m["quality_from"][0]["basis"] == "measured", "the stored measurement")
    origin = model["quality_from"][0]
    assert model["quality"] == measured["acc"]
    assert origin["measurement"]["state"] == "fresh"
    assert origin["measurement"]["measured"]["n"] == 10
    assert origin["measurement"]["measured"]["ci95"] == measured["ci95"]

    request = tmp_path / "req.json"
    request.write_text(json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}]}))
    explained = run(switchyard_bin, "policy", "explain", policy, "--request", request, "--repo", repo).stdout
    assert f"smollm2@1 on `mini`: {measured['acc']:.3f}, measured (acc {measured['acc']:.3f}" in explained
    assert "n 10, fresh)" in explained

    # Another item: the stored record no longer describes this suite.
    suite.write_text(suite.read_text() + suite.read_text().splitlines()[0] + "\n")
    model = wait_for(admin, lambda m: m["quality_from"][0]["basis"] == "declared", "the stale record")
    assert model["quality"] == 0.123
    assert model["quality_from"][0]["measurement"]["why"] == "stale: the suite changed"
    explained = run(switchyard_bin, "policy", "explain", policy, "--request", request, "--repo", repo).stdout
    assert "smollm2@1 on `mini`: 0.123, declared figure used (" in explained
    assert "stale: the suite changed)" in explained
    # Without a repository nothing can be measured, and explain says so.
    explained = run(switchyard_bin, "policy", "explain", policy, "--request", request).stdout
    assert "no model repository to read measurements from" in explained
