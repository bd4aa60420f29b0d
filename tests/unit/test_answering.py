"""Audit answers built on the worker thread: same bits as inline, files named by their CIDs, a
deadline guard, and CPU time that stays with the thread that spent it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from dilocox.inner import configure_determinism
from protocol.formats.codec import save_state
from protocol.model import init_params
from protocol.store.unixfs import cid_of
from tests.unit.test_engine import SPEC, _batch
from trainer.answering import AnswerWorker, FileSink, build
from trainer.checkpoints import EpochDir
from trainer.engine import LocalEngine, own_cpu


def _epoch(root: Path, e: int, steps: int = 6) -> tuple[LocalEngine, EpochDir]:
    eng, d = LocalEngine(SPEC, every=2), EpochDir(root, e)
    eng.begin(d, steps, init_params(SPEC.model, e), None)
    for k in range(steps):
        eng.step(d, k, _batch(k))
    return eng, d


def test_a_block_replayed_on_the_worker_beside_training_has_the_inline_bits(tmp_path: Path) -> None:
    configure_determinism(1)
    done, d0 = _epoch(tmp_path, 0)
    inline = done.audit_block(d0, 2, 4, 3, [1, 0], _batch)

    def make(sink: FileSink) -> None:  # type: ignore[return]  # the test reads the files, not a manifest
        shard, bounds = done.audit_block(d0, 2, 4, 3, [1, 0], _batch)
        sink(save_state({**shard, **{f"b/{i}/{k}": t for i, o in enumerate(bounds) for k, t in o.flat().items()}}))

    worker = AnswerWorker(threads=1)
    try:
        worker.start(0, make, d0.path, window_s=3600, context="ctx")  # type: ignore[arg-type]
        training, d1 = LocalEngine(SPEC, every=2), EpochDir(tmp_path, 1)  # the next epoch trains meanwhile
        training.begin(d1, 6, init_params(SPEC.model, 1), None)
        for k in range(6):
            training.step(d1, k, _batch(k))
        built, ctx = worker.take(0)
    finally:
        worker.close()
    assert ctx == "ctx" and built.background and built.cpu_s > 0 and not worker.busy(0)
    (path, cid), = built.files
    data = path.read_bytes()
    shard, bounds = inline
    expect = save_state({**shard, **{f"b/{i}/{k}": t for i, o in enumerate(bounds) for k, t in o.flat().items()}})
    assert data == expect and cid == cid_of(data) and built.file_bytes == len(data)


def test_a_step_s_cpu_clock_does_not_count_another_thread_s_replay() -> None:
    """The worker's replay is not the step's cost: ``own_cpu`` (what LocalEngine times steps and leaves
    with) must not move while only another thread works."""
    configure_determinism(1)
    spent = [0.0]

    def replay() -> None:
        c, x = time.thread_time(), torch.randn(192, 192)
        while time.thread_time() - c < 0.3:
            x = (x @ x).tanh()
        spent[0] = time.thread_time() - c

    t = threading.Thread(target=replay)
    own, proc = own_cpu(), time.process_time()
    t.start()
    t.join()  # this thread only waits
    assert spent[0] >= 0.3 and time.process_time() - proc >= 0.3
    assert own_cpu() - own < 0.1


def test_the_node_waits_for_an_answer_once_half_its_window_has_passed(tmp_path: Path) -> None:
    release = threading.Event()

    def slow(sink: FileSink) -> None:  # type: ignore[return]
        release.wait(30)
        sink(b"x")

    worker = AnswerWorker(threads=1)
    try:
        worker.start(1, slow, tmp_path, window_s=3600, context=None)  # type: ignore[arg-type]
        worker.start(2, slow, tmp_path, window_s=0, context=None)  # type: ignore[arg-type]
        assert worker.busy(1) and not worker.ready(1)
        assert not worker.must_wait(1) and worker.must_wait(2)
        release.set()
        built, _ = worker.take(2)
        assert built.files and not worker.busy(2)
    finally:
        release.set()
        worker.close()


def test_a_failed_answer_raises_once_and_leaves_the_epoch_to_answer_again(tmp_path: Path) -> None:
    def broken(sink: FileSink) -> None:  # type: ignore[return]
        raise OSError("disk full")

    worker = AnswerWorker(threads=1)
    try:
        worker.start(3, broken, tmp_path, window_s=60, context=None)  # type: ignore[arg-type]
        with pytest.raises(OSError, match="disk full"):
            worker.take(3)
        assert not worker.busy(3)
    finally:
        worker.close()


def test_an_inline_build_times_the_process(tmp_path: Path) -> None:
    def make(sink: FileSink) -> None:  # type: ignore[return]
        sink(b"abc")

    built = build(make, tmp_path, background=False)  # type: ignore[arg-type]
    assert not built.background and built.files[0][1] == cid_of(b"abc")
