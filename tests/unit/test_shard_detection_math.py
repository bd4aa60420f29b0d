"""The closed forms of benchmarks/shard_detection.py against brute-force enumeration on small cases."""

from __future__ import annotations

import itertools
import math

import pytest

from benchmarks.shard_detection import _p_distinct, analytic


@pytest.mark.parametrize("n,s", [(4, 1), (4, 2), (8, 3), (5, 5)])
def test_distinct_segment_counts_sum_to_one(n: int, s: int) -> None:
    assert sum(_p_distinct(n, s, d) for d in range(1, min(n, s) + 1)) == pytest.approx(1.0)


@pytest.mark.parametrize("h,r,s,f", [(16, 4, 2, 0.125), (9, 3, 3, 0.25), (8, 2, 2, 0.25)])
def test_closed_forms_match_enumeration(h: int, r: int, s: int, f: float) -> None:
    m, blocks = round(f * h), 3
    a = analytic(h, s, r, blocks, f)
    draws = list(itertools.product(range(h), repeat=s))  # each draw's step, uniform

    def segs(ks):
        return {k // r for k in ks}

    spread = sum(all(x // r not in segs(ks) for x in fakes) for ks in draws
                 for fakes in itertools.combinations(range(h), m)) / (len(draws) * math.comb(h, m))
    assert a["fake_fraction_spread"] == pytest.approx(1 - spread)
    clustered_fakes = set(range(m))  # packed from a segment start
    clustered = sum(not any(x // r in segs(ks) for x in clustered_fakes) for ks in draws) / len(draws)
    assert a["fake_fraction_clustered"] == pytest.approx(1 - clustered)
    one = sum(0 // r in segs(ks) for ks in draws) / len(draws)
    assert a["one_transition"] == pytest.approx(one)
    shard = sum(any(k // r == 0 and b == 0 for k, b in zip(ks, bs)) for ks in draws
                for bs in itertools.product(range(blocks), repeat=s)) / (len(draws) * blocks**s)
    assert a["one_shard_or_boundary"] == pytest.approx(shard)
