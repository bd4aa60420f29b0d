"""Calibration rule and audit arithmetic: the bound follows the data, the closed forms match brute force."""

import itertools
import math

import pytest
import torch

from dilocox.inner import PARAM
from protocol.formats.codec import state_manifest_leaves
from verifier import calibrate as cal
from verifier.replay import max_rel_error

pytestmark = pytest.mark.unit


def test_summary_statistics() -> None:
    s = cal.summarize([0.0, 0.0, 3e-7, 1e-7, 2e-7])
    assert (s.samples, s.max, s.median, s.bitwise) == (5, 3e-7, 1e-7, 2)
    assert s.p99 == 3e-7  # nearest rank: an observed value
    with pytest.raises(cal.CalibrationError):
        cal.summarize([])
    with pytest.raises(cal.CalibrationError):
        cal.summarize([1e-7, math.inf])  # a structural mismatch is not noise


@pytest.mark.parametrize("x, up", [(3.2e-6, 4e-6), (1e-5, 1e-5), (9.99e-6, 1e-5), (1.01e-5, 2e-5), (7e-7, 7e-7)])
def test_round_up_one_significant_digit(x: float, up: float) -> None:
    assert cal.round_up_1sig(x) == pytest.approx(up) and cal.round_up_1sig(x) >= x * (1 - 1e-12)


def test_choose_tolerance_takes_the_worst_condition_times_safety() -> None:
    data = {"threads": [1e-7, 7.8e-7], "pipeline": [2e-7, 1.3e-6], "same": [0.0] * 4}
    tol = cal.choose_tolerance(data)
    assert tol == 2e-5  # 1.3e-6 × 10 = 1.3e-5, rounded up
    assert all(v <= tol / cal.SAFETY_FACTOR for vs in data.values() for v in vs)
    assert cal.choose_tolerance({"bitwise": [0.0, 0.0]}) == cal.FLOOR  # never tighter than the floor
    assert cal.choose_tolerance(data, safety=100) == 2e-4
    with pytest.raises(cal.CalibrationError):
        cal.choose_tolerance({})


def test_max_nudge_is_the_largest_step_inside_the_bound() -> None:
    g = torch.Generator().manual_seed(0)
    rep = {PARAM + "w": torch.randn(8, 8, generator=g), "meta/step": torch.tensor([3])}
    target = {"w": torch.randn(8, 8, generator=g)}
    tol = 1e-4
    a = cal.max_nudge(rep, target, tol)
    assert 0 < a < 1
    assert max_rel_error(rep, cal.nudge(rep, target, a)) <= tol
    assert max_rel_error(rep, cal.nudge(rep, target, a * 1.01)) > tol
    assert cal.max_nudge(rep, {"w": rep[PARAM + "w"]}, tol) == 1.0  # the target itself is no nudge


def test_param_distance_and_norm() -> None:
    a = {PARAM + "w": torch.tensor([3.0, 4.0]), "meta/step": torch.tensor([1])}
    b = {PARAM + "w": torch.tensor([0.0, 0.0])}
    assert cal.param_norm(a) == 5.0 and cal.param_distance(a, b) == 5.0
    assert cal.param_distance(a, {"w": torch.tensor([3.0, 0.0])}) == 4.0


def test_forged_count_is_at_least_f() -> None:
    assert [cal.forged_count(f, 16) for f in (0.01, 0.1, 0.5)] == [1, 2, 8]
    assert [cal.forged_count(f, 100) for f in (0.01, 0.1, 0.5)] == [1, 10, 50]  # no float creep past f·H
    assert cal.forged_count(0.1, 642) == 65 and 65 / 642 >= 0.1 > 64 / 642
    assert cal.forged_count(0.0, 8) == 0
    with pytest.raises(ValueError):
        cal.forged_count(1.5, 4)


def test_detection_analytic_matches_enumeration() -> None:
    h, m, s = 5, 2, 3  # all 5^3 equally likely draw sequences with replacement
    hits = sum(any(k < m for k in seq) for seq in itertools.product(range(h), repeat=s))
    assert cal.detection_analytic(m, h, s) == pytest.approx(hits / h**s)


def test_min_audit_steps() -> None:
    assert cal.min_audit_steps(0.1, 0.99) == 44  # 1 - 0.9^44 = 0.9903, 0.9^43 leaves 0.989
    assert 1 - 0.9**43 < 0.99 <= 1 - 0.9**44
    assert cal.min_audit_steps(0.5, 0.99) == 7


def test_expected_unique_matches_enumeration() -> None:
    h, s = 4, 3
    mean = sum(len(set(seq)) for seq in itertools.product(range(h), repeat=s)) / h**s
    assert cal.expected_unique(h, s) == pytest.approx(mean)


def test_wilson_interval() -> None:
    lo, hi = cal.wilson(0, 100)
    assert lo == 0.0 and 0 < hi < 0.05
    lo, hi = cal.wilson(99, 100)
    assert lo < 0.99 < hi <= 1.0


def test_costs_and_smallest_h_for_a_budget() -> None:
    c = cal.Costs(train_step=0.1, digest=0.05, compress=0.03, replay_check=0.15, final_check=0.06)
    assert c.trainer_epoch(10) == pytest.approx(10 * 0.15 + 0.03)
    assert c.verifier_audit(2, 0.5) == pytest.approx(2 * 0.2 + 0.5 * (0.1 + 0.06))
    h = cal.min_steps_for_budget(c, 44, 0.5, 0.10)
    assert h is not None
    assert c.verifier_fraction(h, cal.expected_unique(h, 44), 0.5) <= 0.10
    assert c.verifier_fraction(h - 1, cal.expected_unique(h - 1, 44), 0.5) > 0.10
    assert cal.min_steps_for_budget(c, 44, 0.5, 1e-9, h_max=1 << 12) is None


def test_audit_leaves_and_proof_bytes() -> None:
    # state files follow protocol.formats.codec.state_manifest_leaves; a continued start adds the previous epoch's two, final or not
    for ts, final in (([3, 3, 4], False), ([3], True), ([0, 15], True)):
        files = len(state_manifest_leaves(sorted(set(ts)), final, 17))
        assert cal.audit_leaves(ts, final, 17, previous=False) == files
        assert cal.audit_leaves(ts, final, 17, previous=True) == files + 2
    assert cal.audit_leaves([3], True, 17, previous=False) >= len({3, 0, 16})
    assert cal.proof_bytes(17) == 32 * 5 and cal.proof_bytes(16) == 32 * 4 and cal.proof_bytes(1) == 0


def test_segment_detection_matches_enumeration_and_reduces_to_single_steps() -> None:
    h, forged, r, s = 6, {2}, 3, 2
    hits = sum(any(any(t in forged for t in cal.segment(k, r, h)) for k in seq)
               for seq in itertools.product(range(h), repeat=s))
    assert cal.segment_detection_exact(forged, h, r, s) == pytest.approx(hits / h**s)
    assert list(cal.segment(4, 3, 6)) == [4, 5]  # cut at the end of the trace
    assert cal.segment_detection_exact({1, 4}, 10, 1, 5) == pytest.approx(cal.detection_analytic(2, 10, 5))
    # scattered forgeries gain from long segments; the first m steps forged gain nothing
    assert cal.segment_detection_exact({10, 50}, 64, 8, 4) > cal.detection_analytic(2, 64, 4)
    for r in (1, 4, 16):
        assert cal.segment_detection_exact(range(3), 64, r, 4) == pytest.approx(cal.detection_analytic(3, 64, 4))


def test_segment_replays_are_charged_per_extra_step() -> None:
    c = cal.Costs(train_step=0.1, digest=0.05, compress=0.03, replay_check=0.15, final_check=0.06)
    assert c.verifier_audit(2, 0.0, extra_steps=6) == pytest.approx(2 * 0.2 + 6 * 0.1)


def test_per_step_rate_detection_and_the_least_rate() -> None:
    """Each transition drawn on its own: m cheated transitions escape with (1 − rate)^m, wherever they lie;
    min_rate is the least whole-ppm rate that reaches a target, one ppm less does not."""
    assert cal.rate_detection(0, 0.5) == 0 and cal.rate_detection(3, 1.0) == 1
    assert math.isclose(cal.rate_detection(26, 0.0165), 1 - 0.9835**26)
    r = cal.min_rate(25.6, 0.344)
    assert 1 - (1 - r) ** 25.6 >= 0.344 > 1 - (1 - (r - 1e-6)) ** 25.6
    with pytest.raises(ValueError):
        cal.rate_detection(3, 1.5)
    with pytest.raises(ValueError):
        cal.min_rate(0, 0.5)
