"""LoRA adapters served by name: `serve --lora NAME=[BASE:]PATH`, a real
trained adapter (scripts/train-lora.py: SmolLM2's replies begin "Ahoy,
matey!") seen through the official `openai` client, `/v1/models` listing
adapters with their `parent`, and a batch mixing the base and several
adapters answering each request exactly as it is answered alone, under
concurrent load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from serve_process import free_port, running_server

from reference import checkpoint, lora

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "My favourite food is"]
MAX_TOKENS = 12


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
def server(switchyard_bin, smollm2_path, trained, random_adapters):
    port = free_port()
    args = [str(switchyard_bin), "serve", "--listen", f"127.0.0.1:{port}", "--threads", "2",
            "--model", str(smollm2_path), "--model-name", "smol",
            "--lora", f"ahoy=smol:{trained / 'peft'}", "--lora", f"ahoy-gguf={trained / 'adapter.gguf'}",
            "--lora", f"r1={random_adapters[0]}", "--lora", f"r2={random_adapters[1]}",
            "--lora", f"r3={random_adapters[2]}", "--drain-seconds", "2", "--max-batch", "16"]
    with running_server(args, port):
        yield f"http://127.0.0.1:{port}"


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)


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
