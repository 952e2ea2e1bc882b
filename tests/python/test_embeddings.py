"""`POST /v1/embeddings` on a real server with both real models (SmolLM2 and
Gemma 3 270M), through the official `openai` client and a routing policy.

- the vectors equal the NumPy reference's (mean of the final hidden states after
  the output norm, unit length), within the tolerances written out below;
- a request of several inputs, and several concurrent requests, equal one
  request per input (the engine batches them into shared steps);
- `encoding_format` float and base64 (the client's default) agree;
- the policy path applies: a key is required, and a tenant's token budget is
  charged the prompt tokens (`usage.prompt_tokens`) until it refuses;
- bad input gets an OpenAI-shaped 400 naming the field.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
from conftest import run_json
from reference import checkpoint, llama
from serve_process import free_port, running_server

KEY = "sk-embeddings-tenant"
TIGHT_KEY = "sk-embeddings-tight"
ADMIN_TOKEN = "admin-embeddings-token-0123"
TIGHT_LIMIT = 40
HIDDEN = {"smol": 576, "gemma": 640}

TEXTS = [
    "The capital of France is Paris.",
    "A quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Photosynthesis turns light into chemical energy in plants.",
]

# The engine runs in float32 with ggml-style int8 activations; the reference in
# float64 with the same quantization (tests/python/reference/llama.py). A flip of
# one int8 rounding moves single hidden components; the mean over the tokens and
# the unit norm shrink that. Per component of the unit vectors (of norm 1, so a
# typical component is about 0.04), observed on these texts (2026-12-06, the
# NUMERICS lines of pytest -s): SmolLM2 at most 0.0057, Gemma 3 at most 0.0061;
# the bound leaves three times that.
EMBED_ATOL = {"smol": 0.02, "gemma": 0.02}
# Cosine similarity with the reference: observed at least 0.99975 (SmolLM2) and
# 0.99930 (Gemma 3). A vector that dropped one token of eight, or skipped the
# output norm, falls well below 0.998.
EMBED_MIN_COSINE = 0.998
# A batch against single requests: every kernel computes a row on its own, so
# only the split of a prompt across steps differs, which changes no sum.
BATCH_ATOL = 1e-5


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def policy_text() -> str:
    return f"""\
[routing]
allow_anonymous = false

[[models]]
name = "smol"
version = "1"
cost_per_1k_input = 0.001
cost_per_1k_output = 0.002
quality = 0.5
context_limit = 8192

[[models]]
name = "gemma"
version = "1"
cost_per_1k_input = 0.001
cost_per_1k_output = 0.002
quality = 0.5
context_limit = 32768

[[tenants]]
name = "embedder"
api_keys = ["sha256:{sha(KEY)}"]

[[tenants]]
name = "tight"
api_keys = ["sha256:{sha(TIGHT_KEY)}"]

[[tenants.budgets]]
window = "1d"
limit_tokens = {TIGHT_LIMIT}
"""


@pytest.fixture(scope="module")
def server(switchyard_bin: Path, smollm2_path: Path, gemma3_path: Path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("embeddings")
    policy = tmp / "policy.toml"
    policy.write_text(policy_text())
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve",
            "--model", str(smollm2_path), "--model-name", "smol",
            "--model", str(gemma3_path), "--model-name", "gemma",
            "--policy", str(policy), "--threads", "2",
            "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}",
            "--drain-seconds", "2"]
    with running_server(args, port, env={"SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN}):
        yield {"base": f"http://127.0.0.1:{port}", "admin": f"http://127.0.0.1:{admin_port}",
               "paths": {"smol": smollm2_path, "gemma": gemma3_path}}


def client(server, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server["base"] + "/v1", api_key=key, max_retries=0, timeout=300)


def post(server, body: dict, key: str = KEY):
    request = urllib.request.Request(
        server["base"] + "/v1/embeddings", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def vectors(reply) -> np.ndarray:
    return np.array([d.embedding for d in sorted(reply.data, key=lambda d: d.index)], dtype=np.float64)


@pytest.mark.parametrize("model", ["smol", "gemma"])
def test_vectors_match_the_numpy_reference(server, switchyard_bin, model):
    path = server["paths"][model]
    reply = client(server).embeddings.create(model=model, input=TEXTS[:2], encoding_format="float")
    got = vectors(reply)
    assert got.shape == (2, HIDDEN[model])
    assert reply.model.split("@")[0] == model
    reference = llama.Reference(checkpoint.load(path), act_quant=True)
    total = 0
    for text, vector in zip(TEXTS[:2], got):
        ids = run_json(switchyard_bin, "tokenize", "--model", path, "--text", text)["ids"]
        total += len(ids)
        want = reference.embedding(ids)
        diff = np.abs(vector - want)
        cosine = float(vector @ want / np.linalg.norm(vector))
        print(f"NUMERICS embedding {model}: {len(ids)} tokens, max |diff| {diff.max():.5f}, "
              f"cosine {cosine:.6f}")
        assert abs(np.linalg.norm(vector) - 1.0) < 1e-5
        assert diff.max() <= EMBED_ATOL[model], diff.max()
        assert cosine >= EMBED_MIN_COSINE, cosine
    # usage counts the tokens each input ran as (BOS included, as the file asks).
    assert reply.usage.prompt_tokens == total
    assert reply.usage.total_tokens == total


def test_a_batch_equals_single_and_concurrent_requests(server):
    c = client(server)
    batch = vectors(c.embeddings.create(model="smol", input=TEXTS, encoding_format="float"))
    with ThreadPoolExecutor(len(TEXTS)) as pool:
        singles = list(pool.map(
            lambda text: vectors(c.embeddings.create(model="smol", input=text,
                                                     encoding_format="float"))[0], TEXTS))
    assert np.abs(batch - np.array(singles)).max() <= BATCH_ATOL
    # Different texts give different vectors (a batch that mixed rows up would not).
    assert np.abs(batch[0] - batch[1]).max() > 0.05


def test_base64_the_clients_default_equals_float(server):
    c = client(server)
    as_float = vectors(c.embeddings.create(model="gemma", input=TEXTS[2], encoding_format="float"))
    # Without encoding_format the official client asks for base64 and decodes it.
    as_base64 = vectors(c.embeddings.create(model="gemma", input=TEXTS[2]))
    # JSON numbers are written as the shortest text that reads back as the same f32.
    assert np.array_equal(as_float.astype(np.float32), as_base64.astype(np.float32))


def test_token_id_inputs(server, switchyard_bin):
    path = server["paths"]["smol"]
    ids = run_json(switchyard_bin, "tokenize", "--model", path, "--text", TEXTS[0])["ids"]
    c = client(server)
    by_ids = vectors(c.embeddings.create(model="smol", input=[ids, ids[:3]], encoding_format="float"))
    by_text = vectors(c.embeddings.create(model="smol", input=TEXTS[0], encoding_format="float"))
    assert np.abs(by_ids[0] - by_text[0]).max() <= BATCH_ATOL
    one = c.embeddings.create(model="smol", input=ids[:3], encoding_format="float")
    assert one.usage.prompt_tokens == 3 and len(one.data) == 1


@pytest.mark.parametrize("body, param", [
    ({"model": "smol"}, "input"),
    ({"model": "smol", "input": ""}, "input"),
    ({"model": "smol", "input": []}, "input"),
    ({"model": "smol", "input": ["ok", ""]}, "input[1]"),
    ({"model": "smol", "input": {"text": "x"}}, "input"),
    ({"model": "smol", "input": [[1, 2], "x", 3]}, "input[2]"),
    ({"model": "smol", "input": [1, -2]}, "input[1]"),
    ({"model": "smol", "input": [10**7]}, "input"),
    ({"model": "smol", "input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"model": "smol", "input": "x", "dimensions": 128}, "dimensions"),
    ({"input": "x"}, "model"),
])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    status, reply = post(server, body)
    assert status == 400, reply
    assert reply["error"]["param"] == param, reply
    assert reply["error"]["message"], reply


@pytest.mark.parametrize("tokens", [[1] * 8193, ["ok", [1] * 8193]])
def test_an_input_longer_than_the_context_is_a_400(server, tokens):
    # The policy refuses it before it runs (the engine's own refusal, naming
    # `input[i]`, is checked without a policy in test_first_hour.py).
    status, reply = post(server, {"model": "smol", "input": tokens})
    assert status == 400, reply
    assert "context limit 8192" in reply["error"]["message"], reply


def test_dimensions_of_the_models_size_is_accepted(server):
    reply = client(server).embeddings.create(model="smol", input="x", dimensions=576,
                                             encoding_format="float")
    assert len(reply.data[0].embedding) == 576


def test_the_policy_requires_a_key_and_charges_the_prompt_tokens(server):
    with pytest.raises(openai.AuthenticationError):
        client(server, key="sk-wrong").embeddings.create(model="smol", input="x")
    c = client(server, key=TIGHT_KEY)
    charged = 0
    refused = None
    for _ in range(20):
        try:
            reply = c.embeddings.create(model="smol", input=TEXTS[1], encoding_format="float")
            charged += reply.usage.prompt_tokens
        except openai.RateLimitError as error:
            refused = error
            break
    assert refused is not None, f"the {TIGHT_LIMIT}-token budget never refused ({charged} charged)"
    assert refused.body["code"] == "budget_exhausted", refused.body
    assert 0 < charged <= TIGHT_LIMIT
    request = urllib.request.Request(server["admin"] + "/admin/policy",
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        policy = json.loads(r.read())
    budget = next(t for t in policy["tenants"] if t["name"] == "tight")["budgets"][0]
    assert budget["settled"] == charged, budget
    assert budget["reserved"] == 0, budget
