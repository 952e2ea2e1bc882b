"""End-to-end tests of policy routing through a real `switchyard serve`, with the
official `openai` client, the `switchyard policy` CLI and the admin API.

Three checkpoints are served from one settings file: SmolLM2 as `smol@v1` and again as
`smol-large@v1`, and a synthetic checkpoint (`switchyard synth`, 256-token context) as
`smol-canary@v2`, the canary arm of a split on `smol` (a cross-model arm: the engine only
takes versions of one model that share a vocabulary). The policy layer asks the engine for
`name@version`. The policy declares an 8192-token context for the canary, so long prompts
routed to it fail in the engine: that is how the canary's error rate rises for real.

See conftest.py for SWITCHYARD_BIN and SWITCHYARD_MODEL.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from serve_process import free_port, running_server

ACME_KEY = "sk-acme-e2e"
TINY_KEY = "sk-tiny-e2e"
ADMIN_TOKEN = "admin-e2e-token-0123"
MAX_TOKENS = 4
# Long enough to overflow the synthetic canary's 256-token context whatever its
# tokenizer does, short enough for SmolLM2 to prefill quickly.
LONG_PROMPT = "Summarize: " + " ".join(f"item{i}" for i in range(300))


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


POLICY = f"""\
[routing]
quality_weight = 1.0
cost_weight = 100.0
latency_weight = 0.0
allow_anonymous = false

[[models]]
name = "smol"
version = "v1"
aliases = ["cheap"]
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0002
quality = 0.5
context_limit = 8192

# Reached through the split on `smol` (its lower quality keeps `auto` off it).
[[models]]
name = "smol-canary"
version = "v2"
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0002
quality = 0.45
context_limit = 8192

[[models]]
name = "smol-large"
version = "v1"
cost_per_1k_input = 0.01
cost_per_1k_output = 0.02
quality = 0.9
context_limit = 8192

[[tenants]]
name = "acme"
api_keys = ["sha256:{sha(ACME_KEY)}"]

[[tenants]]
name = "tiny"
api_keys = ["sha256:{sha(TINY_KEY)}"]
allowed_models = ["smol"]

[[tenants.budgets]]
window = "1h"
limit_tokens = 60

[[splits]]
name = "smol-canary"
model = "smol"
sticky = "user"
arms = [
  {{ name = "stable", target = "smol@v1", weight = 50 }},
  {{ name = "canary", target = "smol-canary@v2", weight = 50 }},
]

[splits.rollback]
baseline = "stable"
candidate = "canary"
window = "10m"
min_samples = 3
max_error_rate_increase = 0.3
"""

# The line and column of `quality = 0.9` (smol-large) in POLICY, for the broken edit.
QUALITY_LINE = POLICY.splitlines().index("quality = 0.9") + 1



def http(method: str, url: str, token: str | None = None, body: bytes | None = None):
    """(status, parsed JSON or text) of one request."""
    request = urllib.request.Request(url, data=body, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


@pytest.fixture(scope="module")
def deployment(switchyard_bin: Path, smollm2_path: Path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("policy")
    canary = tmp / "canary.gguf"
    subprocess.run(
        [str(switchyard_bin), "synth", "--preset", "smollm2", "--dtype", "q8_0", "--out", str(canary)],
        check=True, capture_output=True,
    )
    policy = tmp / "policy.toml"
    policy.write_text(POLICY)
    settings = tmp / "serve.toml"
    settings.write_text(
        "threads = 2\nmax_batch = 4\n"
        f'[[models]]\npath = "{smollm2_path}"\nname = "smol"\nversion = "v1"\n'
        f'[[models]]\npath = "{canary}"\nname = "smol-canary"\nversion = "v2"\n'
        f'[[models]]\npath = "{smollm2_path}"\nname = "smol-large"\nversion = "v1"\n'
    )
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--config", str(settings), "--policy", str(policy),
            "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}",
            "--drain-seconds", "5"]
    with running_server(args, port, env={"SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN}):
        yield {
            "base": f"http://127.0.0.1:{port}",
            "admin": f"http://127.0.0.1:{admin_port}",
            "policy": policy,
            "bin": switchyard_bin,
            "tmp": tmp,
        }


def client(deployment, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=deployment["base"] + "/v1", api_key=key, max_retries=0)


def admin(deployment, method: str, path: str, body: bytes | None = None):
    return http(method, deployment["admin"] + path, ADMIN_TOKEN, body)


def explain(deployment, body: dict, headers: dict) -> dict:
    req = deployment["tmp"] / "req.json"
    req.write_text(json.dumps(body))
    args = [str(deployment["bin"]), "policy", "explain", str(deployment["policy"]),
            "--request", str(req), "--json"]
    for name, value in headers.items():
        args += ["--header", f"{name}: {value}"]
    out = subprocess.run(args, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    "model,user,hints",
    [
        ("auto", "alice", {}),
        ("auto", "alice", {"x-switchyard-max-cost": "0.00005"}),
        ("auto", "bob", {"x-switchyard-min-quality": "0.8"}),
        ("cheap", "carol", {}),
        ("smol", "dave", {"x-switchyard-tags": "chat"}),
        ("smol-large@v1", "erin", {}),
    ],
)
def test_hints_route_as_explain_predicts(deployment, model, user, hints):
    messages = [{"role": "user", "content": "Name a colour."}]
    body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "user": user}
    predicted = explain(deployment, body, {"authorization": f"Bearer {ACME_KEY}", **hints})
    pick = predicted["pick"]
    assert pick is not None, predicted

    raw = client(deployment, ACME_KEY).chat.completions.with_raw_response.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, user=user, extra_headers=hints,
    )
    completion = raw.parse()
    assert raw.headers["x-switchyard-model"] == pick["model"]
    assert raw.headers["x-switchyard-version"] == pick["version"]
    assert without_latency(raw.headers["x-switchyard-route"]) == without_latency(pick["explanation"])
    assert float(raw.headers["x-switchyard-cost"]) == pytest.approx(pick["estimated_cost"], abs=1e-6)
    assert completion.model == f"{pick['model']}@{pick['version']}"
    assert completion.usage.completion_tokens <= MAX_TOKENS


def test_streamed_requests_are_routed_and_unknown_keys_refused(deployment):
    with client(deployment, ACME_KEY).chat.completions.with_streaming_response.create(
        model="auto", messages=[{"role": "user", "content": "Hi"}], max_tokens=MAX_TOKENS,
        stream=True, extra_headers={"x-switchyard-min-quality": "0.8"},
    ) as response:
        assert response.headers["x-switchyard-model"] == "smol-large"
        chunks = list(response.parse())
    assert chunks and all(c.model == "smol-large@v1" for c in chunks)

    with pytest.raises(openai.AuthenticationError) as err:
        client(deployment, "sk-nobody").chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Hi"}], max_tokens=MAX_TOKENS)
    assert "not known to the routing policy" in str(err.value)

    with pytest.raises(openai.PermissionDeniedError) as err:
        client(deployment, TINY_KEY).chat.completions.create(
            model="smol-large", messages=[{"role": "user", "content": "Hi"}], max_tokens=MAX_TOKENS)
    assert "tenant `tiny` may not use this model" in str(err.value)


def test_exhausted_budget_gets_429_with_a_clear_message(deployment):
    tiny = client(deployment, TINY_KEY)
    served = 0
    for _ in range(10):
        try:
            tiny.chat.completions.create(
                model="smol@v1", messages=[{"role": "user", "content": "Say hi."}],
                max_tokens=MAX_TOKENS)
            served += 1
        except openai.RateLimitError as err:
            error = err.response.json()["error"]
            assert error["message"].startswith("Budget exhausted"), error
            assert "budget `tokens per 3600s` has" in error["message"], error
            assert error["code"] == "budget_exhausted"
            break
    else:
        pytest.fail("the 60-token budget never ran out")
    assert served >= 1, "the first request should fit the budget"
    status, policy = admin(deployment, "GET", "/admin/policy")
    assert status == 200
    budget = next(t for t in policy["tenants"] if t["name"] == "tiny")["budgets"][0]
    # Charged the engine's real counts (chat template included), not the estimate.
    assert budget["settled"] > 10 * served
    assert budget["reserved"] == 0
    metrics = urllib.request.urlopen(deployment["base"] + "/metrics").read().decode()
    # Tenant names and spend are not public: the admin API serves them.
    assert 'tenant="tiny"' not in metrics
    assert 'switchyard_policy_rejected_total{constraint="budget"}' in metrics
    request = urllib.request.Request(
        deployment["admin"] + "/admin/metrics",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    full = urllib.request.urlopen(request).read().decode()
    assert 'switchyard_policy_spend_tokens_total{tenant="tiny"}' in full


def test_failing_canary_is_rolled_back_automatically(deployment):
    acme = client(deployment, ACME_KEY)
    outcomes = []
    rolled_back = False
    for i in range(40):
        try:
            raw = acme.chat.completions.with_raw_response.create(
                model="smol", messages=[{"role": "user", "content": LONG_PROMPT}],
                max_tokens=1, user=f"user-{i}")
            headers, ok = raw.headers, True
        except openai.BadRequestError as err:
            headers, ok = err.response.headers, False
            assert "context length" in str(err)
        outcomes.append((headers["x-switchyard-model"] + "@" + headers["x-switchyard-version"], ok))
        if "rolled back" in headers["x-switchyard-route"]:
            rolled_back = True
            break
    assert rolled_back, f"no rollback after {outcomes}"
    assert all(ok == (arm == "smol@v1") for arm, ok in outcomes[:-1]), outcomes
    assert any(arm == "smol-canary@v2" and not ok for arm, ok in outcomes), outcomes

    # Every user is on the stable arm now, and the admin API says why.
    for i in range(4):
        raw = acme.chat.completions.with_raw_response.create(
            model="smol", messages=[{"role": "user", "content": "Hi"}],
            max_tokens=1, user=f"late-{i}")
        assert raw.headers["x-switchyard-model"] == "smol"
    status, policy = admin(deployment, "GET", "/admin/policy")
    rollback = policy["rollback"][0]
    assert rollback["state"]["state"] == "rolled_back", rollback
    assert "error rate of arm `canary`" in rollback["state"]["reason"]
    # Earlier tests' short prompts succeeded on the canary; these long ones failed.
    assert rollback["candidate"]["samples"] >= 3 and rollback["candidate"]["errors"] >= 1
    assert rollback["baseline"]["errors"] == 0
    metrics = urllib.request.urlopen(deployment["base"] + "/metrics").read().decode()
    assert 'switchyard_policy_rollback_tripped{split="smol-canary"} 1' in metrics
    assert 'reason="rolled_back"' in metrics
    assert 'switchyard_policy_split_arm_total{split="smol-canary",arm="canary"}' in metrics

    status, _ = admin(deployment, "POST", "/admin/policy/splits/smol-canary/reset")
    assert status == 200
    status, policy = admin(deployment, "GET", "/admin/policy")
    assert policy["rollback"][0]["state"]["state"] == "watching"


def route_of(deployment) -> tuple[str, str]:
    raw = client(deployment, ACME_KEY).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "Hi"}], max_tokens=1, user="alice")
    return raw.headers["x-switchyard-model"], without_latency(raw.headers["x-switchyard-route"])


def without_latency(route: str) -> str:
    """A route explanation without its expected latency: the server estimates it
    from live engine state (recent step time, queues), `explain` from an idle engine."""
    return re.sub(r"latency \d+ ms", "latency (live) ms", route)


def test_broken_policy_edit_changes_nothing(deployment):
    path = deployment["policy"]
    before = route_of(deployment)
    status, shown = admin(deployment, "GET", "/admin/policy")
    generation = shown["generation"]

    # A broken edit: the watcher refuses it and keeps the old policy.
    broken = POLICY.replace("quality = 0.9", "quality = 1.95")
    path.write_text(broken)
    where = f"{path}:{QUALITY_LINE}:11:"
    deadline = time.time() + 120  # a guard against a hang, not a bound on the watcher
    while time.time() < deadline:
        status, shown = admin(deployment, "GET", "/admin/policy")
        if shown["last_reload_error"]:
            break
        time.sleep(0.2)
    assert shown["last_reload_error"] and where in shown["last_reload_error"], shown
    assert shown["generation"] == generation
    assert route_of(deployment) == before

    # The admin reload says the same, with line and column, and changes nothing.
    status, reply = admin(deployment, "POST", "/admin/policy/reload")
    assert status == 422, reply
    assert where in reply["error"]["message"]
    assert reply["error"]["diagnostics"][0]["line"] == QUALITY_LINE
    status, reply = admin(deployment, "POST", "/admin/policy/reload", broken.encode())
    assert status == 422 and f"admin-request:{QUALITY_LINE}:11:" in reply["error"]["message"]
    assert admin(deployment, "GET", "/admin/policy")[1]["generation"] == generation
    assert route_of(deployment) == before
    check = subprocess.run([str(deployment["bin"]), "policy", "check", str(path)],
                           capture_output=True, text=True)
    assert check.returncode != 0 and where in check.stderr + check.stdout

    # A good edit goes live: smol-large's quality drops, so `auto` now picks smol.
    path.write_text(POLICY.replace("quality = 0.9", "quality = 0.4"))
    deadline = time.time() + 120  # a guard against a hang, not a bound on the watcher
    while time.time() < deadline:
        status, shown = admin(deployment, "GET", "/admin/policy")
        if shown["generation"] > generation:
            break
        time.sleep(0.2)
    assert shown["generation"] == generation + 1, shown
    assert shown["last_reload_error"] is None
    assert route_of(deployment)[0] == "smol"
    path.write_text(POLICY)


def test_admin_api_needs_its_token(deployment):
    status, reply = http("GET", deployment["admin"] + "/admin/policy")
    assert status == 401 and reply["error"]["code"] == "missing_admin_token"
    status, reply = http("GET", deployment["admin"] + "/admin/policy", "wrong")
    assert status == 401 and reply["error"]["code"] == "invalid_admin_token"
    status, reply = http("GET", deployment["admin"] + "/admin/models", "wrong")
    assert status == 401 and reply["error"]["code"] == "invalid_admin_token"
    status, reply = admin(deployment, "GET", "/admin/models")
    assert status == 200 and {m["name"] for m in reply["models"]} >= {"smol", "smol-canary"}
