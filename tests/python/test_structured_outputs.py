"""Structured outputs and tool calls through the official `openai` client,
against the real binary serving SmolLM2 (issue 20).

JSON-schema answers are checked with the independent `jsonschema` validator;
tool calls are checked against each tool's parameter schema the same way.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai
import pytest
from serve_process import free_port, running_server

# Every string and number bounded, so a sampled answer always ends well within
# MAX_TOKENS (an unbounded string could run to the token limit at temperature 1).
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "paint": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "glossy": {"type": "boolean"},
        },
        "required": ["color", "glossy"],
        "additionalProperties": False,
    },
    "tags": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                     "minItems": 1, "maxItems": 3},
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
    "city": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "pattern": "^[A-Z][a-z]{1,15}$"},
            "population": {"type": "integer", "minimum": 1, "maximum": 99999999},
            "capital": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
        },
        "required": ["city", "population", "capital"],
        "additionalProperties": False,
    },
}
MAX_TOKENS = 160

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
QUESTION = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def server(switchyard_bin: Path, smollm2_path: Path):
    port = free_port()
    args = [str(switchyard_bin), "serve", "--model", str(smollm2_path),
            "--listen", f"127.0.0.1:{port}", "--drain-seconds", "5"]
    with running_server(args, port, ready_within=60) as proc:
        yield {"base": f"http://127.0.0.1:{port}", "model": smollm2_path.stem, "proc": proc}


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server["base"] + "/v1", api_key="unused", max_retries=0,
                         timeout=300)


def json_schema_format(name: str) -> dict:
    return {"type": "json_schema",
            "json_schema": {"name": name, "strict": True, "schema": SCHEMAS[name]}}


def sampled_answer(client, model: str, name: str, seed: int, completions: bool) -> str:
    """One temperature-1.0 answer constrained to SCHEMAS[name]."""
    if completions:
        # The openai client has no response_format on completions; it goes in the body.
        reply = client.completions.create(
            model=model, prompt=f"A {name} record as JSON:", temperature=1.0, seed=seed,
            max_tokens=MAX_TOKENS, extra_body={"response_format": json_schema_format(name)})
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", (name, seed, choice)
        return choice.text
    reply = client.chat.completions.create(
        model=model, temperature=1.0, seed=seed, max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": f"Describe a {name} as JSON."}],
        response_format=json_schema_format(name))
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", (name, seed, choice)
    return choice.message.content


def test_one_hundred_sampled_schema_answers_all_validate(client, server):
    names = sorted(SCHEMAS)
    jobs = [(names[seed % len(names)], seed, seed % 5 == 4) for seed in range(100)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(
            lambda job: sampled_answer(client, server["model"], *job), jobs))
    for (name, seed, completions), text in zip(jobs, answers):
        value = json.loads(text)
        jsonschema.validate(value, SCHEMAS[name])
    # Sampling at temperature 1.0 really varies the answers (the mask is not
    # collapsing them onto one string).
    assert len(set(answers)) > 50


def test_json_object_mode_answers_an_object(client, server):
    reply = client.chat.completions.create(
        model=server["model"], temperature=0, max_tokens=MAX_TOKENS,
        messages=[{"role": "user",
                   "content": "Describe a cat as a JSON object with a name and a color."}],
        response_format={"type": "json_object"})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(json.loads(choice.message.content), dict)


def test_unsupported_schema_feature_is_refused_naming_it(client, server):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=server["model"], max_tokens=8, messages=QUESTION,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "u", "schema": schema}})
    error = refused.value.body
    assert error["param"] == "response_format.json_schema.schema", error
    assert "uniqueItems" in error["message"], error
    # Nothing else disturbed: the next request is answered.
    reply = client.chat.completions.create(model=server["model"], max_tokens=4,
                                           temperature=0, messages=QUESTION)
    assert reply.choices[0].finish_reason in ("stop", "length")


def check_calls(calls, allowed: set[str]):
    assert calls, "no tool calls"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed, call
        jsonschema.validate(json.loads(call.function.arguments),
                            PARAMETERS[call.function.name])


def test_two_round_tool_conversation(client, server):
    messages = list(QUESTION)
    first = client.chat.completions.create(
        model=server["model"], temperature=0, max_tokens=MAX_TOKENS, messages=messages,
        tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    check_calls(choice.message.tool_calls, {"get_weather", "get_time"})
    assert len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": json.dumps({"temperature": 18, "sky": "clear"})})
    second = client.chat.completions.create(
        model=server["model"], temperature=0, max_tokens=48, messages=messages,
        tools=TOOLS, tool_choice="auto")
    answer = second.choices[0]
    # The model is free now; whatever it chose must come back well formed.
    if answer.finish_reason == "tool_calls":
        check_calls(answer.message.tool_calls, {"get_weather", "get_time"})
    else:
        assert answer.finish_reason in ("stop", "length")
        assert answer.message.content and not answer.message.tool_calls
    # The tool result reached the prompt: the second prompt is longer than
    # the first by at least the call and its result.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 10


def test_streamed_tool_call_deltas_reassemble_into_the_whole_answer(client, server):
    named = {"type": "function", "function": {"name": "get_time"}}
    kwargs = dict(model=server["model"], temperature=0, max_tokens=MAX_TOKENS,
                  messages=QUESTION, tools=TOOLS, tool_choice=named)
    whole = client.chat.completions.create(**kwargs).choices[0]
    check_calls(whole.message.tool_calls, {"get_time"})
    calls: dict[int, dict] = {}
    finish = None
    pieces = 0
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                pieces += 1
                call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert pieces >= 2 * len(calls)
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_bad_tool_requests_name_the_field(client, server):
    def param(**kwargs) -> str:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=server["model"], max_tokens=4, **kwargs)
        return refused.value.body["param"]

    unknown = {"type": "function", "function": {"name": "get_stock_price"}}
    assert param(messages=QUESTION, tools=TOOLS, tool_choice=unknown) == "tool_choice"
    orphan = QUESTION + [{"role": "tool", "tool_call_id": "call_nobody", "content": "18C"}]
    assert param(messages=orphan, tools=TOOLS) == "messages[1].tool_call_id"
    bad_schema = {"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "not": {"required": ["x"]}}}}
    assert param(messages=QUESTION, tools=[bad_schema], tool_choice="required") == \
        "tools[0].function.parameters"
