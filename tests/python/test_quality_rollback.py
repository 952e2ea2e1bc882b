"""A split's rollback rule acting on quality, end to end on the real SmolLM2.

A repository from `switchyard demo-repo` holds the base (v1); the test adds
v3, the base with noise multiplied into its norm weights (as
test_quality_gate.py does). A policy splits `smollm2` 50/50 between
`stable` (smollm2@1) and `canary` (smollm2@3), and its rollback rule names
only quality signals, so errors and latency cannot trip it:

- client scores (`POST /v1/feedback`): the canary's answers scored 0, the
  stable's 1, past `min_samples` each, roll the canary back; the reason,
  the arms' feedback means and the metrics say so, and every request then
  goes to the stable arm;
- the engine's confidence (mean token log-probability of each answer, no
  client involved): the degraded canary's answers are less sure, and
  `max_confidence_drop` rolls it back;
- stored evaluations (`eval_suite`, `max_eval_drop`): once `switchyard eval
  --save` has measured both versions, the server re-reads the records and
  rolls the canary back without a single request.

Each case installs its own rule (a changed rule starts a fresh monitor).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from serve_process import free_port, running_server

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "quality-rollback-admin-token"
PROMPTS = ["Name a country in Africa.", "What is the capital of France?", "Say hello.",
           "Name a color.", "What is 2 + 2?", "Name an animal.", "Name a fruit.", "Say goodbye."]


def degrade(path: Path) -> None:
    """Noise into every norm weight (f32) of the GGUF at `path`, in place."""
    reader = GGUFReader(path, "r+")
    rng = np.random.default_rng(0)
    for tensor in reader.tensors:
        if tensor.name.endswith(("attn_norm.weight", "ffn_norm.weight")):
            data = tensor.data
            data[:] = data * (1 + 0.5 * rng.standard_normal(data.shape)).astype(np.float32)


def policy(rule: str) -> str:
    return f"""
[routing]
allow_anonymous = true

[[models]]
name = "smollm2"
versions = ["1", "3"]
active_version = "1"
cost_per_1k_input = 0.00002
cost_per_1k_output = 0.00004
quality = 0.4
context_limit = 2048

[[splits]]
name = "rollout"
model = "smollm2"
sticky = "user"
arms = [
  {{ name = "stable", target = "smollm2@1", weight = 50 }},
  {{ name = "canary", target = "smollm2@3", weight = 50 }},
]

[splits.rollback]
baseline = "stable"
candidate = "canary"
window = "10m"
{rule}
"""


def run(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def server(switchyard_bin: Path, smollm2_path: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("quality-rollback")
    repo = out / "repo"
    run(switchyard_bin, "demo-repo", repo, "--base", smollm2_path, "--derived", "0")
    model = repo / "smollm2"
    (model / "3").mkdir()
    shutil.copy(model / "1" / smollm2_path.name, model / "3" / "degraded.gguf")
    degrade(model / "3" / "degraded.gguf")
    policy_file = out / "policy.toml"
    policy_file.write_text(policy("min_samples = 1000\nmax_feedback_drop = 0.5"))
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--repo", str(repo), "--policy", str(policy_file),
            "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}",
            "--admin-token", TOKEN, "--speculate", "off"]
    with running_server(args, port):
        server = {"base": f"http://127.0.0.1:{port}", "admin": f"http://127.0.0.1:{admin_port}",
                  "policy": policy_file, "repo": repo}
        status, body = admin(server, "POST", "/admin/models/smollm2/versions/3/load")
        assert status == 200, body
        yield server


def admin(server: dict, method: str, path: str) -> tuple[int, dict]:
    request = urllib.request.Request(server["admin"] + path, method=method,
                                     data=b"" if method == "POST" else None,
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=600) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def post(url: str, body: dict) -> tuple[int, dict, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, {}, json.load(e)


def ask(server: dict, user: str, prompt: str) -> tuple[dict, dict]:
    status, headers, body = post(server["base"] + "/v1/chat/completions", {
        "model": "smollm2", "max_tokens": 12, "temperature": 0, "user": user,
        "messages": [{"role": "user", "content": prompt}]})
    assert status == 200, body
    return headers, body


def install(server: dict, rule: str) -> None:
    """Writes a new rule and waits until the server serves it, watching."""
    server["policy"].write_text(policy(rule))
    deadline = time.time() + 30
    while True:
        status, body = admin(server, "GET", "/admin/policy")
        assert status == 200, body
        if body.get("source") and rule_installed(body, rule):
            return
        if time.time() > deadline:
            pytest.fail(f"rule {rule!r} not installed: {body.get('last_error')}")
        time.sleep(0.25)


def rule_installed(body: dict, rule: str) -> bool:
    """Whether the served rule is `rule` (its `key = value` lines) and watching."""
    served = body["splits"][0]["rollback"]
    wanted = dict(line.split(" = ") for line in rule.splitlines())
    return (body["rollback"][0]["state"]["state"] == "watching"
            and all(str(served[k]) == v.strip('"') for k, v in wanted.items()))


def rollback_status(server: dict) -> dict:
    status, body = admin(server, "GET", "/admin/policy")
    assert status == 200, body
    return body["rollback"][0]


def metrics(server: dict) -> str:
    with urllib.request.urlopen(server["base"] + "/metrics", timeout=30) as r:
        return r.read().decode()


def arm_of(headers: dict) -> str:
    return "canary" if headers["x-switchyard-version"] == "3" else "stable"


def test_client_scores_roll_a_worse_canary_back(server):
    install(server, "min_samples = 3\nmax_feedback_drop = 0.5")
    scored = {"stable": 0, "canary": 0}
    for i in range(40):
        headers, body = ask(server, f"fb-{i}", PROMPTS[i % len(PROMPTS)])
        if "rolled back" in headers["x-switchyard-route"]:
            break
        arm = arm_of(headers)
        score = 1.0 if arm == "stable" else 0.0
        status, _, reply = post(server["base"] + "/v1/feedback", {"id": body["id"], "score": score})
        assert status == 200, reply
        assert reply["arm"] == f"rollout/{arm}", reply
        scored[arm] += 1
        if rollback_status(server)["state"]["state"] == "rolled_back":
            break
    rollback = rollback_status(server)
    assert rollback["state"]["state"] == "rolled_back", (scored, rollback)
    assert rollback["state"]["signal"] == "feedback", rollback
    assert "mean client score of arm `canary` is 0.000 against 1.000 on `stable`" in rollback["state"]["reason"]
    assert rollback["candidate"]["feedback"]["n"] >= 3 and rollback["baseline"]["feedback"]["n"] >= 3
    # Errors and latency stayed out of it: both arms answered every request.
    assert rollback["candidate"]["errors"] == 0 and rollback["baseline"]["errors"] == 0
    text = metrics(server)
    assert 'switchyard_policy_rollback_tripped{split="rollout"} 1' in text
    assert 'switchyard_policy_rollbacks_total{split="rollout",signal="feedback"} 1' in text
    for i in range(4):
        headers, _ = ask(server, f"after-{i}", "Say hi.")
        assert headers["x-switchyard-version"] == "1", headers
        assert "rolled back" in headers["x-switchyard-route"], headers


def test_less_sure_answers_roll_the_canary_back_without_any_client_score(server):
    install(server, "min_samples = 4\nmax_confidence_drop = 0.3")
    for i in range(60):
        headers, _ = ask(server, f"conf-{i}", PROMPTS[i % len(PROMPTS)])
        if "rolled back" in headers["x-switchyard-route"]:
            break
    rollback = rollback_status(server)
    assert rollback["state"]["state"] == "rolled_back", rollback
    assert rollback["state"]["signal"] == "confidence", rollback
    base, cand = rollback["baseline"]["confidence"], rollback["candidate"]["confidence"]
    print(f"\nCONFIDENCE stable {base['mean']:.3f} (n {base['n']}) canary {cand['mean']:.3f} (n {cand['n']})")
    assert base["mean"] - cand["mean"] > 0.3 and cand["ci95"][1] < base["ci95"][1]
    assert rollback["candidate"]["feedback"] is None
    assert 'switchyard_policy_rollbacks_total{split="rollout",signal="confidence"} 1' in metrics(server)


def test_stored_evaluations_roll_the_canary_back(switchyard_bin, server, tmp_path):
    suite = server["repo"] / "smollm2" / "rollout.jsonl"
    suite.write_text("\n".join((ROOT / "evals" / "geo.jsonl").read_text().splitlines()[:60]) + "\n")
    install(server, "min_samples = 1000\neval_suite = \"rollout\"\nmax_eval_drop = 0.05")
    acc = {}
    for version in ("1", "3"):
        out = run(switchyard_bin, "eval", "--repo", server["repo"], "--model", f"smollm2@{version}",
                  "--suite", suite, "--json", "--save")
        acc[version] = json.loads(out.stdout)["acc"]
    print(f"\nEVAL rollout acc v1 {acc['1']:.3f} v3 {acc['3']:.3f}")
    assert acc["1"] - acc["3"] > 0.05
    deadline = time.time() + 30
    while rollback_status(server)["state"]["state"] != "rolled_back":
        if time.time() > deadline:
            pytest.fail(f"no rollback on the stored evaluations: {rollback_status(server)}")
        time.sleep(0.25)
    state = rollback_status(server)["state"]
    assert state["signal"] == "eval", state
    assert f"accuracy of arm `canary` (smollm2@3) on `rollout` is {acc['3']:.3f} (n 60)" in state["reason"]
    assert f"against {acc['1']:.3f} (n 60) on `stable` (smollm2@1)" in state["reason"]
    headers, _ = ask(server, "after-eval", "Say hi.")
    assert headers["x-switchyard-version"] == "1" and "rolled back" in headers["x-switchyard-route"]
