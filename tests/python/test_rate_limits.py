"""Rate limits per tenant and per API key (issue 37), end to end: the real
binary, SmolLM2, a policy with limits, and the official `openai` client.

The n+1th request in a minute gets 429 with `Retry-After` and OpenAI's
`x-ratelimit-*` headers; every answer to a limited tenant carries them; a
reload through the admin API changes the limits at once and keeps the
counts; a key's own limit leaves the tenant's other keys alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from serve_process import free_port, running_server

KEYS = {"r": "sk-rate-r", "k1": "sk-rate-k1", "k2": "sk-rate-k2", "t": "sk-rate-t", "free": "sk-rate-free"}
ADMIN_TOKEN = "rate-limit-admin-token"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def policy(r_requests: int) -> str:
    return f"""\
[[models]]
name = "smol"
version = "v1"
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0002
quality = 0.5
context_limit = 8192

[[tenants]]
name = "r"
api_keys = ["sha256:{sha(KEYS["r"])}"]
rate_limits = {{ requests_per_minute = {r_requests} }}

[[tenants]]
name = "k"
api_keys = ["sha256:{sha(KEYS["k1"])}", "sha256:{sha(KEYS["k2"])}"]
key_rate_limits = {{ requests_per_minute = 1 }}

[[tenants]]
name = "t"
api_keys = ["sha256:{sha(KEYS["t"])}"]
rate_limits = {{ tokens_per_minute = 100 }}

[[tenants]]
name = "free"
api_keys = ["sha256:{sha(KEYS["free"])}"]
"""


@pytest.fixture(scope="module")
def server(switchyard_bin: Path, smollm2_path: Path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rate-limits")
    path = tmp / "policy.toml"
    path.write_text(policy(3))
    settings = tmp / "serve.toml"
    settings.write_text(
        f'threads = 2\n[[models]]\npath = "{smollm2_path}"\nname = "smol"\nversion = "v1"\n'
    )
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--config", str(settings), "--policy", str(path),
            "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}",
            "--drain-seconds", "5"]
    with running_server(args, port, env={"SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN}):
        yield {"base": f"http://127.0.0.1:{port}", "admin": f"http://127.0.0.1:{admin_port}", "policy": path}


def ask(server, key: str, max_tokens: int = 1):
    """The raw response of one short chat (headers and parsed body)."""
    client = openai.OpenAI(base_url=server["base"] + "/v1", api_key=KEYS[key], max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model="smol", max_tokens=max_tokens, messages=[{"role": "user", "content": "Hi"}])


def test_the_request_past_the_limit_gets_429_with_the_headers_and_a_reload_applies_at_once(server):
    for remaining in (2, 1, 0):
        raw = ask(server, "r")
        assert raw.headers["x-ratelimit-limit-requests"] == "3"
        assert raw.headers["x-ratelimit-remaining-requests"] == str(remaining)
        assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
        raw.parse()
    with pytest.raises(openai.RateLimitError) as err:
        ask(server, "r")
    response = err.value.response
    assert 1 <= int(response.headers["retry-after"]) <= 60
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert response.headers["x-ratelimit-limit-requests"] == "3"
    assert err.value.code == "rate_limit_exceeded"
    assert "requests per minute: limit 3" in err.value.message

    # Raised without a restart: the 3 requests of this minute still count. The
    # file is edited too (the admin reload re-reads it), so that the file
    # watcher, whenever it looks, finds the same policy.
    server["policy"].write_text(policy(5))
    request = urllib.request.Request(server["admin"] + "/admin/policy/reload", data=b"",
                                     method="POST", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.status == 200, json.loads(r.read())
    raw = ask(server, "r")
    assert raw.headers["x-ratelimit-limit-requests"] == "5"
    assert raw.headers["x-ratelimit-remaining-requests"] == "1"


def test_a_keys_limit_leaves_the_tenants_other_keys_alone(server):
    assert ask(server, "k1").headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError):
        ask(server, "k1")
    assert ask(server, "k2").headers["x-ratelimit-limit-requests"] == "1"


def test_tokens_per_minute_count_the_prompt_and_max_tokens(server):
    raw = ask(server, "t", max_tokens=20)
    assert raw.headers["x-ratelimit-limit-tokens"] == "100"
    used = 100 - int(raw.headers["x-ratelimit-remaining-tokens"])
    assert used >= 20
    with pytest.raises(openai.RateLimitError) as err:
        ask(server, "t", max_tokens=95)
    assert "tokens per minute: limit 100" in err.value.message
    assert "x-ratelimit-reset-tokens" in err.value.response.headers


def test_a_tenant_without_limits_gets_no_rate_limit_headers(server):
    raw = ask(server, "free")
    assert not [h for h in raw.headers if h.startswith("x-ratelimit-")]


def test_a_broken_limit_is_refused_with_its_line(server):
    broken = policy(3).replace("requests_per_minute = 3", "requests_per_minute = 0")
    request = urllib.request.Request(server["admin"] + "/admin/policy/reload", data=broken.encode(),
                                     method="POST", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=30)
    assert err.value.code == 422
    assert "rate_limits.requests_per_minute must be above 0" in err.value.read().decode()


@pytest.fixture
def redis_port(tmp_path):
    """A Redis server on a loopback port (Debian's `redis-server`, which
    scripts/setup.sh installs), stopped after the test."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: run scripts/setup.sh (Debian redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir",
                             str(tmp_path), "--save", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60  # a guard against a hang: it starts in milliseconds
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                             text=True).stdout.strip() != "PONG":
            assert time.time() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_two_instances_on_one_redis_share_a_tenants_limit(switchyard_bin: Path,
                                                          smollm2_path: Path, tmp_path,
                                                          redis_port):
    """Issue 37: with the spend ledger in Redis, rate limits are counted there too, so
    two instances hold tenant `r` to one limit of 3 requests a minute, not 3 each."""
    path = tmp_path / "policy.toml"
    path.write_text(policy(3))
    settings = tmp_path / "serve.toml"
    settings.write_text(
        f'threads = 1\n[[models]]\npath = "{smollm2_path}"\nname = "smol"\nversion = "v1"\n'
    )
    url = f"redis://127.0.0.1:{redis_port}/0"
    with contextlib.ExitStack() as stack:
        bases = []
        for _ in range(2):
            port = free_port()
            args = [str(switchyard_bin), "serve", "--config", str(settings), "--policy",
                    str(path), "--listen", f"127.0.0.1:{port}", "--ledger", url,
                    "--drain-seconds", "5"]
            stack.enter_context(running_server(args, port))
            bases.append({"base": f"http://127.0.0.1:{port}"})
        # The windows are clock minutes: start well inside one.
        if time.time() % 60 > 45:
            time.sleep(61 - time.time() % 60)
        first, second = bases
        remaining = [ask(server, "r").headers["x-ratelimit-remaining-requests"]
                     for server in (first, second, first)]
        assert remaining == ["2", "1", "0"]
        for server in (second, first):
            with pytest.raises(openai.RateLimitError) as err:
                ask(server, "r")
            assert err.value.response.headers["x-ratelimit-remaining-requests"] == "0"
            assert 1 <= int(err.value.response.headers["retry-after"]) <= 60
