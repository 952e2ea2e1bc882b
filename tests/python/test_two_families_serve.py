"""One server, two model families that share nothing: SmolLM2 (Llama, Q4_1,
BPE) and Gemma 3 270M (Gemma 3, Q4_K_M, SentencePiece 262k) from one
repository, under concurrent mixed traffic. Every greedy answer must equal
that model's answer from a server holding it alone; `switchyard models` and
`/admin/models` show each checkpoint's family and quant mix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from serve_process import free_port, running_server

TOKEN = "test-admin-token"
PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "My favourite food is"]
MAX_TOKENS = 16
GEMMA3_MIX = "Q4_K_M: Q5_0 81, Q4_K 27, Q8_0 10, Q6_K 9"


def make_repo(root: Path, models: dict[str, Path]) -> Path:
    for name, path in models.items():
        version = root / name / "1"
        version.mkdir(parents=True)
        # A hard link (or a copy across file systems), not a symlink: the repository
        # scan refuses files whose real path lies outside the repository (issue 17).
        try:
            os.link(path, version / path.name)
        except OSError:
            shutil.copyfile(path, version / path.name)
    return root


@pytest.fixture(scope="module")
def models(smollm2_path: Path, gemma3_path: Path) -> dict[str, Path]:
    return {"smollm2": smollm2_path, "gemma3": gemma3_path}


def serve(switchyard_bin: Path, repo: Path):
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--repo", str(repo), "--listen", f"127.0.0.1:{port}",
            "--admin-listen", f"127.0.0.1:{admin_port}", "--admin-token", TOKEN, "--drain-seconds", "5"]
    return running_server(args, port), f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"


def greedy(base: str, model: str, prompt: str) -> str:
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    assert reply.model.split("@")[0] == model
    return reply.choices[0].text


@pytest.fixture(scope="module")
def alone(switchyard_bin: Path, models: dict[str, Path], tmp_path_factory) -> dict:
    """Each model's greedy answers from a server that holds only it."""
    table = {}
    for name, path in models.items():
        repo = make_repo(tmp_path_factory.mktemp(f"alone-{name}"), {name: path})
        server, base, _ = serve(switchyard_bin, repo)
        with server:
            for prompt in PROMPTS:
                table[(name, prompt)] = greedy(base, name, prompt)
    # Equal answers across the two models would prove nothing.
    assert table[("smollm2", PROMPTS[0])] != table[("gemma3", PROMPTS[0])]
    return table


def test_mixed_traffic_matches_each_model_alone(switchyard_bin, models, alone, tmp_path):
    repo = make_repo(tmp_path / "repo", models)
    listing = subprocess.run([str(switchyard_bin), "models", str(repo), "--json"],
                             check=True, capture_output=True, text=True)
    versions = {m["name"]: m["versions"][0] for m in json.loads(listing.stdout)["models"]}
    assert versions["gemma3"]["family"] == "gemma3"
    assert versions["gemma3"]["quant_mix"] == GEMMA3_MIX
    assert versions["smollm2"]["family"] == "llama"
    assert versions["smollm2"]["quant_mix"].startswith("Q4_1: Q4_1 ")
    table = subprocess.run([str(switchyard_bin), "models", str(repo)], check=True, capture_output=True, text=True)
    assert GEMMA3_MIX in table.stdout

    server, base, admin = serve(switchyard_bin, repo)
    with server:
        jobs = [(name, prompt) for _ in range(3) for name in models for prompt in PROMPTS]
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda job: greedy(base, *job), jobs))
        wrong = [(job, got, alone[job]) for job, got in zip(jobs, answers) if got != alone[job]]
        assert not wrong, f"{len(wrong)} of {len(jobs)} answers differ from the model served alone: {wrong[:3]}"

        request = urllib.request.Request(admin + "/admin/models", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=60) as r:
            body = json.loads(r.read())
        loaded = {m["name"]: v for m in body["models"] for v in m["versions"] if v["tier"] == "ram"}
        assert loaded["gemma3"]["family"] == "gemma3"
        assert loaded["gemma3"]["quant_mix"] == GEMMA3_MIX
        assert loaded["smollm2"]["family"] == "llama"
