"""The speculation ceiling's replay (`benches/speculation_ceiling.py`) without a
server: its copy of the engine's draft control pauses as `speculate/control.rs`
does, and its drafters and step costs give the speedups worked out by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches"))

import speculation_ceiling as ceiling  # noqa: E402


def test_the_control_pauses_as_the_engine_does():
    # `control.rs`'s `low_acceptance_pauses_for_longer_each_time`, step for step.
    control = ceiling.Control(8)
    pauses = []
    for _ in range(4):
        while control.allows():
            control.record(1, 0)
        paused = 1
        while not control.allows():
            paused += 1
        pauses.append(paused)
    assert pauses == [2, 4, 8, 16]
    control.record(2, 2)
    control.record(4, 4)
    assert control.acceptance > ceiling.OFF_BELOW
    while control.allows():
        control.record(1, 0)
    paused = 1
    while not control.allows():
        paused += 1
    assert paused == 2


def test_the_control_lengthens_kept_drafts_and_shortens_missed_ones():
    # `control.rs`'s `kept_drafts_grow_and_a_miss_shortens_them`.
    control = ceiling.Control(16)
    assert control.length == 4
    control.record(4, 4)
    assert control.length == 8
    control.record(8, 8)
    control.record(16, 16)
    assert control.length == 16
    control.record(16, 5)
    assert control.length == 6


def test_costs_interpolate_and_add_the_overhead_once_per_step():
    cost = ceiling.Cost([0, 2, 4], [2.0, 3.0, 5.0], overhead=1.0)
    assert cost.forward_ms(1) == pytest.approx(2.5)
    # Past the last point at the mean cost of a row: (5 - 2) / 4 ms a token.
    assert cost.forward_ms(8) == pytest.approx(8.0)
    assert cost(0) == pytest.approx(1.0)
    assert cost(2) == pytest.approx((3.0 + 1.0) / (2.0 + 1.0))


def test_the_lookup_is_the_engines():
    # `ngram.rs`'s cases: the longest suffix wins, then the latest occurrence.
    assert ceiling.lookup_latest([1, 2, 3, 4, 0, 0, 2, 3, 8, 1, 2, 3], 1) == [4]
    assert ceiling.lookup_latest([5, 6, 1, 5, 6, 2, 5, 6], 1) == [2]
    assert ceiling.lookup_latest([9, 4, 1, 9], 4) == []
    assert ceiling.lookup_latest([9, 4, 1, 9, 4], 4) == [1, 9, 4]


def test_a_copied_answer_replays_to_the_worked_out_speedup():
    # Steps cost 1 (plain) or 2 (any draft); no server overhead.
    cost = ceiling.Cost([0, 1, 8], [1.0, 2.0, 2.0])
    prompt = [100 + i for i in range(20)]
    answer = prompt[:9]
    # The oracle: the prompt's pass gives token 0; one verify step drafts
    # the 8 tokens that follow it and keeps them all: 8 tokens for 2 steps.
    oracle = ceiling.oracle(prompt, answer, cost, key=None, cap=8)
    assert oracle["runs"] == [8]
    assert oracle["speedup"] == pytest.approx(8 / 2)
    # The engine needs a 2-token key: token 1 is a plain step; then a draft
    # of 4, all kept, and one of 8 of which the answer's last 2 are kept,
    # cost 2 each.
    engine = ceiling.simulate(prompt, answer, cost, ceiling.lookup_latest)
    assert engine["verify_steps"] == 2 and engine["kept"] == 6
    assert engine["speedup"] == pytest.approx(8 / (1 + 2 + 2))


def test_nothing_to_copy_replays_to_plain_decoding():
    cost = ceiling.Cost([0, 1], [1.0, 1.5])
    prompt, answer = [1, 2, 3], [7, 8, 9, 10, 11]
    assert ceiling.oracle(prompt, answer, cost, key=None, cap=8)["speedup"] == 1.0
    assert ceiling.simulate(prompt, answer, cost, ceiling.lookup_latest)["speedup"] == 1.0
    assert ceiling.seen_share(prompt, answer, 1) == 0.0
