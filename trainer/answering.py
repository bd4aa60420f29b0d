"""Audit answers built beside training: one worker thread replays the drawn segments while the node trains.

Answering a shard audit replays each drawn segment from the last checkpoint to recover the block's
boundary tensors (trainer/shard_response.py): about 40 steps per epoch at s = 4, r = 4 and a
checkpoint every 16 steps. Inline, that stops the next epoch's training for as long; on this
worker thread it runs beside it, so the trainer waits only while it publishes the files and sends
the transaction. The replay still costs its CPU (logged as ``answer_cpu_s``): on a machine with a
core to spare it is hidden, on a full one it slows the steps instead.

Safety over speed: an answer still unfinished once half the time between its start and the chain's
response deadline has passed is waited for, so a slow worker never costs an honest trainer its
stake. Only the drawing, publishing and transaction stay on the node's thread (the chain client
and its nonces are not shared).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from protocol.shard_audit import ShardManifest
from protocol.store.unixfs import cid_of
from protocol.types import Cid


@dataclass(frozen=True)
class Built:
    """A shard answer ready to publish: its manifest, its files on disk with their CIDs, what it cost."""

    manifest: ShardManifest
    files: tuple[tuple[Path, Cid], ...]
    seconds: float
    cpu_s: float
    background: bool

    @property
    def file_bytes(self) -> int:
        return sum(p.stat().st_size for p, _ in self.files)


class FileSink:
    """The ``publish`` of a shard answer built away from the store: each file goes to ``folder`` under
    its CID, computed here, and is published later by the node (``files``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: list[tuple[Path, Cid]] = []

    def __call__(self, data: bytes) -> Cid:
        cid = cid_of(data)
        path = self.folder / f"answer-{len(self.files)}.bin"
        path.write_bytes(data)  # transient: removed once published, rebuilt after a crash
        self.files.append((path, cid))
        return cid


def build(make: Callable[[FileSink], ShardManifest], folder: Path, background: bool) -> Built:
    """Run ``make`` (which publishes through the sink it is given) and time it on this thread."""
    cpu = time.thread_time if background else time.process_time
    t0, c0 = time.monotonic(), cpu()
    sink = FileSink(folder)
    m = make(sink)
    return Built(m, tuple(sink.files), time.monotonic() - t0, cpu() - c0, background)


@dataclass
class _Job:
    future: Future[Built]
    wait_at: float  # time.monotonic() past which the node waits for it
    context: Any


class AnswerWorker:
    """At most one answer per epoch in flight, on one worker thread with the node's torch thread count."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: dict[int, _Job] = {}

    def busy(self, epoch: int) -> bool:
        return epoch in self._jobs

    def start(self, epoch: int, make: Callable[[FileSink], ShardManifest], folder: Path, *,
              window_s: float, context: Any) -> None:
        """Build epoch's answer on the worker; ``window_s``: seconds left to the chain's response
        deadline (counted here on this machine's clock, since a quiet chain's last block is old)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="audit-answer",
                                            initializer=torch.set_num_threads, initargs=(self.threads,))
        fut = self._pool.submit(build, make, folder, True)
        self._jobs[epoch] = _Job(fut, time.monotonic() + max(0.0, window_s) / 2, context)

    def must_wait(self, epoch: int) -> bool:
        """Whether the node should stop and wait for epoch's answer: half its window has passed."""
        job = self._jobs[epoch]
        return not job.future.done() and time.monotonic() >= job.wait_at

    def ready(self, epoch: int) -> bool:
        return self._jobs[epoch].future.done()

    def take(self, epoch: int) -> tuple[Built, Any]:
        """The answer (waiting for it if needed) and what was stored with it; the job is forgotten first,
        so a worker's error, raised here, leaves the epoch to be answered again."""
        job = self._jobs.pop(epoch)
        return job.future.result(), job.context

    def forget(self, epoch: int) -> None:
        """Drop epoch's job (the epoch closed before its answer was sent); a running build finishes unread."""
        self._jobs.pop(epoch, None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._jobs.clear()
