"""Repeated runs of one protocol scenario are reported as their mean, with every run kept."""

import json
import sys

import pytest

from benchmarks.protocol import SAMPLED, combine, main, markdown

pytestmark = pytest.mark.unit


def _run(h: int, x: float) -> dict:
    fixed = {"preset": "small", "H": h, "audit_mode": "shard", "audit_steps": 4, "audit_segment": 8, "stages": 1,
             "quorum": 3, "trainers": 2, "verifiers": 3, "epochs": 2, "state_bytes_largest_process_fraction": 1}
    return {**fixed, **{k: x for k in SAMPLED}, "wall_seconds": x}


def test_repeats_average_and_distinct_scenarios_stay_apart() -> None:
    one, two, other = _run(256, 1.0), _run(256, 2.0), _run(64, 5.0)
    merged = combine([other, one, two])
    assert merged[0] is other
    assert merged[1]["traffic_reduction_vs_allreduce"] == 1.5 and merged[1]["runs"] == [one, two]
    assert "wall_seconds" not in merged[1]  # a run's own seconds stay with the run
    assert "(mean of 2 runs)" in markdown(merged)


def test_start_rules_stay_apart_whatever_order_the_runs_came_in(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """--merge-steps 0 1 in one run and 1 0 in another: two scenarios, each the mean of its two runs."""
    parts = []
    for n, order in enumerate(((0, 1), (1, 0))):
        part = tmp_path / f"run{n}.json"
        part.write_text(json.dumps({"scenarios": [{**_run(64, float(m + n)), "merge_step": m} for m in order],
                                    "command": f"run {n}", "machine": {}}))
        parts.append(str(part))
    monkeypatch.setattr(sys, "argv", ["protocol.py", "--merge", *parts, "--out", str(tmp_path / "out.json")])
    assert main() == 0
    delay, merged = json.loads((tmp_path / "out.json").read_text())["scenarios"]
    assert (delay["merge_step"], merged["merge_step"]) == (0, 1)
    assert delay["trainer_stall_fraction"] == 0.5 and merged["trainer_stall_fraction"] == 1.5
    out = capsys.readouterr().out
    assert "| one-step delay |" in out and "| merge at step 1 |" in out


def test_log_budgets_and_stages_stay_apart_when_runs_interleave() -> None:
    """--log-budgets node 0:0 run twice: the repeats of each budget average together although the two
    budgets alternate in the list, and a staged run of the same budget is its own scenario."""
    node, none = ({"log_budgets_gib": b} for b in (None, [0.0, 0.0]))
    runs = [{**_run(16, 1.0), **node}, {**_run(16, 5.0), **none}, {**_run(16, 3.0), **node}, {**_run(16, 7.0), **none},
            {**_run(16, 9.0), **node, "stages": 2, "state_bytes_largest_process_fraction": 0.5}]
    merged = combine(runs)
    assert [m["verifier_compute_fraction"] for m in merged] == [2.0, 6.0, 9.0]
    assert [len(m.get("runs", [m])) for m in merged] == [2, 2, 1] and merged[1]["log_budgets_gib"] == [0.0, 0.0]


def test_merge_writes_the_means_and_every_run(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    parts = []
    for n, x in enumerate((1.0, 3.0)):
        part = tmp_path / f"run{n}.json"
        part.write_text(json.dumps({"scenarios": [_run(256, x)], "command": f"run {n}", "machine": {"load_average": [x]}}))
        parts.append(str(part))
    out = tmp_path / "protocol.json"
    monkeypatch.setattr(sys, "argv", ["protocol.py", "--merge", *parts, "--out", str(out)])
    assert main() == 0
    r = json.loads(out.read_text())
    assert r["commands"] == ["run 0", "run 1"] and [m["load_average"] for m in r["machines"]] == [[1.0], [3.0]]
    (sc,) = r["scenarios"]
    assert sc["verifier_compute_fraction"] == 2.0 and len(sc["runs"]) == 2
    assert "(mean of 2 runs)" in capsys.readouterr().out


def test_stall_is_the_last_epoch_s_cycle_and_answers_count_as_compute(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two epochs: the first holds no answer, the second holds the first's; the headline stall is the
    second cycle's, and the answer's CPU (builds and boundary log) is reported against the steps' CPU."""
    from benchmarks.protocol import analyze
    from veriloco.netdemo import DemoOptions

    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("trainer0", "trainer1"):
        evs = [
            {"event": "started", "t": 0.0},
            {"event": "step", "t": 1.0, "epoch": 0, "step": 1},
            # epoch 0: 100 s of steps, no stall; epoch 1's cycle (100 -> 300): 150 s of steps in 200 s
            {"event": "trained", "t": 100.0, "epoch": 0, "steps": 64, "step_wall_s": 100.0, "compute_s": 80.0,
             "digest_s": 1.0, "log_s": 4.0, "boundary_log_bytes": 2000, "boundary_log_ram_bytes": 500, "payload_bytes": 1000, "sent_bytes": 1000},
            {"event": "responded", "t": 180.0, "epoch": 0, "audit_bytes": 5000, "answer_s": 30.0, "answer_cpu_s": 16.0,
             "beside_training": True, "sent_bytes": 6000},
            {"event": "trained", "t": 300.0, "epoch": 1, "steps": 64, "step_wall_s": 150.0, "compute_s": 80.0,
             "digest_s": 1.0, "log_s": 4.0, "boundary_log_bytes": 2000, "payload_bytes": 1000, "sent_bytes": 7000},
        ]
        (logs / f"{name}.jsonl").write_text("\n".join(json.dumps(e) for e in evs) + "\n")
    (logs / "coordinator0.jsonl").write_text("")
    verified = [{"event": "verified", "t": 200.0, "cpu_s": 2.0},  # before the edges were metered: counted, not split
                {"event": "verified", "t": 210.0, "cpu_s": 4.0, "rpc_calls": 10, "rpc_cpu_s": 1.0, "store_cpu_s": 0.5,
                 "fetched_bytes": 300}]
    (logs / "verifier0.jsonl").write_text("\n".join(json.dumps(e) for e in verified) + "\n")
    opts = DemoOptions(trainers=2, verifiers=3, epochs=2, preset="tiny", steps=64, workdir=tmp_path)
    r = analyze(opts, "shard", {"epochs_finalized": 2, "initial_eval_loss": None, "final_eval_loss": None, "gas_used": None})
    assert r["verifier_cpu_seconds_per_verification"] == 3.0 and r["verifier_rpc_calls_per_verification"] == 10
    assert r["verifier_rpc_cpu_share"] == 0.25 and r["verifier_store_cpu_share"] == 0.125
    assert r["verifier_fetched_bytes_per_verification"] == 300
    assert r["trainer_stall_fraction"] == 0.25  # 1 - 150 / 200
    assert r["trainer_stall_fraction_from_first_step"] == round(1 - 250 / (300 - (1 - 100 / 64)), 4)  # first step at 1 - 100/64
    assert r["audit_answer_build_fraction"] == 0.1 and r["audit_answers_beside_training"]
    assert r["boundary_log_fraction"] == 0.05 and r["audit_answer_compute_fraction"] == 0.15  # the log's writes count too
    assert r["boundary_log_bytes_per_trainer_per_epoch"] == 2000 and r["boundary_log_ram_bytes_per_trainer_per_epoch"] == 250


def test_rows_of_the_shipped_length_reach_the_run_config() -> None:
    """``--seq-len``: the benchmark runs `small` at rows of its 128-token context, the demo keeps its 64
    (examples/small.toml's too), and no row outgrows the preset's context."""
    from veriloco.netdemo import DemoOptions

    assert DemoOptions(preset="small", seq_len=128, batch_size=8).config().data.seq_len == 128
    assert DemoOptions(preset="small").config().data.seq_len == 64
    assert DemoOptions(preset="tiny", seq_len=4096).config().data.seq_len == DemoOptions(preset="tiny").config().data.seq_len


def test_the_shipped_rank_and_first_merge_reach_the_run_config() -> None:
    """--rank 128 --first-merge-step 0 run examples/small.toml's compression and epoch-1 merge, not the
    demo's adaptive rule from rank 8; the scenario records both, so such runs merge apart."""
    from veriloco.netdemo import DemoOptions

    cfg = DemoOptions(preset="small", rank=128, first_merge_step=0, merge_step=1).config()
    c = cfg.compression
    assert (c.rank_initial, c.rank_min, c.rank_max, cfg.schedule.first_merge_step) == (128, 128, 128, 0)
    plain = DemoOptions(preset="small").config()
    assert plain.compression.rank_min < plain.compression.rank_max and plain.schedule.first_merge_step == -1
    assert DemoOptions(preset="small", first_merge_step=0, merge_step=0).config().schedule.first_merge_step == -1
    assert len(combine([{**_run(256, 1.0), "rank": 128}, {**_run(256, 2.0), "rank": None}])) == 2
