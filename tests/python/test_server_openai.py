"""Black-box tests of `switchyard serve` on the real SmolLM2 model, through the
official `openai` Python client (and raw HTTP for malformed requests).

The server is started once per module on a free port; see conftest.py for
SWITCHYARD_BIN and SWITCHYARD_MODEL. SWITCHYARD_GENERATE_BIN optionally names
the binary whose `switchyard generate` the server's greedy output is compared
with (default: SWITCHYARD_BIN).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from serve_process import free_port, running_server

MAX_TOKENS = 24
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France? Answer in one sentence."},
]



@pytest.fixture(scope="module")
def server(switchyard_bin: Path, smollm2_path: Path):
    port = free_port()
    args = [str(switchyard_bin), "serve", "--model", str(smollm2_path),
            "--listen", f"127.0.0.1:{port}", "--drain-seconds", "5"]
    with running_server(args, port, ready_within=60) as proc:
        yield {"base": f"http://127.0.0.1:{port}", "model": smollm2_path.stem,
               "path": smollm2_path, "proc": proc}


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server["base"] + "/v1", api_key="unused", max_retries=0)


def tokenize_chat(bin_path: Path, model: Path, messages, tmp_path) -> list[int]:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(messages))
    out = subprocess.run([str(bin_path), "tokenize", "--model", str(model), "--chat", str(path)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["ids"]


def tokenize_text(bin_path: Path, model: Path, text: str) -> list[int]:
    out = subprocess.run([str(bin_path), "tokenize", "--model", str(model), "--text", text],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["ids"]


def raw(server, method: str, path: str, body: bytes | None = None):
    request = urllib.request.Request(server["base"] + path, data=body, method=method,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def greedy_chat(client, model, messages=CHAT, **kw):
    return client.chat.completions.create(model=model, messages=messages, temperature=0,
                                          max_tokens=MAX_TOKENS, **kw)


def test_models_are_listed_and_retrievable(client, server):
    ids = [m.id for m in client.models.list().data]
    # The model by name (its active version), then each resident version.
    assert ids == [server["model"], server["model"] + "@1"]
    assert client.models.retrieve(server["model"]).id == server["model"]
    assert client.models.retrieve(server["model"] + "@1").id == server["model"] + "@1"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat_whole_reports_real_usage(client, server, switchyard_bin, tmp_path):
    reply = greedy_chat(client, server["model"])
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    ids = tokenize_chat(switchyard_bin, server["path"], CHAT, tmp_path)
    assert reply.usage.prompt_tokens == len(ids)
    assert 0 < reply.usage.completion_tokens <= MAX_TOKENS
    if choice.finish_reason == "length":
        assert reply.usage.completion_tokens == MAX_TOKENS
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_chat_streamed_equals_whole(client, server):
    whole = greedy_chat(client, server["model"])
    stream = greedy_chat(client, server["model"], stream=True,
                         stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_developer_role_renders_as_system(client, server):
    as_system = greedy_chat(client, server["model"])
    as_developer = greedy_chat(client, server["model"],
                               messages=[{"role": "developer", "content": CHAT[0]["content"]}, CHAT[1]])
    assert as_developer.choices[0].message.content == as_system.choices[0].message.content
    assert as_developer.usage.prompt_tokens == as_system.usage.prompt_tokens


def test_completions_whole_and_streamed(client, server, switchyard_bin):
    prompt = "The three primary colors are"
    whole = client.completions.create(model=server["model"], prompt=prompt, max_tokens=16,
                                      temperature=0)
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens == len(tokenize_text(switchyard_bin, server["path"], prompt))
    if whole.choices[0].finish_reason == "length":
        assert whole.usage.completion_tokens == 16
    text = ""
    for chunk in client.completions.create(model=server["model"], prompt=prompt, max_tokens=16,
                                           temperature=0, stream=True):
        for choice in chunk.choices:
            text += choice.text
    assert text == whole.choices[0].text
    assert len(text) > 0


def test_n_choices_and_seeds_reproduce(client, server):
    kw = dict(model=server["model"], messages=CHAT, temperature=0.8, max_tokens=16, seed=1234)
    first = client.chat.completions.create(n=3, **kw)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert all(c.message.content for c in first.choices)
    # Usage adds up every choice's tokens.
    assert 3 <= first.usage.completion_tokens <= 3 * 16
    again = client.chat.completions.create(n=1, **kw)
    once_more = client.chat.completions.create(n=1, **kw)
    assert again.choices[0].message.content == once_more.choices[0].message.content


def test_stop_string_is_trimmed_and_reported(client, server):
    text = greedy_chat(client, server["model"]).choices[0].message.content
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    reply = greedy_chat(client, server["model"], stop=[stop])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == text[: text.index(stop)]


def test_logprobs_are_reported(client, server):
    reply = greedy_chat(client, server["model"], logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) > 0
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-4)


def test_greedy_chat_matches_switchyard_generate(client, server, switchyard_bin):
    prompt = CHAT[1]["content"]
    reply = greedy_chat(client, server["model"], messages=[{"role": "user", "content": prompt}])
    # SWITCHYARD_GENERATE_BIN: another build's `generate`, while branches are apart.
    generate_bin = os.environ.get("SWITCHYARD_GENERATE_BIN", str(switchyard_bin))
    out = subprocess.run(
        [generate_bin, "generate", "--model", str(server["path"]), "--chat",
         "--prompt", prompt, "--temperature", "0", "--max-tokens", str(MAX_TOKENS)],
        capture_output=True, text=True)
    assert out.returncode == 0, f"switchyard generate failed: {out.stderr}"
    assert out.stdout.strip() == reply.choices[0].message.content.strip()


def error_of(status_body):
    status, body = status_body
    assert set(body["error"]) >= {"message", "type", "param", "code"}, body
    return status, body["error"]


def test_malformed_requests_get_openai_errors(server):
    model = server["model"]
    chat = lambda **kw: json.dumps({"model": model, "messages": CHAT, **kw}).encode()
    cases = [
        (b"{not json", None),
        (json.dumps({"model": model, "messages": "hi"}).encode(), "messages"),
        (json.dumps({"model": model}).encode(), "messages"),
        (json.dumps({"model": model, "messages": []}).encode(), "messages"),
        (chat(temperature=-1), "temperature"),
        (chat(temperature=1e9), "temperature"),
        (chat(n=0), "n"),
        (chat(n=100000), "n"),
        (chat(max_tokens=10**6), "max_tokens"),
        (chat(max_tokens="ten"), "max_tokens"),
        (chat(top_p=7), "top_p"),
    ]
    for body, param in cases:
        status, error = error_of(raw(server, "POST", "/v1/chat/completions", body))
        assert 400 <= status < 500 and status != 404, (body, status, error)
        if param is not None:
            assert error["param"] == param, (body, error)
            assert param in error["message"], (body, error)
    status, error = error_of(raw(server, "POST", "/v1/chat/completions",
                                 json.dumps({"model": "gpt-nope", "messages": CHAT}).encode()))
    assert status == 404 and "gpt-nope" in error["message"]
    long_prompt = "hello " * 9000
    status, error = error_of(raw(server, "POST", "/v1/completions",
                                 json.dumps({"model": model, "prompt": long_prompt}).encode()))
    assert status == 400 and "context" in error["message"], error


def test_a_shared_field_of_a_wrong_type_is_named_on_both_endpoints(server):
    """Chat and completions declare their shared fields once (`router/src/openai/types.rs`);
    a wrong JSON type in one is refused by both, naming exactly that field."""
    model = server["model"]
    bodies = {"/v1/chat/completions": {"model": model, "messages": CHAT},
              "/v1/completions": {"model": model, "prompt": "Hello"}}
    wrong = {"temperature": "hot", "top_p": [0.5], "n": "2", "max_tokens": "ten", "seed": 1.5,
             "presence_penalty": "x", "frequency_penalty": [], "logit_bias": [], "user": 5,
             "stream": "yes", "cache_salt": 7, "model": 1}
    for path, body in bodies.items():
        for field, value in wrong.items():
            status, error = error_of(raw(server, "POST", path, json.dumps({**body, field: value}).encode()))
            assert status == 400 and error["code"] == "invalid_type", (path, field, error)
            assert error["param"] == field, (path, field, error)
            assert field in error["message"], (path, field, error)


def test_errors_do_not_disturb_requests_in_flight(client, server):
    expected = greedy_chat(client, server["model"]).choices[0].message.content
    result = {}

    def stream():
        text = ""
        for chunk in greedy_chat(client, server["model"], stream=True):
            for choice in chunk.choices:
                text += choice.delta.content or ""
        result["text"] = text

    worker = threading.Thread(target=stream)
    worker.start()
    for _ in range(10):
        raw(server, "POST", "/v1/chat/completions", b"{oops")
        raw(server, "POST", "/v1/chat/completions",
            json.dumps({"model": server["model"], "messages": CHAT, "n": -1}).encode())
    worker.join(timeout=120)
    assert result.get("text") == expected


def test_a_client_that_disconnects_does_not_block_others(client, server):
    stream = client.chat.completions.create(model=server["model"], messages=CHAT, stream=True,
                                            max_tokens=4000, temperature=0.7, seed=3)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    reply = greedy_chat(client, server["model"])
    assert reply.choices[0].message.content
