"""benchmarks/answers.py: one trainer's answer costs at the shipped policy, on the tiny model; the
answers come from the log (none falls back to whole steps), and the fractions add up."""

from __future__ import annotations

import pytest

from benchmarks.answers import markdown, measure

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("rows", "seq", "micro", "segment", "gib", "kind"),
                         [(4, 16, 1, 4, 4.0, "boundaries"), (32, 64, 2, 1, 0.01, "gradients")])  # the second's boundaries outgrow the budget
def test_answers_are_built_from_the_log_and_their_costs_add_up(rows: int, seq: int, micro: int, segment: int, gib: float,
                                                                kind: str) -> None:
    r = measure("tiny", rows, seq, micro, segment, gib, 4, 8, 16, 256, 2, 1)
    assert r["log_kind"] == kind and r["log_fell_back"] is None and r["answer_bytes_per_epoch"] > 0
    assert r["answer_compute_fraction"] == pytest.approx(r["answer_build_fraction"] + r["answer_log_fraction"], abs=2e-4)
    assert r["checkpoint_every"] == 4 and r["checkpoint_s_per_step"] > 0
    assert r["checkpoints"] == [0, 8, 16]  # every step logged: the wider spacing
    assert markdown([r]).splitlines()[-1].startswith(
        f"| tiny {rows} x {seq} (M = {micro}, r = {segment}, checkpoints every 8 logged, 4 not) | {kind} |")
