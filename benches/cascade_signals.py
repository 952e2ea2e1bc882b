"""Deferral signals for the cascade, judged held out (used by benches/cost_quality.py).

A suite's items are split once, from a fixed seed, into a calibration half and a test
half (`split`); everything fitted or chosen (a logistic combination's weights, a
threshold, which signal) is fitted or chosen on the calibration half only, and judged on
the test half.

Signals (higher is surer for each), from what the engine sees of SmolLM2's answer: the
engine's own statistics (`x-switchyard-confidence`: mean, min, quantiles, the first
token's margin and minus its entropy, the smallest margin) and, from the per-token
log-probabilities and top-2 margins the client receives, the same over the answer's
content only (`*_content`: without the token that ended it, the line break the
stop matched, which says nothing about the fact), the first k tokens only
(`first3_min`), and the answer's length (`neg_tokens`: minus its token count). A
logistic combination of the engine's statistics and the length (`logistic`, L2
regularised, standardised features) is fitted on the calibration half to predict
"SmolLM2 right"; its weights are reported so a policy could store them.
"""

from __future__ import annotations

import math
import random

SPLIT_SEED = "switchyard-cascade-split"
ENGINE = ["mean", "min", "p05", "p10", "p25", "p50", "margin", "neg_entropy", "min_margin"]
# The engine's statistics less the near-duplicates (p05 is min for answers under 20 tokens;
# p25 and neg_entropy add nothing p10 and margin do not), and the length.
LOGISTIC_FEATURES = ["mean", "min", "p10", "p50", "margin", "min_margin", "neg_tokens"]


def split(n: int) -> tuple[list[int], list[int]]:
    """Calibration and test indices (each sorted): a shuffle from a fixed seed, halved."""
    order = list(range(n))
    random.Random(SPLIT_SEED).shuffle(order)
    return sorted(order[: n // 2]), sorted(order[n // 2:])


def _finite(xs: list[float | None]) -> list[float]:
    return [x for x in xs if x is not None and math.isfinite(x)]


def _low(xs: list[float], default: float = float("-inf")) -> float:
    return min(xs) if xs else default


def per_token(row: dict) -> dict[str, float]:
    """The client-side signals of one answer (see the module's doc)."""
    logprobs = list(row.get("logprobs") or [])
    margins = list(row.get("margins") or [])
    # An answer that ended at a stop (`finish_reason` "stop": the line break, or end of
    # sequence) has that token last: it is not part of the answer's text.
    ended_by_stop = row.get("finish_reason", "stop") == "stop"
    content_lp = logprobs[:-1] if ended_by_stop and len(logprobs) > 1 else logprobs
    content_m = margins[:-1] if ended_by_stop and len(margins) > 1 else margins
    return {
        "min_content": _low(_finite(content_lp)),
        "mean_content": (sum(content_lp) / len(content_lp)) if content_lp else float("-inf"),
        "min_margin_content": _low(_finite(content_m)),
        "first3_min": _low(_finite(logprobs[:3])),
        "neg_tokens": -float(len(logprobs)),
    }


def signals(row: dict) -> dict[str, float]:
    """Every signal of one answer: the engine's statistics and the client-side ones."""
    return {**row["stats"], **per_token(row)}


def auroc(values: list[float], right: list[bool]) -> float | None:
    """P(a right answer's value > a wrong one's), ties half (0.5 = no separation)."""
    pos = sorted(v for v, r in zip(values, right) if r)
    neg = sorted(v for v, r in zip(values, right) if not r)
    if not pos or not neg:
        return None
    # Rank-sum with ties: count, for each right value, the wrong ones below and equal.
    import bisect
    wins = 0.0
    for v in pos:
        lo = bisect.bisect_left(neg, v)
        hi = bisect.bisect_right(neg, v)
        wins += lo + 0.5 * (hi - lo)
    return wins / (len(pos) * len(neg))


class Logistic:
    """P(SmolLM2 right) = sigmoid(bias + sum(weight * feature)), on raw features (the
    standardisation folded into the weights); infinite features are clipped to the
    calibration half's finite range first."""

    def __init__(self, rows: list[dict], l2: float = 1.0, iterations: int = 50):
        import numpy as np

        feats = [[signals(r)[f] for f in LOGISTIC_FEATURES] for r in rows]
        self.lo, self.hi = [], []
        for j in range(len(LOGISTIC_FEATURES)):
            finite = _finite([f[j] for f in feats]) or [0.0]
            self.lo.append(min(finite))
            self.hi.append(max(finite))
        x = np.array([self._clip(f) for f in feats], dtype=float)
        y = np.array([1.0 if r["smol"] else 0.0 for r in rows])
        mu, sd = x.mean(axis=0), x.std(axis=0)
        sd[sd == 0] = 1.0
        z = np.hstack([np.ones((len(x), 1)), (x - mu) / sd])
        w = np.zeros(z.shape[1])
        penalty = np.eye(z.shape[1]) * l2
        penalty[0, 0] = 0.0  # no penalty on the bias
        for _ in range(iterations):  # Newton steps on the penalised log-likelihood
            p = 1 / (1 + np.exp(-z @ w))
            grad = z.T @ (p - y) + penalty @ w
            hess = z.T @ (z * (p * (1 - p))[:, None]) + penalty
            step = np.linalg.solve(hess, grad)
            w -= step
            if np.abs(step).max() < 1e-8:
                break
        self.weights = {f: float(w[j + 1] / sd[j]) for j, f in enumerate(LOGISTIC_FEATURES)}
        self.bias = float(w[0] - sum(w[j + 1] * mu[j] / sd[j] for j in range(len(LOGISTIC_FEATURES))))

    def _clip(self, f: list[float]) -> list[float]:
        return [min(max(v, lo), hi) if not math.isnan(v) else lo for v, lo, hi in zip(f, self.lo, self.hi)]

    def score(self, row: dict) -> float:
        """The log-odds that SmolLM2 is right (higher is surer)."""
        f = self._clip([signals(row)[k] for k in LOGISTIC_FEATURES])
        return self.bias + sum(self.weights[k] * v for k, v in zip(LOGISTIC_FEATURES, f))


def with_signals(rows: list[dict], model: Logistic) -> list[dict]:
    """Rows with `signals` filled in: every signal, the fitted logistic's log-odds too."""
    return [{**r, "signals": {**signals(r), "logistic": model.score(r)}} for r in rows]


SIGNALS = ENGINE + ["min_content", "mean_content", "min_margin_content", "first3_min", "neg_tokens", "logistic"]
