"""The gradient log (issue 31): past the batch where boundaries outgrow the model, a trainer keeps each
step's total gradients instead, batch-free, and its answers still have the bits of whole-step replay."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from dilocox.inner import configure_determinism
from protocol.formats.codec import save_state
from protocol.leaf import StepLeaf, block_count
from protocol.model import init_params
from tests.unit.test_engine import CFG, SPEC
from trainer.boundaries import BOUNDARIES, GRADIENTS, BoundaryLog
from trainer.checkpoints import EpochDir
from trainer.engine import LocalEngine
from trainer.shard_response import challenge_file

STEPS, EVERY = 8, 4
PICKS = [1, 0]
N_PARAMS = sum(t.numel() for t in init_params(CFG, 0).values())
ROWS = 16  # 256 tokens a step: past tiny's crossover (P / (2 (B − 1) d) = 212 tokens), gradients are smaller


def _batch(k: int, rows: int = ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + k)
    x = torch.randint(0, CFG.vocab_size, (rows, 16), generator=g)
    return x, torch.roll(x, -1, 1)


def _sizes(rows: int) -> tuple[int, int]:
    """(boundary bytes, gradient bytes) of one step at ``rows`` rows of 16 tokens."""
    return 2 * (block_count(CFG) - 1) * rows * 16 * CFG.d_model * 4, 4 * N_PARAMS


def _epoch(root: Path, disk: int | None, rows: int = ROWS) -> tuple[LocalEngine, EpochDir, dict[int, StepLeaf]]:
    configure_determinism(1)
    spec = dataclasses.replace(SPEC, batch_size=rows)
    eng, d = LocalEngine(spec, every=EVERY, log_disk_bytes=disk), EpochDir(root, 0)
    leaves = {0: eng.begin(d, STEPS, init_params(CFG, 0), None)}
    for k in range(STEPS):
        leaves[k + 1] = eng.step(d, k, _batch(k, rows))[1]
    return eng, d, leaves


def _between(rows: int = ROWS) -> int:
    """A disk budget the epoch's gradients fit and its boundaries do not."""
    bound, grad = _sizes(rows)
    assert grad < bound
    return STEPS * (bound + grad) // 2


def test_boundaries_are_kept_while_the_epoch_fits_and_gradients_once_it_does_not(tmp_path: Path) -> None:
    fits, _, _ = _epoch(tmp_path / "fits", None)
    assert all(log.kind == BOUNDARIES for log in fits._logs.values())
    small, _, _ = _epoch(tmp_path / "small", STEPS * _sizes(4)[0] // 2, rows=4)  # boundaries are smaller: kept as far as they go
    assert all(log.kind == BOUNDARIES for log in small._logs.values())
    eng, d, _ = _epoch(tmp_path / "grad", _between())
    assert eng._logs[d.path].kind == GRADIENTS and not eng._logs[d.path].unlogged
    assert sorted(p.name for p in (d.path / "bounds").iterdir()) == [f"grad-{k:06d}.safetensors" for k in range(STEPS)]
    assert BoundaryLog(d.path).kind == GRADIENTS  # a restarted node reads the files it kept as what they are


def test_an_answer_from_the_gradient_log_has_the_bits_of_whole_step_replay(tmp_path: Path) -> None:
    eng, d, leaves = _epoch(tmp_path, _between())
    spec = eng.spec
    for start in (2, 4, 6):
        for b in (0, 3, block_count(CFG) - 1):  # embeddings (no input), a middle half, the head (no output gradient)
            mine = challenge_file(eng, d, start, start + 2, b, PICKS, _batch, leaves, spec)
            shard, opened = eng.audit_block(d, start, start + 2, b, PICKS, _batch)
            full_shard, full = eng.audit_block(d, start, start + 2, b, PICKS, _batch, logged=False)
            assert save_state(shard) == save_state(full_shard)
            for o, f in zip(opened, full, strict=True):
                assert save_state(o.flat()) == save_state(f.flat())
            whole = LocalEngine(spec, every=EVERY, keep_boundaries=False)
            assert save_state(mine[0]) == save_state(challenge_file(whole, d, start, start + 2, b, PICKS, _batch, leaves, spec)[0])
    assert eng.log_error is None  # every answer came from the log, none from the fallback


def test_the_gradient_log_is_the_same_size_at_twice_the_batch(tmp_path: Path) -> None:
    one, d1, _ = _epoch(tmp_path / "x1", _between())
    two, d2, _ = _epoch(tmp_path / "x2", _between(2 * ROWS), rows=2 * ROWS)
    assert one._logs[d1.path].kind == two._logs[d2.path].kind == GRADIENTS
    assert one.boundary_log_bytes(d1) == two.boundary_log_bytes(d2)


def test_a_torn_gradient_log_falls_back_to_whole_steps(tmp_path: Path) -> None:
    eng, d, leaves = _epoch(tmp_path, _between())
    honest = save_state(challenge_file(eng, d, 6, 8, 3, PICKS, _batch, leaves, eng.spec)[0])
    (d.path / "bounds" / "grad-000005.safetensors").write_bytes(b"torn")
    assert save_state(challenge_file(eng, d, 6, 8, 3, PICKS, _batch, leaves, eng.spec)[0]) == honest
    assert eng.log_error is not None and "unreadable" in eng.log_error


def test_a_log_with_no_room_keeps_nothing_says_so_and_answers_by_whole_steps(tmp_path: Path) -> None:
    eng, d, leaves = _epoch(tmp_path, 0)
    assert eng.log_kind(d) is None and eng.unlogged_steps(d) == STEPS and eng.boundary_log_bytes(d) == (0, 0)
    whole = LocalEngine(eng.spec, every=EVERY, keep_boundaries=False)
    assert save_state(challenge_file(eng, d, 6, 8, 3, PICKS, _batch, leaves, eng.spec)[0]) == save_state(
        challenge_file(whole, d, 6, 8, 3, PICKS, _batch, leaves, eng.spec)[0])
    grad, _, _ = _epoch(tmp_path / "grad", _between())
    assert grad.log_kind(EpochDir(tmp_path / "grad", 0)) == GRADIENTS
