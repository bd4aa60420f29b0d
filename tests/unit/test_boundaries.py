"""The boundary log: an answer built from it has the bits of one built by replaying whole steps, costs a
fraction of it, and a torn or altered log never reaches a verifier."""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dilocox.inner import configure_determinism
from protocol.formats.codec import save_state
from protocol.leaf import StepLeaf, block_count
from protocol.model import init_params
from tests.fixtures.fulldisk import full_at
from tests.unit.test_engine import CFG, SPEC, _batch
from trainer.boundaries import BoundaryLog, ByteBudget, DiskHeadroom, memory_headroom
from trainer.checkpoints import EpochDir
from trainer.engine import LocalEngine
from trainer.shard_response import challenge_file
from veriloco.argtypes import gibibytes

STEPS, EVERY = 8, 4  # checkpoints at 0, 4, 8; segment 2, so segments 2..4 and 6..8 start past a checkpoint
PICKS = [1, 0]  # the groups opened at the segment's two steps (SPEC has 2)


def _epoch(root: Path, keep: bool = True) -> tuple[LocalEngine, EpochDir, dict[int, StepLeaf]]:
    configure_determinism(1)
    eng, d = LocalEngine(SPEC, every=EVERY, keep_boundaries=keep), EpochDir(root, 0)
    leaves = {0: eng.begin(d, STEPS, init_params(CFG, 0), None)}
    for k in range(STEPS):
        leaves[k + 1] = eng.step(d, k, _batch(k))[1]
    return eng, d, leaves


def _file(eng: LocalEngine, d: EpochDir, start: int, b: int, leaves: dict[int, StepLeaf]) -> bytes:
    return save_state(challenge_file(eng, d, start, start + 2, b, PICKS, _batch, leaves, SPEC)[0])


def test_an_answer_from_the_log_has_the_bits_of_whole_step_replay(tmp_path: Path) -> None:
    eng, d, _ = _epoch(tmp_path)
    assert sorted(p.name for p in (d.path / "bounds").iterdir()) == [f"step-{k:06d}.safetensors" for k in range(STEPS)]
    for start in (2, 4, 6):
        for b in (0, 3, block_count(CFG) - 1):  # embeddings (no input), a middle half, the head (no output gradient)
            shard, opened = eng.audit_block(d, start, start + 2, b, PICKS, _batch)
            full_shard, full_opened = eng.audit_block(d, start, start + 2, b, PICKS, _batch, logged=False)
            assert save_state(shard) == save_state(full_shard)
            for o, f in zip(opened, full_opened, strict=True):
                assert o.groups == f.groups
                for mine, theirs in ((o.inp, f.inp), (o.g_out, f.g_out)):
                    assert mine is theirs is None or (mine is not None and theirs is not None and torch.equal(mine, theirs))
                for sums, full in ((o.before, f.before), (o.total, f.total)):
                    assert sums is full is None or (sums is not None and full is not None and save_state(sums) == save_state(full))


def test_the_log_replays_one_block_where_whole_steps_would_be_replayed(tmp_path: Path) -> None:
    eng, d, _ = _epoch(tmp_path)

    def cpu(logged: bool) -> float:
        t = time.process_time()
        for _ in range(3):
            eng.audit_block(d, 6, 8, 3, PICKS, _batch, logged=logged)
        return time.process_time() - t

    assert cpu(True) < cpu(False)


def test_an_altered_or_missing_log_falls_back_to_whole_steps(tmp_path: Path) -> None:
    eng, d, leaves = _epoch(tmp_path)
    honest = {b: _file(eng, d, 6, b, leaves) for b in (2, 5)}
    log = BoundaryLog(d.path)
    step = d.path / "bounds" / "step-000006.safetensors"
    tensors = load_file(step)
    tensors["act/1"] = tensors["act/1"] + 1.0  # block 2's input at step 6
    save_file(tensors, step)
    assert eng.log_error is None
    assert _file(eng, d, 6, 2, leaves) == honest[2]
    assert eng.log_error is not None and "segment 6..8 of block 2" in eng.log_error  # said, for the node to warn
    eng.log_error = None
    (d.path / "bounds" / "step-000005.safetensors").write_bytes(b"torn")  # inside block 5's replay to the segment
    assert _file(eng, d, 6, 5, leaves) == honest[5]
    assert eng.log_error is not None and "unreadable" in eng.log_error
    (d.path / "bounds" / "step-000007.safetensors").unlink()
    assert not log.has(range(4, 8)) and _file(eng, d, 6, 5, leaves) == honest[5]


def test_a_trainer_without_the_log_keeps_no_boundaries_and_answers_alike(tmp_path: Path) -> None:
    eng, d, leaves = _epoch(tmp_path / "a")
    bare, d2, leaves2 = _epoch(tmp_path / "b", keep=False)
    assert leaves == leaves2 and not (d2.path / "bounds").exists()
    assert _file(bare, d2, 6, 4, leaves2) == _file(eng, d, 6, 4, leaves)
    eng.forget_boundaries(d)
    assert not (d.path / "bounds").exists() and _file(eng, d, 6, 4, leaves) == _file(bare, d2, 6, 4, leaves2)


def test_a_log_write_that_fails_costs_the_log_not_the_step(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    configure_determinism(1)
    eng, d = LocalEngine(SPEC, every=EVERY), EpochDir(tmp_path, 0)
    ref, d_ref = LocalEngine(SPEC, every=EVERY, keep_boundaries=False), EpochDir(tmp_path / "ref", 0)
    leaves = {0: eng.begin(d, 4, init_params(CFG, 0), None)}
    ref.begin(d_ref, 4, init_params(CFG, 0), None)

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    for k in range(4):
        if k == 2:
            monkeypatch.setattr("trainer.boundaries.write_file", full)
        leaves[k + 1] = eng.step(d, k, _batch(k))[1]
        assert leaves[k + 1] == ref.step(d_ref, k, _batch(k))[1]
    assert eng.log_error is not None and "No space left" in eng.log_error
    assert sorted(p.name for p in (d.path / "bounds").iterdir()) == ["step-000000.safetensors", "step-000001.safetensors"]
    monkeypatch.undo()
    assert _file(eng, d, 2, 3, leaves) == _file(ref, d_ref, 2, 3, leaves)  # whole steps for the missing ones


def test_steps_within_the_memory_budget_are_kept_the_rest_written_and_answers_are_alike(tmp_path: Path) -> None:
    configure_determinism(1)
    _, d_disk, leaves = _epoch(tmp_path / "disk")
    disk = LocalEngine(SPEC, every=EVERY)
    one = sum(f.stat().st_size for f in (d_disk.path / "bounds").iterdir()) // STEPS  # a step's file: its tensors + a header
    eng, d = LocalEngine(SPEC, every=EVERY, log_ram_bytes=3 * one), EpochDir(tmp_path / "ram", 0)
    eng.begin(d, STEPS, init_params(CFG, 0), None)
    for k in range(STEPS):
        eng.step(d, k, _batch(k))
    ram, on_disk = eng.boundary_log_bytes(d)
    assert 0 < ram <= 3 * one and eng.log_budget.used == ram
    assert sorted(p.name for p in (d.path / "bounds").iterdir()) == [f"step-{k:06d}.safetensors" for k in range(3, STEPS)]
    assert on_disk == sum(f.stat().st_size for f in (d.path / "bounds").iterdir())
    for start, b in ((0, 4), (2, 1), (6, 3)):  # from memory, across memory and disk, from disk
        assert _file(eng, d, start, b, leaves) == _file(disk, d_disk, start, b, leaves)
        assert eng.log_error is None  # built from the log, not by the whole-step fallback that would match too
    eng.forget_boundaries(d)
    assert eng.log_budget.used == 0 and eng.boundary_log_bytes(d) == (0, 0)


def test_the_memory_budget_flag_takes_gib_and_refuses_nonsense() -> None:
    assert gibibytes("0.5") == 2**29 and gibibytes("0") == 0
    for bad in ("-1", "lots", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="GiB"):
            gibibytes(bad)


def test_steps_over_both_budgets_are_not_logged_and_their_answers_replay_whole_steps(tmp_path: Path) -> None:
    """At batches where a step's boundaries outgrow memory and disk (80 GB per step for a 124M model at
    0.5M tokens), the log keeps what fits and skips the rest instead of filling the disk that
    checkpoints need; answers over skipped steps come from whole-step replay and are the same bytes."""
    configure_determinism(1)
    _, d_disk, leaves = _epoch(tmp_path / "disk")
    disk = LocalEngine(SPEC, every=EVERY)
    one = sum(f.stat().st_size for f in (d_disk.path / "bounds").iterdir()) // STEPS
    eng = LocalEngine(SPEC, every=EVERY, log_ram_bytes=2 * one, log_disk_bytes=3 * one)
    d = EpochDir(tmp_path / "budget", 0)
    eng.begin(d, STEPS, init_params(CFG, 0), None)
    for k in range(STEPS):
        eng.step(d, k, _batch(k))
    ram, on_disk = eng.boundary_log_bytes(d)
    assert 0 < ram <= 2 * one and 0 < on_disk and eng.log_disk.used <= 3 * one
    kept = {int(p.stem.split("-")[1]) for p in (d.path / "bounds").iterdir()}
    assert kept == {2, 3, 4} and eng.unlogged_steps(d) == STEPS - 5  # 2 in memory, 3 on disk, the rest skipped
    for start, b in ((0, 4), (2, 1), (6, 3)):  # memory, disk, skipped: the same file as from a whole log
        assert _file(eng, d, start, b, leaves) == _file(disk, d_disk, start, b, leaves)
    eng.forget_boundaries(d)
    assert eng.log_budget.used == 0 and eng.log_disk.used == 0 and eng.unlogged_steps(d) == 0


def test_checkpoints_are_sparse_where_the_log_holds_the_steps_and_dense_where_it_does_not(tmp_path: Path) -> None:
    """From a logged stretch an answer advances one block from its checkpoint, so it may lie far back;
    across steps the log left out it replays whole steps, so checkpoints stay every ``every`` there.
    The answers are the bits of a trainer that checkpoints every ``every`` steps and logs everything."""
    configure_determinism(1)
    steps = 12
    dense, d_dense = LocalEngine(SPEC, every=2), EpochDir(tmp_path / "dense", 0)
    leaves = {0: dense.begin(d_dense, steps, init_params(CFG, 0), None)}
    for k in range(steps):
        leaves[k + 1] = dense.step(d_dense, k, _batch(k))[1]
    one = sum(f.stat().st_size for f in (d_dense.path / "bounds").iterdir()) // steps
    runs = {}
    for name, disk in (("whole", None), ("short", 5 * one)):  # the whole epoch logged; steps 0..4 only
        eng, d = LocalEngine(SPEC, every=2, every_logged=8, log_disk_bytes=disk), EpochDir(tmp_path / name, 0)
        eng.begin(d, steps, init_params(CFG, 0), None)
        at = []
        for k in range(steps):
            eng.step(d, k, _batch(k))
            at += [k + 1] if eng.checkpoints.last == k + 1 else []
        assert at == d.checkpoints()[1:]  # what the node records its leaves at, for a restart
        runs[name] = eng, d
    assert runs["whole"][1].checkpoints() == [0, 8, 12]
    assert runs["short"][1].checkpoints() == [0, 6, 8, 10, 12]  # 6: the first every-2 step past the unlogged step 5
    for name, (eng, d) in runs.items():
        for start, b in ((2, 4), (4, 1), (8, 3), (10, 5)):  # logged from far back; across step 5; either side of 8
            assert _file(eng, d, start, b, leaves) == _file(dense, d_dense, start, b, leaves), (name, start)
        assert eng.log_error is None


def test_a_checkpoint_that_cannot_be_written_costs_replay_distance_not_the_epoch(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A full disk mid-epoch (the previous epoch's log is freed only once its audit is answered) used
    to end the trainer at its next checkpoint; now the engine says so and answers from the one before.
    The epoch's last state is still required: its final check reads it."""
    configure_determinism(1)
    _, d_ref, leaves = _epoch(tmp_path / "ref", keep=False)
    ref = LocalEngine(SPEC, every=EVERY, keep_boundaries=False)
    eng, d = LocalEngine(SPEC, every=EVERY, keep_boundaries=False), EpochDir(tmp_path / "full", 0)
    eng.begin(d, STEPS, init_params(CFG, 0), None)
    monkeypatch.setattr(EpochDir, "save", full_at(4))
    for k in range(STEPS):
        assert eng.step(d, k, _batch(k))[1] == leaves[k + 1]
        assert eng.checkpoints.last == (0 if k + 1 < STEPS else STEPS)  # 4 was not kept: a restart resumes at 0
    assert d.checkpoints() == [0, STEPS] and eng.checkpoints.error is not None and "step 4" in eng.checkpoints.error
    assert _file(eng, d, 4, 3, leaves) == _file(ref, d_ref, 4, 3, leaves)  # whole steps from 0
    monkeypatch.setattr(EpochDir, "save", full_at(STEPS))
    late, d_late = LocalEngine(SPEC, every=EVERY, keep_boundaries=False), EpochDir(tmp_path / "late", 0)
    late.begin(d_late, STEPS, init_params(CFG, 0), None)
    for k in range(STEPS - 1):
        late.step(d_late, k, _batch(k))
    with pytest.raises(OSError, match="No space"):
        late.step(d_late, STEPS - 1, _batch(STEPS - 1))


def test_trainers_sharing_a_machine_stop_at_its_headroom_not_at_their_budgets(tmp_path: Path) -> None:
    """Each node's default budget is a share of the machine (a quarter of its memory), so trainers
    started side by side could together keep more than it has. The machine's headroom, read at each
    step, bounds them together: here each budget alone holds 4 steps, the machine 5 for both; what
    does not fit goes to disk and the answers are the same bytes."""
    configure_determinism(1)
    _, d_disk, leaves = _epoch(tmp_path / "disk")
    disk = LocalEngine(SPEC, every=EVERY)
    one = sum(f.stat().st_size for f in (d_disk.path / "bounds").iterdir()) // STEPS
    engines: list[LocalEngine] = []

    def headroom() -> int:  # a machine with room for 5 steps of logs, less what both logs keep
        return 5 * one - sum(e.log_budget.used for e in engines)

    engines += [LocalEngine(SPEC, every=EVERY, log_ram_bytes=4 * one, log_headroom=(headroom, None)) for _ in range(2)]
    dirs = [EpochDir(tmp_path / f"t{i}", 0) for i in range(2)]
    for e, d in zip(engines, dirs):
        e.begin(d, STEPS, init_params(CFG, 0), None)
    for k in range(STEPS):
        for e, d in zip(engines, dirs):
            e.step(d, k, _batch(k))
    ram = [e.boundary_log_bytes(d)[0] for e, d in zip(engines, dirs)]
    assert all(r > 0 for r in ram) and sum(ram) <= 5 * one < 8 * one
    for e, d in zip(engines, dirs):
        assert e.unlogged_steps(d) == 0  # the rest is on disk
        for start, b in ((0, 4), (6, 3)):
            assert _file(e, d, start, b, leaves) == _file(disk, d_disk, start, b, leaves)


def test_the_machine_headroom_is_read_from_this_machine(tmp_path: Path) -> None:
    mem = memory_headroom()
    assert mem is None or mem < os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    use = shutil.disk_usage(tmp_path)
    spare = DiskHeadroom(tmp_path)()
    assert spare is not None and abs(spare - (use.free - use.total // 10)) < 2**30
    assert DiskHeadroom(tmp_path / "gone" / "deeper")() is None  # unreadable: no check, not a crash
    full = ByteBudget(None, lambda: -5)  # a machine already past its reserve: nothing fits
    assert full.room() == 0 and not full.fits(1) and ByteBudget(10, lambda: None).fits(10)


def test_dropping_answered_steps_keeps_what_later_answers_need_and_returns_the_budget(tmp_path: Path) -> None:
    """A windowed trainer's retention (engine.drop_before): checkpoints between the first and the latest
    at or before k go, and the logged steps before that checkpoint, memory and disk alike; what answers
    from k on read stays, so their files are the bits they were."""
    _, d_ref, leaves = _epoch(tmp_path / "ref")
    ref = LocalEngine(SPEC, every=EVERY)
    one = sum(f.stat().st_size for f in (d_ref.path / "bounds").iterdir()) // STEPS
    eng, d = LocalEngine(SPEC, every=EVERY, log_ram_bytes=3 * one), EpochDir(tmp_path / "win", 0)
    eng.begin(d, STEPS, init_params(CFG, 0), None)
    for k in range(STEPS):
        eng.step(d, k, _batch(k))
    before = eng.boundary_log_bytes(d)
    freed = eng.drop_before(d, 5)  # the latest checkpoint at or before 5 is 4
    assert d.checkpoints() == [0, 4, 8] and freed > 0  # 0 (start and final checks) and 8 (the last) stay
    assert sorted(p.name for p in (d.path / "bounds").iterdir()) == [f"step-{k:06d}.safetensors" for k in range(4, STEPS)]
    assert eng.boundary_log_bytes(d) == (0, before[1] - one) and eng.log_budget.used == 0
    for start, b in ((4, 2), (6, 3)):
        assert _file(eng, d, start, b, leaves) == _file(ref, d_ref, start, b, leaves) and eng.log_error is None
    assert eng.drop_before(d, 8) > 0 and d.checkpoints() == [0, 8] and not list((d.path / "bounds").iterdir())
    assert d.held_bytes() == (d.path / "state-000008.safetensors").stat().st_size
