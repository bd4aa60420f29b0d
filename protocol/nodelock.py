"""One node per key and state folder: a second process with the same key refuses to start.

Two processes signing with one key in one state folder read and write the same epoch records, race
each other's transactions and can leave an audit unanswered, and the honest node is slashed for it.
So a node (`veriloco trainer | verifier | coordinator`, veriloco/nodes.py) takes an exclusive
`flock` on `node.lock` in its run directory (protocol/statedir.py, under `<workdir>/<role>-<address>`)
before it sends anything, and holds it for as long as it lives. The kernel drops the lock however the
process ends (a crash, SIGKILL), so a lock file left behind never blocks a restart; the PID written
into it only names the holder in the refusal.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from protocol.errors import VerilocoError

if TYPE_CHECKING:
    from protocol.chain.binding import Chain

LOCK_FILE = "node.lock"
PID_WAIT_S = 1.0  # how long to wait for a holder that has just taken the lock to write its PID


class NodeRunningError(VerilocoError):
    """Another live process holds this node's lock: the same key already runs on this state folder."""


class NodeLock:
    """A held lock; `release()` (or leaving a `with` block, or the process ending) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # closing the only descriptor of the open file drops its flock

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _holder(fd: int) -> int | None:
    """The PID the holder wrote, or None if it wrote none (yet) within PID_WAIT_S."""
    deadline = time.monotonic() + PID_WAIT_S
    while True:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return int(text)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def acquire(path: Path) -> NodeLock:
    """Lock `path` (created with its folder if missing) for this process and write our PID into it.

    Raises NodeRunningError, naming the holder's PID, if another open of the file holds it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by exec'd children (O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(fd)
        os.close(fd)
        who, stop = (f"PID {pid}", f"stop it first (kill {pid})") if pid else ("PID unknown", "stop it first")
        raise NodeRunningError(
            f"another node with this key is already running on this state folder ({who} holds {path}); "
            f"{stop}, or use another --workdir"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return NodeLock(path, fd)


def lock_node(chain: Chain, run_id: int, root: Path) -> NodeLock:
    """Lock the node's directory for `run_id` under `root` (its `<workdir>/<role>-<address>`)."""
    from protocol.statedir import run_dir  # web3 and the chain binding: not for a bare acquire()

    return acquire(run_dir(chain, run_id, root) / LOCK_FILE)
