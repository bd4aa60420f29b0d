"""The README's adversary demo, as a user types it, runs to its summary.

Three epochs: a cheater caught in epoch 0 is removed from epoch 1 on (under the demo's merge rule an
epoch-1 commitment waits for epoch 0 to be final), or, under the one-step delay, from epoch 2 on
while it still owes epoch 1's audit, and must answer it and stop cleanly rather than crash the demo.
The copier cannot reveal, so an epoch it committed in waits out its reveal window: 30 s windows (of
the demo's 60) halve that wait, and the test moves the devnet's clock over the rest from outside the
demo's process, as tests/fixtures/network.py's skip_unrevealed does for run_network's tests (it
reads the devnet file and the trainers' logs the demo writes; the command itself is the user's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from devnet.launch import DevnetInfo
from protocol.chain.binding import Chain
from protocol.errors import VerilocoError
from tests.fixtures.network import skip_unrevealed
from veriloco.netdemo import Control, NodeProc

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TRAINERS, EPOCHS = 5, 3


class _Running:
    """A trainer process of the demo's, seen from outside it: never taken as exited on its own, so
    only a logged `reveal-failed` counts as giving up (skip_unrevealed then waits for nothing less)."""

    def poll(self) -> None:
        return None


def _skip_unrevealed_while(proc: subprocess.Popen[Any], workdir: Path, timeout_s: float) -> None:
    """Until `proc` (the demo) exits: once its devnet file is up, run skip_unrevealed twice a second
    on the demo's chain (its first run, id 1) and its trainers' logs."""
    skip, control = skip_unrevealed(EPOCHS), None
    end = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() > end:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        time.sleep(0.5)
        try:
            if control is None:
                info = DevnetInfo.from_json(json.loads((workdir / "devnet" / "devnet.json").read_text()))
                assert info.contract is not None
                trainers = [NodeProc("trainer", i, 1 + i, info.accounts[1 + i].address,
                                     workdir / "logs" / f"trainer{i}.jsonl", [], _Running())  # type: ignore[arg-type]
                            for i in range(TRAINERS)]
                control = Control(Chain(info.rpc_url, info.contract), 1, trainers)
            for n in control.nodes:
                n.read()
            skip(control)
        except (OSError, ValueError, VerilocoError):
            continue  # not up yet (no devnet file, no run), or going down: the demo decides


def test_the_readme_adversary_demo_prints_its_summary_and_slashes_every_cheater_once(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "veriloco.cli", "demo", "--trainers", str(TRAINERS),
           "--cheat", "lazy:1", "--cheat", "noise:1", "--cheat", "copy:1",
           "--epochs", str(EPOCHS), "--steps", "4", "--windows", "30", "--workdir", str(tmp_path / "demo"), "--report", str(tmp_path / "report")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with stdout.open("w") as so, stderr.open("w") as se:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=so, stderr=se, text=True)
        try:
            _skip_unrevealed_while(proc, tmp_path / "demo", timeout_s=1200)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    done = subprocess.CompletedProcess(cmd, proc.returncode, stdout.read_text(), stderr.read_text())
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "\nsummary\n" in done.stdout, out
    s = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert sorted(s["cheaters"].values()) == ["copy", "lazy", "noise"]
    assert set(s["slashed"]) == set(s["cheaters"]), out
    # once each: a cheater caught in epoch e is taken out of e+1 too, not slashed again there
    assert sorted(x["account"] for x in s["slashes"]) == sorted(s["cheaters"]), s["slashes"]
    # honest traffic: every store byte up and down, against AllReduce for the steps trained; the model's CID
    assert s["bytes_sent_per_trainer"] > 0 and s["bytes_received_per_trainer"] > 0
    assert s["bytes_per_trainer"] == pytest.approx(s["bytes_sent_per_trainer"] + s["bytes_received_per_trainer"], abs=1)
    assert s["allreduce_bytes_equivalent"] > 0 and "AllReduce would send" in done.stdout
    assert s["final_model_cid"] in done.stdout and s["fetch_model"] in done.stdout
    assert (tmp_path / "report" / "loss.png").stat().st_size > 0
