"""The cascade's handoff on a real server (`[cascade]` under `min_margin` with
`handoff = true`): SmolLM2-135M answers `auto` first; when the engine stops it
at its first token whose top-2 margin is below the threshold, Gemma 3 270M is
given the prompt and SmolLM2's tokens before that one, and continues them.

- a sure answer is not handed off: SmolLM2's greedy answer stands, no
  `x-switchyard-handoff`;
- an unsure one is: the answer is SmolLM2's kept tokens (the text its own greedy
  answer starts with, up to the token the threshold is placed before) followed
  by exactly what Gemma says greedily when asked directly for `prompt + kept
  text` with what is left of `max_tokens`; the headers say which checkpoints
  wrote it and how many tokens were kept, the metrics count it;
- streamed, the same text arrives (the kept tokens first, then Gemma's).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from serve_process import free_port, running_server
from test_cascade import metric, policy

ROOT = Path(__file__).resolve().parents[2]
MAX_TOKENS = 24
STOP = ["\n"]


def handoff_policy(min_confidence: float) -> str:
    return policy(min_confidence, "min_margin") + "handoff = true\n"


@pytest.fixture(scope="module")
def server(switchyard_bin: Path, smollm2_path: Path, gemma3_path: Path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("handoff")
    policy_file = tmp / "policy.toml"
    policy_file.write_text(handoff_policy(0.0))
    settings = tmp / "serve.toml"
    settings.write_text(
        "threads = 2\nmax_batch = 4\n"
        f'[[models]]\npath = "{smollm2_path}"\nname = "smol"\nversion = "1"\n'
        f'[[models]]\npath = "{gemma3_path}"\nname = "gemma"\nversion = "1"\n'
    )
    port = free_port()
    args = [str(switchyard_bin), "serve", "--config", str(settings), "--policy", str(policy_file),
            "--listen", f"127.0.0.1:{port}"]
    with running_server(args, port):
        yield f"http://127.0.0.1:{port}", policy_file


def complete(base: str, model: str, prompt: str, salt: str, max_tokens: int = MAX_TOKENS,
             stream: bool = False) -> tuple[dict, dict | str]:
    """A greedy completion, in its own prompt-cache scope (`salt`): each request computes
    its prompt afresh, so two asked the same text compute the same numbers."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stop": STOP, "logprobs": 2, "cache_salt": salt, "stream": stream}
    request = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        headers = {k.lower(): v for k, v in r.headers.items()}
        text = r.read().decode()
    return headers, (text if stream else json.loads(text))


def streamed_text(sse: str) -> str:
    events = [line[len("data: "):] for line in sse.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", sse[-300:]
    return "".join(c.get("text") or "" for e in events[:-1] for c in json.loads(e)["choices"])


def unsure_point(answer: dict) -> tuple[int, float] | None:
    """Where to place a `min_margin` threshold so that the engine stops this answer
    mid-way: a token `at` >= 1 whose margin is clearly below every earlier one's, and the
    threshold between them. None when the answer has no such token (or a token whose two
    best alternatives decode to the same text, so the client cannot see its margin)."""
    tops = answer["choices"][0]["logprobs"]["top_logprobs"]
    if any(len(top) < 2 for top in tops):
        return None
    margins = [a - b for a, b in (sorted(top.values(), reverse=True)[:2] for top in tops)]
    for at in range(1, len(margins) - 1):
        if margins[at] < min(margins[:at]) - 0.05:
            return at, round((margins[at] + min(margins[:at])) / 2, 4)
    return None


def until_verdict(base: str, policy_file: Path, text: str, prompt: str, expect: str) -> dict:
    """Writes the policy and asks until an `auto` answer's verdict starts with `expect`."""
    policy_file.write_text(text)
    deadline = time.time() + 30
    while True:
        headers, _ = complete(base, "auto", prompt, f"wait-{time.time()}")
        if headers.get("x-switchyard-cascade", "").startswith(expect) or time.time() > deadline:
            return headers
        time.sleep(0.5)


def test_an_unsure_answer_is_continued_by_the_stronger_model(server):
    base, policy_file = server
    items = [json.loads(line) for line in (ROOT / "evals" / "letter-sentence-gen.jsonl").read_text().splitlines()]
    # An item whose SmolLM2 answer turns unsure mid-way (most do, at the letter).
    found = None
    for i, item in enumerate(items[:20]):
        _, answer = complete(base, "smol", item["prompt"], f"probe-{i}")
        point = unsure_point(answer)
        if point:
            found = item["prompt"], answer, point
            break
    assert found, "no item of the first 20 has an answer that turns unsure mid-way"
    prompt, smol, (at, threshold) = found
    smol_text = smol["choices"][0]["text"]
    kept = "".join(smol["choices"][0]["logprobs"]["tokens"][:at])
    assert smol_text.startswith(kept) and kept

    # Sure enough (every margin >= 0): SmolLM2's answer stands, nothing is handed off.
    headers = until_verdict(base, policy_file, handoff_policy(0.0), prompt, "accepted: min_margin")
    headers, body = complete(base, "auto", prompt, "accepted")
    assert headers["x-switchyard-model"] == "smol", headers
    assert "x-switchyard-handoff" not in headers, headers
    assert body["choices"][0]["text"] == smol_text

    # A threshold just above token `at`'s margin: SmolLM2 stops there, Gemma continues.
    handoffs = 'switchyard_cascade_handoff_total{from="smol@1",to="gemma@1"}'
    kept_total = 'switchyard_cascade_kept_tokens_total{model="smol@1"}'
    until_verdict(base, policy_file, handoff_policy(threshold), prompt, "deferred")
    before = (metric(base, handoffs), metric(base, kept_total))
    headers, body = complete(base, "auto", prompt, "handoff")
    assert headers["x-switchyard-model"] == "gemma", headers
    assert headers["x-switchyard-handoff"] == f"from=smol@1 kept={at} to=gemma@1", headers
    assert headers["x-switchyard-cascade"].endswith(
        f"; handed off: gemma@1 continues its first {at} tokens"), headers
    assert f"over {at + 1} tokens; the attempt stopped at its first unsure token" in headers["x-switchyard-cascade"]
    assert (metric(base, handoffs), metric(base, kept_total)) == (before[0] + 1, before[1] + at)
    answer = body["choices"][0]["text"]

    # What Gemma says greedily when given the prompt and the kept text itself.
    _, direct = complete(base, "gemma", prompt + kept, "direct", MAX_TOKENS - at)
    continuation = direct["choices"][0]["text"]
    assert answer == kept + continuation, (answer, kept, continuation)
    assert body["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"]
    assert body["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]

    # Streamed: the kept tokens first, then Gemma's continuation: the same text.
    headers, sse = complete(base, "auto", prompt, "handoff-stream", stream=True)
    assert headers["x-switchyard-handoff"] == f"from=smol@1 kept={at} to=gemma@1", headers
    assert streamed_text(sse) == answer
