"""The steering benchmark: one trainer at the cap every round, under the clipped mean and the trimmed mean."""

import json
from pathlib import Path

import pytest
import torch

from benchmarks.steering import cap_forgery, direction, edge_forgery, main, momentum_bound
from dilocox.aggregate import clip_scales, delta_norm

pytestmark = pytest.mark.unit


def test_forgeries_sit_at_the_cap_and_at_the_others_extremes() -> None:
    shapes = {"w": (6, 5), "b": (5,)}
    u = direction(shapes, 3)
    assert abs(sum(float((t**2).sum()) for t in u.values()) - 1.0) < 1e-12
    g = torch.Generator().manual_seed(0)
    others = [{n: torch.randn(s, generator=g) for n, s in shapes.items()} for _ in range(3)]
    forged = cap_forgery(others, u, 2.0)
    cap = 2.0 * sorted(delta_norm(d) for d in others)[1]  # lower median of the four, the forgery being largest
    assert abs(delta_norm(forged) - cap) <= 1e-5 * cap
    assert clip_scales([forged, *others], 2.0)[0] > 1 - 1e-4  # the coordinator lets it through (nearly) whole
    edge = edge_forgery(others, u)
    stack = torch.stack([d["w"] for d in others])
    assert torch.equal(edge["w"], torch.where(u["w"] < 0, stack.max(0).values, stack.min(0).values))


def test_momentum_bound_is_the_outer_step_s_impulse_response() -> None:
    assert momentum_bound([1.0], 0.7, 0.0) == [0.7]
    assert momentum_bound([1.0, 0.0], 1.0, 0.5) == pytest.approx([1.5, 1.75])  # Nesterov: (1 + mu), then mu^2
    assert momentum_bound([1.0, 0.0], 1.0, 0.5, nesterov=False) == pytest.approx([1.0, 1.5])


def test_a_short_run_writes_results_within_the_stated_bounds(tmp_path: Path) -> None:
    out, md = tmp_path / "s.json", tmp_path / "s.md"
    assert main(["--rounds", "2", "--h", "1", "--seeds", "0", "--eval-rows", "4", "--batch-size", "2",
                 "--seq-len", "16", "--out", str(out), "--md", str(md), "--quiet"]) == 0
    j = json.loads(out.read_text())
    by = {(s["rule"], s["attack"]): s for s in j["summary"]}
    assert set(by) == {(r, a) for r in ("mean", "trimmed") for a in ("cap", "edge")}
    assert 0.99 <= by["mean", "cap"]["steer_over_bound_max"] <= 1 + 1e-6  # the cap forgery reaches the mean's bound
    assert all(s["steer_over_bound_max"] <= 1 + 1e-6 for s in j["summary"])
    assert all(len(r["displacement_along_u"]) == 2 for r in j["runs"])
    text = md.read_text()
    assert j["command"] in text and "| mean | cap |" in text and "| trimmed | edge |" in text
    assert "benchmarks/convergence.py" in text and "fixed_rank_merge_b1_trimmed" in text
    again = tmp_path / "again.md"
    assert main(["--render", str(out), "--md", str(again)]) == 0 and again.read_text() == text
    with pytest.raises(SystemExit):
        main(["--rounds", "2"])  # no --out
