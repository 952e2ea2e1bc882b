"""A `[cascade]` on a real server: SmolLM2-135M answers `auto` first, Gemma 3 270M
takes what it is unsure of.

- the engine's confidence (the 10% quantile of the answer's token
  log-probabilities, `x-switchyard-cascade`) equals the one computed from the
  logprobs the same answer returns to the client;
- with a threshold below it the answer stands (SmolLM2 answers), with one
  just above it the request is deferred to Gemma (hot-reloaded policy), and
  `switchyard_cascade_total` counts both;
- a streamed `auto` request waits for the verdict: deferred, it streams
  Gemma's answer with the deferral in its headers; accepted, it streams
  SmolLM2's answer token by token, the same text as the whole-JSON answer;
- `switchyard calibrate` measures SmolLM2's answers on a shipped suite and
  writes the lowest threshold whose kept answers reach a target accuracy into
  the policy; the server then defers exactly the answers the calibration saw
  below it; with `--strong gemma --of-strong F` it asks Gemma too and keeps
  the cascade at F of Gemma's accuracy; from a file of answers it needs no
  server, and a bad line is refused naming the file and line;
- `POST /v1/feedback` scores an answer by its response id, once; the score
  and the answers' confidence show per checkpoint in `/admin/policy`;
- under `margin` (the first token's top-2 log-probability gap) the engine
  stops SmolLM2 after its first token when it is to be deferred (the header
  and `switchyard_cascade_stopped_early_total` say so, the attempt used one
  generated token), whole and streamed; the margin the engine reports equals
  the gap between the first token's two best log-probabilities the client
  gets;
- under `min_margin` (the smallest top-2 gap over the answer) the engine
  stops SmolLM2 at its first token below the threshold, mid-answer: the
  attempt used the tokens up to that one, whole and streamed;
- the engine times every forward step per checkpoint
  (`switchyard_step_seconds`, the cost the cost-quality bench measures).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from serve_process import free_port, running_server

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Name a country in Africa."
ADMIN_TOKEN = "cascade-admin-token-0123"


def policy(min_confidence: float, statistic: str = "p10") -> str:
    return f"""
[routing]
allow_anonymous = true

[[models]]
name = "smol"
version = "1"
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0002
quality = 0.4
context_limit = 2048

[[models]]
name = "gemma"
version = "1"
cost_per_1k_input = 0.0002
cost_per_1k_output = 0.0004
quality = 0.6
context_limit = 2048

[cascade]
models = ["smol", "gemma"]
confidence = "{statistic}"
min_confidence = {min_confidence!r}
"""


@pytest.fixture(scope="module")
def server(switchyard_bin: Path, smollm2_path: Path, gemma3_path: Path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cascade")
    policy_file = tmp / "policy.toml"
    policy_file.write_text(policy(-1000.0))
    settings = tmp / "serve.toml"
    settings.write_text(
        "threads = 2\nmax_batch = 4\n"
        f'[[models]]\npath = "{smollm2_path}"\nname = "smol"\nversion = "1"\n'
        f'[[models]]\npath = "{gemma3_path}"\nname = "gemma"\nversion = "1"\n'
    )
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--config", str(settings), "--policy", str(policy_file),
            "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}"]
    with running_server(args, port, env={"SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN}):
        yield f"http://127.0.0.1:{port}", policy_file, f"http://127.0.0.1:{admin_port}"


def chat(base: str, **extra) -> tuple[dict, dict]:
    body = {"model": "auto", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": PROMPT}], **extra}
    request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        headers = {k.lower(): v for k, v in r.headers.items()}
        text = r.read().decode()
    return headers, (json.loads(text) if not extra.get("stream") else {"sse": text})


def p10(logprobs: list[float]) -> float:
    """Nearest rank, as the engine computes it."""
    ordered = sorted(logprobs)
    return ordered[max(1, math.ceil(0.1 * len(ordered))) - 1]


def test_an_unsure_answer_goes_to_the_stronger_model(server):
    base, policy_file, _ = server
    headers, body = chat(base, logprobs=True)
    assert headers["x-switchyard-model"] == "smol"
    verdict = re.fullmatch(r"accepted: p10 (-?\d+\.\d\d) >= -1000\.00 over (\d+) tokens",
                           headers["x-switchyard-cascade"])
    assert verdict, headers["x-switchyard-cascade"]
    tokens = [t["logprob"] for t in body["choices"][0]["logprobs"]["content"]]
    assert int(verdict.group(2)) == len(tokens) == body["usage"]["completion_tokens"]
    confidence = float(verdict.group(1))
    assert abs(confidence - p10(tokens)) <= 0.006, (confidence, p10(tokens))

    # A threshold just above this answer's confidence: the same (greedy) answer is deferred.
    threshold = round(confidence + 0.05, 2)
    policy_file.write_text(policy(threshold))
    deadline = time.time() + 30
    while True:
        headers, body = chat(base)
        if "deferred" in headers.get("x-switchyard-cascade", "") or time.time() > deadline:
            break
        time.sleep(0.5)
    assert headers["x-switchyard-cascade"].startswith(
        f"deferred from smol@1: p10 {confidence:.2f} < {threshold:.2f} over {len(tokens)} tokens; "
        f"the attempt ran to its end ("), headers
    assert headers["x-switchyard-cascade"].endswith(f" + {len(tokens)} generated tokens)"), headers
    assert headers["x-switchyard-model"] == "gemma"
    assert body["model"] == "gemma@1"
    assert body["choices"][0]["message"]["content"]

    whole = body["choices"][0]["message"]["content"]
    headers, body = chat(base, stream=True)
    assert headers["x-switchyard-model"] == "gemma", headers
    assert headers["x-switchyard-cascade"].startswith("deferred from smol@1: p10"), headers
    assert streamed_text(body["sse"]) == whole

    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        metrics = r.read().decode()
    for outcome in ("accepted", "deferred"):
        assert f'switchyard_cascade_total{{model="smol@1",outcome="{outcome}"}}' in metrics, outcome


def streamed_text(sse: str) -> str:
    """The content of a chat stream's chunks, joined; the stream must end with [DONE]."""
    events = [line[len("data: "):] for line in sse.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", sse[-300:]
    text = ""
    for event in events[:-1]:
        for choice in json.loads(event)["choices"]:
            text += choice["delta"].get("content") or ""
    return text


def test_an_accepted_streamed_answer_is_replayed_as_generated(server):
    base, policy_file, _ = server
    policy_file.write_text(policy(-1000.0))
    deadline = time.time() + 30
    while True:
        headers, body = chat(base)
        if headers.get("x-switchyard-cascade", "").startswith("accepted") or time.time() > deadline:
            break
        time.sleep(0.5)
    assert headers["x-switchyard-model"] == "smol", headers
    whole = body["choices"][0]["message"]["content"]
    headers, body = chat(base, stream=True)
    assert headers["x-switchyard-model"] == "smol", headers
    assert headers["x-switchyard-cascade"].startswith("accepted: p10"), headers
    chunks = [line for line in body["sse"].splitlines() if line.startswith("data: {")]
    # Token by token (several chunks), not one block, and the same greedy answer.
    assert len(chunks) > 3, chunks
    assert streamed_text(body["sse"]) == whole


def complete(base: str, prompt: str) -> dict:
    """The headers of an `auto` completion of `prompt`, as the calibration asked it."""
    body = {"model": "auto", "prompt": prompt, "max_tokens": 8, "temperature": 0}
    request = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        r.read()
        return {k.lower(): v for k, v in r.headers.items()}


def calibrate(switchyard_bin, *args) -> tuple[int, dict, str]:
    out = subprocess.run([str(switchyard_bin), "calibrate", *args, "--json"],
                         capture_output=True, text=True, timeout=900)
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr


def on_suite(switchyard_bin, base: str, *args, min_kept: int = 3) -> tuple[int, dict, str]:
    return calibrate(switchyard_bin, "--base", base, "--model", "smol", "--suite",
                     str(ROOT / "evals" / "geo-gen.jsonl"), "--count", "12", "--min-kept", str(min_kept), *args)


def confidence(item: dict) -> float:
    return -math.inf if item["confidence"] is None else item["confidence"]


def test_calibration_sets_the_threshold_from_measured_answers(switchyard_bin, server):
    base, policy_file, _ = server
    status, everything, err = on_suite(switchyard_bin, base, "--target", "0.01")
    assert status == 0, err
    items = sorted(everything["items"], key=confidence, reverse=True)
    assert len(items) == 12 and everything["deferred_share"] == 0.0
    # A target the most confident half reaches, so that a threshold exists by construction.
    top = items[:6]
    target = sum(r["correct"] for r in top) / len(top)
    if target == 0:
        pytest.fail("SmolLM2 answered none of its most confident half right: the suite changed?")
    status, result, err = on_suite(switchyard_bin, base, "--target", str(target), "--policy", str(policy_file))
    assert status == 0, err
    threshold = result["min_confidence"]
    kept_acc = result["kept_correct"] / result["kept"]
    print(f"\nCALIBRATED target {target:.3f}: p10 >= {threshold} keeps {result['kept']} of 12 "
          f"(kept acc {kept_acc:.3f}, all {result['first_accuracy']:.3f})")
    kept = [r for r in result["items"] if confidence(r) >= threshold]
    assert result["kept"] == len(kept) >= 3
    assert sum(r["correct"] for r in kept) / len(kept) >= target
    # The lowest such threshold: keeping any more answers misses the target.
    for level in {confidence(r) for r in result["items"] if confidence(r) < threshold}:
        more = [r for r in result["items"] if confidence(r) >= level]
        assert sum(r["correct"] for r in more) / len(more) < target, level
    assert f"min_confidence = {threshold!r}" in policy_file.read_text()

    # The server reads the new threshold and judges as the calibration measured.
    prompts = [json.loads(line)["prompt"] for line in (ROOT / "evals" / "geo-gen.jsonl").read_text().splitlines()[:12]]
    below = next((p for p, r in zip(prompts, result["items"]) if confidence(r) < threshold), None)
    above = next(p for p, r in zip(prompts, result["items"]) if confidence(r) >= threshold)
    deadline = time.time() + 30
    while True:
        headers = complete(base, above)
        if f">= {threshold:.2f}" in headers.get("x-switchyard-cascade", "") or time.time() > deadline:
            break
        time.sleep(0.5)
    assert headers["x-switchyard-cascade"].startswith("accepted"), headers
    if below is not None:
        headers = complete(base, below)
        assert headers["x-switchyard-cascade"].startswith("deferred from smol@1"), headers
    status, refused, err = on_suite(switchyard_bin, base, "--target", "1.0", min_kept=12)
    assert status != 0 or refused["kept_correct"] == 12, err
    if status != 0:
        assert "no p10 threshold meets the goal" in err, err

    # Against the next model: the cascade at least 0.9 of Gemma's accuracy, deferring least.
    status, strong, err = on_suite(switchyard_bin, base, "--strong", "gemma", "--of-strong", "0.9")
    assert status == 0, err
    assert all(isinstance(r["strong_correct"], bool) for r in strong["items"])
    assert strong["cascade_accuracy"] >= 0.9 * strong["strong_accuracy"] - 1e-9, strong
    print(f"CALIBRATED of-strong 0.9: defers {strong['deferred_share']:.2f}, cascade "
          f"{strong['cascade_accuracy']:.3f} against Gemma {strong['strong_accuracy']:.3f}")


def test_calibration_reads_answers_from_a_file(switchyard_bin, tmp_path):
    answers = tmp_path / "answers.jsonl"
    rows = [(True, [-0.1, -0.05], True), (True, [-0.3], False), (False, [-1.2, -0.2], True),
            (False, [], True), (True, [-2.5], True)]
    answers.write_text("".join(json.dumps({"correct": c, "logprobs": l, "strong_correct": s}) + "\n"
                               for c, l, s in rows))
    status, result, err = calibrate(switchyard_bin, "--answers", answers, "--statistic", "min",
                                    "--of-strong", "1.0")
    assert status == 0, err
    # Gemma is right on 4 of 5. Deferring only the answer without tokens keeps 3 + 1 right:
    # as many as Gemma alone, so that is the least deferral meeting the goal.
    assert (result["kept"], result["min_confidence"]) == (4, -2.52), result
    assert result["cascade_accuracy"] == result["strong_accuracy"] == 0.8, result
    assert [None if r["confidence"] is None else round(r["confidence"], 4) for r in result["items"]] == \
        [-0.1, -0.3, -1.2, None, -2.5]
    answers.write_text(json.dumps({"correct": True, "logprobs": [-0.1]}) + "\n"
                       + json.dumps({"correct": "yes", "logprobs": []}) + "\n")
    status, _, err = calibrate(switchyard_bin, "--answers", answers, "--target", "0.5")
    assert status != 0 and f"{answers} line 2: `correct` must be true or false" in err, err
    status, _, err = calibrate(switchyard_bin, "--answers", answers, "--of-strong", "0.9")
    assert status != 0


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_feedback_scores_an_answer_once_and_shows_per_checkpoint(server):
    base, _, admin = server
    headers, body = chat(base, model="gemma")
    status, scored = post(base + "/v1/feedback", {"id": body["id"], "score": 0.25})
    assert status == 200, scored
    assert (scored["checkpoint"], scored["arm"], scored["score"]) == ("gemma@1", None, 0.25)
    status, again = post(base + "/v1/feedback", {"id": body["id"], "score": 1})
    assert status == 409 and again["error"]["param"] == "id", again
    status, unknown = post(base + "/v1/feedback", {"id": "chatcmpl-nope", "score": 1})
    assert status == 404 and "no answer `nope`" in unknown["error"]["message"], unknown
    status, bad = post(base + "/v1/feedback", {"id": body["id"], "score": "good"})
    assert status == 400, bad

    request = urllib.request.Request(admin + "/admin/policy", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        signals = json.load(r)["quality_signals"]
    gemma = next(s for s in signals if s["checkpoint"] == "gemma@1")
    assert gemma["feedback"]["n"] == 1 and gemma["feedback"]["mean"] == 0.25
    assert gemma["confidence"]["n"] >= 1 and gemma["confidence"]["mean"] < 0


def metric(base: str, line_start: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)]
    return sum(values)


def until_policy(base: str, policy_file: Path, text: str, expect: str) -> tuple[dict, dict]:
    """Writes the policy and asks until a whole answer's verdict starts with `expect`,
    then once more: the answer that first shows the new policy may have been submitted
    under the old one (judged under the new), the next one is asked under it alone."""
    policy_file.write_text(text)
    deadline = time.time() + 30
    while True:
        headers, body = chat(base, logprobs=True, top_logprobs=2)
        if headers.get("x-switchyard-cascade", "").startswith(expect):
            return chat(base, logprobs=True, top_logprobs=2)
        if time.time() > deadline:
            return headers, body
        time.sleep(0.5)


def test_a_first_token_margin_escalates_after_one_token(server):
    base, policy_file, _ = server
    early = 'switchyard_cascade_stopped_early_total{model="smol@1"}'
    try:
        # Every margin is >= 0: the cheap model answers, judged on its first token.
        headers, body = until_policy(base, policy_file, policy(0.0, "margin"), "accepted: margin")
        assert headers["x-switchyard-model"] == "smol", headers
        verdict = re.fullmatch(r"accepted: margin (\d+\.\d\d) >= 0\.00 on the first token",
                               headers["x-switchyard-cascade"])
        assert verdict, headers["x-switchyard-cascade"]
        confidence = dict(pair.split("=") for pair in headers["x-switchyard-confidence"].split())
        margin = float(confidence["margin"])
        assert f"{margin:.2f}" == verdict.group(1)
        top = body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        assert abs(margin - (top[0]["logprob"] - top[1]["logprob"])) < 1e-4, (margin, top)
        assert float(confidence["entropy"]) > 0

        # A threshold above it: deferred after SmolLM2's first token.
        threshold = round(margin + 0.05, 2)
        headers, body = until_policy(base, policy_file, policy(threshold, "margin"), "deferred")
        before = metric(base, early)
        assert headers["x-switchyard-model"] == "gemma", headers
        cascade = headers["x-switchyard-cascade"]
        assert cascade.startswith(
            f"deferred from smol@1: margin {margin:.2f} < {threshold:.2f} on the first token; "
            "the attempt stopped after its first token ("), cascade
        assert cascade.endswith(" + 1 generated tokens)"), cascade
        assert body["model"] == "gemma@1" and body["choices"][0]["message"]["content"]
        whole = body["choices"][0]["message"]["content"]

        headers, body = chat(base, stream=True)
        assert headers["x-switchyard-model"] == "gemma", headers
        assert headers["x-switchyard-cascade"] == cascade, headers
        assert streamed_text(body["sse"]) == whole
        assert metric(base, early) == before + 1
    finally:
        policy_file.write_text(policy(-1000.0))


def test_min_margin_stops_the_cheap_model_at_its_first_unsure_token(server):
    base, policy_file, _ = server
    try:
        headers, body = until_policy(base, policy_file, policy(0.0, "min_margin"), "accepted: min_margin")
        assert headers["x-switchyard-model"] == "smol", headers
        content = body["choices"][0]["logprobs"]["content"]
        margins = [t["top_logprobs"][0]["logprob"] - t["top_logprobs"][1]["logprob"] for t in content]
        confidence = dict(pair.split("=") for pair in headers["x-switchyard-confidence"].split())
        assert abs(float(confidence["min_margin"]) - min(margins)) < 1e-4, (confidence, margins)
        # A threshold between a later token's margin and every margin before it: the
        # engine stops at that token, mid-answer.
        at = next(i for i in range(1, len(margins)) if margins[i] < min(margins[:i]) - 0.02)
        threshold = round((margins[at] + min(margins[:at])) / 2, 4)
        headers, body = until_policy(base, policy_file, policy(threshold, "min_margin"), "deferred")
        assert headers["x-switchyard-model"] == "gemma", headers
        cascade = headers["x-switchyard-cascade"]
        assert cascade.startswith(
            f"deferred from smol@1: min_margin {margins[at]:.2f} < {threshold:.2f} over {at + 1} tokens; "
            "the attempt stopped at its first unsure token ("), (cascade, margins)
        assert cascade.endswith(f" + {at + 1} generated tokens)"), (cascade, margins)
        assert at + 1 < len(margins), "it stopped before the answer's end"
        headers, body = chat(base, stream=True)
        assert headers["x-switchyard-cascade"] == cascade, headers
    finally:
        policy_file.write_text(policy(-1000.0))


def test_the_engine_times_each_checkpoints_forward_steps(server):
    """`switchyard_step_seconds` (what benches/cost_quality.py prices a cascade by): one
    observation per forward step of a checkpoint, their sum the engine time its tokens
    took, within the request's own wall time."""
    base, _, _ = server
    series = [f'switchyard_{name}{{model="smol",version="1"}}'
              for name in ("steps_total", "step_seconds_count", "step_seconds_sum")]
    before = [metric(base, s) for s in series]
    started = time.monotonic()
    headers, body = chat(base, model="smol")
    elapsed = time.monotonic() - started
    steps, timed, seconds = (metric(base, s) - b for s, b in zip(series, before))
    assert headers["x-switchyard-model"] == "smol", headers
    assert steps >= body["usage"]["completion_tokens"] >= 1, (steps, body["usage"])
    assert timed == steps
    assert 0 < seconds <= elapsed, (seconds, elapsed)
