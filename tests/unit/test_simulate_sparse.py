"""The field's compressors as training methods (issue 33): ``sparseloco_merge`` and ``demo_merge`` run
the shipped method's start rule with a ``veriloco.sparsecodec`` codec at the shipped codec's bytes,
k fitted once, error feedback carried in the state like the shipped codec's."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import veriloco.simulate as sim
import veriloco.sparsecodec as sc
from benchmarks.convergence import PRESETS_BENCH, _compressed, main
from dilocox.compress import CompressionConfig, compress
from dilocox.inner import InnerConfig, configure_determinism
from protocol.data import Corpus, default_corpus
from protocol.model import PRESETS, param_shapes

pytestmark = pytest.mark.unit

NEW = ("sparseloco_merge", "demo_merge")
CI = PRESETS_BENCH["ci"]
CFG = sim.SimConfig(
    model=PRESETS[CI.model], trainers=2, steps=4, batch_size=CI.batch_size, seq_len=CI.seq_len, h=2, rank=CI.rank,
    merge_step=1, inner=InnerConfig(lr=CI.lr, warmup_steps=2, total_steps=4), eval_rows=8,
)  # fmt: skip


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    configure_determinism(1)
    return default_corpus(CI.corpus_bytes)


def test_the_budget_is_the_shipped_payload_at_the_rank() -> None:
    shapes = param_shapes(CFG.model)
    g = torch.Generator().manual_seed(0)
    x = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    shipped = compress(x, {}, CFG.rank, 0, CompressionConfig(bits=4)).payload
    assert sim.shipped_budget(shapes, CFG.rank) == len(shipped)


def test_the_new_methods_share_the_shipped_rule_and_take_the_robust_suffixes() -> None:
    table = sim.methods(16, 8, 1)
    ship = table["fixed_rank_merge_b1"]
    for name in NEW:
        m = table[name]
        assert (m.rule, m.merge_step, m.first_merge_step) == (ship.rule, ship.merge_step, ship.first_merge_step)
        assert isinstance(m.compression, sim.SparseBaseline) and m.compression.rank == 8
        t = sim.resolve_method(f"{name}_trimmed", table)
        assert t is not None and t.aggregate == "trimmed" and t.compression == m.compression
        assert _compressed(name) and _compressed(f"{name}_median")  # read the rank: named _r<rank> when joined
    assert table["sparseloco_merge"].compression == sim.SparseBaseline("topk", "2bit", 8)
    assert table["demo_merge"].compression == sim.SparseBaseline("dct", "2bit", 8)  # DeMo's best at equal bytes


def _run_observed(name: str, corpus: Corpus, monkeypatch: pytest.MonkeyPatch) -> tuple[sim.MethodResult, dict[str, list[Any]]]:
    """Run ``name`` recording each worker's pseudo-gradient, encoded x and payload, and carried buffer."""
    seen: dict[str, list[Any]] = {"delta": [], "x": [], "payload": [], "ef": []}
    pg, enc, carry = sim.merged_pseudo_gradient, sc.baseline_encode, sim.carry

    def pg_(*a: Any) -> Any:
        seen["delta"].append(out := pg(*a))
        return out

    def enc_(x: Any, codec: Any) -> Any:
        out = enc(x, codec)
        if sys._getframe(1).f_code.co_name == "run_local":  # the payload sent, not k's bisection
            if seen["x"] and seen["x"][-1][0] is x:  # the same x again, with fewer kept: that one is sent
                seen["x"].pop(), seen["payload"].pop()
            seen["x"].append((x, {n: t.clone() for n, t in x.items()}))
            seen["payload"].append(out[0])
        return out

    def carry_(s: Any, ef: Any) -> Any:
        seen["ef"].append({n: t.clone() for n, t in ef.items()})
        return carry(s, ef)

    with monkeypatch.context() as mp:
        mp.setattr(sim, "merged_pseudo_gradient", pg_)
        mp.setattr(sc, "baseline_encode", enc_)
        mp.setattr(sim, "carry", carry_)
        r = sim.run_method(name, CFG, corpus)
    seen["x"] = [copy for _, copy in seen["x"]]
    return r, seen


@pytest.mark.parametrize("name", NEW)
def test_runs_at_equal_bytes_with_carried_error_feedback_and_repeats(
    name: str, corpus: Corpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    r, seen = _run_observed(name, corpus, monkeypatch)
    info = r.codec
    assert info is not None
    budget = sim.shipped_budget(param_shapes(CFG.model), CFG.rank)
    assert info["budget_bytes"] == budget and info["budget_rank"] == CFG.rank
    k = info["k"]
    assert isinstance(k, int)
    codec = sc.SparseCodec(str(info["transform"]), k, str(info["values"]))
    # k is the largest whose first payload fits: one more does not
    assert seen["payload"][0] == sc.baseline_encode(seen["x"][0], codec)[0]
    assert info["fit_bytes"] == len(seen["payload"][0]) <= budget
    if codec.k < codec.full:
        bigger = sc.SparseCodec(codec.transform, codec.k + 1, codec.values)
        assert len(sc.baseline_encode(seen["x"][0], bigger)[0]) > budget
    # bytes per round at the budget (k held; a payload whose coded indices come out larger keeps fewer)
    assert r.rounds == 2 and len(r.payload_bytes) == 2
    assert all(0.75 * budget <= p <= budget for p in r.payload_bytes)
    assert info["max_payload_bytes"] == max(len(p) for p in seen["payload"]) <= budget
    assert info["payloads"] == len(seen["payload"]) == 4
    lowered = info["lowered_k"]
    assert isinstance(lowered, list) and all(1 <= x < k for x in lowered)
    k_ = CFG.trainers  # calls run round by round, worker by worker: round i's are [i * K, (i + 1) * K)
    assert r.bytes_per_worker == sum(max(len(p) for p in seen["payload"][i * k_:(i + 1) * k_]) for i in range(2))
    assert r.schedule == [(CFG.rank, CFG.h)] * 2
    # error feedback: x = Δ + ef, new ef = x - decode(payload), carried into the worker's next round
    shapes = param_shapes(CFG.model)
    for i, (delta, x, p, ef) in enumerate(zip(seen["delta"], seen["x"], seen["payload"], seen["ef"], strict=True)):
        dec = sc.baseline_decode(p, shapes, codec)
        assert all(torch.equal(ef[n], x[n] - dec[n]) for n in x)
        prev = seen["ef"][i - k_] if i >= k_ else {n: torch.zeros_like(t) for n, t in x.items()}
        assert all(torch.equal(x[n], delta[n].float() + prev[n]) for n in x)
    assert all(sum(float(t.abs().sum()) for t in ef.values()) > 0 for ef in seen["ef"][:k_])  # non-zero after round 1
    assert all(0 < e < 1 for e in r.rel_error)
    assert math.isfinite(r.final_eval_loss) and r.final_eval_loss < r.curve[0][1]
    assert r.unsent_eval_loss is not None and math.isfinite(r.unsent_eval_loss)
    again = sim.run_method(name, CFG, corpus)  # deterministic
    assert again.curve == r.curve and again.payload_bytes == r.payload_bytes and again.codec == r.codec


def test_the_convergence_benchmark_takes_them_and_records_the_codec(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    argv = ["--preset", "ci", "--seeds", "3", "--eval-rows", "8", "--steps", "4", "--h", "2", "--trainers", "2",
            "--merge-step", "1", "--methods", "sparseloco_merge,demo_merge_trimmed", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    got = json.loads(out.read_text())["per_seed"][0]["methods"]
    assert set(got) == {"sparseloco_merge", "demo_merge_trimmed"}
    for rec in got.values():
        c = rec["codec"]
        assert c["budget_rank"] == CI.rank and 0.75 * c["budget_bytes"] <= c["fit_bytes"] <= c["budget_bytes"]
        assert all(p <= c["budget_bytes"] for p in rec["payload_bytes_per_round"])
        assert c["max_payload_bytes"] <= c["budget_bytes"]
    assert "outer aggregate trimmed" in got["demo_merge_trimmed"]["description"]


def test_sparseloco_at_its_own_operating_point_holds_k_and_decays_its_accumulator(
    corpus: Corpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "sparseloco_paper_merge"
    m = sim.methods(16, 8, 1)[name]
    assert m.compression == sim.SparseBaseline("topk", "2bit", 8, k=sim.SPARSELOCO_K, decay=sim.SPARSELOCO_DECAY)
    assert sim.SPARSELOCO_K / sc.BASELINE_CHUNK == pytest.approx(0.015625) and 0 < sim.SPARSELOCO_DECAY < 1
    r, seen = _run_observed(name, corpus, monkeypatch)
    info = r.codec
    assert info is not None and info["k"] == sim.SPARSELOCO_K and info["decay"] == sim.SPARSELOCO_DECAY
    assert info["budget_bytes"] is None and info["lowered_k"] == []  # no budget: k is never lowered
    codec = sc.SparseCodec("topk", sim.SPARSELOCO_K, "2bit")
    shapes, k_ = param_shapes(CFG.model), CFG.trainers
    for i, (delta, x, p, ef) in enumerate(zip(seen["delta"], seen["x"], seen["payload"], seen["ef"], strict=True)):
        assert p == sc.baseline_encode(x, codec)[0]
        dec = sc.baseline_decode(p, shapes, codec)
        assert all(torch.equal(ef[n], x[n] - dec[n]) for n in x)
        prev = seen["ef"][i - k_] if i >= k_ else {n: torch.zeros_like(t) for n, t in x.items()}
        # e <- decay * e + Δ: the decay is applied (round 2 differs from plain feedback where e is non-zero)
        assert all(torch.equal(x[n], delta[n].float() + sim.SPARSELOCO_DECAY * prev[n]) for n in x)
    assert any(not torch.equal(seen["x"][k_][n], seen["delta"][k_][n].float() + seen["ef"][0][n]) for n in shapes)
    assert math.isfinite(r.final_eval_loss) and r.final_eval_loss < r.curve[0][1]


@pytest.mark.parametrize("bad", [{"decay": 0.0}, {"decay": 1.5}, {"k": -1}])
def test_a_baseline_with_a_decay_outside_0_1_or_a_negative_k_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="decay|k must"):
        sim.SparseBaseline("topk", "2bit", 8, **bad)
