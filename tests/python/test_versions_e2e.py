"""Versions end to end: `switchyard serve --repo` on the demo repository made
from the real SmolLM2 (`switchyard demo-repo`), driven by the official
`openai` client and the admin API.

- every response names the version that served it (`model` is `name@version`,
  as OpenAI names the snapshot behind an alias), and its greedy text equals
  that version's text run alone, while versions are activated and rolled
  back every 200 ms under concurrent load;
- a stream survives the activation, rollback and unload of its version;
- a corrupt or mismatched version is refused with the file named, and
  nothing changes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from serve_process import free_port, running_server

TOKEN = "test-admin-token"
# Each derived checkpoint's greedy text differs from the base's on at least
# one of these (checked below: equal outputs would prove nothing).
# smollm2@2 is a Q8_0 re-quantization of smollm2@1's Q4_1 weights, so close
# that greedy text agrees on the first three prompts; on the last it departs
# after about 18 tokens (checked with `switchyard generate` on both files).
PROMPTS = ["The capital of France is", "My favourite food is", "Once upon a time", "The quick brown fox"]
MAX_TOKENS = 24
CHECKPOINTS = ["smollm2@1", "smollm2@2", "smollm2-derived-a@1", "smollm2-derived-b@1"]



@pytest.fixture(scope="module")
def repo(switchyard_bin: Path, smollm2_path: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("repo")
    subprocess.run([str(switchyard_bin), "demo-repo", str(out), "--base", str(smollm2_path)],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def server(switchyard_bin: Path, repo: Path):
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--repo", str(repo), "--listen", f"127.0.0.1:{port}",
            "--admin-listen", f"127.0.0.1:{admin_port}", "--admin-token", TOKEN,
            "--drain-seconds", "5"]
    with running_server(args, port):
        yield {"base": f"http://127.0.0.1:{port}", "admin": f"http://127.0.0.1:{admin_port}",
               "repo": repo}


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server["base"] + "/v1", api_key="unused", max_retries=0)


def admin(server, method: str, path: str) -> tuple[int, dict]:
    request = urllib.request.Request(server["admin"] + path, method=method, data=b"" if method == "POST" else None,
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def greedy(client, model: str, prompt: str, max_tokens: int = MAX_TOKENS):
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    return reply.model, reply.choices[0].text


@pytest.fixture(scope="module")
def reference(client) -> dict:
    """Each checkpoint's greedy text for each prompt, one request at a time."""
    table = {}
    for checkpoint in CHECKPOINTS:
        for prompt in PROMPTS:
            served, text = greedy(client, checkpoint, prompt)
            assert served == checkpoint
            table[(checkpoint, prompt)] = text
    return table


def active_version(server, model: str) -> str:
    status, body = admin(server, "GET", "/admin/models")
    assert status == 200, body
    return next(m["active_version"] for m in body["models"] if m["name"] == model)


def test_the_repository_is_served_with_shared_tensors_once(server, client):
    ids = {m.id for m in client.models.list().data}
    for checkpoint in CHECKPOINTS:
        assert checkpoint in ids
        assert checkpoint.split("@")[0] in ids
    status, body = admin(server, "GET", "/admin/models")
    assert status == 200
    memory = body["memory"]
    # Where resident weights live: this server runs on the CPU backend.
    assert body["device"].startswith("cpu"), body["device"]
    # The derived checkpoints share all but two matrices with smollm2@1.
    assert memory["ram_bytes"] < 0.6 * memory["ram_bytes_without_sharing"], memory
    assert active_version(server, "smollm2") == "1"
    # What the engine recorded while it loaded, before serving, is exported.
    with urllib.request.urlopen(server["base"] + "/metrics", timeout=30) as r:
        metrics = r.read().decode()
    assert f'switchyard_memory_bytes{{tier="ram"}} {memory["ram_bytes"]}' in metrics
    assert 'switchyard_active_version{model="smollm2",version="1"} 1' in metrics
    assert 'switchyard_loads_total{model="smollm2-derived-a",version="1",result="ok"} 1' in metrics


def test_no_request_mixes_weights_while_versions_flip(server, client, reference):
    # The versions must differ somewhere, or matching outputs prove nothing.
    for other in CHECKPOINTS[1:]:
        assert any(reference[(other, p)] != reference[("smollm2@1", p)] for p in PROMPTS), other

    stop = threading.Event()
    failures: list[str] = []
    served_versions: set[str] = set()

    def flipper():
        steps = 0
        while not stop.is_set():
            if steps % 3 == 2:
                status, body = admin(server, "POST", "/admin/models/smollm2/rollback")
            else:
                version = "2" if steps % 2 == 0 else "1"
                status, body = admin(server, "POST", f"/admin/models/smollm2/versions/{version}/activate")
            if status not in (200, 409):
                failures.append(f"admin call failed: {status} {body}")
            steps += 1
            time.sleep(0.2)

    def worker(index: int):
        specs = ["smollm2", "smollm2-derived-a", "smollm2-derived-b", "smollm2@2"]
        for i in range(6):
            spec = specs[(index + i) % len(specs)]
            prompt = PROMPTS[(index * 5 + i) % len(PROMPTS)]
            try:
                served, text = greedy(client, spec, prompt)
            except Exception as e:  # noqa: BLE001 - any failure fails the test below
                failures.append(f"{spec}: {e!r}")
                continue
            served_versions.add(served)
            if text != reference[(served, prompt)]:
                failures.append(f"{spec} served by {served} gave {text!r}, "
                                f"alone it gives {reference[(served, prompt)]!r}")

    flip = threading.Thread(target=flipper)
    flip.start()
    workers = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    flip.join()
    assert not failures, failures
    assert {"smollm2@1", "smollm2@2"} <= served_versions, served_versions
    admin(server, "POST", "/admin/models/smollm2/versions/1/activate")


def test_a_stream_survives_activation_rollback_and_unload_of_its_version(server, client):
    _, expected = greedy(client, "smollm2@2", PROMPTS[2], max_tokens=48)
    assert admin(server, "POST", "/admin/models/smollm2/versions/2/activate")[0] == 200
    stream = client.completions.create(model="smollm2", prompt=PROMPTS[2], max_tokens=48,
                                       temperature=0, stream=True)
    pieces, served = [], None
    for i, chunk in enumerate(stream):
        served = chunk.model
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
        if i == 2:
            assert admin(server, "POST", "/admin/models/smollm2/rollback")[0] == 200
            status, body = admin(server, "POST", "/admin/models/smollm2/versions/2/unload")
            assert status == 200, body
    assert served == "smollm2@2"
    assert "".join(pieces) == expected
    assert active_version(server, "smollm2") == "1"
    # Unloaded: asking for it is refused with a clear message, then it loads again.
    with pytest.raises(openai.BadRequestError, match="not loaded"):
        greedy(client, "smollm2@2", PROMPTS[0])
    status, body = admin(server, "POST", "/admin/models/smollm2/versions/2/load")
    assert status == 200, body
    assert greedy(client, "smollm2@2", PROMPTS[2], max_tokens=48)[1] == expected


def test_a_corrupt_or_mismatched_version_is_refused_and_changes_nothing(
        server, client, reference, switchyard_bin):
    repo = server["repo"]
    base = next((repo / "smollm2" / "1").glob("*.gguf"))
    corrupt = repo / "smollm2" / "7" / "broken.gguf"
    corrupt.parent.mkdir()
    corrupt.write_bytes(base.read_bytes()[: base.stat().st_size // 3])
    mismatched = repo / "smollm2" / "8" / "other.gguf"
    mismatched.parent.mkdir()
    subprocess.run([str(switchyard_bin), "synth", "--preset", "llama", "--dtype", "q8_0", "--seed", "1",
                    "--format", "gguf", "--out", str(mismatched)], check=True, capture_output=True)
    try:
        before = active_version(server, "smollm2")
        status, body = admin(server, "POST", "/admin/models/smollm2/versions/7/load")
        assert status == 422, body
        assert "broken.gguf" in body["error"]["message"], body
        status, body = admin(server, "POST", "/admin/models/smollm2/versions/8/load")
        assert status == 422, body
        assert "does not match" in body["error"]["message"]
        for version in ("7", "8"):
            status, _ = admin(server, "POST", f"/admin/models/smollm2/versions/{version}/activate")
            assert status in (404, 409)
        assert active_version(server, "smollm2") == before
        served, text = greedy(client, "smollm2", PROMPTS[0])
        assert text == reference[(served, PROMPTS[0])]
    finally:
        shutil.rmtree(corrupt.parent)
        shutil.rmtree(mismatched.parent)
