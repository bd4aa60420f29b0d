"""benchmarks/headline.py: each plan names the settings its committed results file records, and the runner
resumes, merges and reports failures as it says."""

import dataclasses
import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from benchmarks.convergence import PRESETS_BENCH, parse_outer
from benchmarks.headline import (
    ADAPTIVE,
    CONVERGENCE,
    HEADLINES,
    SHIPPED,
    TUNING_LRS,
    TUNING_OUTER,
    Headline,
    Piece,
    flag_values,
    per_run,
    result_flags,
    run,
    with_flag,
)
from benchmarks.headline import main as headline_main
from veriloco.simulate import methods, resolve_method

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
# what a run's flags mean apart from the method and seed: compared as values (5e-4 == 0.0005)
IDENTITY = ("--seeds", "--methods")


def committed(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _value(v: str) -> object:
    try:
        return float(v)
    except ValueError:
        return v


def settings(args: Sequence[str]) -> frozenset[tuple[str, object]]:
    return frozenset((k, _value(v)) for k, v in result_flags(args).items() if k not in IDENTITY)


def joined_name(method: str, rank: int, base_rank: int) -> str:
    """The method's name once merged (benchmarks/convergence.py ``_method_name``): a compressed method
    run at another rank than the baseline's carries it."""
    m = resolve_method(method, methods())
    return f"{method}_r{rank}" if rank != base_rank and m is not None and m.compression is not None else method


def runs(commands: Sequence[Sequence[str]], base_rank: int, preset_rank: int) -> dict[tuple[int, str], set[Any]]:
    """(seed, merged method name) -> the settings of every command that ran it."""
    out: dict[tuple[int, str], set[Any]] = {}
    for args in commands:
        f = result_flags(args)
        rank = int(f.get("--rank", preset_rank))
        for seed in (int(x) for x in f["--seeds"].split(",")):
            for m in f["--methods"].split(","):
                out.setdefault((seed, joined_name(m, rank, base_rank)), set()).add(settings(args))
    return out


def effective(args: Sequence[str]) -> dict[str, Any]:
    """A run's settings as its results file's ``config`` records them (flag, else the preset's or the default)."""
    f = result_flags(args)
    p = PRESETS_BENCH[f["--preset"]]
    return {
        "batch_size": int(f.get("--batch-size", p.batch_size)),
        "inner_lr": float(f.get("--inner-lr", p.lr)),
        "rank_initial": int(f.get("--rank", p.rank)),
        "steps_per_worker": int(f.get("--steps", p.steps)),
        "h_initial": int(f.get("--h", p.h)),
        "trainers": int(f.get("--trainers", 4)),
        "eval_rows": int(f.get("--eval-rows", 512)),
        "outer": (float(f.get("--outer-lr", 1.0)), float(f.get("--outer-momentum", 0.0))),
        "merge_step": int(f.get("--merge-step", 1)),
    }


def recorded(cfg: dict[str, Any]) -> dict[str, Any]:
    return {
        "batch_size": cfg["batch_size"], "inner_lr": cfg["inner"]["lr"], "rank_initial": cfg["rank_initial"],
        "steps_per_worker": cfg["steps_per_worker"], "h_initial": cfg["h_initial"], "trainers": cfg["trainers"],
        "eval_rows": cfg["eval_rows"], "outer": (cfg["outer"]["lr"], cfg["outer"]["momentum"]),
        "merge_step": cfg.get("merge_step", 1),
    }


def plan_args(h: Headline) -> list[list[str]]:
    return [p.args("x")[1:] for p in h.pieces]


def config_mismatches(h: Headline, data: dict[str, Any]) -> list[str]:
    """What the plan's baseline pieces (those with AllReduce) would record differently in ``config``,
    and whether every seed's merged methods are the committed ones."""
    bad = []
    base = [p for p in h.pieces if "allreduce" in p.methods]
    for p in base:
        args = p.args("x")[1:]
        if result_flags(args)["--preset"] != data["preset"]:
            bad.append(f"{p.name}: preset {result_flags(args)['--preset']} != {data['preset']}")
        got, want = effective(args), recorded(data["config"])
        bad += [f"{p.name}: {k} {got[k]} != {want[k]}" for k in want if got[k] != want[k]]
    seeds = {s for p in h.pieces for s in p.seeds}
    if sorted(seeds) != data["seeds"]:
        bad.append(f"seeds {sorted(seeds)} != {data['seeds']}")
    for s in data["per_seed"]:
        ranks = [effective(p.args("x")[1:])["rank_initial"] for p in base if s["seed"] in p.seeds]
        if len(ranks) != 1:
            bad.append(f"seed {s['seed']}: {len(ranks)} baseline pieces")
            continue
        got_m = [joined_name(m, effective(p.args("x")[1:])["rank_initial"], ranks[0])
                 for p in h.pieces if s["seed"] in p.seeds for m in p.methods]
        if got_m != list(s["methods"]):
            bad.append(f"seed {s['seed']}: methods {got_m} != {list(s['methods'])}")
    return bad


def small_mismatches(h: Headline) -> list[str]:
    """Every way the plan departs from committed convergence-small.json: its config, the recorded
    command that ran each (seed, method), its merged_from inputs' roles and its DiLoCoX."""
    data = committed("convergence-small")
    bad = config_mismatches(h, data)
    base_rank, preset_rank = data["config"]["rank_initial"], PRESETS_BENCH["small"].rank
    rec = runs([shlex.split(c)[1:] for c in data["command"]], base_rank, preset_rank)
    ours = runs(plan_args(h), base_rank, preset_rank)
    final = {(s["seed"], m) for s in data["per_seed"] for m in s["methods"]}
    if set(ours) != final:
        bad.append(f"runs {sorted(set(ours) ^ final)} differ from the committed methods per seed")
    for key in sorted(final & set(ours)):
        if len(rec[key]) != 1:
            bad.append(f"{key}: the committed commands ran it at {len(rec[key])} settings")
        elif ours[key] != rec[key]:
            diff = sorted(next(iter(ours[key])) ^ next(iter(rec[key])))
            bad.append(f"{key}: settings differ: {diff}")
    # merged_from: which input gave each (seed, method), at which rank, and with the baseline or joined to it
    roles: dict[tuple[int, str], tuple[int, bool]] = {}
    for path in data["merged_from"]:
        part = json.loads((ROOT / path).read_text())
        for s in part["per_seed"]:
            for m in s["methods"]:
                name = joined_name(m, part["config"]["rank_initial"], base_rank)
                roles.setdefault((s["seed"], name), (part["config"]["rank_initial"], "unpaired" not in part))
    for p in h.pieces:
        rank = effective(p.args("x")[1:])["rank_initial"]
        for s in p.seeds:
            for m in p.methods:
                key = (s, joined_name(m, rank, base_rank))
                if key not in roles:
                    bad.append(f"{key}: no merged_from input has it")
                    continue
                r, paired = roles[key]
                if r != rank:
                    bad.append(f"{key}: rank {rank}, the committed input's {r}")
                if not paired and "allreduce" in p.methods:  # the other way is a split: a method run on its own
                    bad.append(f"{key}: joined to the baseline in the committed merge, run with it here")
    firsts = {s: next(p for p in h.pieces if s in p.seeds) for s in data["seeds"]}
    bad += [f"seed {s}: its first piece {p.name} has no AllReduce (the merge pairs against it)"
            for s, p in firsts.items() if "allreduce" not in p.methods]
    if h.dilocox != data.get("dilocox_choice"):
        bad.append(f"--dilocox {h.dilocox} != {data.get('dilocox_choice')}")
    if h.keep and set(h.keep) | {"allreduce"} != set(data["methods"]):
        bad.append(f"--keep {h.keep} drops committed methods")
    return bad


def test_small_plan_is_the_committed_headline() -> None:
    assert small_mismatches(HEADLINES["convergence-small"]) == []


def _rerank(h: Headline, old: str, new: str) -> Headline:
    pieces = tuple(dataclasses.replace(p, flags=with_flag(p.flags, "--rank", new))
                   if dict(zip(p.flags, p.flags[1:])).get("--rank") == old else p for p in h.pieces)
    return dataclasses.replace(h, pieces=pieces)


def _reflag(h: Headline, flag: str, value: str, only: str = "") -> Headline:
    return dataclasses.replace(h, pieces=tuple(
        dataclasses.replace(p, flags=with_flag(p.flags, flag, value)) if only in ("", p.name) else p
        for p in h.pieces))


@pytest.mark.parametrize("change, says", [
    pytest.param(lambda h: _rerank(h, "128", "96"), "fixed_rank_merge_b1_r96", id="shipped-rank"),
    pytest.param(lambda h: _rerank(h, "64", "32"), "--rank", id="baseline-rank"),
    pytest.param(lambda h: _reflag(h, "--batch-size", "64", "s1-diloco"), "(1, 'diloco'): settings differ",
                 id="one-run-batch-size"),
    pytest.param(lambda h: _reflag(h, "--eval-rows", "256"), "eval_rows 256", id="eval-rows"),
    pytest.param(lambda h: dataclasses.replace(h, pieces=h.pieces[:-1]),
                 "(2, 'fixed_rank_merge_b1_inparams_trimmed_r128')", id="missing-run"),
    pytest.param(lambda h: dataclasses.replace(h, dilocox="fixed_rank_merge_b1"), "--dilocox", id="dilocox"),
    pytest.param(lambda h: dataclasses.replace(h, pieces=h.pieces[1:]),
                 "seed 0: its first piece s0-diloco has no AllReduce", id="baseline-not-first"),
])  # fmt: skip
def test_a_plan_off_the_committed_file_fails(change: Any, says: str) -> None:
    bad = small_mismatches(change(HEADLINES["convergence-small"]))
    assert any(says in b for b in bad), bad


def test_tiny_plan_is_the_committed_headline() -> None:
    """convergence-tiny.json's recorded command lacks the outer 0.7 / 0.5 its config holds (it was run
    when they were the default), so the plan is checked against the config and the sweep it has."""
    h, data = HEADLINES["convergence-tiny"], committed("convergence-tiny")
    assert config_mismatches(h, data) == []
    sweeps = {tuple(parse_outer(result_flags(a)["--sweep-outer"])) for a in plan_args(h)}
    assert sweeps == {tuple(parse_outer(",".join(data["per_seed"][0]["sweep"])))}
    assert h.dilocox is None and data.get("dilocox_method") is None and not h.keep
    wrong = dataclasses.replace(h, pieces=tuple(dataclasses.replace(p, flags=with_flag(p.flags, "--outer-lr", "1.0"))
                                                for p in h.pieces))
    assert any("outer (1.0, 0.5) != (0.7, 0.5)" in b for b in config_mismatches(wrong, data))


def test_dry_run_prints_one_command_per_piece_and_the_merge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h = HEADLINES["convergence-small"]
    assert headline_main(["convergence-small.json", "--dry-run", "--work", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(h.pieces) + 1 and lines[0].startswith("# convergence-small: 21 pieces (0 done)")
    assert all(" benchmarks/convergence.py --preset small " in x and x.endswith(f"# piece {i}: to run")
               for i, x in enumerate(lines[1:-1], 1))
    assert " --merge " in lines[-1] and "--dilocox fixed_rank_merge_b1_inparams_trimmed_r128" in lines[-1]
    assert headline_main(["convergence-small", "--dry-run", "--only", "2", "--work", str(tmp_path)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1 + 7 + 1


def test_the_held_out_plan_confirms_the_shipped_method_on_seeds_and_rows_nobody_chose_on() -> None:
    """issue 33: convergence-small-heldout runs the headline's shipped method, AllReduce and DiLoCo at
    the headline's settings, on seeds disjoint from every selection run and on the held-out eval rows."""
    small, held = HEADLINES["convergence-small"], HEADLINES["convergence-small-heldout"]
    assert held.dilocox == small.dilocox
    chosen = {s for p in small.pieces for s in p.seeds}
    assert chosen.isdisjoint(s for p in held.pieces for s in p.seeds)
    for p in held.pieces:
        assert flag_values(p.flags)["--eval-split"] == "heldout"
        base = {k: v for k, v in flag_values(p.flags).items() if k not in ("--eval-split", "--rank")}
        assert base == {k: v for k, v in flag_values(small.pieces[0].flags).items() if k != "--rank"}
    methods_run = {joined_name(p.methods[0], int(flag_values(p.flags)["--rank"]), 64) for p in held.pieces}
    assert methods_run == {"allreduce", "diloco", small.dilocox}
    assert held.pieces[0].methods == ("allreduce",)  # each seed pairs against its own AllReduce


def test_the_held_out_plan_is_the_committed_held_out_file() -> None:
    """convergence-small-heldout.json is what its one command makes: the plan's config and seeds, merged
    from exactly the plan's pieces in order, its DiLoCoX, and the selection seeds reported beside it."""
    h, data = HEADLINES["convergence-small-heldout"], committed("convergence-small-heldout")
    assert config_mismatches(h, data) == []
    work = f".veriloco/headline/{h.name}"
    assert data["merged_from"] == [f"{work}/{p.name}.json" for p in h.pieces]
    assert data["dilocox_method"] == h.dilocox and data["config"]["eval_split"] == "heldout"
    assert data["held_out_seeds"] == [5] and set(data["chosen_on_before"]) == {"3", "4"}  # 3, 4 chose the merge rule
    assert data["selection_seeds"] == committed("convergence-small")["seeds"] == [0, 1, 2]
    assert data["selection"]["file"] == h.selection


def test_the_baselines_plan_adds_the_field_s_compressors_to_the_held_out_runs() -> None:
    """issue 33: convergence-small-baselines trains SparseLoCo- and DeMo-style top-k at the shipped
    payload's bytes on the held-out seeds and rows, and every other piece is one of the held-out plan's
    (the same name and flags, so it is copied rather than run twice)."""
    held, base = HEADLINES["convergence-small-heldout"], HEADLINES["convergence-small-baselines"]
    shared = {p.name: p for p in held.pieces}
    new = [p for p in base.pieces if p.name not in shared]
    assert all(shared[p.name] == p for p in base.pieces if p.name in shared) and len(shared) == len(held.pieces)
    assert {p.methods[0] for p in new} == {"sparseloco_merge_trimmed", "demo_merge_trimmed"}
    for p in new:
        assert resolve_method(p.methods[0], methods()) is not None  # a method the simulation knows
        f = flag_values(p.flags)
        assert f["--rank"] == "128" and f["--eval-split"] == "heldout" and p.seeds[0] in (3, 4, 5)
    assert base.dilocox == held.dilocox


def test_a_piece_another_plan_finished_is_copied_not_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[list[str]] = []
    assert run(TOY, tmp_path / "toy", tmp_path / "toy.json", range(4), 1, str, fake(calls)) == 0
    more = Headline("more", per_run((0,), [("allreduce", ("--preset", "ci")), ("diloco", ("--preset", "ci")),
                                           ("dilocox", ("--preset", "ci"))]), dilocox="dilocox")
    (tmp_path / "toy" / "s0-diloco.json").write_text("{trunc")  # unfinished there: not copied
    calls.clear()
    assert run(more, tmp_path / "more", tmp_path / "more.json", range(3), 1, str, fake(calls)) == 0
    ran = [c[c.index("--methods") + 1] for c in calls if "--methods" in c]
    assert ran == ["diloco", "dilocox"]  # allreduce copied from toy's folder
    assert "piece 1/3 (s0-allreduce): done under toy, copied" in capsys.readouterr().err
    assert json.loads((tmp_path / "more" / "s0-allreduce.json").read_text())["per_seed"][0]["seed"] == 0
    assert (tmp_path / "more" / "s0-allreduce.log").read_text() == "ok\n"


def test_unknown_headline_and_pieces_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        headline_main(["convergence-huge", "--dry-run"])
    assert e.value.code == 2 and "known: convergence-small, convergence-small-heldout" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        headline_main(["convergence-small", "--piece", "22", "--dry-run"])
    assert "pieces 1 to 21" in capsys.readouterr().err


def fake(calls: list[list[str]], fail: str = "") -> Any:
    """A launcher that writes what convergence.py would (a run's seeds, methods and command, or the merge)."""

    def launch(args: Sequence[str], log: Path) -> int:
        calls.append(list(args))
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("progress\nboom\n" if fail and fail in args else "ok\n")
        if fail and fail in args:
            return 3
        f = flag_values(args)
        out = ROOT / f["--out"] if not Path(f["--out"]).is_absolute() else Path(f["--out"])
        seeds = [int(x) for x in f.get("--seeds", "0").split(",")]
        per_seed = [{"seed": s, "methods": {m: {} for m in f.get("--methods", "").split(",")}} for s in seeds]
        out.write_text(json.dumps({"benchmark": "convergence", "command": " ".join(args), "per_seed": per_seed}))
        return 0

    return launch


TOY = Headline("toy", per_run((0, 1), [("allreduce", ("--preset", "ci")), ("diloco", ("--preset", "ci"))]),
               dilocox="diloco")


def test_pieces_resume_and_the_merge_waits_for_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[list[str]] = []
    work, out = tmp_path / "w", tmp_path / "toy.json"
    assert run(TOY, work, out, [0, 1], 1, str, fake(calls)) == 0  # seed 0 only: no merge yet
    assert [c[c.index("--methods") + 1] for c in calls] == ["allreduce", "diloco"] and not out.exists()
    assert "2 of 4 pieces still to run (3, 4); the merge waits" in capsys.readouterr().err
    (work / "s1-allreduce.json").write_text("{trunc")  # a piece killed while writing reruns
    calls.clear()
    assert run(TOY, work, out, range(4), 2, str, fake(calls)) == 0
    assert sorted(c[c.index("--out") + 1].rsplit("/", 1)[-1] for c in calls[:-1]) == ["s1-allreduce.json",
                                                                                       "s1-diloco.json"]
    assert calls[-1][:2] == [CONVERGENCE, "--merge"] and calls[-1][-4:] == ["--dilocox", "diloco", "--out", str(out.resolve())]
    assert [Path(x).name for x in calls[-1][2:6]] == ["s0-allreduce.json", "s0-diloco.json", "s1-allreduce.json",
                                                      "s1-diloco.json"]
    err = capsys.readouterr().err
    assert "piece 1/4 (s0-allreduce): done, skipped" in err and f"wrote {out.resolve()}" in err
    stale = json.loads((work / "s0-diloco.json").read_text())  # another plan's run is not this piece
    stale["command"] = stale["command"].replace("--preset ci", "--preset tiny")
    (work / "s0-diloco.json").write_text(json.dumps(stale))
    calls.clear()
    assert run(TOY, work, out, range(4), 1, str, fake(calls)) == 0
    assert len(calls) == 2 and "s0-diloco.json" in calls[0][-1]


def test_a_failed_piece_is_named_with_its_rerun_and_stops_new_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[list[str]] = []
    rc = run(TOY, tmp_path, tmp_path / "toy.json", range(4), 1, lambda i: f"RERUN --piece {i}",
             fake(calls, fail="diloco"))
    assert rc == 1 and len(calls) == 2 and not (tmp_path / "toy.json").exists()
    err = capsys.readouterr().err
    assert "piece 2/4 (s0-diloco) FAILED (exit 3)" in err and "boom" in err
    assert "rerun piece 2 alone: RERUN --piece 2" in err and "not started after the failure: pieces 3, 4" in err
    assert (tmp_path / "s0-allreduce.json").exists()  # kept: the rerun skips it


@pytest.mark.slow
def test_a_toy_plan_runs_end_to_end_and_joins_its_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real convergence.py (ci preset, 4 steps): per-run pieces of two seeds, one at another rank,
    merge into the file a single paired run of them all would name."""
    ci = ("--preset", "ci", "--eval-rows", "8", "--steps", "4", "--h", "2", "--rank", "8", "--merge-step", "1")
    h = Headline("toy", per_run((3, 4), [("allreduce", ci), ("fixed_rank_merge_b1", ci),
                                         ("fixed_rank_merge_b1", with_flag(ci, "--rank", "16"))]),
                 dilocox="fixed_rank_merge_b1_r16")
    out = tmp_path / "toy.json"
    assert run(h, tmp_path / "w", out, range(len(h.pieces)), 2, str) == 0
    r = json.loads(out.read_text())
    assert [s["seed"] for s in r["per_seed"]] == [3, 4] and r["dilocox_method"] == "fixed_rank_merge_b1_r16"
    assert all(list(s["methods"]) == ["allreduce", "fixed_rank_merge_b1", "fixed_rank_merge_b1_r16"]
               for s in r["per_seed"])
    assert r["config"]["rank_initial"] == 8 and len(r["merged_from"]) == 6
    calls: list[list[str]] = []
    assert run(h, tmp_path / "w", out, range(len(h.pieces)), 1, str, fake(calls)) == 0
    assert [c[1] for c in calls] == ["--merge"]  # every piece done: only the merge reruns


def test_a_plan_joins_its_pieces_onto_a_committed_file(tmp_path: Path) -> None:
    """A plan with a ``base`` merges its pieces onto that merged file: the base's runs are kept to the
    digit and paired against, none of them reruns, and the new method joins at its rank."""
    import benchmarks.headline as hb

    ci = ("--preset", "ci", "--eval-rows", "8", "--steps", "4", "--h", "2", "--rank", "8", "--merge-step", "1")
    first = Headline("first", per_run((3,), [("allreduce", ci), ("fixed_rank_merge_b1", ci)]))
    base = tmp_path / "first.json"
    assert run(first, tmp_path / "w1", base, range(2), 1, str) == 0
    h = Headline("more", per_run((3,), [("dilocox_merge_b1", with_flag(ci, "--rank", "16"))]), base=str(base))
    out = tmp_path / "more.json"
    calls: list[list[str]] = []

    def spy(args: Sequence[str], log: Path) -> int:
        calls.append(list(args))
        return hb._launch(args, log)

    assert run(h, tmp_path / "w2", out, range(1), 1, str, spy) == 0
    assert [c[1:3] for c in calls[:-1]] == [["--preset", "ci"]] and calls[-1][1:3] == ["--merge", str(base)]
    r, b = json.loads(out.read_text()), json.loads(base.read_text())
    assert list(r["per_seed"][0]["methods"]) == ["allreduce", "fixed_rank_merge_b1", "dilocox_merge_b1_r16"]
    for m in ("allreduce", "fixed_rank_merge_b1"):
        assert r["per_seed"][0]["methods"][m]["final_eval_loss"] == b["per_seed"][0]["methods"][m]["final_eval_loss"]
    assert r["merged_from"][0] == str(base) and len(r["command"]) == 3
    base.unlink()
    assert run(h, tmp_path / "w2", out, range(1), 1, str) == 1  # no base file: said, not a traceback


def test_a_plan_s_runs_at_other_inner_lrs_join_the_base_file_s_sweep(tmp_path: Path) -> None:
    """The tuning plan's shape: a method per piece at another inner lr (one at another rank) joins the
    committed file as its inner lr sweep, and each method is read at its own best lr; a local method at
    another outer lr and momentum joins its outer sweep."""
    ci = ("--preset", "ci", "--eval-rows", "8", "--steps", "4", "--h", "2", "--rank", "8", "--merge-step", "1")
    r16 = with_flag(ci, "--rank", "16")
    first = Headline("first", per_run((3,), [("allreduce", ci), ("diloco", ci), ("fixed_rank_merge_b1", r16)]))
    base = tmp_path / "first.json"
    assert run(first, tmp_path / "w1", base, range(3), 1, str) == 0
    lr = f"{PRESETS_BENCH['ci'].lr * 2:g}"
    outer = ("--outer-lr", "0.7", "--outer-momentum", "0.9")
    h = Headline("tune", tuple(Piece(f"s3-{m}", (3,), (m,), with_flag(f, "--inner-lr", lr))
                               for m, f in (("allreduce", ci), ("fixed_rank_merge_b1", r16), ("diloco", ci)))
                 + (Piece("s3-outer", (3,), ("fixed_rank_merge_b1",), (*r16, *outer)),),
                 keep=("allreduce", "fixed_rank_merge_b1_r16"), base=str(base))
    out = tmp_path / "tune.json"
    assert run(h, tmp_path / "w2", out, range(len(h.pieces)), 1, str) == 0
    r, b = json.loads(out.read_text()), json.loads(base.read_text())
    seed = r["per_seed"][0]
    assert list(seed["methods"]) == ["allreduce", "fixed_rank_merge_b1_r16"]
    assert set(seed["sweep_inner_lr"]) == {lr} and set(seed["sweep_inner_lr"][lr]) == set(seed["methods"])
    assert seed["methods"]["allreduce"]["final_eval_loss"] == b["per_seed"][0]["methods"]["allreduce"]["final_eval_loss"]
    tuned = r["sweep_inner_lr"]
    main_lr = f"{PRESETS_BENCH['ci'].lr:g}"
    assert tuned["lrs"] == sorted([main_lr, lr], key=float) and set(tuned["best_lr"]) == set(seed["methods"])
    assert list(seed["sweep"]) == ["0.7:0.9"] and list(seed["sweep"]["0.7:0.9"]) == ["fixed_rank_merge_b1_r16"]
    assert [(row["outer"], row["main"]) for row in r["sweep_outer"]] == [
        ({"lr": 1.0, "momentum": 0.0}, True), ({"lr": 0.7, "momentum": 0.9}, False)]
    assert set(r["sweep_outer"][1]["paired_gap_vs_allreduce"]) == {"allreduce", "fixed_rank_merge_b1_r16"}
    assert len(r["command"]) == len(r["machine"]) == 7 and "--outer-lr 0.7" in r["command"][-1]  # every run said


def test_the_tuning_plan_gives_every_method_the_same_lr_grid_on_the_selection_seeds() -> None:
    """Issue 33's equal tuning budget: AllReduce, DiLoCo and the shipped method each at the same inner lrs
    beside the selection file's, on its seeds, and otherwise at its settings."""
    h, sel = HEADLINES["convergence-small-tuning"], committed("convergence-small")
    grid: dict[str, set[tuple[int, float, tuple[float, float]]]] = {}
    main_lr, main_outer = sel["config"]["inner"]["lr"], recorded(sel["config"])["outer"]
    for p in h.pieces:
        f = effective(p.args("x")[1:])
        assert {k: v for k, v in f.items() if k not in ("inner_lr", "rank_initial", "outer")} == \
            {k: v for k, v in recorded(sel["config"]).items() if k not in ("inner_lr", "rank_initial", "outer")}
        assert f["rank_initial"] == (128 if p.methods[0] == SHIPPED else sel["config"]["rank_initial"])
        assert (f["inner_lr"] == main_lr) != (f["outer"] == main_outer)  # one setting moved at a time
        grid.setdefault(p.methods[0], set()).update((s, f["inner_lr"], f["outer"]) for s in p.seeds)
    lrs = {float(x) for x in TUNING_LRS}
    outer = tuple(float(x) for x in TUNING_OUTER)
    assert main_lr not in lrs and outer != main_outer and set(grid) == {"allreduce", "diloco", SHIPPED}
    for m, g in grid.items():
        want = {(s, lr, main_outer) for s in sel["seeds"] for lr in lrs}
        assert g == want | ({(s, main_lr, outer) for s in sel["seeds"]} if m != "allreduce" else set())
    assert h.base == "benchmarks/results/convergence-small.json" and set(h.keep) <= set(sel["per_seed"][0]["methods"])


def test_piece_args_are_a_convergence_command() -> None:
    p = Piece("s0", (0, 1), ("allreduce", "diloco"), ("--preset", "ci"))
    assert p.args("o.json") == [CONVERGENCE, "--preset", "ci", "--seeds", "0,1", "--methods", "allreduce,diloco",
                                "--out", "o.json"]
    assert with_flag(("--rank", "8", "--h", "2"), "--rank", "16") == ("--rank", "16", "--h", "2")


def test_the_baselines_plan_is_the_committed_baselines_file() -> None:
    """convergence-small-baselines.json is what its one command makes: the held-out plan's runs plus the
    SparseLoCo- and DeMo-style methods on seeds 3-5 and the held-out rows, merged in the plan's order."""
    h, data = HEADLINES["convergence-small-baselines"], committed("convergence-small-baselines")
    assert config_mismatches(h, data) == []
    work = f".veriloco/headline/{h.name}"
    assert data["merged_from"] == [f"{work}/{p.name}.json" for p in h.pieces]
    assert data["dilocox_method"] == h.dilocox and data["config"]["eval_split"] == "heldout"
    assert data["held_out_seeds"] == [5] and data["selection"]["file"] == h.selection
    held = committed("convergence-small-heldout")
    for method in ("allreduce", "diloco", h.dilocox):  # the shared runs are the held-out file's, to the digit
        assert [s["methods"][method]["final_eval_loss"] for s in data["per_seed"]] == \
            [s["methods"][method]["final_eval_loss"] for s in held["per_seed"]]


def test_the_adaptive_plan_is_the_committed_adaptive_file() -> None:
    """convergence-small-adaptive.json is what its one command makes: DiLoCoX's adaptive rank and H rule
    on the held-out seeds and rows, joined onto the committed baselines file, whose runs it keeps to the digit."""
    h, data = HEADLINES["convergence-small-adaptive"], committed("convergence-small-adaptive")
    work = f".veriloco/headline/{h.name}"
    assert h.base is not None and data["merged_from"] == [h.base, *(f"{work}/{p.name}.json" for p in h.pieces)]
    assert data["dilocox_method"] == h.dilocox and data["config"]["eval_split"] == "heldout"
    assert data["held_out_seeds"] == [5] and data["selection"]["file"] == h.selection
    base = committed(Path(h.base).stem)
    for s, b in zip(data["per_seed"], base["per_seed"], strict=True):
        assert list(s["methods"]) == [*b["methods"], f"{ADAPTIVE}_r128"]
        for method, rec in b["methods"].items():
            assert s["methods"][method]["final_eval_loss"] == rec["final_eval_loss"]
    for p in h.pieces:
        assert p.methods == (ADAPTIVE,) and flag_values(p.flags)["--rank"] == "128"
        assert resolve_method(ADAPTIVE, methods()).compression.adaptive  # type: ignore[union-attr]


def test_the_tuning_plan_is_the_committed_tuning_file() -> None:
    """convergence-small-tuning.json is what its one command makes: the selection file's runs of the
    three methods, to the digit, with every method's runs at the other inner lrs joined as its inner lr
    sweep (each method read at its own best lr) and the local methods' runs at the DiLoCo paper's outer
    setting as its outer sweep."""
    h, data = HEADLINES["convergence-small-tuning"], committed("convergence-small-tuning")
    work = f".veriloco/headline/{h.name}"
    assert h.base is not None and data["merged_from"] == [h.base, *(f"{work}/{p.name}.json" for p in h.pieces)]
    base = committed(Path(h.base).stem)
    assert data["dilocox_method"] == h.dilocox and data["seeds"] == base["seeds"]
    lrs = {f"{float(x):g}" for x in TUNING_LRS}
    for s, b in zip(data["per_seed"], base["per_seed"], strict=True):
        assert list(s["methods"]) == list(h.keep)
        for method in h.keep:
            assert s["methods"][method]["final_eval_loss"] == b["methods"][method]["final_eval_loss"]
        assert set(s["sweep_inner_lr"]) == lrs and all(set(v) == set(h.keep) for v in s["sweep_inner_lr"].values())
    assert set(data["sweep_inner_lr"]["best_lr"]) == set(h.keep)
    assert [row["main"] for row in data["sweep_outer"]] == [True, False]
