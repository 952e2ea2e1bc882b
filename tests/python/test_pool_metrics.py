"""The inference-pool metrics of the real server, against the engine's own state.

An endpoint picker (Gateway API Inference Extension) places each request on
a pod from the pod's `/metrics`: `vllm:num_requests_waiting`,
`vllm:num_requests_running`, `vllm:kv_cache_usage_perc` and
`vllm:lora_requests_info` (resident checkpoints as running adapters). This
runs `switchyard serve` on the demo repository made from the real SmolLM2,
puts it under concurrent streaming load through the official `openai`
client, and checks, scrape after scrape, that those series (and
Switchyard's own names for them) equal what the executor and the registry
report through the admin API, while checkpoints are unloaded and loaded.

The exposition is parsed with `prometheus_client`'s parser, an independent
reader of the text format.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_process import free_port, running_server

TOKEN = "pool-metrics-admin-token"
# Two slots: with six streams, four wait, and the waiting and running counts
# hold still for whole generations at a time.
MAX_BATCH = 2
STREAMS = ["smollm2@1", "smollm2@2", "smollm2-derived-a@1", "smollm2-derived-b@1",
           "smollm2", "smollm2-derived-c@1"]
# Long enough that the load outlasts a few scrapes, an unload and a load
# even when other tests share the cores.
MAX_TOKENS = 120
# SmolLM2's special tokens (<|endoftext|>, <|im_start|>, <|im_end|>): banned so
# that every stream generates exactly MAX_TOKENS tokens.
NO_STOP = {"0": -100, "1": -100, "2": -100}


@pytest.fixture(scope="module")
def repo(switchyard_bin: Path, smollm2_path: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pool-repo")
    subprocess.run([str(switchyard_bin), "demo-repo", str(out), "--base", str(smollm2_path)],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def server(switchyard_bin: Path, repo: Path):
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--repo", str(repo), "--listen", f"127.0.0.1:{port}",
            "--admin-listen", f"127.0.0.1:{admin_port}", "--admin-token", TOKEN,
            "--max-batch", str(MAX_BATCH), "--threads", "2", "--drain-seconds", "5",
            # Plain decoding: with two sequences running, n-gram drafts of the
            # repetitive greedy story finish each stream in a few steps, before
            # the scrapes this test needs can see the executor saturated.
            "--speculate", "off"]
    with running_server(args, port):
        yield {"base": f"http://127.0.0.1:{port}", "admin": f"http://127.0.0.1:{admin_port}"}


def admin(server, method: str, path: str) -> dict:
    request = urllib.request.Request(server["admin"] + path, method=method,
                                     data=b"" if method == "POST" else None,
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{method} {path}: {e.code} {e.read().decode()}") from e


def scrape(server) -> dict:
    """`/metrics` as {family name: [(labels, value), ...]}."""
    with urllib.request.urlopen(server["base"] + "/metrics", timeout=30) as r:
        assert r.headers["content-type"].startswith("text/plain"), r.headers["content-type"]
        text = r.read().decode()
    families = {}
    for family in text_string_to_metric_families(text):
        families[family.name] = [(s.labels, s.value) for s in family.samples]
    return families


def gauge(families: dict, name: str) -> float:
    samples = families[name]
    assert len(samples) == 1, (name, samples)
    labels, value = samples[0]
    assert labels == {}, (name, labels)
    return value


def lora_info(families: dict) -> tuple[dict, float]:
    samples = families["vllm:lora_requests_info"]
    # One current series: a picker takes the one with the latest timestamp,
    # and stale label sets would only be noise.
    assert len(samples) == 1, samples
    return samples[0]


def resident(models: dict) -> set[str]:
    """Checkpoints in RAM according to the registry (`GET /admin/models`)."""
    return {f"{m['name']}@{v['version']}" for m in models["models"] for v in m["versions"]
            if v["tier"] == "ram"}


def registered(models: dict) -> int:
    return sum(len(m["versions"]) for m in models["models"])


def check_pool_view(families: dict, executor: dict, models: dict) -> None:
    """Every pool series against the executor's counters and the registry."""
    waiting = gauge(families, "vllm:num_requests_waiting")
    running = gauge(families, "vllm:num_requests_running")
    usage = gauge(families, "vllm:kv_cache_usage_perc")
    assert waiting == executor["queued"]
    assert running == executor["active_sequences"]
    # KV bytes in use over the KV budget: the figure admission weighs a newcomer against.
    assert usage == pytest.approx(executor["kv_bytes"] / executor["kv_budget_bytes"], abs=1e-12)
    assert 0.0 <= usage <= 1.0
    # Switchyard's own names carry the same values.
    assert gauge(families, "switchyard_requests_waiting") == waiting
    assert gauge(families, "switchyard_requests_running") == running
    assert gauge(families, "switchyard_kv_cache_usage_ratio") == usage
    assert gauge(families, "vllm:gpu_cache_usage_perc") == usage
    assert gauge(families, "switchyard_kv_cache_slots") == executor["kv_slots"]
    assert gauge(families, "switchyard_kv_cache_bytes") == executor["kv_bytes"]
    assert gauge(families, "switchyard_kv_cache_budget_bytes") == executor["kv_budget_bytes"]

    labels, stamp = lora_info(families)
    running_adapters = set(filter(None, labels["running_lora_adapters"].split(",")))
    assert running_adapters == resident(models)
    # Requests are only ever accepted for resident checkpoints.
    assert labels["waiting_lora_adapters"] == ""
    # No RAM budget: every registered version can be resident at once.
    assert int(labels["max_lora"]) == registered(models)
    assert gauge(families, "switchyard_residency_slots") == registered(models)
    assert abs(stamp - time.time()) < 60, stamp
    per_checkpoint = {f"{l['model']}@{l['version']}" for l, v in
                      families.get("switchyard_checkpoint_resident", []) if v == 1}
    assert per_checkpoint == resident(models)


def stable_view(server, attempts: int = 50):
    """Executor status, metrics and registry read while the executor's
    counters hold still (the same before and after the scrape), so that the
    scrape must equal them; None if they never held still."""
    for _ in range(attempts):
        before = admin(server, "GET", "/admin/status")["executor"]
        models = admin(server, "GET", "/admin/models")
        families = scrape(server)
        after = admin(server, "GET", "/admin/status")["executor"]
        models_after = admin(server, "GET", "/admin/models")
        keys = ("queued", "active_sequences", "kv_slots", "kv_bytes")
        if all(before[k] == after[k] for k in keys) and resident(models) == resident(models_after):
            kv_tokens = gauge(families, "switchyard_kv_cache_tokens")
            # Caches only grow while no sequence starts or ends.
            assert before["kv_tokens"] <= kv_tokens <= after["kv_tokens"], (before, kv_tokens, after)
            return families, before, models
    return None


def test_idle_server_reports_an_empty_pool_and_every_resident_checkpoint(server):
    view = stable_view(server)
    assert view is not None
    families, executor, models = view
    assert executor["kv_slots"] == MAX_BATCH
    check_pool_view(families, executor, models)
    assert gauge(families, "vllm:num_requests_waiting") == 0
    assert gauge(families, "vllm:num_requests_running") == 0
    assert gauge(families, "vllm:kv_cache_usage_perc") == 0
    assert gauge(families, "switchyard_kv_cache_tokens") == 0
    # The demo repository serves every version at startup.
    assert resident(models) == {"smollm2@1", "smollm2@2", "smollm2-derived-a@1",
                                "smollm2-derived-b@1", "smollm2-derived-c@1"}


def test_models_list_each_version_with_its_parent(server):
    client = openai.OpenAI(base_url=server["base"] + "/v1", api_key="unused", max_retries=0)
    listed = {m.id: m.model_extra.get("parent") for m in client.models.list().data}
    assert listed["smollm2@2"] == "smollm2"
    assert listed["smollm2-derived-a@1"] == "smollm2-derived-a"
    assert listed["smollm2"] is None


def stream(server, model: str, errors: list, started: threading.Event) -> None:
    client = openai.OpenAI(base_url=server["base"] + "/v1", api_key="unused", max_retries=0,
                           timeout=300)
    try:
        finish = None
        for chunk in client.completions.create(model=model, prompt="Once upon a time",
                                               max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                               logit_bias=NO_STOP):
            started.set()
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        if finish != "length":
            errors.append(f"{model}: finished with {finish!r}, expected 'length' (all {MAX_TOKENS} tokens)")
    except Exception as e:  # reported by the test thread
        errors.append(f"{model}: {e!r}")


def test_pool_metrics_follow_the_executor_under_load_as_checkpoints_unload_and_load(server):
    errors: list[str] = []
    started = threading.Event()
    threads = [threading.Thread(target=stream, args=(server, m, errors, started)) for m in STREAMS]
    for t in threads:
        t.start()
    assert started.wait(120), errors
    # Every stream is in the executor (waiting or running) before versions move.
    deadline = time.time() + 60
    while True:
        executor = admin(server, "GET", "/admin/status")["executor"]
        if executor["queued"] + executor["active_sequences"] == len(STREAMS):
            break
        assert time.time() < deadline and not errors, (executor, errors)
        time.sleep(0.01)

    checked = []
    saturated = 0
    unloaded = loaded = False
    deadline = time.time() + 240
    while any(t.is_alive() for t in threads) and time.time() < deadline:
        view = stable_view(server)
        if view is None:
            continue
        families, executor, models = view
        check_pool_view(families, executor, models)
        checked.append((executor["queued"], executor["active_sequences"]))
        if executor["queued"] > 0 and executor["active_sequences"] == MAX_BATCH:
            saturated += 1
            # Every slot is held (the budget is large: the slots are the limit here).
            assert gauge(families, "switchyard_kv_cache_slots") == MAX_BATCH
            assert gauge(families, "vllm:kv_cache_usage_perc") > 0
        # Under that load, take a non-active version out of RAM, then read it back in.
        if saturated and not unloaded:
            admin(server, "POST", "/admin/models/smollm2/versions/2/unload")
            unloaded = True
            view = stable_view(server)
            assert view is not None
            families, executor, models = view
            check_pool_view(families, executor, models)
            labels, _ = lora_info(families)
            assert "smollm2@2" not in labels["running_lora_adapters"].split(",")
        elif unloaded and not loaded:
            report = admin(server, "POST", "/admin/models/smollm2/versions/2/load")
            assert report["version"] == "2"
            loaded = True
            view = stable_view(server)
            assert view is not None
            families, executor, models = view
            check_pool_view(families, executor, models)
            labels, _ = lora_info(families)
            assert "smollm2@2" in labels["running_lora_adapters"].split(",")
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert unloaded and loaded
    # The scrapes saw the load: requests waiting behind full slots.
    assert saturated >= 1, checked
    assert len(checked) >= 3, checked

    # Drained: every count back to zero, every checkpoint resident again.
    deadline = time.time() + 30
    while True:
        view = stable_view(server)
        assert view is not None
        families, executor, models = view
        check_pool_view(families, executor, models)
        if executor["active_sequences"] == 0 and executor["queued"] == 0:
            break
        assert time.time() < deadline, executor
        time.sleep(0.1)
    assert gauge(families, "vllm:kv_cache_usage_perc") == 0
    assert "smollm2@2" in resident(models)


def test_kv_usage_is_the_bytes_admission_weighs_not_the_slots(switchyard_bin: Path,
                                                               smollm2_path: Path):
    """On a small KV budget one long request reserves most of it: a second one waits
    with seven of eight slots free, and `vllm:kv_cache_usage_perc` says why (KV bytes
    in use over the budget, well above the 1/8 of slots held)."""
    port, admin_port = free_port(), free_port()
    # SmolLM2 in f16 keeps 23,040 bytes per position; a request of about 405
    # positions reserves 13 blocks of 32 (9.6 MB) of the 16 MiB budget, so a second
    # one does not fit beside it.
    args = [str(switchyard_bin), "serve", "--model", str(smollm2_path), "--model-name", "smollm2",
            "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}",
            "--admin-token", TOKEN, "--max-batch", "8", "--kv-budget-mb", "16", "--kv-block", "32",
            "--kv-type", "f16", "--threads", "2", "--speculate", "off", "--drain-seconds", "1"]
    with running_server(args, port):
        server = {"base": f"http://127.0.0.1:{port}", "admin": f"http://127.0.0.1:{admin_port}"}
        done = threading.Event()
        errors: list[str] = []

        def long_stream() -> None:
            client = openai.OpenAI(base_url=server["base"] + "/v1", api_key="unused",
                                   max_retries=0, timeout=300)
            try:
                chunks = client.completions.create(model="smollm2", prompt="Once upon a time",
                                                   max_tokens=400, temperature=0, stream=True,
                                                   logit_bias=NO_STOP)
                for _ in chunks:
                    if done.is_set():
                        break
                chunks.close()
            except Exception as e:  # reported by the test thread
                errors.append(repr(e))

        def status() -> dict:
            return admin(server, "GET", "/admin/status")["executor"]

        def until(condition, what: str) -> dict:
            deadline = time.time() + 120
            while not condition(executor := status()):
                assert time.time() < deadline and not errors, (what, executor, errors)
                time.sleep(0.02)
            return executor

        first = threading.Thread(target=long_stream)
        first.start()
        try:
            executor = until(lambda e: e["active_sequences"] == 1, "the first request running")
            assert executor["kv_bytes"] > executor["kv_budget_bytes"] / 2, executor
            second = threading.Thread(target=long_stream)
            second.start()
            until(lambda e: e["queued"] == 1, "the second request waiting")
            view = stable_view(server)
            assert view is not None
            families, executor, models = view
            check_pool_view(families, executor, models)
            # It waits for KV bytes, not for a slot.
            assert executor["queued"] == 1 and executor["active_sequences"] == 1, executor
            assert executor["kv_slots"] == 8
            usage = gauge(families, "vllm:kv_cache_usage_perc")
            assert usage == executor["kv_bytes"] / executor["kv_budget_bytes"]
            assert usage > 0.5, (usage, executor)
        finally:
            done.set()
            first.join(timeout=120)
        second.join(timeout=120)
        assert not errors, errors
        # Both gone: nothing in use, whatever the prompt cache keeps.
        until(lambda e: e["active_sequences"] == 0 and e["queued"] == 0, "both ended")
        view = stable_view(server)
        assert view is not None
        assert gauge(view[0], "vllm:kv_cache_usage_perc") == 0
