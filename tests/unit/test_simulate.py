"""The local simulation: every method runs on a toy model, traffic follows the stated formulas, runs repeat."""

import json
import math
from dataclasses import replace

import pytest

from dilocox.inner import InnerConfig, configure_determinism
from protocol.data import Corpus, default_corpus
from protocol.model import GPTConfig, n_params
from veriloco.simulate import (
    DDP_BUCKET_BYTES,
    Link,
    RoundTiming,
    SimConfig,
    SimulationError,
    compare,
    curve_times,
    ddp_buckets,
    ddp_step_seconds,
    markdown_table,
    methods,
    resolve_method,
    ring_allreduce_bytes,
    run_method,
    simulated_seconds,
    simulated_timeline,
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
    for name in ("dilocox", "dilocox_blocking", "dilocox_eager", "dilocox_e80", "quant_only", "fixed_rank",
                 "fixed_rank_blocking", "fixed_rank_half", "lowrank_only", "dilocox_merge", "dilocox_merge_b1", "fixed_rank_merge",
                 "fixed_rank_merge_b1"):
        r = res[name]
        assert r.steps_per_worker == 8
        assert r.unsent_eval_loss is not None and math.isfinite(r.unsent_eval_loss)
        assert r.bytes_per_worker == sum(p for p in r.payload_bytes)  # (K-1) = 1 payload per round
        assert r.bytes_per_worker < res["diloco"].bytes_per_worker
    assert res["quant_only"].bytes_per_worker < res["diloco"].bytes_per_worker / 5  # int4 vs fp32
    assert res["diloco"].unsent_eval_loss is None  # nothing is held back without compression
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
    # a merge step: the exchange hides behind only that many steps, the round stalls for the rest
    merge1 = [replace(r, hide_steps=1) for r in rounds]
    assert simulated_seconds(merge1, overlaps=True) == pytest.approx(1.1 + 2 * (1.1 + 0.7 - 0.5) + 0.7)
    assert simulated_seconds([replace(r, hide_steps=2) for r in rounds], overlaps=True) == pytest.approx(
        simulated_seconds(rounds, overlaps=True))
    assert simulated_seconds([replace(r, hide_steps=0) for r in rounds], overlaps=True) == pytest.approx(
        simulated_seconds(rounds, overlaps=False))


def test_ddp_overlaps_each_bucket_with_the_rest_of_the_backward() -> None:
    # compute 3 s: forward 1 s, backward 2 s; two buckets, each half the parameters
    halves = [(0.5, 0.5), (1.0, 0.5)]
    # bucket 1 ready at 2 s, sent by 2.5; bucket 2 ready at 3 s, sent by 3.5: only it is exposed
    assert ddp_step_seconds(3.0, halves) == pytest.approx(3.5)
    slow = [(0.5, 1.5), (1.0, 1.5)]  # bucket 2 waits for the link: 2 + 1.5 + 1.5
    assert ddp_step_seconds(3.0, slow) == pytest.approx(5.0)
    one = [(1.0, 0.5)]  # a single bucket cannot overlap anything: compute + exchange
    assert ddp_step_seconds(3.0, one) == pytest.approx(3.5)
    assert ddp_step_seconds(3.0, []) == 3.0
    # overlap never makes a step slower than compute or faster than compute + last bucket
    many = [((i + 1) / 10, 0.05) for i in range(10)]
    assert ddp_step_seconds(3.0, many) == pytest.approx(3.05)


def test_ddp_buckets_follow_backward_order_and_caps() -> None:
    shapes = {"a": (256,), "b": (512,), "c": (1024,)}  # 1, 2 and 4 KiB of fp32
    # reverse order c, b, a; first bucket closes at >= 4 KiB, the next at >= 2 KiB
    b = ddp_buckets(shapes, bucket_bytes=2048, first_bucket_bytes=4096)
    assert b == [(4096 / 7168, 4096), (6144 / 7168, 2048), (1.0, 1024)]
    assert ddp_buckets(shapes) == [(1.0, 7168)]  # DDP's caps: one bucket for a tiny model
    assert sum(n for _, n in ddp_buckets({"x": (30, 2**20)}, DDP_BUCKET_BYTES)) == 120 * 2**20


def test_one_link_model_for_every_method(corpus: Corpus) -> None:
    link = Link(bandwidth_bps=8e6, latency_s=0.01)  # 1 MB/s
    assert link.seconds(1_000_000) == pytest.approx(1.01)
    assert link.ring_allreduce_seconds(4_000_000, 4) == pytest.approx(6.0 + 0.06)
    assert link.allgather_seconds(1_000_000, 4) == pytest.approx(3.0 + 0.03)
    assert link.seconds(0, 5) == 0.0
    with pytest.raises(SimulationError):
        Link(bandwidth_bps=0)
    cfg = SimConfig(
        model=TOY, trainers=2, steps=4, batch_size=2, h=2, rank=2, eval_rows=4,
        bandwidth_bps=8e6, latency_s=0.01,
    )  # fmt: skip
    dense = 4 * n_params(TOY)
    ar = run_method("allreduce", cfg, corpus)
    assert all(r.comm_s == pytest.approx(dense / 1e6 + 0.02) for r in ar.rounds_detail)
    assert len(ar.rounds_detail[0].buckets) == 1  # the toy model fits DDP's first bucket
    dl = run_method("diloco", cfg, corpus)
    assert all(r.comm_s == pytest.approx(dense / 1e6 + 0.02) for r in dl.rounds_detail)
    dx = run_method("dilocox", cfg, corpus)
    for r, p in zip(dx.rounds_detail, dx.payload_bytes):
        assert r.comm_s == pytest.approx(p / 1e6 + 0.01, rel=0.05)  # K-1 = 1 hop, the largest


def test_allreduce_exposes_only_communication_left_after_backward() -> None:
    step = RoundTiming(steps=1, train_s=3.0, codec_s=0.0, agg_s=0.1, comm_s=1.0,
                       buckets=((0.5, 0.5), (1.0, 0.5)))  # fmt: skip
    assert simulated_seconds([step] * 4, overlaps=False) == pytest.approx(4 * 3.6)
    # with a common step time (which includes the update), the update is not counted twice
    assert simulated_seconds([step] * 4, overlaps=False, step_seconds=3.1) == pytest.approx(4 * 3.6)
    no_overlap = RoundTiming(steps=1, train_s=3.0, codec_s=0.0, agg_s=0.1, comm_s=1.0)
    assert simulated_seconds([no_overlap] * 4, overlaps=False) == pytest.approx(4 * 4.1)


def test_normalised_allreduce_update_is_its_median(corpus: Corpus) -> None:
    from veriloco.simulate import normalise_times

    r = run_method("allreduce", CFG, corpus)
    r.rounds_detail[0].agg_s = 100.0  # a load burst on the first update
    step_s = normalise_times({"allreduce": r})
    assert max(x.agg_s for x in r.rounds_detail) < 100.0
    assert r.simulated_seconds_1gbps < 50.0
    assert r.simulated_seconds_1gbps == pytest.approx(
        simulated_seconds(r.rounds_detail, False, step_s)
    )


def test_timeline_and_curve_times(corpus: Corpus) -> None:
    rounds = [RoundTiming(2, 1.0, 0.0, 0.0, 3.0)] * 3
    assert simulated_timeline(rounds, overlaps=False) == pytest.approx([4.0, 8.0, 12.0])
    # overlapped: round r's exchange runs during round r+1's training
    assert simulated_timeline(rounds, overlaps=True) == pytest.approx([4.0, 7.0, 10.0])
    r = run_method("diloco", CFG, corpus)
    times = curve_times(r)
    assert times[0] == 0.0 and times[-1] == pytest.approx(r.simulated_seconds_1gbps)
    assert times == sorted(times) and len(times) == len(r.curve)


def test_merge_step_spans_blocking_to_the_one_step_delay(corpus: Corpus) -> None:
    """Merging G_e before an epoch's first step trains like blocking; at its end, like the delay."""
    for m, twin in ((0, "fixed_rank_blocking"), (CFG.h, "fixed_rank")):
        cfg = replace(CFG, merge_step=m)
        merged, ref = run_method("fixed_rank_merge", cfg, corpus), run_method(twin, cfg, corpus)
        assert merged.final_eval_loss == pytest.approx(ref.final_eval_loss, abs=1e-4)
        assert merged.bytes_per_worker == ref.bytes_per_worker
    with pytest.raises(SimulationError, match="merge_step"):
        replace(CFG, merge_step=-1)


def test_first_merge_can_wait_for_round_one(corpus: Corpus) -> None:
    """``fixed_rank_merge_b1`` trains round 2 like blocking (G_1 folded in before its first step) and
    merges after step 1 from round 3 on; its timing exposes round 1's exchange alone."""
    cfg = replace(CFG, steps=12, merge_step=1)  # 3 rounds of H = 4
    b1, blocking, merged = (run_method(n, cfg, corpus) for n in ("fixed_rank_merge_b1", "fixed_rank_blocking",
                                                                  "fixed_rank_merge"))
    assert b1.curve[:3] == blocking.curve[:3] and b1.curve[:2] == merged.curve[:2]
    assert b1.curve[3] not in (blocking.curve[3], merged.curve[3])  # round 3 merges after step 1
    assert [r.hide_steps for r in b1.rounds_detail] == [1, 0, 1]
    assert [r.hide_steps for r in merged.rounds_detail] == [1, 1, 1]


def test_unknown_method_and_bad_config_are_errors(corpus: Corpus) -> None:
    with pytest.raises(SimulationError, match="unknown method"):
        run_method("gossip", CFG, corpus)
    with pytest.raises(SimulationError):
        SimConfig(model=TOY, steps=0)


def test_a_robust_aggregate_is_a_method_suffix(corpus: Corpus) -> None:
    """``<local method>_trimmed`` / ``_median`` run the method with that outer aggregate: at 2 workers
    nothing is dropped (the mean itself, bit for bit), at 3 it differs."""
    table = methods()
    m = resolve_method("fixed_rank_trimmed", table)
    assert m is not None and m.aggregate == "trimmed" and m.compression == table["fixed_rank"].compression
    assert resolve_method("diloco_median", table).aggregate == "median"  # type: ignore[union-attr]
    assert resolve_method("allreduce_trimmed", table) is None and resolve_method("gossip_median", table) is None
    assert resolve_method("fixed_rank_trimmed_trimmed", table) is None
    assert run_method("fixed_rank_trimmed", CFG, corpus).curve == run_method("fixed_rank", CFG, corpus).curve
    three = replace(CFG, trainers=3, steps=4)
    assert run_method("fixed_rank_median", three, corpus).curve != run_method("fixed_rank", three, corpus).curve


def test_demo_command_prints_the_table_and_writes_a_report(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from veriloco.cli import main

    argv = ["simulate", "--epochs", "1", "--h", "2", "--trainers", "2", "--batch-size", "2"]
    assert main([*argv, "--methods", "allreduce,diloco,fixed_rank_merge", "--merge-step", "1", "--report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| allreduce |" in out and "| diloco |" in out and "| fixed_rank_merge |" in out
    report = json.loads((tmp_path / "demo.json").read_text())
    assert "merged after step 1" in report["fixed_rank_merge"]["description"]
    assert report["fixed_rank_merge"]["rounds_detail"][0]["hide_steps"] == 1
    assert (tmp_path / "demo.md").read_text().startswith("| method |")
    assert main([*argv, "--methods", "gossip"]) == 2
    assert "unknown methods" in capsys.readouterr().err


def test_error_feedback_in_the_parameters_is_a_merge_method_suffix(corpus: Corpus) -> None:
    """``<compressed merge method>_inparams`` keeps no buffer (the compressor's is off) and merges the
    public offset instead; it composes with a robust suffix, and its run trains differently from the
    buffered one (the residual sits in the trained parameters) while sending the same bytes."""
    table = methods()
    m = resolve_method("fixed_rank_merge_b1_inparams_trimmed", table)
    assert m is not None and m.ef_in_params and m.aggregate == "trimmed"
    assert not m.compression.error_feedback  # type: ignore[union-attr]
    for bad in ("diloco_inparams", "fixed_rank_inparams", "allreduce_inparams", "fixed_rank_merge_b1_trimmed_inparams"):
        assert resolve_method(bad, table) is None, bad
    cfg = replace(CFG, merge_step=1)
    buffered, in_params = (run_method(n, cfg, corpus) for n in ("fixed_rank_merge_b1", "fixed_rank_merge_b1_inparams"))
    assert in_params.curve[1] == buffered.curve[1]  # round 1 is the same: nothing was left out before it
    assert in_params.curve != buffered.curve and in_params.bytes_per_worker == buffered.bytes_per_worker
