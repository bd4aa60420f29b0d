"""The README's adversary demo, as a user types it, runs to its summary.

Four epochs: a cheater caught in epoch 0 is removed from epoch 2 on while it still owes epoch 1's
audit, and must answer it and stop cleanly rather than crash the demo. The copier cannot reveal, so
epoch 0 waits out its reveal window: 30 s windows (of the demo's 60) halve that wait.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_adversary_demo_prints_its_summary_and_slashes_every_cheater_once(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "veriloco.cli", "demo", "--trainers", "5",
           "--cheat", "lazy:1", "--cheat", "noise:1", "--cheat", "copy:1",
           "--epochs", "4", "--steps", "4", "--windows", "30", "--workdir", str(tmp_path / "demo"), "--report", str(tmp_path / "report")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
                          check=False)
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
