"""Tolerant-mode calibration and audit-policy arithmetic: pure functions over measured numbers.

Tolerant mode accepts a published state k+1 when it lies within a relative bound of the verifier's
replay of step k (verifier.replay.check_step). The bound has to sit above every honest divergence
(different thread counts, processes, pipeline splits give different float summation orders) and far
below what any forgery produces. This module holds the rule that turns measured honest divergences
into that bound, the statistics around it, and the closed forms the benchmark compares its
measurements with (detection probability, expected replays per audit, verifier cost and audit bytes).

The measurements themselves (training, replaying, spawning processes) live in
benchmarks/verification.py; everything here is deterministic and cheap, so it is unit-tested.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor

from dilocox.inner import PARAM
from protocol import merkle
from protocol.errors import VerilocoError
from protocol.formats.codec import state_manifest_leaves
from verifier.replay import max_rel_error

# Tolerant-mode bound chosen from benchmarks/results/verification.json (`calibration.tolerance`):
# the largest honest divergence measured there, times SAFETY_FACTOR, rounded up to one significant
# digit. tests/integration/test_tolerance.py checks that this constant and the committed
# measurement agree, so re-running the calibration on other hardware cannot silently drift.
CALIBRATED_TOLERANCE = 2e-5

SAFETY_FACTOR = 10.0  # honest divergence is a max over finitely many samples; leave an order of magnitude
FLOOR = 1e-6  # ~8 float32 ulps: never pick a bound tighter than the arithmetic itself can promise


class CalibrationError(VerilocoError):
    """Calibration data that cannot produce a sound bound (no samples, non-finite honest divergence)."""


@dataclass(frozen=True)
class Summary:
    """Order statistics of one condition's honest divergences."""

    samples: int
    max: float
    p99: float
    median: float
    bitwise: int  # samples with divergence exactly 0 (bitwise-equal replays)

    def to_json(self) -> dict[str, float | int]:
        return {"samples": self.samples, "max": self.max, "p99": self.p99, "median": self.median, "bitwise": self.bitwise}


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: an observed value, never an interpolation between two."""
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


def summarize(values: Iterable[float]) -> Summary:
    """Summary of honest divergences; a non-finite one means the replay itself is broken, not noisy."""
    v = sorted(values)
    if not v:
        raise CalibrationError("no divergence samples to summarize")
    if not all(math.isfinite(x) and x >= 0 for x in v):
        raise CalibrationError("honest divergences must be finite and non-negative; a replay mismatched structurally")
    return Summary(len(v), v[-1], _quantile(v, 0.99), _quantile(v, 0.5), sum(1 for x in v if x == 0.0))


def round_up_1sig(x: float) -> float:
    """Round up to one significant digit (3.2e-6 -> 4e-6), so the bound is a readable config value."""
    if x <= 0:
        raise CalibrationError(f"cannot round non-positive {x}")
    e = math.floor(math.log10(x))
    mant = x / 10**e
    d = math.ceil(mant - 1e-9)
    if d >= 10:
        d, e = 1, e + 1
    return float(f"{d}e{e}")


def choose_tolerance(by_condition: Mapping[str, Sequence[float]], safety: float = SAFETY_FACTOR, floor: float = FLOOR) -> float:
    """The bound: max honest divergence over all conditions × `safety`, at least `floor`, rounded up.

    The max (not a quantile) because one false positive slashes an honest trainer; the safety factor
    covers hardware and builds the samples did not include.
    """
    if not by_condition:
        raise CalibrationError("no conditions measured")
    worst = max(summarize(v).max for v in by_condition.values())
    return round_up_1sig(max(worst * safety, floor))


def separation(tolerance: float, smallest_forgery: float) -> float:
    """How many times the smallest forged-step divergence exceeds the bound (must be ≫ 1)."""
    return smallest_forgery / tolerance if tolerance > 0 else math.inf


# ---- tolerance abuse ------------------------------------------------------------------------------


def nudge(state: Mapping[str, Tensor], target: Mapping[str, Tensor], alpha: float) -> dict[str, Tensor]:
    """`state` with every parameter moved a fraction `alpha` of the way to `target` (other entries kept)."""
    out = dict(state)
    for n, t in target.items():
        p = state[PARAM + n]
        out[PARAM + n] = p + alpha * (t - p)
    return out


def max_nudge(replayed: Mapping[str, Tensor], target: Mapping[str, Tensor], tolerance: float, iters: int = 40) -> float:
    """Largest alpha in [0, 1] whose nudge of `replayed` towards `target` stays within `tolerance`.

    This is what a tolerance-abusing trainer publishes instead of the honest state k+1. Bisection,
    because max_rel_error is relative to the nudged state and so not linear in alpha.
    """
    lo, hi = 0.0, 1.0
    if max_rel_error(replayed, nudge(replayed, target, hi)) <= tolerance:
        return hi
    for _ in range(iters):
        mid = (lo + hi) / 2
        if max_rel_error(replayed, nudge(replayed, target, mid)) <= tolerance:
            lo = mid
        else:
            hi = mid
    return lo


def param_distance(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    """Global L2 distance between the parameters of two states (or a state and a param dict)."""
    total = 0.0
    for k, v in a.items():
        if k.startswith(PARAM):
            other = b[k] if k in b else b[k[len(PARAM):]]
            total += float((v.double() - other.double()).pow(2).sum())
    return math.sqrt(total)


def param_norm(a: Mapping[str, Tensor]) -> float:
    return math.sqrt(sum(float(v.double().pow(2).sum()) for k, v in a.items() if k.startswith(PARAM)))


# ---- sampling and cost arithmetic ------------------------------------------------------------------


def forged_count(f: float, steps: int) -> int:
    """Forged transitions m of a trainer faking at least a fraction f of H steps: ceil(f·H).

    "At least f" is the adversary the target is stated for; rounding down would let m/H fall below f
    (H=642, f=0.1 would give 64 = 9.97%). The epsilon absorbs float error in f·H (0.1·100 etc.).
    """
    if not 0 <= f <= 1 or steps < 1:
        raise ValueError(f"need 0 <= f <= 1 and steps >= 1, got {f}, {steps}")
    return math.ceil(f * steps - 1e-9)


def detection_analytic(forged: int, steps: int, audit_steps: int) -> float:
    """P(at least one of `audit_steps` draws, with replacement over H transitions, hits a forged one)."""
    return 1.0 - (1.0 - forged / steps) ** audit_steps


def segment(k: int, length: int, steps: int) -> range:
    """Transitions a segment audit from leaf k replays: k .. min(k + length, H) − 1 (docs/protocol.md §5)."""
    return range(k, min(k + length, steps))


def segment_detection_exact(forged: Iterable[int], steps: int, length: int, audit_steps: int) -> float:
    """Exact detection for a given forged set: each draw is uniform over H starts and independent, so
    it is 1 − (1 − p)^s with p the share of starts whose segment holds a forged transition.

    Every forged k is itself a start that catches it, so p ≥ m/H, with equality when the m forged
    steps are the first m (no segment starting later reaches back): against a cheater who picks
    where to forge, segments add nothing over single steps; they help only against scattered ones.
    """
    bad = set(forged)
    p = sum(1 for k in range(steps) if any(t in bad for t in segment(k, length, steps))) / steps
    return 1.0 - (1.0 - p) ** audit_steps


def rate_detection(cheated: int, rate: float) -> float:
    """P(at least one of ``cheated`` transitions is challenged) when each is drawn on its own with
    probability ``rate`` (audit.rate): 1 − (1 − rate)^cheated, whatever H is and wherever they lie. Skips
    packed in whole segments count their own transitions; a skip inside a segment of r steps is caught by
    a draw of any of the segment's r transitions, so spread skips count r each."""
    if not 0 <= rate <= 1 or cheated < 0:
        raise ValueError(f"need 0 <= rate <= 1 and cheated >= 0, got {rate}, {cheated}")
    return 1.0 - (1.0 - rate) ** cheated


def min_rate(cheated: float, target: float) -> float:
    """The least audit.rate, in whole parts per million, with 1 − (1 − rate)^cheated ≥ target."""
    if cheated <= 0 or not 0 < target < 1:
        raise ValueError(f"need cheated > 0 and 0 < target < 1, got {cheated}, {target}")
    ppm = math.ceil(-math.expm1(math.log1p(-target) / cheated) * 1_000_000)
    while 1 - (1 - ppm / 1_000_000) ** cheated < target:  # log rounding
        ppm += 1
    return ppm / 1_000_000


def min_audit_steps(f: float, target: float) -> int:
    """Smallest s with 1 − (1 − f)^s ≥ target (draws with replacement)."""
    if not 0 < f < 1 or not 0 < target < 1:
        raise ValueError(f"need 0 < f < 1 and 0 < target < 1, got {f}, {target}")
    s = math.ceil(math.log1p(-target) / math.log1p(-f))
    while 1 - (1 - f) ** s < target:  # guard against log rounding landing one short
        s += 1
    return s


def expected_unique(steps: int, audit_steps: int) -> float:
    """E[distinct transitions] among `audit_steps` uniform draws over H: duplicates are replayed once."""
    return steps * (1.0 - (1.0 - 1.0 / steps) ** audit_steps)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (sane at 0 and 1, unlike the normal one)."""
    if n <= 0:
        raise ValueError("n must be positive")
    p = successes / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


@dataclass(frozen=True)
class Costs:
    """Measured seconds of the pieces an epoch and its audit are made of (one machine, one thread count)."""

    train_step: float  # one inner step on the trainer
    digest: float  # state_digest of one full state
    compress: float  # final_transition: end state -> payload (trainer and verifier alike)
    replay_check: float  # check_step: replay + digest of the replayed state
    final_check: float  # check_final + check_start (the start-state rule rides on the final check)

    def trainer_epoch(self, steps: int) -> float:
        """H steps, each digested for the trace, then compression."""
        return steps * (self.train_step + self.digest) + self.compress

    def verifier_audit(self, unique_steps: float, final_prob: float, extra_steps: float = 0.0) -> float:
        """Per challenge: digest the revealed state k (against leaf k), then check_step; a segment
        audit replays `extra_steps` more steps in all. A final check digests the start and end
        states and runs check_final + check_start.
        """
        return (unique_steps * (self.digest + self.replay_check) + extra_steps * self.train_step
                + final_prob * (2 * self.digest + self.final_check))

    def verifier_fraction(self, steps: int, unique_steps: float, final_prob: float, extra_steps: float = 0.0) -> float:
        return self.verifier_audit(unique_steps, final_prob, extra_steps) / self.trainer_epoch(steps)


def min_steps_for_budget(costs: Costs, audit_steps: int, final_prob: float, budget: float, h_max: int = 1 << 20) -> int | None:
    """Smallest H for which `audit_steps` draws (plus the final check) cost at most `budget` of an epoch."""
    lo, hi = 1, h_max
    if costs.verifier_fraction(hi, expected_unique(hi, audit_steps), final_prob) > budget:
        return None
    while lo < hi:  # the fraction falls monotonically with H: replays saturate at s, training grows
        mid = (lo + hi) // 2
        if costs.verifier_fraction(mid, expected_unique(mid, audit_steps), final_prob) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return lo


def audit_leaves(transitions: Sequence[int], final: bool, leaf_count: int, previous: bool) -> int:
    """State files a trainer publishes for an audit in exact mode: protocol.formats.codec.state_manifest_leaves,
    plus the previous epoch's start and end state whenever its start continued that epoch (every
    audit checks the start rule, docs/protocol.md §8; leaf 0 itself is proven by digest only)."""
    return len(state_manifest_leaves(sorted(set(transitions)), final, leaf_count)) + (2 if previous else 0)


def proof_bytes(leaf_count: int) -> int:
    """Bytes of one Merkle proof: 32 per level of the padded tree (docs/protocol.md §3)."""
    return 32 * merkle.proof_length(leaf_count)

