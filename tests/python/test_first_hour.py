"""A new user's first hour (issue 36), each case against the real binary and
the two real test models.

1. Chat with Gemma 3 270M: the file ships no chat template but says
   `add_bos_token`; the prompt ids must be llama.cpp's for its `gemma`
   template (BOS included) and the answer must hold no template markers.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import openai
import pytest
from conftest import run_json
from first_hour_server import logged_server
from serve_process import free_port

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
