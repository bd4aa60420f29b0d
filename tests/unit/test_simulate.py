"""The local simulation: every method runs on a toy model, traffic follows the stated formulas, runs repeat."""

import math

import pytest

from protocol.data import Corpus, default_corpus
from protocol.model import GPTConfig, n_params
from trainer.inner import InnerConfig, configure_determinism
from veriloco.simulate import (
    RoundTiming,
    SimConfig,
    SimulationError,
    compare,
    markdown_table,
    methods,
    ring_allreduce_bytes,
    run_method,
    simulated_seconds,
    summary,
)

pytestmark = pytest.mark.unit

TOY = GPTConfig(n_layer=1, n_head=2, d_model=32, seq_len=16)
CFG = SimConfig(
    model=TOY,
    trainers=2,
    steps=8,
    batch_size=2,
    h=4,
    rank=2,
    inner=InnerConfig(lr=3e-3, warmup_steps=2, total_steps=8),
    eval_rows=8,
)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    configure_determinism(1)
    return default_corpus(200_000)


def test_all_methods_run_with_the_stated_traffic(corpus: Corpus) -> None:
    res = compare(list(methods()), CFG, corpus)
    assert set(res) == set(methods())
    dense = 4 * n_params(TOY)
    assert res["allreduce"].bytes_per_worker == ring_allreduce_bytes(dense, 2) * 8 == dense * 8
    assert (
        res["diloco"].bytes_per_worker == dense * 2
    )  # two rounds of H=4, one full all-reduce each
    for name in ("dilocox", "dilocox_blocking", "quant_only", "fixed_rank", "lowrank_only"):
        r = res[name]
        assert r.steps_per_worker == 8
        assert r.bytes_per_worker == sum(p for p in r.payload_bytes)  # (K-1) = 1 payload per round
        assert r.bytes_per_worker < res["diloco"].bytes_per_worker
    assert res["quant_only"].bytes_per_worker < res["diloco"].bytes_per_worker / 5  # int4 vs fp32
    for r in res.values():
        assert math.isfinite(r.final_eval_loss) and r.final_eval_loss < r.curve[0][1]  # it learned
    assert res["dilocox"].schedule[0] == (2, 4)
    ratios = summary(res)
    assert (
        ratios["allreduce"]["traffic_reduction"] == 1.0
        and ratios["dilocox"]["traffic_reduction"] > 5
    )
    table = markdown_table(res)
    assert all(f"| {n} |" in table for n in res)


def test_runs_repeat_exactly(corpus: Corpus) -> None:
    a = run_method("dilocox", CFG, corpus)
    b = run_method("dilocox", CFG, corpus)
    assert a.curve == b.curve and a.payload_bytes == b.payload_bytes and a.rel_error == b.rel_error


def test_budget_shorter_than_h_is_one_round(corpus: Corpus) -> None:
    r = run_method(
        "diloco", SimConfig(model=TOY, trainers=1, steps=3, batch_size=2, h=16, eval_rows=4), corpus
    )
    assert (
        r.rounds == 1 and r.steps_per_worker == 3 and r.bytes_per_worker == 0
    )  # K=1 sends nothing


def test_simulated_time_overlaps_exchange_with_next_round() -> None:
    rounds = [
        RoundTiming(steps=2, train_s=1.0, codec_s=0.1, agg_s=0.2, comm_s=0.5) for _ in range(3)
    ]
    assert simulated_seconds(rounds, overlaps=False) == pytest.approx(3 * 1.8)
    assert simulated_seconds(rounds, overlaps=True) == pytest.approx(1.1 * 3 + 0.7)
    slow_link = [RoundTiming(2, 1.0, 0.0, 0.0, 5.0)] * 2
    assert simulated_seconds(slow_link, overlaps=True) == pytest.approx(1.0 + 5.0 + 5.0)
    assert simulated_seconds(rounds, overlaps=False, step_seconds=2.0) == pytest.approx(
        3 * (4.0 + 0.1 + 0.7)
    )
    assert simulated_seconds([], overlaps=True) == 0.0


def test_unknown_method_and_bad_config_are_errors(corpus: Corpus) -> None:
    with pytest.raises(SimulationError, match="unknown method"):
        run_method("gossip", CFG, corpus)
    with pytest.raises(SimulationError):
        SimConfig(model=TOY, steps=0)


def test_demo_command_prints_the_table_and_writes_a_report(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from veriloco.cli import main

    argv = ["simulate", "--epochs", "1", "--h", "2", "--trainers", "2", "--batch-size", "2"]
    assert main([*argv, "--methods", "allreduce,diloco", "--report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| allreduce |" in out and "| diloco |" in out
    assert (tmp_path / "demo.md").read_text().startswith("| method |")
    assert main([*argv, "--methods", "gossip"]) == 2
    assert "unknown methods" in capsys.readouterr().err
