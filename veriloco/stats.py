"""Paired statistics over seeds: mean, sample sd and a Student-t 95% interval, stdlib only.

Convergence gaps move by 2-3 points between seeds on small models, so a single run cannot carry a
target of a few percent; the benchmark reports each method's gap as the mean of per-seed paired
differences (same init and data order for every method within a seed) with a t interval. The
t quantile is exact for integer degrees of freedom (the closed-form CDF of Abramowitz & Stegun
26.7.3-4, inverted by bisection), so no scipy is needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.errors import VerilocoError


class StatsError(VerilocoError):
    """Statistics asked of data that cannot carry them (no values, bad confidence level)."""


def t_abs_cdf(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` degrees of freedom (A&S 26.7.3-4)."""
    if df < 1:
        raise StatsError(f"degrees of freedom must be a positive integer, got {df}")
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        total, term = 0.0, math.cos(theta)  # cos, 2/3 cos^3, (2*4)/(3*5) cos^5, ...
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        return 2 / math.pi * (theta + s * total)
    total, term = 0.0, 1.0  # 1, 1/2 cos^2, (1*3)/(2*4) cos^4, ...
    for k in range(1, df // 2 + 1):
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return s * total


def t_quantile_two_sided(level: float, df: int) -> float:
    """The t with P(|T| <= t) = ``level`` (e.g. 4.303 for a 95% interval from 3 values, df 2)."""
    if not 0 < level < 1:
        raise StatsError(f"confidence level must be in (0, 1), got {level}")
    lo, hi = 0.0, 1.0
    while t_abs_cdf(hi, df) < level:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_abs_cdf(mid, df) < level:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Paired:
    """Summary of per-seed paired differences; ``sd`` and ``ci95`` are None with one seed."""

    mean: float
    sd: float | None
    ci95: tuple[float, float] | None
    per_seed: tuple[float, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "mean": self.mean,
            "sd": self.sd,
            "ci95": list(self.ci95) if self.ci95 is not None else None,
            "per_seed": list(self.per_seed),
            "n": len(self.per_seed),
        }


def paired(values: Sequence[float], level: float = 0.95) -> Paired:
    """Mean, sample sd (n - 1) and the two-sided t interval of per-seed paired differences."""
    xs = tuple(float(v) for v in values)
    if not xs:
        raise StatsError("no values to summarise: run at least one seed")
    n = len(xs)
    mean = math.fsum(xs) / n
    if n == 1:
        return Paired(mean, None, None, xs)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile_two_sided(level, n - 1) * sd / math.sqrt(n)
    return Paired(mean, sd, (mean - half, mean + half), xs)


def relative_gaps(losses: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Per-seed ``loss / baseline - 1`` (the gap as a fraction of the baseline's loss)."""
    if len(losses) != len(baseline):
        raise StatsError(f"{len(losses)} losses against {len(baseline)} baselines: pair by seed")
    return [a / b - 1.0 for a, b in zip(losses, baseline)]


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with integer ``df`` degrees of freedom."""
    half = 0.5 * t_abs_cdf(abs(t), df)
    return 0.5 + half if t >= 0 else 0.5 - half


@dataclass(frozen=True)
class Equivalence:
    """A two one-sided t-test (TOST) that the mean of paired differences lies within ±``margin``:
    equivalent when both one-sided nulls (mean <= -margin, mean >= +margin) are rejected at ``alpha``,
    i.e. when the (1 - 2 alpha) interval lies inside the margins. A wide interval is *not* equivalence."""

    margin: float
    alpha: float
    p_lower: float  # H0: mean <= -margin
    p_upper: float  # H0: mean >= +margin
    interval: tuple[float, float]  # the (1 - 2 alpha) t interval
    n: int

    @property
    def p(self) -> float:
        return max(self.p_lower, self.p_upper)

    @property
    def equivalent(self) -> bool:
        return self.p < self.alpha

    def to_json(self) -> dict[str, object]:
        return {"test": "TOST", "margin": self.margin, "alpha": self.alpha, "p_lower": self.p_lower,
                "p_upper": self.p_upper, "p": self.p, "interval": list(self.interval),
                "interval_level": 1 - 2 * self.alpha, "n": self.n, "equivalent": self.equivalent}


def tost(values: Sequence[float], margin: float, alpha: float = 0.05) -> Equivalence:
    """Equivalence of paired differences to 0 within ±``margin`` (see ``Equivalence``); needs 2 values."""
    if margin <= 0:
        raise StatsError(f"the equivalence margin must be positive, got {margin}")
    if not 0 < alpha < 0.5:
        raise StatsError(f"alpha must be in (0, 0.5), got {alpha}")
    p = paired(values, 1 - 2 * alpha)
    if p.sd is None or p.ci95 is None:
        raise StatsError("an equivalence test needs at least 2 seeds")
    n, se = len(p.per_seed), p.sd / math.sqrt(len(p.per_seed))
    if se == 0:  # no spread: the mean is the answer
        p_lo, p_hi = (0.0 if p.mean > -margin else 1.0), (0.0 if p.mean < margin else 1.0)
    else:
        p_lo = 1 - t_cdf((p.mean + margin) / se, n - 1)
        p_hi = t_cdf((p.mean - margin) / se, n - 1)
    return Equivalence(margin, alpha, p_lo, p_hi, p.ci95, n)
