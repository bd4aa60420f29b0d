"""protocol/nodelock.py: one process per node lock; the holder's PID in the refusal; freed on any exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.errors import VerilocoError
from protocol.nodelock import NodeRunningError, acquire

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
HOLD = """
import sys, time
from protocol.nodelock import acquire
lock = acquire(sys.argv[1])
print("held", flush=True)
if sys.argv[2] == "sleep":
    time.sleep(120)
"""
TRY = """
import sys
from protocol.nodelock import NodeRunningError, acquire
try:
    acquire(sys.argv[1])
except NodeRunningError as exc:
    print(exc)
    sys.exit(3)
"""


def python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def holder(path: Path) -> subprocess.Popen[str]:
    """A process that takes the lock, says so, and sleeps until it is killed."""
    proc = python(HOLD, str(path), "sleep")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held", proc.stderr
    return proc


def test_another_process_is_refused_and_told_our_pid(tmp_path: Path) -> None:
    path = tmp_path / "trainer-0xabc" / "run-1" / "node.lock"  # its folder is made
    with acquire(path) as lock:
        assert lock.held and path.read_text() == f"{os.getpid()}\n"
        proc = python(TRY, str(path))
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 3, err
        assert f"PID {os.getpid()} holds {path}" in out and f"kill {os.getpid()}" in out and "--workdir" in out
        assert len(out.strip().splitlines()) == 1
    assert not lock.held
    proc = python(TRY, str(path))  # released when the block ends
    assert proc.wait(timeout=60) == 0


def test_a_second_open_in_the_same_process_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "node.lock"
    lock = acquire(path)
    with pytest.raises(NodeRunningError, match=f"PID {os.getpid()}") as info:
        acquire(path)
    assert isinstance(info.value, VerilocoError)  # the CLI prints it as one line, exit status 2
    lock.release()
    lock.release()  # twice is harmless
    acquire(path).release()


def test_sigkill_frees_the_lock_and_the_dead_pid_left_behind_does_not_block(tmp_path: Path) -> None:
    path = tmp_path / "node.lock"
    proc = holder(path)
    try:
        with pytest.raises(NodeRunningError, match=f"PID {proc.pid} holds .*kill {proc.pid}"):
            acquire(path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert path.read_text() == f"{proc.pid}\n"  # the stale file names a dead process ...
    with acquire(path):  # ... and blocks nothing
        assert path.read_text() == f"{os.getpid()}\n"


def test_a_normal_exit_frees_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "node.lock"
    proc = python(HOLD, str(path), "exit")
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    acquire(path).release()


def test_other_keys_and_roles_in_one_workdir_do_not_collide(tmp_path: Path) -> None:
    paths = [tmp_path / f"{role}-{key}" / "run-1-abc" / "node.lock"
             for role in ("trainer", "verifier") for key in ("0xaa", "0xbb")]
    locks = [acquire(p) for p in paths]
    assert all(lock.held for lock in locks)
    for lock in locks:
        lock.release()


def test_a_holder_that_has_not_written_its_pid_yet_is_still_refused(tmp_path: Path) -> None:
    import fcntl

    path = tmp_path / "node.lock"
    path.write_text("")
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(NodeRunningError, match=r"PID unknown holds .*; stop it first, or use another --workdir"):
            acquire(path)
    finally:
        os.close(fd)
