"""A new user's first hour (issue 36), each case against the real binary and
the two real test models.

1. Chat with Gemma 3 270M: the file ships no chat template but says
   `add_bos_token`; the prompt ids must be llama.cpp's for its `gemma`
   template (BOS included) and the answer must hold no template markers.
2. A policy naming checkpoints nobody serves stops startup.
3. A model.toml typo or one bad --model path stops startup, each problem once
   (test_startup_skips.py: a bad version, and --allow-partial-start).
4. `policy check` lists every problem.
5. A port in use is said before the models load.
6. `policy explain` prints utilities readably and fails when nothing can be picked.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from conftest import run_json
from first_hour_server import logged_server, run_to_exit
from serve_process import free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "  And 3+3?  \n"},
    ],
]
MARKERS = ["<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|im_end|>", "<im_start>", "<bos>"]


def link_or_copy(source: Path, dest: Path):
    # Not a symlink: the repository scan refuses files whose real path lies outside it.
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def llama_cpp_prompt(llama, template: str, messages: list[dict]) -> list[int]:
    """llama.cpp's prompt ids: its built-in `template` applied to `messages`, then
    tokenized with the special tokens the file asks for (BOS), as llama-server does."""
    import llama_cpp  # scripts/install-llama-cpp.sh

    chat = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode()) for m in messages]
    )
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(template.encode(), chat, len(messages), True, buf, len(buf))
    assert 0 < n <= len(buf), f"llama_chat_apply_template returned {n}"
    text = buf.raw[:n].decode()
    return llama.tokenize(text.encode(), add_bos=True, special=True)


@pytest.fixture(scope="module")
def gemma_llama(gemma3_path):
    import llama_cpp

    return llama_cpp.Llama(str(gemma3_path), vocab_only=True, verbose=False)


@pytest.fixture(scope="module")
def two_models(switchyard_bin, smollm2_path, gemma3_path, tmp_path_factory):
    """One server: SmolLM2 as `smol`, Gemma 3 as `gemma`, no flags beyond the README's."""
    port = free_port()
    log = tmp_path_factory.mktemp("two_models") / "serve.log"
    args = [str(switchyard_bin), "serve", "--listen", f"127.0.0.1:{port}", "--threads", "2",
            "--model", str(smollm2_path), "--model-name", "smol",
            "--model", str(gemma3_path), "--model-name", "gemma", "--drain-seconds", "2"]
    with logged_server(args, port, log):
        yield f"http://127.0.0.1:{port}", log


@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_gemma_chat_prompt_ids_are_llama_cpps(switchyard_bin, gemma3_path, gemma_llama, tmp_path, conversation):
    messages = CONVERSATIONS[conversation]
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(messages))
    ours = run_json(switchyard_bin, "tokenize", "--model", gemma3_path, "--chat", chat)
    theirs = llama_cpp_prompt(gemma_llama, "gemma", messages)
    assert ours["ids"] == theirs, ours["text"]
    assert ours["ids"][0] == 2 and ours["ids"].count(2) == 1, "exactly one BOS"
    assert "gemma" in ours["template"], ours["template"]


def test_gemma_chat_over_http_uses_the_gemma_prompt_and_answers_without_markers(two_models, gemma_llama):
    base, log = two_models
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
    messages = CONVERSATIONS[0]
    reply = client.chat.completions.create(model="gemma", messages=messages, max_tokens=24, temperature=0)
    assert reply.usage.prompt_tokens == len(llama_cpp_prompt(gemma_llama, "gemma", messages))
    answer = reply.choices[0].message.content
    assert not any(marker in answer for marker in MARKERS), answer
    console = log.read_text()
    assert "`gemma@1`" in console and "built-in `gemma`" in console, console
    assert "`smol@1`" in console and "chat template: the checkpoint's own" in console, console


def test_chat_template_flag_names_a_template_or_a_file(switchyard_bin, gemma3_path, gemma_llama, tmp_path):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(CONVERSATIONS[1]))
    chatml = run_json(switchyard_bin, "tokenize", "--model", gemma3_path, "--chat", chat, "--chat-template", "chatml")
    assert chatml["ids"] == llama_cpp_prompt(gemma_llama, "chatml", CONVERSATIONS[1])
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    from_file = run_json(switchyard_bin, "tokenize", "--model", gemma3_path, "--chat", chat, "--chat-template", jinja)
    assert from_file["text"].startswith("[system] You are terse.\n[user] What is 2+2?")
    assert from_file["ids"][0] == 2, "BOS from add_bos_token though the template writes none"


# 2. A policy whose names nothing serves stops startup, naming its line and the served names.
def test_a_policy_naming_unserved_checkpoints_stops_startup(switchyard_bin, smollm2_path):
    policy = EXAMPLES / "policy-cost-saver.toml"
    done = run_to_exit([switchyard_bin, "serve", "--listen", f"127.0.0.1:{free_port()}", "--threads", "2",
                        "--model", smollm2_path, "--model-name", "smol", "--policy", policy])
    assert done.returncode != 0, done.stderr
    err = done.stderr
    assert "`smollm2-135m@q4_1`" in err and "policy-cost-saver.toml:18" in err, err
    assert "serves smol@1" in err and "`NAME@1`" in err, err
    assert err.count("`smollm2-135m@q4_1`") == 1, err


# 3. A model.toml typo stops startup (and `switchyard models` exits non-zero); so does one
#    bad --model path of two, each problem once with its file.
def test_a_model_toml_typo_stops_startup_and_fails_models(switchyard_bin, smollm2_path, tmp_path):
    repo = tmp_path / "repo"
    for name in ("good", "typo"):
        (repo / name / "1").mkdir(parents=True)
        link_or_copy(smollm2_path, repo / name / "1" / "model.gguf")
    (repo / "typo" / "model.toml").write_text('aliases = []\ndefault_versoin = "1"\n')
    listing = run_to_exit([switchyard_bin, "models", repo])
    assert listing.returncode != 0 and "default_versoin" in listing.stdout, listing
    done = run_to_exit([switchyard_bin, "serve", "--repo", repo, "--listen", f"127.0.0.1:{free_port()}"])
    assert done.returncode != 0, done.stderr
    assert done.stderr.count("default_versoin") == 1 and "line 2, column 1" in done.stderr, done.stderr


def test_one_bad_model_path_of_two_stops_startup(switchyard_bin, smollm2_path, tmp_path):
    missing = tmp_path / "nope.gguf"
    done = run_to_exit([switchyard_bin, "serve", "--listen", f"127.0.0.1:{free_port()}", "--threads", "2",
                        "--model", smollm2_path, "--model", missing])
    assert done.returncode != 0, done.stderr
    assert done.stderr.count(str(missing)) == 1, done.stderr
    assert "cannot read" in done.stderr and done.stderr.count("cannot read") == 1, done.stderr
    assert "admin API" not in done.stderr.split("did not start")[1], done.stderr


# 5. A port in use is found before the models load.
def test_a_port_in_use_is_said_before_loading(switchyard_bin, gemma3_path):
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_to_exit([switchyard_bin, "serve", "--listen", f"127.0.0.1:{port}", "--model", gemma3_path])
    assert done.returncode != 0 and f"cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr
    assert "loaded" not in done.stderr, done.stderr


# 4. `policy check` lists every problem: typos on two lines, both reported.
def test_policy_check_lists_every_problem(switchyard_bin, tmp_path):
    lines = (EXAMPLES / "policy-cost-saver.toml").read_text().splitlines()
    assert lines[11].startswith("cost_weight") and lines[22].startswith("quality =")
    lines[11] = lines[11].replace("cost_weight", "cost_wieght")
    lines[22] = lines[22].replace("quality", "qualty")
    policy = tmp_path / "typos.toml"
    policy.write_text("\n".join(lines) + "\n")
    done = run_to_exit([switchyard_bin, "policy", "check", policy])
    assert done.returncode != 0
    assert f"{policy}:12:1:" in done.stderr and "cost_wieght" in done.stderr, done.stderr
    assert f"{policy}:23:1:" in done.stderr and "qualty" in done.stderr, done.stderr
    # The misspelt `quality` also leaves that model with no quality figure
    # (`quality` is optional since `quality_from`): a third problem, said once.
    assert "has no quality" in done.stderr, done.stderr
    assert "3 problems" in done.stderr, done.stderr


# 6. `policy explain` prints utilities that tell candidates apart, and fails without a pick.
def test_policy_explain_is_readable_and_fails_without_a_pick(switchyard_bin, tmp_path):
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"model": "auto", "messages": [{"role": "user", "content": "Hi"}]}))
    policy = EXAMPLES / "policy-cost-saver.toml"
    done = run_to_exit([switchyard_bin, "policy", "explain", policy, "--request", request])
    assert done.returncode == 0, done.stderr
    utilities = [line.split("utility ")[1].split()[0] for line in done.stdout.splitlines() if "utility " in line]
    assert len(utilities) >= 2 and "-0.0000" not in utilities, done.stdout
    assert len(set(utilities)) == len(utilities), utilities
    unpickable = run_to_exit([switchyard_bin, "policy", "explain", policy, "--request", request,
                              "--header", "x-switchyard-min-quality: 0.99"])
    assert unpickable.returncode != 0, unpickable.stdout
    assert "no pick" in unpickable.stdout, unpickable.stdout


# 6. The flags people reach for: --api-key, --ctx-size, --log-level, --log-format.
@pytest.fixture(scope="module")
def keyed_server(switchyard_bin, smollm2_path, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("keyed") / "serve.log"
    args = [str(switchyard_bin), "serve", "--listen", f"127.0.0.1:{port}", "--threads", "2",
            "--model", str(smollm2_path), "--model-name", "smol", "--ctx-size", "64",
            "--api-key", "key-one", "--api-key", "key-two", "--log-level", "info", "--drain-seconds", "2"]
    with logged_server(args, port, log):
        yield f"http://127.0.0.1:{port}", log


def get(url: str, key: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_api_keys_guard_v1_and_leave_the_probes_open(keyed_server):
    base, _ = keyed_server
    status, body = get(base + "/v1/models")
    assert status == 401 and body["error"]["code"] == "invalid_api_key", body
    assert get(base + "/v1/models", "wrong")[0] == 401
    assert get(base + "/ready")[0] == 200 and get(base + "/health")[0] == 200
    client = openai.OpenAI(base_url=base + "/v1", api_key="key-two", max_retries=0, timeout=60)
    reply = client.completions.create(model="smol", prompt="Hi", max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base + "/v1", api_key="nope", max_retries=0).models.list()


def test_ctx_size_bounds_the_context(keyed_server):
    base, _ = keyed_server
    status, body = get(base + "/v1/models", "key-one")
    assert status == 200 and body["data"][0]["context_length"] == 64, body
    client = openai.OpenAI(base_url=base + "/v1", api_key="key-one", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="smol", prompt="word " * 80, max_tokens=4)


def test_embeddings_respect_ctx_size_and_name_the_input(keyed_server):
    base, _ = keyed_server
    client = openai.OpenAI(base_url=base + "/v1", api_key="key-one", max_retries=0, timeout=60)
    fits = client.embeddings.create(model="smol", input=[[1] * 64], encoding_format="float")
    assert fits.usage.prompt_tokens == 64 and len(fits.data[0].embedding) == 576
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="smol", input=["fits", [1] * 65])
    assert refused.value.body["param"] == "input[1]", refused.value.body
    assert "maximum context length is 64 tokens" in refused.value.body["message"], refused.value.body


def test_logs_have_no_colour_when_redirected(keyed_server):
    _, log = keyed_server
    text = log.read_text()
    assert " INFO " in text and "\x1b[" not in text, text


def json_lines(stderr: str) -> list[dict]:
    """Every line of `stderr` as a JSON object (a line that is not one fails the test)."""
    events = []
    for line in stderr.splitlines():
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"a log line is not JSON: {line!r}\n{stderr}")
        assert isinstance(event, dict) and {"timestamp", "level", "target", "message"} <= event.keys(), line
        events.append(event)
    return events


def test_json_logs_cover_everything_a_refused_start_prints(switchyard_bin, smollm2_path):
    done = run_to_exit([switchyard_bin, "serve", "--listen", f"127.0.0.1:{free_port()}", "--log-format", "json",
                        "--log-level", "info", "--model", smollm2_path, "--model", smollm2_path.parent / "nope.gguf"])
    assert done.returncode != 0
    events = json_lines(done.stderr)
    assert any(e["message"] == "load failed; nothing changed" for e in events), events
    # The error the program exits with is a JSON line too, with every problem in it.
    last = events[-1]
    assert last["level"] == "ERROR" and "did not start" in last["message"] and "nope.gguf" in last["message"], last
    assert "--log-level" in run_to_exit([switchyard_bin, "serve", "--log-level", "loud=7=x"]).stderr


def test_json_logs_cover_startup_access_lines_and_stop(switchyard_bin, smollm2_path, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    args = [str(switchyard_bin), "serve", "--listen", f"127.0.0.1:{port}", "--threads", "2",
            "--model", str(smollm2_path), "--model-name", "smol", "--api-key", "key-one",
            "--log-format", "json", "--log-level", "info", "--drain-seconds", "2"]
    with logged_server(args, port, log):
        base = f"http://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=base + "/v1", api_key="key-one", max_retries=0, timeout=60)
        client.completions.create(model="smol", prompt="Hi", max_tokens=2,
                                  extra_headers={"x-request-id": "json-log-check"})
    events = json_lines(log.read_text())
    messages = [e["message"] for e in events]
    assert any(m.startswith("loaded `smol@1`") for m in messages), messages
    assert any(m.startswith("serving OpenAI-compatible API on http://") for m in messages), messages
    assert any("API key" in m for m in messages), messages
    assert messages[-1] == "stopped", messages
    # One access line per response, carrying the request's span fields.
    access = [e for e in events if e.get("request_id") == "json-log-check" and "status" in e]
    assert access and access[0]["path"] == "/v1/completions" and access[0]["method"] == "POST", events
    assert access[0]["status"] == 200, access
