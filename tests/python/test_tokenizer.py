"""Switchyard's tokenizer and chat templates against independent references.

* GGUF tokenization is compared with llama.cpp's (llama-cpp-python, vocab only)
  on a corpus of tricky strings (tokenizer_corpus.json).
* Chat templates are compared with Python jinja2 set up the way transformers
  renders them (trim_blocks, lstrip_blocks, raise_exception, tojson).
* The tokenizer.json path is compared with the Python `tokenizers` package on
  a tokenizer.json built here from the GGUF vocabulary.

Self-contained: the binary comes from SWITCHYARD_BIN or target/release/switchyard,
the model from SWITCHYARD_MODEL or the fetch script's cache.
"""

import json
import subprocess
from pathlib import Path

import pytest

CORPUS = json.loads((Path(__file__).with_name("tokenizer_corpus.json")).read_text(encoding="utf-8"))

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "  And 3+3?  \n"},
    ],
    [
        {"role": "user", "content": "Écris un haïku 🌸 sur <|im_start|> les jetons."},
        {"role": "assistant", "content": "def f():\n\treturn 1\n"},
        {"role": "user", "content": ""},
    ],
]

# A template with the Python-isms checkpoints use.
PYTHONIC_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'].strip() %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set rest = messages %}{% endif %}"
    "{% for message in rest %}\n"
    "    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}\n"
    "    {% if loop.first and system %}[SYS] {{ system }} [/SYS]\n{% endif %}\n"
    "    {% if message['role'].startswith('user') %}[INST] {{ message['content'].strip() }} [/INST]"
    "{% else %} {{ message['content'] | trim }}{{ eos_token }}{% endif %}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '' }}{% endif %}"
)


@pytest.fixture(scope="module")
def binary(switchyard_bin) -> Path:
    return switchyard_bin


@pytest.fixture(scope="module")
def model(smollm2_path) -> Path:
    return smollm2_path


@pytest.fixture(scope="module")
def llama(model):
    import llama_cpp  # installed by scripts/setup.sh (scripts/install-llama-cpp.sh)

    return llama_cpp.Llama(str(model), vocab_only=True, verbose=False)


@pytest.fixture(scope="module")
def gguf_tokenizer_metadata(model):
    """The tokenizer keys, read with the `gguf` package (not our reader)."""
    import gguf  # tests/python/requirements.txt
    reader = gguf.GGUFReader(str(model))
    return {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}


def run_cli(binary: Path, *args) -> object:
    result = subprocess.run(
        [str(binary), "tokenize", *map(str, args)], capture_output=True, text=True, encoding="utf-8"
    )
    assert result.returncode == 0, f"switchyard tokenize {args} failed:\n{result.stderr}"
    return json.loads(result.stdout)


def first_difference(ours, theirs) -> str:
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return f"first difference at index {i}: ours {ours[i:i + 8]} vs reference {theirs[i:i + 8]}"
    return f"lengths differ: ours {len(ours)} vs reference {len(theirs)}"


def transformers_jinja_render(template: str, messages, bos_token: str, eos_token: str) -> str:
    """Renders like transformers' apply_chat_template."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages,
        add_generation_prompt=True,
        bos_token=bos_token,
        eos_token=eos_token,
        tools=None,
        documents=None,
    )


@pytest.mark.parametrize("add_special", [True, False], ids=["special", "no-special"])
def test_gguf_ids_match_llama_cpp(binary, model, llama, tmp_path, add_special):
    corpus_file = tmp_path / "corpus.json"
    corpus_file.write_text(json.dumps(CORPUS, ensure_ascii=False), encoding="utf-8")
    args = ["--model", model, "--input", corpus_file] + ([] if add_special else ["--no-special"])
    ours = run_cli(binary, *args)
    assert len(ours) == len(CORPUS)
    mismatches = []
    for text, our_ids in zip(CORPUS, ours):
        reference = llama.tokenize(text.encode("utf-8"), add_bos=add_special, special=True)
        if our_ids != reference:
            mismatches.append(f"{text[:60]!r}: {first_difference(our_ids, reference)}")
    assert not mismatches, f"{len(mismatches)} of {len(CORPUS)} texts differ:\n" + "\n".join(mismatches)


@pytest.mark.parametrize("add_special", [True, False], ids=["special", "no-special"])
def test_gemma3_ids_match_llama_cpp(binary, gemma3_path, tmp_path, add_special):
    """Gemma 3's SentencePiece vocabulary (262k tokens, no space prefix,
    byte fallback) tokenizes the corpus exactly as llama.cpp does."""
    import llama_cpp  # installed by scripts/setup.sh (scripts/install-llama-cpp.sh)

    model = gemma3_path
    llama = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    corpus_file = tmp_path / "corpus.json"
    corpus_file.write_text(json.dumps(CORPUS, ensure_ascii=False), encoding="utf-8")
    args = ["--model", model, "--input", corpus_file] + ([] if add_special else ["--no-special"])
    ours = run_cli(binary, *args)
    assert len(ours) == len(CORPUS)
    mismatches = []
    for text, our_ids in zip(CORPUS, ours):
        reference = llama.tokenize(text.encode("utf-8"), add_bos=add_special, special=True)
        if our_ids != reference:
            mismatches.append(f"{text[:60]!r}: {first_difference(our_ids, reference)}")
    assert not mismatches, f"{len(mismatches)} of {len(CORPUS)} texts differ:\n" + "\n".join(mismatches)
    text = "Hello <start_of_turn>user 123 🤖\n\n  spaces"
    ids = run_cli(binary, "--model", model, "--text", text)["ids"]
    assert ids == llama.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    assert llama.detokenize(ids, special=True).decode("utf-8").endswith(text)


def test_single_text_and_detokenization(binary, model, llama):
    text = "Hello <|im_start|> 123 🤖"
    ours = run_cli(binary, "--model", model, "--text", text)["ids"]
    assert ours == llama.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    assert llama.detokenize(ours, special=True).decode("utf-8") == text


@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_gguf_chat_template_matches_jinja2(binary, model, llama, gguf_tokenizer_metadata, tmp_path, conversation):
    messages = CONVERSATIONS[conversation]
    meta = gguf_tokenizer_metadata
    tokens = meta["tokenizer.ggml.tokens"]
    expected_text = transformers_jinja_render(
        meta["tokenizer.chat_template"],
        messages,
        tokens[meta["tokenizer.ggml.bos_token_id"]],
        tokens[meta["tokenizer.ggml.eos_token_id"]],
    )
    messages_file = tmp_path / "messages.json"
    messages_file.write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
    ours = run_cli(binary, "--model", model, "--chat", messages_file)
    assert ours["text"] == expected_text
    assert ours["ids"] == llama.tokenize(expected_text.encode("utf-8"), add_bos=False, special=True)


@pytest.fixture(scope="module")
def tokenizer_json_dir(gguf_tokenizer_metadata, tmp_path_factory):
    """A tokenizer.json equivalent to SmolLM2's, built from the GGUF vocabulary
    with the Python `tokenizers` package, and a tokenizer_config.json."""
    import tokenizers  # tests/python/requirements.txt
    from tokenizers import AddedToken, decoders, models, pre_tokenizers

    meta = gguf_tokenizer_metadata
    tokens = meta["tokenizer.ggml.tokens"]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = tokenizers.Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    control = [t for t, kind in zip(tokens, meta["tokenizer.ggml.token_type"]) if kind == 3]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])

    directory = tmp_path_factory.mktemp("hf_tokenizer")
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": tokens[meta["tokenizer.ggml.bos_token_id"]],
        "eos_token": {"content": tokens[meta["tokenizer.ggml.eos_token_id"]], "special": True},
        "chat_template": PYTHONIC_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def test_tokenizer_json_ids_match_python_tokenizers(binary, tokenizer_json_dir, llama, tmp_path):
    from tokenizers import Tokenizer

    corpus_file = tmp_path / "corpus.json"
    corpus_file.write_text(json.dumps(CORPUS, ensure_ascii=False), encoding="utf-8")
    ours = run_cli(binary, "--model", tokenizer_json_dir / "tokenizer.json", "--input", corpus_file)
    reference = Tokenizer.from_file(str(tokenizer_json_dir / "tokenizer.json"))
    mismatches = []
    for text, our_ids in zip(CORPUS, ours):
        expected = reference.encode(text, add_special_tokens=True).ids
        if our_ids != expected:
            mismatches.append(f"{text[:60]!r}: {first_difference(our_ids, expected)}")
        # The same vocabulary through llama.cpp: the two paths agree.
        assert our_ids == llama.tokenize(text.encode("utf-8"), add_bos=False, special=True), text[:60]
    assert not mismatches, f"{len(mismatches)} of {len(CORPUS)} texts differ:\n" + "\n".join(mismatches)


@pytest.mark.parametrize("conversation", [1, 2])
def test_pythonic_template_from_tokenizer_config_matches_jinja2(binary, tokenizer_json_dir, tmp_path, conversation):
    from tokenizers import Tokenizer

    messages = CONVERSATIONS[conversation]
    expected_text = transformers_jinja_render(PYTHONIC_TEMPLATE, messages, "<|im_start|>", "<|im_end|>")
    messages_file = tmp_path / "messages.json"
    messages_file.write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
    ours = run_cli(binary, "--model", tokenizer_json_dir / "tokenizer.json", "--chat", messages_file)
    assert ours["text"] == expected_text
    reference = Tokenizer.from_file(str(tokenizer_json_dir / "tokenizer.json"))
    assert ours["ids"] == reference.encode(expected_text, add_special_tokens=False).ids


def test_template_raise_exception_is_reported(binary, tokenizer_json_dir, tmp_path):
    messages = [{"role": "assistant", "content": "I speak first"}]
    messages_file = tmp_path / "messages.json"
    messages_file.write_text(json.dumps(messages), encoding="utf-8")
    result = subprocess.run(
        [str(binary), "tokenize", "--model", str(tokenizer_json_dir / "tokenizer.json"), "--chat", str(messages_file)],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "Conversation roles must alternate" in result.stderr


def test_missing_tokenizer_json_names_the_file(binary, tmp_path):
    missing = tmp_path / "nowhere" / "tokenizer.json"
    missing.parent.mkdir()
    missing.write_text("{ not json", encoding="utf-8")
    result = subprocess.run(
        [str(binary), "tokenize", "--model", str(missing), "--text", "x"], capture_output=True, text=True
    )
    assert result.returncode != 0
    assert str(missing) in result.stderr
