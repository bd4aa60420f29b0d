"""The demo's node processes (veriloco/nodeprocs.py): forked from the preloaded server, each is still
the command a user would type, in its own session, with its own environment, output and status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from veriloco.nodeprocs import FORKS, Forked, start_node

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not FORKS, reason="this platform has no forkserver: nodes are exec'd")]

PROBE = [sys.executable, "-m", "tests.fixtures.probe_node"]


def _said(log: Path) -> dict[str, object]:
    return json.loads(log.read_text().splitlines()[0])


def test_a_forked_node_is_the_command_with_its_environment_output_and_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "node.jsonl"
    log.write_text("an earlier line\n")
    monkeypatch.setenv("PROBE_VALUE", "set after the server started")  # the node sees the caller's env now
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # a node runs one thread whatever the caller has
    monkeypatch.chdir(tmp_path)
    proc = start_node([*PROBE, "3", "--flag"], log)
    assert isinstance(proc, Forked)
    assert proc.wait(timeout=120) == 3 and proc.returncode == 3 and proc.poll() == 3
    lines = log.read_text().splitlines()
    assert lines[0] == "an earlier line"  # appended, as the exec'd node's output was
    said = json.loads(lines[1])
    assert said["argv"] == ["3", "--flag"] and said["name"] == "__main__"
    assert said["pid"] == proc.pid and said["sid"] == proc.pid  # its own session, as start_new_session gave
    assert said["cwd"] == str(tmp_path)
    assert said["probe"] == "set after the server started"
    assert said["omp"] == "1" and said["threads"] == 1
    assert lines[2:] == ["to stderr", "atexit ran"]


def test_a_forked_node_is_signalled_killed_and_waited_for_like_a_popen(tmp_path: Path) -> None:
    log = tmp_path / "node.jsonl"
    proc = start_node([*PROBE, "wait"], log)
    assert log.exists()  # before the child runs, as with exec
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    assert proc.poll() is None
    end = time.monotonic() + 120
    while "to stderr" not in log.read_text():  # the node's second line: it runs
        if time.monotonic() > end:
            pytest.fail(f"the node said nothing: {log.read_text()!r}")
        time.sleep(0.1)
    assert _said(log)["argv"] == ["wait"]
    os.kill(proc.pid, signal.SIGSTOP)  # the fault injection's pause reaches the node itself
    os.kill(proc.pid, signal.SIGCONT)
    assert proc.poll() is None
    proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.kill()  # a dead node: nothing happens, as with Popen
    proc.send_signal(signal.SIGTERM)
    assert proc.returncode == -signal.SIGKILL


def test_a_command_that_is_not_a_module_run_is_started_with_exec(tmp_path: Path) -> None:
    log = tmp_path / "node.jsonl"
    proc = start_node([sys.executable, "-c", "import os; print(os.getsid(0) == os.getpid())"], log)
    assert isinstance(proc, subprocess.Popen)
    assert proc.wait(timeout=120) == 0
    assert log.read_text().strip() == "True"
    assert os.getsid(0) != proc.pid
