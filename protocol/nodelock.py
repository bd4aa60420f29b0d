"""One node per key: a second process with the same key refuses to start, in its folder or any other.

Two processes signing with one key in one state folder read and write the same epoch records, race
each other's transactions and can leave an audit unanswered, and the honest node is slashed for it.
So a node (`veriloco trainer | verifier | coordinator`, veriloco/nodes.py) takes an exclusive
`flock` on `node.lock` in its run directory (protocol/statedir.py, under `<workdir>/<role>-<address>`)
before it sends anything, and holds it for as long as it lives. The kernel drops the lock however the
process ends (a crash, SIGKILL), so a lock file left behind never blocks a restart; the PID written
into it only names the holder in the refusal. A second lock per user and machine, keyed by chain,
contract, run, role and address (`lock_key`, under ``~/.veriloco/locks``), catches the same key
started from another --workdir.
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


def _holder(fd: int) -> tuple[int | None, str]:
    """(the PID the holder wrote, or None if it wrote none (yet) within PID_WAIT_S; the note after it)."""
    deadline = time.monotonic() + PID_WAIT_S
    while True:
        first, _, note = os.pread(fd, 4096, 0).decode("utf-8", "replace").partition("\n")
        if first.strip().isdigit():
            return int(first), note.strip()
        if time.monotonic() >= deadline:
            return None, ""
        time.sleep(0.05)


def acquire(path: Path, note: str = "", what: str | None = None) -> NodeLock:
    """Lock `path` (created with its folder if missing) for this process and write our PID into it,
    and ``note`` on the next line (what a refused process is told about the holder).

    Raises NodeRunningError, naming the holder's PID, if another open of the file holds it; ``what``
    replaces the default account of the conflict (its note is appended).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by exec'd children (O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid, held = _holder(fd)
        os.close(fd)
        who, stop = (f"PID {pid}", f"stop it first (kill {pid})") if pid else ("PID unknown", "stop it first")
        if what is not None:
            raise NodeRunningError(f"{what} ({who}{', state folder ' + held if held else ''}); {stop}") from None
        raise NodeRunningError(
            f"another node with this key is already running on this state folder ({who} holds {path}); "
            f"{stop}, or use another --workdir"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n{note}\n".encode() if note else f"{os.getpid()}\n".encode(), 0)
    return NodeLock(path, fd)


def lock_node(chain: Chain, run_id: int, root: Path) -> NodeLock:
    """Lock the node's directory for `run_id` under `root` (its `<workdir>/<role>-<address>`)."""
    from protocol.statedir import run_dir  # web3 and the chain binding: not for a bare acquire()

    return acquire(run_dir(chain, run_id, root) / LOCK_FILE)


def key_lock_dir() -> Path:
    """Where this user's per-key locks live: ``VERILOCO_LOCK_DIR``, else ``~/.veriloco/locks``."""
    return Path(os.environ.get("VERILOCO_LOCK_DIR") or Path.home() / ".veriloco" / "locks")


def lock_key(chain: Chain, run_id: int, role: str, folder: Path) -> NodeLock:
    """Lock this key's part in `run_id` on this machine, whatever its state folder (issue 46): a second
    copy started from another --workdir would commit, reveal and answer beside the first, and the
    honest one is slashed for the audit its twin left unanswered."""
    name = f"{chain.chain_id}-{chain.address.lower()}-{run_id}-{role}-{str(chain.sender).lower()}.lock"
    return acquire(key_lock_dir() / name, note=str(Path(folder).absolute()),
                   what=f"key {chain.sender} already runs in run {run_id} on this machine from another state "
                        "folder; one copy of a key per run, or it answers its twin's audits wrong and is slashed")
