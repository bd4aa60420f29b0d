"""trainer/checkpoints.py: a checkpoint written past the page cache reads back whole, a failed write
leaves no temporary behind, and a closed epoch keeps only the states the next one checks."""

from __future__ import annotations

import errno
from functools import partial
from pathlib import Path

import pytest
import torch

import trainer.direct_io as dio
from protocol.formats.codec import load_state_file
from trainer.checkpoints import Checkpointer, CheckpointRule, EpochDir

pytestmark = pytest.mark.unit


def test_a_checkpoint_written_past_the_cache_reads_back_whole_and_a_failed_one_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = EpochDir(tmp_path, 0)
    state = {"param/w": torch.randn(4, dio.ALIGN + 3), "step": torch.tensor([7])}
    d.save_step(4, state)
    back = load_state_file(d.path / "state-000004.safetensors")
    assert all(torch.equal(back[k], v) for k, v in state.items())

    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("trainer.checkpoints.write_file", full)
    with pytest.raises(OSError, match="No space"):
        d.save_step(8, state)
    assert sorted(p.name for p in d.path.iterdir()) == ["state-000004.safetensors"]  # no torn temporary left


def test_a_closed_epoch_keeps_its_first_and_last_checkpoint_only(tmp_path: Path) -> None:
    d = EpochDir(tmp_path, 3)
    state = {"param/w": torch.randn(8)}
    for k in (0, 4, 8, 12, 16):
        d.save_step(k, state)
    d.save("state-000008.stage1", state)  # a staged run's part
    d.save("carried", state)
    one = (d.path / "state-000004.safetensors").stat().st_size
    assert d.drop_between() == 4 * one and d.checkpoints() == [0, 16]
    assert sorted(p.name for p in d.path.iterdir()) == ["carried.safetensors", "state-000000.safetensors",
                                                        "state-000016.safetensors"]
    assert d.drop_between() == 0 and EpochDir(tmp_path, 4).drop_between() == 0


def test_the_logged_spacing_is_a_multiple_of_the_unlogged_one_and_the_last_step_is_always_kept() -> None:
    assert CheckpointRule.of(4, 16) == CheckpointRule(4, 16) and CheckpointRule.of(4, 10) == CheckpointRule(4, 12)
    assert CheckpointRule.of(8, 4) == CheckpointRule(8, 8) and CheckpointRule.of(4) == CheckpointRule(4, 4)
    rule = CheckpointRule.of(4, 16)
    assert [k for k in range(1, 21) if rule.due(k, 20, True)] == [16, 20]
    assert [k for k in range(1, 21) if rule.due(k, 20, False)] == [4, 8, 12, 16, 20]


def test_the_checkpointer_keeps_what_the_rule_wants_and_skips_a_refused_state_but_not_the_last() -> None:
    """Both engines' bookkeeping: a step the log missed brings the dense spacing until the next kept
    state; a refused mid-epoch write is said and the last kept state stays where it was."""
    kept: list[int] = []
    refuse: set[int] = set()

    def save(k: int) -> None:
        if k in refuse:
            raise OSError(28, "No space left on device")
        kept.append(k)

    c = Checkpointer(CheckpointRule.of(2, 4))
    c.begin(8)
    for k in range(8):
        c.after_step(k, k != 4, partial(save, k + 1))
    assert kept == [4, 6, 8] and c.last == 8 and c.error is None  # 5 unlogged: 6 kept, then 8 (the last)
    kept.clear()
    refuse.add(4)
    c.begin(8)
    assert [c.after_step(k, True, partial(save, k + 1)) for k in range(5)] == [False] * 5
    assert c.last == 0 and c.error is not None and c.error.startswith("step 4:") and "No space" in c.error
    refuse.add(8)
    with pytest.raises(OSError):
        for k in range(5, 8):
            c.after_step(k, True, partial(save, k + 1))
    assert kept == [] and c.last == 0


def test_the_worst_replay_is_the_widest_gap_between_kept_states() -> None:
    """Issue 46 item 8: with a step outside the answer log, an answer replays from the kept state before it;
    a disk that refused every mid-epoch checkpoint leaves the whole epoch to replay, which the node now
    weighs against the response window before it commits (trainer/node.py, `answer at risk`)."""
    from trainer.checkpoints import worst_replay

    assert worst_replay(8, [0, 4, 8]) == 4
    assert worst_replay(8, [0, 2, 8]) == 6  # d_4 refused: from d_2 through step 7
    assert worst_replay(31, [0, 31]) == 31  # every mid-epoch state refused
    assert worst_replay(31, []) == 31 and worst_replay(0, []) == 0
