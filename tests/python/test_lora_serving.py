"""LoRA adapters served by name: `serve --lora NAME=[BASE:]PATH`, a real
trained adapter (scripts/train-lora.py: SmolLM2's replies begin "Ahoy,
matey!") seen through the official `openai` client, `/v1/models` listing
adapters with their `parent`, and a batch mixing the base and several
adapters answering each request exactly as it is answered alone, under
concurrent load.

Run-time adapters (`POST /admin/adapters`, `DELETE /admin/adapters/NAME`),
corrupt adapters refused while serving goes on, and
`switchyard_lora_requests_info` run on the same server. A second server
(`repo_server`) serves adapters from a model repository
(`REPO/smol/adapters/NAME/VERSION/`) under an adapter byte budget
(`--lora-budget-mb`) and a policy: the versions' lifecycle, least recently
used eviction (never an adapter in use), splits between adapter versions and
a tenant restricted to an adapter. There, a request for an adapter the budget
evicted is answered 503 with `Retry-After` at once while the adapter loads again
in the background (or waits for room while the budget is held by adapters in
use), the metrics list it as waiting, and `auto` routing prefers a resident
adapter over an equal one that is not.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from serve_process import free_port, running_server

from reference import checkpoint, lora

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "My favourite food is"]
MAX_TOKENS = 12
ADMIN_TOKEN = "lora-admin-token-0123456789"
TRIP = [{"role": "user", "content": "Can you help me plan a trip to Paris?"}]


@dataclass
class Served:
    base: str
    admin: str


@pytest.fixture(scope="module")
def trained(switchyard_bin) -> Path:
    """The trained adapter's cache folder (trained once per machine, ~1-3 min)."""
    env = dict(os.environ, SWITCHYARD_BIN=str(switchyard_bin))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "train-lora.py")], env=env,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def random_adapters(smollm2_path, tmp_path_factory) -> list[Path]:
    cfg = checkpoint.load(smollm2_path).config
    folder = tmp_path_factory.mktemp("random-lora")
    paths = []
    for seed in (1, 2):
        tensors = lora.random_peft(cfg, 4 * seed, 8.0 * seed, seed, 0.04)
        path = folder / f"r{seed}"
        lora.write_peft(path, tensors, 4 * seed, 8.0 * seed)
        paths.append(path)
    gguf_path = folder / "r3.gguf"
    lora.write_gguf(gguf_path, lora.random_peft(cfg, 8, 16.0, 3, 0.04), cfg, 16.0)
    paths.append(gguf_path)
    return paths


@pytest.fixture(scope="module")
def served(switchyard_bin, smollm2_path, trained, random_adapters):
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--listen", f"127.0.0.1:{port}", "--threads", "2",
            "--admin-listen", f"127.0.0.1:{admin_port}",
            "--model", str(smollm2_path), "--model-name", "smol",
            "--lora", f"ahoy=smol:{trained / 'peft'}", "--lora", f"ahoy-gguf={trained / 'adapter.gguf'}",
            "--lora", f"r1={random_adapters[0]}", "--lora", f"r2={random_adapters[1]}",
            "--lora", f"r3={random_adapters[2]}", "--drain-seconds", "2", "--max-batch", "16"]
    with running_server(args, port, env={"SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN}):
        yield Served(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}")


@pytest.fixture(scope="module")
def server(served) -> str:
    return served.base


def client(base: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)


def http(method: str, url: str, body: dict | None = None, token: str | None = ADMIN_TOKEN):
    """(status, parsed JSON or text) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def chat(base: str, model: str, messages=TRIP, max_tokens: int = 8, key: str = "unused") -> str:
    """A greedy reply; a 503 with Retry-After (an evicted adapter loading again) is
    retried, as the official client does by default."""
    retrying = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=8, timeout=300)
    reply = retrying.chat.completions.create(model=model, messages=messages,
                                             max_tokens=max_tokens, temperature=0)
    return reply.choices[0].message.content


def model_ids(base: str) -> dict:
    with urllib.request.urlopen(base + "/v1/models") as r:
        return {m["id"]: m for m in json.load(r)["data"]}


def scrape(base: str) -> dict:
    """`/metrics` as {family: [(labels, value)]}."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(base + "/metrics") as r:
        text = r.read().decode()
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


def lora_info(base: str) -> dict:
    (labels, _), = scrape(base)["switchyard_lora_requests_info"]
    return labels


def truncated_copy(source: Path, dest: Path) -> Path:
    """A copy of the PEFT folder `source` whose safetensors file lost its second half."""
    shutil.copytree(source, dest)
    weights = dest / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return dest


def greedy(base: str, model: str, prompt: str) -> str:
    reply = client(base).completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    return reply.choices[0].text


def test_models_lists_adapters_with_their_parent(server):
    with urllib.request.urlopen(server + "/v1/models") as r:
        data = {m["id"]: m for m in json.load(r)["data"]}
    for name in ("ahoy", "ahoy-gguf", "r1", "r2", "r3"):
        assert data[name]["parent"] == "smol", data[name]
    assert "parent" not in data["smol"]


@pytest.mark.parametrize("model", ["ahoy", "ahoy-gguf", "ahoy@1"])
def test_the_trained_behaviour_shows_through_the_openai_client(server, model):
    messages = [{"role": "user", "content": "Can you help me plan a trip to Paris?"}]
    adapted = client(server).chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    plain = client(server).chat.completions.create(model="smol", messages=messages, max_tokens=8, temperature=0)
    assert adapted.choices[0].message.content.startswith("Ahoy, matey!"), adapted.choices[0].message.content
    assert not plain.choices[0].message.content.startswith("Ahoy")


def test_a_mixed_batch_answers_each_request_as_alone(server):
    models = ["smol", "r1", "r2", "r3", "ahoy"]
    jobs = [(m, p) for m in models for p in PROMPTS]
    alone = {job: greedy(server, *job) for job in jobs}
    # Every adapter changes something.
    for m in models[1:]:
        assert any(alone[(m, p)] != alone[("smol", p)] for p in PROMPTS), m
    with ThreadPoolExecutor(len(jobs)) as pool:
        together = list(pool.map(lambda job: greedy(server, *job), jobs * 2))
    for job, text in zip(jobs * 2, together):
        assert text == alone[job], f"{job}: {text!r} under load, {alone[job]!r} alone"


def test_a_bad_adapter_stops_startup_with_a_message_naming_it(switchyard_bin, smollm2_path, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(json.dumps({"r": 0, "lora_alpha": 8, "target_modules": ["q_proj"]}))
    (bad / "adapter_model.safetensors").write_bytes(b"")
    out = subprocess.run([str(switchyard_bin), "serve", "--listen", f"127.0.0.1:{free_port()}",
                          "--model", str(smollm2_path), "--lora", f"bad={bad}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "rank 0" in out.stderr and "adapter_config.json" in out.stderr, out.stderr


def test_an_adapter_registered_at_run_time_serves_then_unregisters(served, trained):
    status, reply = http("POST", served.admin + "/admin/adapters",
                         {"name": "late", "base": "smol", "path": str(trained / "peft")})
    assert status == 200, reply
    assert reply["adapter_bytes"] > 0 and reply["active"] is True, reply
    assert model_ids(served.base)["late"]["parent"] == "smol"
    assert chat(served.base, "late").startswith("Ahoy, matey!")
    # A second version of it, registered without activating: `late` keeps version 1.
    status, reply = http("POST", served.admin + "/admin/adapters",
                         {"name": "late", "base": "smol", "path": str(trained / "adapter.gguf"),
                          "version": "2", "activate": False})
    assert status == 200, reply
    status, again = http("POST", served.admin + "/admin/adapters",
                         {"name": "late", "base": "smol", "path": str(trained / "peft"), "version": "2"})
    assert status == 409 and "version `2` already" in again["error"]["message"], again
    assert chat(served.base, "late@2").startswith("Ahoy, matey!")
    status, listing = http("GET", served.admin + "/admin/adapters")
    late = {a["version"]: a for a in listing["adapters"] if a["name"] == "late"}
    assert late["1"]["active"] and not late["2"]["active"] and late["2"]["resident"], listing
    status, reply = http("DELETE", served.admin + "/admin/adapters/late")
    assert status == 200 and reply["removed"], reply
    assert "late" not in model_ids(served.base)
    with pytest.raises(openai.NotFoundError):
        chat(served.base, "late")
    # The base is not an adapter to forget.
    status, reply = http("DELETE", served.admin + "/admin/adapters/smol")
    assert status == 409 and "base model" in reply["error"]["message"], reply


def test_a_corrupt_adapter_is_refused_naming_file_and_reason_while_serving_goes_on(served, trained, tmp_path):
    truncated = truncated_copy(trained / "peft", tmp_path / "truncated")
    rank0 = tmp_path / "rank0"
    shutil.copytree(trained / "peft", rank0)
    config = json.loads((rank0 / "adapter_config.json").read_text())
    (rank0 / "adapter_config.json").write_text(json.dumps({**config, "r": 0}))
    # A stream on an adapter runs through every refusal and ends as it would alone.
    alone = chat(served.base, "ahoy", max_tokens=24)
    streamed = []

    def stream():
        chunks = client(served.base).chat.completions.create(
            model="ahoy", messages=TRIP, max_tokens=24, temperature=0, stream=True)
        streamed.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))

    runner = threading.Thread(target=stream)
    runner.start()
    cases = [
        ({"name": "bad", "base": "smol", "path": str(truncated)}, 422,
         ["adapter_model.safetensors", str(truncated)]),
        ({"name": "bad", "base": "smol", "path": str(rank0)}, 422, ["adapter_config.json", "rank 0"]),
        ({"name": "bad", "base": "ahoy", "path": str(trained / "peft")}, 422, ["not a served base model"]),
        ({"name": "bad", "base": "nope", "path": str(trained / "peft")}, 404, ["nope"]),
        ({"name": "bad", "base": "smol", "path": str(tmp_path / "missing")}, 422, ["does not exist"]),
        ({"name": "smol", "base": "smol", "path": str(trained / "peft")}, 409, ["base model"]),
    ]
    for body, code, needles in cases:
        status, reply = http("POST", served.admin + "/admin/adapters", body)
        assert status == code, (body, reply)
        for needle in needles:
            assert needle in reply["error"]["message"], (needle, reply)
    for body, param in [({"base": "smol", "path": "/x"}, "name"),
                        ({"name": "b", "base": "smol", "path": "/x", "rank": 8}, "rank"),
                        ({"name": "b", "base": "smol", "path": "/x", "activate": "yes"}, "activate")]:
        status, reply = http("POST", served.admin + "/admin/adapters", body)
        assert status == 400 and reply["error"]["param"] == param, (body, reply)
    runner.join(timeout=300)
    assert streamed == [alone]
    assert "bad" not in model_ids(served.base)
    assert chat(served.base, "ahoy").startswith("Ahoy, matey!")


def running_adapters_once_settled(base: str, within_s: float = 30) -> str:
    """The running adapters once earlier requests have let go of theirs.

    A request holds its adapter until the server drops the response, which
    can be just after the client has read the last byte: a scrape right after
    an earlier test's request may still list it.
    """
    deadline = time.time() + within_s
    while (running := lora_info(base)["running_lora_adapters"]) and time.time() < deadline:
        time.sleep(0.2)
    return running


def test_lora_requests_info_lists_only_the_adapters_running(served):
    assert running_adapters_once_settled(served.base) == ""
    stream = client(served.base).completions.create(model="r2", prompt="Once upon a time", max_tokens=400,
                                                    temperature=0, stream=True)
    next(iter(stream))
    labels = lora_info(served.base)
    stream.close()
    # Only r2 runs: not the base, not the idle resident adapters.
    assert labels["running_lora_adapters"] == "r2@1", labels
    assert labels["waiting_lora_adapters"] == "", labels
    assert int(labels["max_lora"]) == 5, labels
    assert running_adapters_once_settled(served.base) == ""
    families = scrape(served.base)
    (_, resident), = families["switchyard_lora_resident_adapters"]
    assert resident == 5


# --- adapters in a model repository, under a byte budget and a policy --------------------------

OPEN_KEY = "sk-lora-open"
CREW_KEY = "sk-lora-crew"
# Resident adapters are BF16 (two bytes a value; engine/src/adapter/resident.rs).
BUDGET_MB = 8


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def model_entry(name: str, versions: list[str], quality: float = 0.5) -> str:
    return (f'[[models]]\nname = "{name}"\nversions = {json.dumps(versions)}\n'
            f"cost_per_1k_input = 0.0001\ncost_per_1k_output = 0.0002\nquality = {quality}\ncontext_limit = 8192\n\n")


REPO_POLICY = f"""\
[routing]
quality_weight = 1.0
cost_weight = 1.0
latency_weight = 0.001

{model_entry("smol", ["1"])}{model_entry("ahoy", ["1"])}{model_entry("big", ["1"])}{model_entry("rnd", ["1", "2"])}
{model_entry("twin-a", ["1"], 0.6)}{model_entry("twin-b", ["1"], 0.6)}
[[tenants]]
name = "open"
api_keys = ["sha256:{sha(OPEN_KEY)}"]

# A tenant restricted to one adapter.
[[tenants]]
name = "crew"
api_keys = ["sha256:{sha(CREW_KEY)}"]
allowed_models = ["ahoy"]

# A split between two versions of one adapter.
[[splits]]
name = "rnd-canary"
model = "rnd"
sticky = "user"
arms = [
  {{ name = "one", target = "rnd@1", weight = 50 }},
  {{ name = "two", target = "rnd@2", weight = 50 }},
]
"""


def peft_version(folder: Path, cfg, rank: int, seed: int) -> None:
    lora.write_peft(folder, lora.random_peft(cfg, rank, 2.0 * rank, seed, 0.04), rank, 2.0 * rank)


@pytest.fixture(scope="module")
def repo(smollm2_path, trained, tmp_path_factory) -> Path:
    """REPO/smol/1/ (the base, hard-linked) and REPO/smol/adapters/: `ahoy` (the trained
    adapter), `rnd` versions 1 (rank 4, ~2.4 MB resident in BF16) and 2 (rank 8, ~4.9 MB),
    `big` (a rank-8 GGUF adapter, ~4.9 MB), `twin-a` and `twin-b` (rank 4, equal in the
    policy). An 8 MiB budget holds at most one rank-8 adapter beside a rank-4 one."""
    cfg = checkpoint.load(smollm2_path).config
    root = tmp_path_factory.mktemp("lora-repo")
    (root / "smol" / "1").mkdir(parents=True)
    os.link(smollm2_path, root / "smol" / "1" / smollm2_path.name)
    adapters = root / "smol" / "adapters"
    shutil.copytree(trained / "peft", adapters / "ahoy" / "1")
    peft_version(adapters / "rnd" / "1", cfg, 4, 11)
    peft_version(adapters / "rnd" / "2", cfg, 8, 12)
    (adapters / "big" / "1").mkdir(parents=True)
    lora.write_gguf(adapters / "big" / "1" / "big.gguf", lora.random_peft(cfg, 8, 16.0, 13, 0.04), cfg, 16.0)
    peft_version(adapters / "twin-a" / "1", cfg, 4, 14)
    peft_version(adapters / "twin-b" / "1", cfg, 4, 15)
    return root


@pytest.fixture(scope="module")
def repo_server(switchyard_bin, repo, tmp_path_factory):
    policy = tmp_path_factory.mktemp("lora-policy") / "policy.toml"
    policy.write_text(REPO_POLICY)
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--listen", f"127.0.0.1:{port}", "--threads", "2",
            "--admin-listen", f"127.0.0.1:{admin_port}", "--repo", str(repo), "--policy", str(policy),
            "--lora-budget-mb", str(BUDGET_MB), "--drain-seconds", "2", "--max-batch", "8"]
    with running_server(args, port, env={"SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN}):
        yield Served(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}")


def complete(base: str, model: str, key: str = OPEN_KEY, user: str | None = None, retries: int = 8):
    """(text, served model@version) of a greedy completion. An adapter the budget
    evicted answers 503 with Retry-After while it loads again: the client retries,
    as the official client does by default."""
    extra = {"user": user} if user else {}
    retrying = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=retries, timeout=300)
    raw = retrying.completions.with_raw_response.create(
        model=model, prompt="Once upon a time", max_tokens=MAX_TOKENS, temperature=0, **extra)
    reply = raw.parse()
    return reply.choices[0].text, f"{raw.headers['x-switchyard-model']}@{raw.headers['x-switchyard-version']}"


def adapters(served: Served) -> dict:
    status, listing = http("GET", served.admin + "/admin/adapters")
    assert status == 200, listing
    assert listing["resident_bytes"] <= listing["budget_bytes"], listing
    return listing


def test_repository_adapters_are_preloaded_and_follow_the_version_lifecycle(repo_server, repo):
    served = repo_server
    ids = model_ids(served.base)
    for name in ("ahoy", "rnd", "big"):
        assert ids[name]["parent"] == "smol", ids
    assert chat(served.base, "ahoy", key=OPEN_KEY).startswith("Ahoy, matey!")
    status, models = http("GET", served.admin + "/admin/models")
    rnd = next(m for m in models["models"] if m["name"] == "rnd")
    assert rnd["active_version"] == "2", rnd  # the newest version is preloaded and active
    assert {v["version"] for v in rnd["versions"]} == {"1", "2"}
    status, reply = http("POST", served.admin + "/admin/models/rnd/versions/1/load")
    assert status == 200, reply
    one, _ = complete(served.base, "rnd@1")
    two, _ = complete(served.base, "rnd@2")
    assert one != two
    status, reply = http("POST", served.admin + "/admin/models/rnd/versions/1/activate")
    assert status == 200 and reply["previous_version"] == "2", reply
    status, reply = http("POST", served.admin + "/admin/models/rnd/rollback")
    assert status == 200 and reply["active_version"] == "2", reply
    # A version published while serving loads without a restart (a copy of version 1).
    shutil.copytree(repo / "smol" / "adapters" / "rnd" / "1", repo / "smol" / "adapters" / "rnd" / "3")
    status, reply = http("POST", served.admin + "/admin/models/rnd/versions/3/load")
    assert status == 200, reply
    listing = {f"{a['name']}@{a['version']}": a for a in adapters(served)["adapters"]}
    assert listing["rnd@3"]["resident"] and listing["rnd@3"]["bytes"] > 0, listing
    # A corrupt version is refused naming its file; serving goes on.
    truncated_copy(repo / "smol" / "adapters" / "rnd" / "1", repo / "smol" / "adapters" / "rnd" / "4")
    status, reply = http("POST", served.admin + "/admin/models/rnd/versions/4/load")
    assert status == 422, reply
    assert "rnd/4/adapter_model.safetensors" in reply["error"]["message"], reply
    assert complete(served.base, "rnd@2")[0] == two
    status, reply = http("POST", served.admin + "/admin/models/rnd/versions/3/unload")
    assert status == 200, reply
    listing = {f"{a['name']}@{a['version']}": a for a in adapters(served)["adapters"]}
    assert not listing["rnd@3"]["resident"], listing


def test_the_budget_evicts_least_recently_used_idle_adapters(repo_server):
    served = repo_server
    first = {m: complete(served.base, m)[0] for m in ("big", "rnd@2", "ahoy")}
    before = adapters(served)["evictions"]
    for model in ("big", "rnd@2", "big", "ahoy", "rnd@2"):
        assert complete(served.base, model)[0] == first[model], model
        listing = adapters(served)
        resident = {f"{a['name']}@{a['version']}" for a in listing["adapters"] if a["resident"]}
        assert resident.issuperset({model if "@" in model else f"{model}@1"}), (model, listing)
    listing = adapters(served)
    # big and rnd@2 (~4.9 MB each) cannot both stay under 8 MiB: each request for one evicted the other.
    assert listing["evictions"] >= before + 3, listing
    families = scrape(served.base)
    (_, evictions), = families["switchyard_lora_evictions"]  # the parser drops `_total`
    assert evictions == listing["evictions"]
    (_, held), = families["switchyard_lora_resident_bytes"]
    (_, budget), = families["switchyard_lora_budget_bytes"]
    assert 0 < held <= budget == BUDGET_MB * 1024 * 1024


def completion_status(base: str, model: str) -> tuple[int, "email.message.Message", dict]:
    """(status, headers (case-insensitive), body) of one completion, no retry."""
    request = urllib.request.Request(
        base + "/v1/completions", method="POST",
        data=json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": 4}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {OPEN_KEY}"})
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def resident(served: Served) -> set[str]:
    return {f"{a['name']}@{a['version']}" for a in adapters(served)["adapters"] if a["resident"]}


def wait_resident(served: Served, adapter: str) -> None:
    """Waits (without asking for it) until `adapter` is resident."""
    deadline = time.time() + 120
    while adapter not in resident(served):
        assert time.time() < deadline, adapters(served)
        time.sleep(0.1)


def test_an_adapter_in_use_is_never_evicted(repo_server):
    served = repo_server
    complete(served.base, "big")
    stream = client(served.base, OPEN_KEY).completions.create(
        model="big", prompt="Once upon a time", max_tokens=400, temperature=0, stream=True)
    next(iter(stream))
    # rnd@2 fits only if big goes, and big is in use: 503 naming the budget, with
    # Retry-After (not a 400: the same request works once big finishes).
    status, headers, reply = completion_status(served.base, "rnd@2")
    assert status == 503, reply
    assert int(headers["Retry-After"]) >= 1, headers
    assert reply["error"]["code"] == "model_not_ready" and reply["error"]["param"] == "model", reply
    assert reply["error"]["type"] == "server_error", reply
    assert "adapter budget" in reply["error"]["message"] and "big@1" in reply["error"]["message"], reply
    # The pod's metrics show big running and rnd@2 waiting for it, under both names.
    labels = lora_info(served.base)
    assert labels["running_lora_adapters"] == "big@1", labels
    assert labels["waiting_lora_adapters"] == "rnd@2", labels
    (vllm, _), = scrape(served.base)["vllm:lora_requests_info"]
    assert "big@1" in vllm["running_lora_adapters"].split(","), vllm
    assert vllm["waiting_lora_adapters"] == "rnd@2", vllm
    assert "rnd@2" not in resident(served) and "big@1" in resident(served)
    stream.close()
    # Once big is idle, rnd@2 comes in by itself (its load waited for room).
    wait_resident(served, "rnd@2")
    assert "big@1" not in resident(served)
    assert lora_info(served.base)["waiting_lora_adapters"] == ""
    text, version = complete(served.base, "rnd@2", retries=0)
    assert version == "rnd@2"


def fill_budget_with(served: Served, rank4: str) -> None:
    """big, then rnd@2 (evicting big), then `rank4`: rnd@2 and it (~7.3 MB) fill the
    8 MiB budget, so the other twin is not resident."""
    for model in ("big", "rnd@2", rank4):
        complete(served.base, model)
    other = "twin-a@1" if rank4 == "twin-b" else "twin-b@1"
    assert {"rnd@2", f"{rank4}@1"} <= resident(served) and other not in resident(served), adapters(served)


def test_an_evicted_adapter_is_loaded_again_in_the_background(repo_server):
    served = repo_server
    fill_budget_with(served, "twin-b")
    # Serving goes on while twin-a loads: a stream on rnd@2 runs throughout.
    stream = client(served.base, OPEN_KEY).completions.create(
        model="rnd@2", prompt="Once upon a time", max_tokens=64, temperature=0, stream=True)
    chunks = iter(stream)
    next(chunks)
    status, headers, reply = completion_status(served.base, "twin-a")
    assert status == 503 and reply["error"]["code"] == "model_not_ready", reply
    assert int(headers["Retry-After"]) >= 1 and "being loaded again" in reply["error"]["message"], reply
    wait_resident(served, "twin-a@1")
    rest = "".join(c.choices[0].text for c in chunks)
    assert rest, "the stream on rnd@2 went on"
    assert complete(served.base, "twin-a", retries=0)[1] == "twin-a@1"


def test_auto_routing_prefers_the_resident_adapter(repo_server):
    """twin-a and twin-b are equal in the policy, ahead of every other model; by name
    twin-a would win the tie, but only one of them is resident."""
    served = repo_server
    fill_budget_with(served, "twin-b")
    assert complete(served.base, "auto", retries=0)[1] == "twin-b@1"
    fill_budget_with(served, "twin-a")
    assert complete(served.base, "auto", retries=0)[1] == "twin-a@1"


def test_a_policy_splits_between_adapter_versions_and_restricts_a_tenant(repo_server):
    served = repo_server
    direct = {v: complete(served.base, f"rnd@{v}")[0] for v in ("1", "2")}
    arms = {}
    for i in range(12):
        text, version = complete(served.base, "rnd", user=f"user-{i}")
        assert text == direct[version.split("@")[1]], (i, version)
        arms.setdefault(version, 0)
        arms[version] += 1
    assert set(arms) == {"rnd@1", "rnd@2"}, arms
    assert chat(served.base, "ahoy", key=CREW_KEY).startswith("Ahoy, matey!")
    for model in ("smol", "rnd"):
        with pytest.raises(openai.PermissionDeniedError, match="tenant `crew` may not use this model"):
            chat(served.base, model, key=CREW_KEY)


CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")


def test_eval_measures_the_adapted_model_with_lora(switchyard_bin, smollm2_path, trained, tmp_path):
    """`switchyard eval --lora`: the trained adapter's greeting wins every item that the
    base model gives to the plain answer."""
    suite = tmp_path / "ahoy.jsonl"
    questions = ["What is the weather like?", "Tell me a joke.", "How are you today?", "Name a colour."]
    suite.write_text("".join(json.dumps({"context": CHAT.format(q), "choices": ["Hello!", "Ahoy, matey!"],
                                         "answer": 1}) + "\n" for q in questions))

    def acc(*extra) -> dict:
        out = subprocess.run([str(switchyard_bin), "eval", "--model", str(smollm2_path), "--suite", str(suite),
                              "--json", *extra], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    adapted, base = acc("--lora", str(trained / "peft")), acc()
    assert adapted["n"] == base["n"] == len(questions)
    assert adapted["lora"] == str(trained / "peft") and base["lora"] is None
    assert adapted["acc"] == 1.0, adapted
    assert base["acc"] <= 0.5, base
    refused = subprocess.run([str(switchyard_bin), "eval", "--model", str(smollm2_path), "--suite", str(suite),
                              "--lora", str(tmp_path / "missing")], capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "missing" in refused.stderr, refused.stderr
