"""Paired seed statistics: t quantiles match published tables, intervals match hand computation."""

import math

import pytest

from veriloco.stats import (
    StatsError,
    paired,
    relative_gaps,
    t_abs_cdf,
    t_quantile_two_sided,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("df", "t975"),
    [(1, 12.706205), (2, 4.302653), (3, 3.182446), (4, 2.776445), (10, 2.228139), (30, 2.042272)],
)
def test_t_quantiles_match_the_tables(df: int, t975: float) -> None:
    assert t_quantile_two_sided(0.95, df) == pytest.approx(t975, abs=1e-5)
    assert t_abs_cdf(t975, df) == pytest.approx(0.95, abs=1e-6)


def test_t_cdf_closed_forms_and_large_df_tends_to_normal() -> None:
    assert t_abs_cdf(1.0, 1) == pytest.approx(0.5)  # Cauchy: P(|T| <= 1) = 1/2
    assert t_abs_cdf(math.sqrt(2), 2) == pytest.approx(1 / math.sqrt(2))  # df 2: t / sqrt(2 + t^2)
    assert t_quantile_two_sided(0.95, 400) == pytest.approx(1.96, abs=0.01)
    assert t_quantile_two_sided(0.99, 5) == pytest.approx(4.032143, abs=1e-5)
    assert t_abs_cdf(0.0, 3) == 0.0


def test_paired_mean_sd_and_interval_by_hand() -> None:
    p = paired([0.01, 0.02, 0.03])
    assert p.mean == pytest.approx(0.02) and p.sd == pytest.approx(0.01)
    half = 4.302653 * 0.01 / math.sqrt(3)
    assert p.ci95 is not None
    assert p.ci95[0] == pytest.approx(0.02 - half, abs=1e-7)
    assert p.ci95[1] == pytest.approx(0.02 + half, abs=1e-7)
    j = p.to_json()
    assert j["per_seed"] == [0.01, 0.02, 0.03] and j["n"] == 3 and len(j["ci95"]) == 2  # type: ignore[arg-type]


def test_one_seed_has_no_spread_and_no_values_is_an_error() -> None:
    p = paired([0.05])
    assert p.mean == 0.05 and p.sd is None and p.ci95 is None
    with pytest.raises(StatsError, match="at least one seed"):
        paired([])
    with pytest.raises(StatsError):
        t_quantile_two_sided(1.5, 3)


def test_relative_gaps_pair_by_seed() -> None:
    assert relative_gaps([3.3, 2.2], [3.0, 2.0]) == pytest.approx([0.1, 0.1])
    with pytest.raises(StatsError, match="pair by seed"):
        relative_gaps([1.0], [1.0, 2.0])


def test_tost_is_equivalence_only_when_the_90_interval_lies_inside_the_margins() -> None:
    """issue 49: an interval containing 0 is not equivalence; a tight one inside the margins is."""
    from veriloco.stats import t_cdf, tost

    assert t_cdf(0.0, 2) == 0.5 and t_cdf(2.919985580, 2) == pytest.approx(0.95, abs=1e-6)
    assert t_cdf(-2.919985580, 2) == pytest.approx(0.05, abs=1e-6)
    tight = tost([0.001, 0.002, 0.0015], 0.003)
    assert tight.equivalent and -0.003 < tight.interval[0] < tight.interval[1] < 0.003 and tight.p < 0.05
    wide = tost([0.001, 0.006, -0.002], 0.003)  # its 95% interval contains 0, yet it is not equivalent
    assert wide.interval[0] < 0 < wide.interval[1] and not wide.equivalent and wide.p > 0.05
    # at the margin's edge the p is exactly one half; one-sided nulls mirror each other
    edge = tost([0.002, 0.004], 0.003)
    assert edge.p_upper == pytest.approx(0.5) and not edge.equivalent
    assert tost([-0.001, -0.002, -0.0015], 0.003).p_lower == pytest.approx(tight.p_upper)
    assert tost([0.001, 0.001], 0.003).equivalent and not tost([0.004, 0.004], 0.003).equivalent  # no spread
    for bad in (([0.001], 0.003), ([0.001, 0.002], 0.0), ([0.001, 0.002], -1.0)):
        with pytest.raises(StatsError):
            tost(*bad)
