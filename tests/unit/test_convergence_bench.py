"""The convergence benchmark's report: paired per-seed gaps under the keys the issue fixes, labelled projection."""

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.convergence import (
    gap_over_run,
    gap_summary,
    headline,
    main,
    parse_outer,
    projection,
    render,
)
from veriloco.simulate import round_timings, simulated_seconds

pytestmark = pytest.mark.unit


def test_gap_summary_pairs_by_seed() -> None:
    s = gap_summary(
        {"allreduce": [2.0, 4.0, 3.0], "diloco": [2.02, 4.08, 3.03], "dilocox": [2.04, 4.08, 3.06]}
    )
    g = s["paired_gap_vs_allreduce"]
    assert g["allreduce"]["mean"] == 0.0 and g["allreduce"]["sd"] == 0.0
    assert g["diloco"]["per_seed"] == pytest.approx([0.01, 0.02, 0.01])
    assert g["dilocox"]["mean"] == pytest.approx(0.02)
    d = s["paired_gap_dilocox_vs_diloco"]
    assert d["per_seed"] == pytest.approx([0.01, 0.0, 0.01])
    lo, hi = d["ci95"]
    assert lo < d["mean"] < hi


def test_the_shipped_merge_rule_is_the_dilocox_the_targets_read() -> None:
    losses = {"allreduce": [2.0, 4.0], "diloco": [2.02, 4.08], "dilocox": [2.1, 4.2], "dilocox_merge": [2.04, 4.08]}
    s = gap_summary(losses)
    assert s["paired_gap_dilocox_vs_diloco"]["per_seed"] == pytest.approx([0.01, 0.0])  # merge minus diloco
    del losses["dilocox_merge"]
    assert gap_summary(losses)["paired_gap_dilocox_vs_diloco"]["per_seed"] == pytest.approx([0.04, 0.03])


def test_projection_labels_every_input() -> None:
    p = projection(4, traffic_reduction=900.0, compression_ratio=280.0, mean_h=8.0)
    assert all(
        v["source"].split(" ")[0].rstrip(":") in ("measured", "assumed")
        for v in p["inputs"].values()
    )
    assert p["inputs"]["traffic_reduction"]["source"].startswith("measured")
    # the DDP overlap hides at most the backward pass: the step is at least the exchange
    assert p["allreduce_comm_s_per_step"] < p["allreduce_step_s_ddp_overlap"]
    assert p["speedup"] == pytest.approx(
        p["allreduce_step_s_ddp_overlap"]
        / max(p["inputs"]["compute_s_per_step"]["value"], p["dilocox_comm_s_per_step"])
    )
    assert parse_outer("1.0:0,0.7:0.5") == [(1.0, 0.0), (0.7, 0.5)]


def test_two_seed_run_writes_the_agreed_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "c.json"
    argv = ["--preset", "ci", "--seeds", "3,4", "--eval-rows", "8", "--steps", "4", "--h", "2",
            "--methods", "allreduce,diloco,dilocox", "--sweep-outer", "0.7:0.5", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert r["seeds"] == [3, 4] and r["eval_rows"] == 8
    for m in ("allreduce", "diloco", "dilocox"):
        g = r["paired_gap_vs_allreduce"][m]
        assert len(g["per_seed"]) == 2 and len(g["ci95"]) == 2 and g["sd"] >= 0
        assert g["ci95"][0] <= g["mean"] <= g["ci95"][1]
    assert set(r["paired_gap_dilocox_vs_diloco"]) >= {"mean", "ci95"}
    assert [s["seed"] for s in r["per_seed"]] == [3, 4]
    losses = [s["methods"]["allreduce"]["final_eval_loss"] for s in r["per_seed"]]
    assert losses[0] != losses[1]  # seeds change init and data
    assert [row["outer"] for row in r["sweep_outer"]] == [
        {"lr": 1.0, "momentum": 0.0},
        {"lr": 0.7, "momentum": 0.5},
    ]
    assert "equal_simulated_time" not in r and "equal_time" not in r["per_seed"][0]  # withdrawn (issue 49)
    eq = r["equivalence_to_diloco"]["dilocox"]  # two seeds: a TOST at the margin, its 90% interval inside or not
    lo, hi = eq["interval"]
    assert eq["test"] == "TOST" and eq["margin"] == 0.003 and eq["n"] == 2
    assert eq["equivalent"] == (-0.003 < lo and hi < 0.003) and r["targets"]["equivalent_to_diloco_tost_0.3_points"] == eq["equivalent"]
    assert r["K"] == r["config"]["trainers"]
    text = capsys.readouterr().out
    assert text.strip() == render(r).strip()
    assert "Equal simulated time" not in text and "| assumed (the paper's model) |" in text
    assert f"traffic reduction (K = {r['K']})" in text and "TOST p" in text
    over = gap_over_run(r)  # from the start (one model for all) to the final gap, at every shared eval step
    assert list(over)[::len(over) - 1] == [0, 4] and over[0] == {"diloco": 0.0, "dilocox": 0.0}
    assert over[4] == pytest.approx({m: r["paired_gap_vs_allreduce"][m]["mean"] for m in ("diloco", "dilocox")})
    assert "Where the gap forms" in text


def test_seed_runs_merge_into_the_joint_run_and_inner_lr_is_tuned_per_method(tmp_path: Path) -> None:
    """Two single-seed runs merged give the two-seed run's statistics exactly (single-threaded runs are
    bitwise reproducible); the inner lr sweep reruns AllReduce too and picks each method's best lr."""
    common = ["--preset", "ci", "--eval-rows", "8", "--steps", "4", "--h", "2", "--methods", "allreduce,diloco",
              "--sweep-inner-lr", "1e-2", "--quiet"]  # fmt: skip
    for seeds, name in (("3,4", "both"), ("4", "s4"), ("3", "s3")):
        assert main([*common, "--seeds", seeds, "--out", str(tmp_path / f"{name}.json")]) == 0
    assert main(["--merge", str(tmp_path / "s4.json"), str(tmp_path / "s3.json"), "--out", str(tmp_path / "m.json")]) == 0
    both, merged = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("both", "m"))
    assert merged["seeds"] == [3, 4]
    for key in ("paired_gap_vs_allreduce", "sweep_inner_lr"):
        assert merged[key] == both[key]
    sw = merged["sweep_inner_lr"]
    assert sw["lrs"] == ["0.003", "0.01"] and set(sw["best_lr"]) == {"allreduce", "diloco"}
    for n, lr in sw["best_lr"].items():
        assert sw["mean_loss"][lr][n] == min(sw["mean_loss"][k][n] for k in sw["lrs"])
    assert "Each method at its own best inner lr" in render(merged)
    with pytest.raises(SystemExit, match="seed"):
        main(["--merge", str(tmp_path / "s3.json"), str(tmp_path / "both.json"), "--out", str(tmp_path / "x.json")])
    # the same sweep from separate files: one at the main lr, one at 1e-2 (which joins the sweep)
    plain = [x for x in common if x not in ("--sweep-inner-lr", "1e-2")]
    assert main([*plain, "--seeds", "3,4", "--out", str(tmp_path / "main.json")]) == 0
    assert main([*plain, "--seeds", "4,3", "--inner-lr", "1e-2", "--out", str(tmp_path / "lr.json")]) == 0
    assert main(["--merge", str(tmp_path / "main.json"), str(tmp_path / "lr.json"), "--out", str(tmp_path / "w.json")]) == 0
    widened = json.loads((tmp_path / "w.json").read_text())
    assert widened["sweep_inner_lr"] == both["sweep_inner_lr"] and widened["seeds"] == [3, 4]
    with pytest.raises(SystemExit, match="already has runs at inner lr"):
        main(["--merge", str(tmp_path / "both.json"), str(tmp_path / "lr.json"), "--out", str(tmp_path / "x.json")])
    bad = json.loads((tmp_path / "s4.json").read_text())
    bad["config"]["batch_size"] += 1
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(SystemExit, match="config"):
        main(["--merge", str(tmp_path / "s3.json"), str(tmp_path / "bad.json"), "--out", str(tmp_path / "x.json")])


def test_rank_override_is_recorded_and_kept_apart_from_other_ranks(tmp_path: Path) -> None:
    common = ["--preset", "ci", "--eval-rows", "8", "--steps", "4", "--h", "2", "--methods", "allreduce,dilocox",
              "--seeds", "3", "--quiet"]  # fmt: skip
    assert main([*common, "--out", str(tmp_path / "r8.json")]) == 0
    assert main([*common, "--rank", "2", "--out", str(tmp_path / "r2.json")]) == 0
    r8, r2 = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("r8", "r2"))
    assert r8["config"]["rank_initial"] == 8 and r2["config"]["rank_initial"] == 2
    ar = [r["per_seed"][0]["methods"]["allreduce"]["final_eval_loss"] for r in (r8, r2)]
    dx = [r["per_seed"][0]["methods"]["dilocox"]["final_eval_loss"] for r in (r8, r2)]
    assert ar[0] == ar[1] and dx[0] != dx[1]  # the rank moves only the compressed method
    # joined, the other rank's compressed method is kept apart by name, paired against the one AllReduce
    assert main(["--merge", str(tmp_path / "r8.json"), str(tmp_path / "r2.json"), "--out", str(tmp_path / "x.json")]) == 0
    x = json.loads((tmp_path / "x.json").read_text())
    assert list(x["methods"]) == ["allreduce", "dilocox", "dilocox_r2"] and x["config"]["rank_initial"] == 8
    assert x["methods"]["dilocox_r2"]["final_eval_loss_per_seed"] == [dx[1]]
    for bad in ("1", "257"):  # refused before anything trains: below the schedule's floor, above the limit
        with pytest.raises(SystemExit):
            main([*common, "--rank", bad, "--out", str(tmp_path / f"r{bad}.json")])
        assert not (tmp_path / f"r{bad}.json").exists()


def test_a_rank_above_the_schedule_s_ceiling_raises_the_ceiling() -> None:
    from veriloco.simulate import methods

    assert methods(rank=64)["dilocox"].compression.rank_max == 64  # type: ignore[attr-defined]
    assert methods(rank=8)["dilocox"].compression.rank_max == 32  # type: ignore[attr-defined]


def test_precision_and_device_are_recorded_and_kept_apart(tmp_path: Path) -> None:
    common = ["--preset", "ci", "--eval-rows", "8", "--steps", "4", "--h", "2", "--methods", "allreduce,dilocox",
              "--seeds", "3", "--quiet"]  # fmt: skip
    assert main([*common, "--out", str(tmp_path / "fp32.json")]) == 0
    assert main([*common, "--precision", "bf16", "--out", str(tmp_path / "bf16.json")]) == 0
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("fp32", "bf16"))
    assert a["config"]["model_config"]["precision"] == "fp32" and b["config"]["model_config"]["precision"] == "bf16"
    assert a["machine"]["device"] == "cpu"
    la, lb = (r["per_seed"][0]["methods"]["allreduce"]["final_eval_loss"] for r in (a, b))
    assert la != lb and abs(la - lb) / la < 0.02  # autocast took effect, and it is close
    with pytest.raises(SystemExit, match="config"):
        main(["--merge", str(tmp_path / "fp32.json"), str(tmp_path / "bf16.json"), "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit):  # a device this machine does not have is refused before anything trains
        main([*common, "--device", "cuda:99", "--out", str(tmp_path / "gpu.json")])
    assert not (tmp_path / "gpu.json").exists()


def test_runs_of_other_methods_on_the_same_seeds_join_against_one_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--preset", "ci", "--eval-rows", "8", "--steps", "4", "--h", "2", "--seeds", "3", "--quiet"]
    a, b, x = (str(tmp_path / f"{n}.json") for n in ("a", "b", "x"))
    assert main([*common, "--methods", "allreduce,diloco,dilocox", "--out", a]) == 0
    assert main([*common, "--methods", "allreduce,fixed_rank_merge", "--merge-step", "1", "--out", b]) == 0
    ra, rb = (json.loads(Path(p).read_text()) for p in (a, b))
    assert rb["config"]["merge_step"] == 1 and "merge_step" not in ra["config"]  # recorded where it was read
    assert main(["--merge", a, b, "--out", x]) == 0
    j = json.loads(Path(x).read_text())
    assert list(j["per_seed"][0]["methods"]) == ["allreduce", "diloco", "dilocox", "fixed_rank_merge"]
    assert j["config"]["merge_step"] == 1 and j["merged_from"] == [a, b] and len(j["command"]) == 2
    assert set(j["paired_gap_vs_diloco"]) == {"dilocox", "fixed_rank_merge"}
    loss = rb["per_seed"][0]["methods"]["fixed_rank_merge"]["final_eval_loss"]
    assert j["methods"]["fixed_rank_merge"]["final_eval_loss_per_seed"] == [loss]
    # a joined run made under other load (3x its step time): every method of the file is simulated at one
    # clock, the median of the runs' measured step times, whatever clock its own run had
    slow = json.loads(json.dumps(rb))
    for sd in slow["per_seed"]:
        sd["step_seconds_for_simulation"] *= 3
        for r in sd["methods"].values():
            r["simulated_seconds_1gbps"] *= 3
            r["eval_curve_simulated_seconds"] = [3 * t for t in r["eval_curve_simulated_seconds"]]
    bs = str(tmp_path / "b_slow.json")
    Path(bs).write_text(json.dumps(slow))
    assert main(["--merge", a, bs, "--out", x]) == 0
    js = json.loads(Path(x).read_text())
    measured = sorted({ra["per_seed"][0]["step_seconds_for_simulation"], 3 * rb["per_seed"][0]["step_seconds_for_simulation"]})
    assert js["clock"]["measured_step_seconds"] == pytest.approx(measured) and js["clock"]["untimed"] == []
    clock = js["clock"]["step_seconds"]
    assert clock == pytest.approx(statistics.median(measured)) and js["per_seed"][0]["step_seconds_for_simulation"] == clock
    for r in js["per_seed"][0]["methods"].values():
        rounds, overlaps = round_timings(r["timing"]["rounds"]), r["timing"]["overlaps"]
        assert r["simulated_seconds_1gbps"] == pytest.approx(simulated_seconds(rounds, overlaps, clock))
    for r in slow["per_seed"][0]["methods"].values():  # a file without the stored timing keeps its own times
        del r["timing"]
    Path(bs).write_text(json.dumps(slow))
    assert main(["--merge", a, bs, "--out", x]) == 0
    js = json.loads(Path(x).read_text())
    # named: its time is its own run's, so the seed stays at its first run's clock (the others join it)
    assert js["clock"]["untimed"] == ["fixed_rank_merge"] and js["clock"]["step_seconds"] is None
    assert js["per_seed"][0]["step_seconds_for_simulation"] == ra["per_seed"][0]["step_seconds_for_simulation"]
    assert js["per_seed"][0]["methods"]["fixed_rank_merge"]["simulated_seconds_1gbps"] == pytest.approx(
        3 * rb["per_seed"][0]["methods"]["fixed_rank_merge"]["simulated_seconds_1gbps"])
    assert main(["--merge", a, b, "--keep", "diloco,fixed_rank_merge", "--out", x]) == 0
    kept = json.loads(Path(x).read_text())
    assert list(kept["methods"]) == ["allreduce", "diloco", "fixed_rank_merge"]
    assert kept["dilocox_method"] == "fixed_rank_merge" and "paired_gap_dilocox_vs_diloco" in kept
    assert "equivalent_to_diloco_tost_0.3_points" not in kept["targets"]  # one seed: no equivalence test
    assert headline({"allreduce", "diloco", "fixed_rank_merge", "fixed_rank_merge_b1"}) == "fixed_rank_merge_b1"
    with pytest.raises(SystemExit, match="no dilocox_eager"):
        main(["--merge", a, b, "--keep", "dilocox_eager", "--out", x])
    # a method run alone, without the baseline, pairs against another run's AllReduce at --merge
    u = str(tmp_path / "u.json")
    assert main([*common, "--methods", "fixed_rank_merge", "--merge-step", "1", "--out", u]) == 0
    ru = json.loads(Path(u).read_text())
    assert "no allreduce" in ru["unpaired"] and "paired_gap_vs_allreduce" not in ru
    assert main(["--merge", u, a, "--out", x]) == 0  # given first, the baseline still comes from a
    ju = json.loads(Path(x).read_text())
    assert list(ju["methods"]) == list(j["methods"]) and ju["paired_gap_vs_allreduce"] == j["paired_gap_vs_allreduce"]
    with pytest.raises(SystemExit, match="no allreduce on seeds"):
        main(["--merge", u, "--out", x])
    with pytest.raises(SystemExit):
        main(["--render", u])
    assert "no allreduce on seeds" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a sweep pairs against AllReduce runs at its own settings
        main([*common, "--methods", "diloco", "--sweep-outer", "0.7:0.5", "--out", str(tmp_path / "n.json")])
    rb["per_seed"][0]["methods"]["allreduce"]["eval_curve"][-1][1] += 1e-6  # not the same baseline run
    Path(b).write_text(json.dumps(rb))
    with pytest.raises(SystemExit, match="repeat exactly"):
        main(["--merge", a, b, "--out", x])
    with pytest.raises(SystemExit):
        main([*common, "--methods", "allreduce,fixed_rank_merge", "--merge-step", "-1", "--out", str(tmp_path / "n.json")])
    assert not (tmp_path / "n.json").exists()


def test_a_method_run_seed_by_seed_or_at_another_rank_pairs_against_one_baseline(tmp_path: Path) -> None:
    """One process per seed, without AllReduce, joins the baseline run seed by seed; a run at another
    initial rank joins under a name that carries the rank, and only its compressed methods are renamed."""
    common = ["--preset", "ci", "--eval-rows", "8", "--steps", "4", "--h", "2", "--quiet", "--merge-step", "1"]
    base, u3, u4, r, x = (str(tmp_path / f"{n}.json") for n in ("base", "u3", "u4", "r", "x"))
    assert main([*common, "--seeds", "3,4", "--methods", "allreduce,diloco,fixed_rank_merge_b1", "--out", base]) == 0
    for seed, out in (("3", u3), ("4", u4)):
        assert main([*common, "--seeds", seed, "--methods", "fixed_rank_merge", "--out", out]) == 0
    assert json.loads(Path(u3).read_text())["config"]["merge_step"] == 1  # recorded for every *_merge* method
    assert main(["--merge", u4, base, u3, "--out", x]) == 0
    j = json.loads(Path(x).read_text())
    assert list(j["methods"]) == ["allreduce", "diloco", "fixed_rank_merge_b1", "fixed_rank_merge"]
    alone = [json.loads(Path(p).read_text())["per_seed"][0]["methods"]["fixed_rank_merge"]["final_eval_loss"]
             for p in (u3, u4)]
    assert j["methods"]["fixed_rank_merge"]["final_eval_loss_per_seed"] == alone
    assert len(j["paired_gap_vs_allreduce"]["fixed_rank_merge"]["per_seed"]) == 2
    with pytest.raises(SystemExit, match=r"fixed_rank_merge ran on seeds \[3\] only"):
        main(["--merge", base, u3, "--out", x])
    assert main([*common, "--seeds", "3,4", "--rank", "16", "--methods", "diloco,fixed_rank_merge_b1", "--out", r]) == 0
    assert main(["--merge", r, base, "--out", x]) == 0
    k = json.loads(Path(x).read_text())
    assert list(k["methods"]) == ["allreduce", "diloco", "fixed_rank_merge_b1", "fixed_rank_merge_b1_r16"]
    assert k["config"]["rank_initial"] == 8 and k["dilocox_method"] == "fixed_rank_merge_b1"
    assert "rank 16" in k["per_seed"][0]["methods"]["fixed_rank_merge_b1_r16"]["description"]
    assert main(["--merge", r, base, "--dilocox", "fixed_rank_merge_b1_r16", "--out", x]) == 0
    c = json.loads(Path(x).read_text())  # the targets and the projection read the chosen method, and keep it
    assert c["dilocox_method"] == "fixed_rank_merge_b1_r16"
    assert c["loss_gap_vs_allreduce"] == c["paired_gap_vs_allreduce"]["fixed_rank_merge_b1_r16"]["mean"]
    assert c["paired_gap_dilocox_vs_diloco"] == c["paired_gap_vs_diloco"]["fixed_rank_merge_b1_r16"] \
        != k["paired_gap_dilocox_vs_diloco"]
    assert main(["--merge", x, u3, u4, "--out", str(tmp_path / "y.json")]) == 0
    assert json.loads((tmp_path / "y.json").read_text())["dilocox_method"] == "fixed_rank_merge_b1_r16"
    for bad in (["--merge", r, base, "--dilocox", "dilocox", "--out", x], ["--render", x, "--dilocox", "diloco"]):
        with pytest.raises(SystemExit):
            main(bad)


def test_a_robust_aggregate_runs_as_a_method_suffix_and_joins_the_baseline(tmp_path: Path) -> None:
    """``<method>_trimmed`` runs that method with outer.aggregate = "trimmed" (the convergence cost of
    the robust rule, docs/results-steering.md); its results join a baseline run like any method, at
    another rank as ``<method>_trimmed_r<rank>``, and the recorded outer settings leave the rule out."""
    common = ["--preset", "ci", "--eval-rows", "8", "--steps", "4", "--h", "2", "--quiet", "--merge-step", "1",
              "--seeds", "3"]
    base, t, x = (str(tmp_path / f"{n}.json") for n in ("base", "t", "x"))
    assert main([*common, "--methods", "allreduce,fixed_rank_merge_b1", "--out", base]) == 0
    assert main([*common, "--rank", "16", "--methods", "fixed_rank_merge_b1_trimmed", "--out", t]) == 0
    part = json.loads(Path(t).read_text())
    assert "aggregate" not in part["config"]["outer"] and "trim" not in part["config"]["outer"]
    assert "outer aggregate trimmed" in part["per_seed"][0]["methods"]["fixed_rank_merge_b1_trimmed"]["description"]
    assert main(["--merge", t, base, "--out", x]) == 0
    assert list(json.loads(Path(x).read_text())["methods"]) == [
        "allreduce", "fixed_rank_merge_b1", "fixed_rank_merge_b1_trimmed_r16"]
    for bad in ("allreduce_trimmed", "fixed_rank_merge_b1_krum"):
        with pytest.raises(SystemExit):
            main([*common, "--methods", bad, "--out", str(tmp_path / "n.json")])


def test_runs_in_parallel_processes_give_the_sequential_results(tmp_path: Path) -> None:
    """--jobs trains each (seed, method, setting) in its own process; single-threaded runs are
    deterministic, so every loss and curve matches the one-process run to the last digit."""
    common = ["--preset", "ci", "--eval-rows", "8", "--steps", "4", "--h", "2", "--seeds", "3,4", "--quiet",
              "--methods", "allreduce,diloco", "--sweep-outer", "0.7:0.5", "--sweep-inner-lr", "1e-2"]  # fmt: skip
    assert main([*common, "--out", str(tmp_path / "one.json")]) == 0
    assert main([*common, "--jobs", "2", "--out", str(tmp_path / "two.json")]) == 0
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    for a, b in zip(one["per_seed"], two["per_seed"], strict=True):
        assert {n: r["eval_curve"] for n, r in a["methods"].items()} == {n: r["eval_curve"] for n, r in b["methods"].items()}
        assert a["sweep"].keys() == b["sweep"].keys() == {"0.7:0.5"}
        assert {k: {n: r["eval_curve"] for n, r in v.items()} for k, v in a["sweep"].items()} == \
            {k: {n: r["eval_curve"] for n, r in v.items()} for k, v in b["sweep"].items()}
        assert a["sweep_inner_lr"] == b["sweep_inner_lr"] and list(a["sweep_inner_lr"]) == ["0.01"]
    assert one["paired_gap_vs_allreduce"] == two["paired_gap_vs_allreduce"]
    assert one["sweep_inner_lr"] == two["sweep_inner_lr"]
    with pytest.raises(SystemExit):
        main([*common, "--jobs", "0", "--out", str(tmp_path / "x.json")])


def test_rendering_a_file_from_before_the_paired_format_names_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"benchmark": "convergence", "command": "benchmarks/convergence.py --preset ci"}))
    with pytest.raises(SystemExit) as e:
        main(["--render", str(old)])
    assert e.value.code == 2 and "rerun its command" in capsys.readouterr().err


def test_a_terminated_parallel_run_ends_its_workers(tmp_path: Path) -> None:
    """SIGTERM to a --jobs run ends its spawned workers too, not only the parent (they used to keep
    training, re-parented to init, for as long as their runs took)."""

    def workers(parent: int) -> set[int]:
        found = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                cmd = (stat.parent / "cmdline").read_bytes()
            except OSError:
                continue  # it ended while we looked
            if int(fields[1]) == parent and b"spawn_main" in cmd:
                found.add(int(stat.parent.name))
        return found

    root = Path(__file__).resolve().parents[2]
    argv = [sys.executable, str(root / "benchmarks" / "convergence.py"), "--preset", "ci", "--eval-rows", "8",
            "--steps", "100000", "--h", "2", "--seeds", "0", "--methods", "allreduce,diloco", "--jobs", "2", "--quiet", "--out", str(tmp_path / "never.json")]  # fmt: skip
    log = tmp_path / "stderr"
    with log.open("wb") as err:
        proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL, stderr=err)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while len(seen) < 2 and time.monotonic() < deadline and proc.poll() is None:
            seen |= workers(proc.pid)
            time.sleep(0.2)
        assert len(seen) == 2, f"the run did not start its two workers: {log.read_text()}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 60
        while (alive := {p for p in seen if Path(f"/proc/{p}").exists()}) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive, f"workers {sorted(alive)} outlived their run"
        assert not (tmp_path / "never.json").exists()
    finally:
        proc.kill()
        proc.wait()
        for p in seen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def test_a_held_out_merge_reports_the_selection_seeds_beside_its_own(tmp_path: Path) -> None:
    """issue 33: a file on the held-out rows records its seeds as held out; merged with --selection it
    names the seeds the choices were made on and puts their gaps beside its own."""
    common = ["--preset", "ci", "--eval-rows", "8", "--steps", "4", "--h", "2", "--methods", "allreduce,diloco,dilocox",
              "--quiet"]  # fmt: skip
    assert main([*common, "--seeds", "0", "--out", str(tmp_path / "sel0.json")]) == 0
    assert main(["--merge", str(tmp_path / "sel0.json"), "--out", str(tmp_path / "sel.json")]) == 0
    assert main([*common, "--seeds", "3", "--eval-split", "heldout", "--out", str(tmp_path / "h3.json")]) == 0
    assert main(["--merge", str(tmp_path / "h3.json"), "--selection", str(tmp_path / "sel.json"),
                 "--out", str(tmp_path / "held.json")]) == 0
    sel, held = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("sel", "held"))
    assert (sel["selection_seeds"], sel["held_out_seeds"]) == ([0], [])
    assert (held["selection_seeds"], held["held_out_seeds"]) == ([0], [3])
    assert held["selection"]["paired_gap_vs_allreduce"] == sel["paired_gap_vs_allreduce"]
    assert "beside the selection seeds [0]" in render(held)
    with pytest.raises(SystemExit, match="selection rows"):  # a held-out file is no selection
        main(["--merge", str(tmp_path / "h3.json"), "--selection", str(tmp_path / "held.json"),
              "--out", str(tmp_path / "x.json")])


def test_the_outer_sweep_table_names_the_file_s_dilocox_method() -> None:
    """A file whose DiLoCoX method is none of HEADLINE's names (the tuning runs' shipped method) titles
    the sweep's difference column with that method, not with HEADLINE's guess (None)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "convergence-small-tuning.json"
    out = json.loads(path.read_text())
    method = out["dilocox_method"]
    assert len(out["sweep_outer"]) > 1
    heads = [line for line in render(out).splitlines() if line.startswith("| outer lr | momentum |")]
    assert heads[0].endswith(f"| {method} - diloco |")
