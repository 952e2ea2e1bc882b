"""The cascade benchmark's held-out machinery (`benches/cascade_signals.py`), without a
server: the calibration/test split is fixed by its seed and disjoint, the client-side
signals leave out the token a stop matched, AUROC counts ties as half, and the logistic
combination is fitted on the rows it is given only and ranks answers by what it learnt.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches"))

import cascade_signals as cs  # noqa: E402


def row(smol: bool, logprobs: list[float], margins: list[float], finish: str = "stop") -> dict:
    stats = {s: min(logprobs) for s in cs.ENGINE}
    stats.update(mean=sum(logprobs) / len(logprobs), min_margin=min(margins), margin=margins[0],
                 neg_entropy=-1.0)
    return {"smol": smol, "logprobs": logprobs, "margins": margins, "finish_reason": finish, "stats": stats}


def test_the_split_is_fixed_disjoint_and_covers_every_item():
    cal, test = cs.split(271)
    assert (cal, test) == cs.split(271)
    assert len(cal) == 135 and len(test) == 136
    assert sorted(cal + test) == list(range(271))
    # Not the even/odd split it replaces: a suite's order does not decide the halves.
    assert cal != list(range(0, 271, 2))


def test_content_signals_leave_out_the_token_the_stop_matched():
    stopped = row(True, [-0.1, -0.2, -3.0], [4.0, 2.0, 0.1])
    assert cs.per_token(stopped)["min_content"] == -0.2
    assert cs.per_token(stopped)["min_margin_content"] == 2.0
    assert cs.per_token(stopped)["neg_tokens"] == -3.0
    # An answer cut by the token limit has no stop token: every token counts.
    cut = row(True, [-0.1, -0.2, -3.0], [4.0, 2.0, 0.1], finish="length")
    assert cs.per_token(cut)["min_content"] == -3.0


def test_auroc_counts_ties_as_half():
    assert cs.auroc([3, 2, 1, 0], [True, True, False, False]) == 1.0
    assert cs.auroc([1, 1], [True, False]) == 0.5
    assert cs.auroc([0, 1], [True, False]) == 0.0
    assert cs.auroc([1, 2], [True, True]) is None


def test_the_logistic_learns_from_its_rows_only_and_ranks_held_out_answers():
    rng = random.Random(7)

    def make(n: int) -> list[dict]:
        out = []
        for _ in range(n):
            right = rng.random() < 0.5
            # Right answers are surer on their least likely token, with noise.
            low = -rng.uniform(0.0, 1.0) if right else -rng.uniform(0.5, 3.0)
            out.append(row(right, [-0.05, low, -0.1], [3.0, 2.0 + low, 1.0]))
        return out

    calibration, test = make(200), make(200)
    model = cs.Logistic(calibration)
    assert set(model.weights) == set(cs.LOGISTIC_FEATURES)
    assert all(math.isfinite(w) for w in model.weights.values()) and math.isfinite(model.bias)
    scored = cs.with_signals(test, model)
    area = cs.auroc([r["signals"]["logistic"] for r in scored], [r["smol"] for r in scored])
    assert area is not None and area > 0.8
    # Fitted on other rows, the weights differ: nothing of the test half went in.
    assert cs.Logistic(test).weights != model.weights
