"""The demo's watch over its nodes (veriloco/netdemo.py `_monitor`) ends on what the coordinator said,
not on when its exit was noticed.

A coordinator removed from the run logs `removed` and exits; a verifier then finalizes the epochs
left, so the watch must go on until every epoch is terminal. Each tick reads the logs, asks the
chain, runs the fault hooks and then checks the coordinator: an exit that lands between the read
and the check (a whole tick on a loaded machine) was taken for a coordinator that had finished,
and the demo stopped with epochs still auditing. Here the exit is put exactly there, by the tick's
hook, against a real chain whose run has no epoch terminal.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from protocol.config import RunConfig
from tests.fixtures.chain import PyEvmNet, params
from veriloco.netdemo import Control, DemoError, DemoOptions, NodeProc, _monitor

pytestmark = pytest.mark.integration


def _coordinator(tmp_path: Path, last: dict[str, object] | None, status: int) -> NodeProc:
    """A coordinator process that, once its stdin closes, logs ``last`` (if any) and exits ``status``."""
    line = json.dumps(last) if last else ""
    code = f"import sys; sys.stdin.read(); print({line!r}, flush=True); sys.exit({status})"
    log = tmp_path / "coordinator0.jsonl"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT)
    return NodeProc("coordinator", 0, 0, "0x0", log, [sys.executable, "-c", code], proc)


def _watch(tmp_path: Path, node: NodeProc, timeout_s: float) -> None:
    """Run the watch over ``node`` on a fresh run of three epochs; its first tick's hook ends the node
    after that tick's read."""
    net = PyEvmNet(accounts=2)
    chain = net.chain(0)
    run_id = chain.create_run(params(net.accounts[0]))

    def end_after_read(control: Control) -> None:
        proc = control.node("coordinator0").proc
        assert isinstance(proc, subprocess.Popen) and proc.stdin is not None
        if not proc.stdin.closed:
            proc.stdin.close()
            proc.wait(timeout=60)

    opts = DemoOptions(workdir=tmp_path, timeout_s=timeout_s)
    cfg = RunConfig(name="monitor").replace(schedule={"epochs": 3})
    _monitor(chain, run_id, cfg, [node], opts, lambda _: None, time.monotonic(), end_after_read)


def test_a_coordinator_removed_mid_tick_does_not_end_the_network_early(tmp_path: Path) -> None:
    node = _coordinator(tmp_path, {"event": "removed", "leave_epoch": 1}, 0)
    with pytest.raises(DemoError, match="did not finish within 3 s"):  # the epochs never end: the watch waits for them
        _watch(tmp_path, node, timeout_s=3)
    assert [ev["event"] for ev in node.events] == ["removed"]


def test_a_coordinator_that_finished_ends_the_watch(tmp_path: Path) -> None:
    node = _coordinator(tmp_path, {"event": "finished"}, 0)
    _watch(tmp_path, node, timeout_s=120)  # a watch that waited for the epochs would raise at its timeout
    assert [ev["event"] for ev in node.events] == ["finished"]


def test_a_coordinator_that_crashed_mid_tick_is_reported(tmp_path: Path) -> None:
    node = _coordinator(tmp_path, None, 1)
    with pytest.raises(DemoError, match="coordinator0 exited with status 1; see "):
        _watch(tmp_path, node, timeout_s=120)
