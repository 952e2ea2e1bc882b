"""Tenants apart in the prompt cache (issue 37): the real binary, SmolLM2, a
policy of four tenants with API keys, and the official `openai` client.

The probe of Gu et al. ("Auditing Prompt Caching in Language Model APIs"):
tenant A sends a confidential ~1,500-token system prompt; tenant B then
sends guesses. B's right guess must get `cached_tokens: 0` and a time to
first token like a miss, while A's own repeat still hits. Tenants whose
policy entries name one `cache_scope` share their blocks; a different
`cache_salt` (vLLM's field) misses even within one tenant. The admin API's
metrics show what each scope holds; the public `/metrics` names no scope.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from serve_process import free_port, running_server

KEYS = {"a": "sk-tenant-a", "b": "sk-tenant-b", "c": "sk-tenant-c", "d": "sk-tenant-d"}
ADMIN_TOKEN = "cache-scope-admin-token"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


POLICY = f"""\
[routing]
allow_anonymous = false

[[models]]
name = "smol"
version = "v1"
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0002
quality = 0.5
context_limit = 8192

[[tenants]]
name = "a"
api_keys = ["sha256:{sha(KEYS["a"])}"]

[[tenants]]
name = "b"
api_keys = ["sha256:{sha(KEYS["b"])}"]

[[tenants]]
name = "c"
api_keys = ["sha256:{sha(KEYS["c"])}"]
cache_scope = "team"

[[tenants]]
name = "d"
api_keys = ["sha256:{sha(KEYS["d"])}"]
cache_scope = "team"
"""


def memo(seed: int, figure: int) -> str:
    """A ~1,500-token memo; `figure` is the secret a guess gets right or wrong."""
    lines = [f"Confidential memo {seed}: the merger price is {figure} dollars per share."]
    lines += [
        f"Clause {i}: the {WORDS[(i + seed) % 12]} desk reviews {WORDS[(i * 7 + seed) % 12]} filings every {i % 5 + 1} days."
        for i in range(85)
    ]
    return " ".join(lines)


@pytest.fixture(scope="module")
def server(switchyard_bin: Path, smollm2_path: Path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cache-scopes")
    policy = tmp / "policy.toml"
    policy.write_text(POLICY)
    settings = tmp / "serve.toml"
    settings.write_text(
        f'threads = 2\nmax_batch = 4\n[[models]]\npath = "{smollm2_path}"\nname = "smol"\nversion = "v1"\n'
    )
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--config", str(settings), "--policy", str(policy),
            "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}",
            "--drain-seconds", "5"]
    with running_server(args, port, env={"SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN}):
        yield {"base": f"http://127.0.0.1:{port}", "admin": f"http://127.0.0.1:{admin_port}"}


def client(server, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server["base"] + "/v1", api_key=KEYS[tenant], max_retries=0)


def ask(server, tenant: str, system: str, salt: str | None = None) -> tuple[int, float]:
    """(cached_tokens, seconds to the first content chunk) of one streamed chat."""
    extra = {"cache_salt": salt} if salt is not None else None
    started = time.perf_counter()
    stream = client(server, tenant).chat.completions.create(
        model="smol", max_tokens=2, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=extra,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "Summarize."}])
    ttft, usage = None, None
    for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - started
        if chunk.usage:
            usage = chunk.usage
    assert usage is not None and usage.prompt_tokens > 1024, usage
    return usage.prompt_tokens_details.cached_tokens, ttft if ttft is not None else time.perf_counter() - started


def test_another_tenants_right_guess_misses_like_a_wrong_one(server):
    secret = memo(1, 4211)
    assert ask(server, "a", secret)[0] == 0
    own, own_ttft = ask(server, "a", secret)
    assert own > 1024, "the same tenant's repeat hits"
    wrong, wrong_ttft = ask(server, "b", memo(1, 9377))
    right, right_ttft = ask(server, "b", secret)
    assert (wrong, right) == (0, 0)
    # A hit skips ~1,400 of ~1,500 prompt tokens: it answers many times
    # faster. A right guess must look like the wrong one, not like a hit.
    assert right_ttft > 0.5 * wrong_ttft, (own_ttft, wrong_ttft, right_ttft)
    assert right_ttft > 3 * own_ttft, (own_ttft, wrong_ttft, right_ttft)
    # B's own copy is B's to reuse now; A's blocks are still A's.
    assert ask(server, "b", secret)[0] > 1024
    assert ask(server, "a", secret)[0] > 1024


def test_tenants_naming_one_cache_scope_share_it(server):
    team = memo(2, 100)
    assert ask(server, "c", team)[0] == 0
    assert ask(server, "d", team)[0] > 1024
    assert ask(server, "a", team)[0] == 0


def test_a_different_cache_salt_misses_within_one_tenant(server):
    salted = memo(3, 55)
    assert ask(server, "a", salted, salt="alice")[0] == 0
    assert ask(server, "a", salted, salt="alice")[0] > 1024
    assert ask(server, "a", salted, salt="bob")[0] == 0
    assert ask(server, "a", salted)[0] == 0


def test_an_empty_cache_salt_is_refused_naming_the_field(server):
    with pytest.raises(openai.BadRequestError) as err:
        client(server, "a").chat.completions.create(
            model="smol", max_tokens=1, messages=[{"role": "user", "content": "hi"}],
            extra_body={"cache_salt": ""})
    assert err.value.body["param"] == "cache_salt"


def scrape(url: str, token: str | None = None) -> str:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as r:
        return r.read().decode()


def test_the_admin_api_shows_cache_use_per_scope_and_the_public_metrics_do_not(server):
    assert ask(server, "c", memo(4, 7))[0] == 0
    full = scrape(server["admin"] + "/admin/metrics", ADMIN_TOKEN)
    for scope in ("tenant:a", "tenant:b", "shared:team"):
        found = re.search(rf'^switchyard_prompt_cache_scope_blocks\{{cache_scope="{scope}"\}} (\S+)$', full, re.M)
        assert found and float(found.group(1)) > 0, scope
    assert 'switchyard_prompt_cache_scope_bytes{cache_scope="shared:team"}' in full
    public = scrape(server["base"] + "/metrics")
    assert "cache_scope=" not in public
    assert "switchyard_prompt_cache_blocks" in public


def test_the_admin_cache_endpoint_lists_each_scopes_blocks_bytes_and_hits(server):
    """`GET /admin/cache` (admin token): each scope owner's blocks and bytes in the
    prompt cache and the prompt tokens its lookups hit and missed; never a salt."""
    shared = memo(5, 31)
    assert ask(server, "c", shared, salt="secret-salt")[0] == 0
    assert ask(server, "c", shared, salt="secret-salt")[0] > 1024
    text = scrape(server["admin"] + "/admin/cache", ADMIN_TOKEN)
    assert "secret-salt" not in text
    scopes = {s["scope"]: s for s in json.loads(text)["scopes"]}
    assert "shared:team" in scopes and all(s.startswith(("tenant:", "shared:"))
                                           for s in scopes), scopes
    team = scopes["shared:team"]
    assert team["blocks"] > 0 and team["bytes"] > 0, team
    assert team["hit_tokens"] > 1024 and team["miss_tokens"] > 1024, team
    with pytest.raises(urllib.error.HTTPError) as err:
        scrape(server["admin"] + "/admin/cache")
    assert err.value.code == 401
