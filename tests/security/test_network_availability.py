"""Whole network: a passing trainer deletes its payload right after its pass verdict (docs/security.md T17).

Three trainers (trainer0 swapped for tests/security/adversary_node.py `withhold`, which deletes its
payload from the shared LocalStore as soon as it has passed, while the epoch is still open), two
verifiers at quorum 1 and the honest coordinator. The test holds the coordinator (SIGSTOP) while an
auditing epoch's deletion is still to come, so it can only aggregate after the payload is gone:
whatever it aggregates of trainer0 was put back by the verifier that passed it.

Expected: every epoch finalizes with trainer0 included and the model equal to the honest
recomputation; the verifier that passed trainer0 re-published each deleted payload; nobody is
slashed (trainer0 did its work; its deletion cost the run nothing).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from coordinator.build import build_global
from protocol.chain import Chain, Phase
from protocol.run import open_run, passing_trainers
from tests.fixtures.network import run_network
from veriloco.netdemo import Control, DemoOptions

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ADVERSARY = "trainer0"
EPOCHS = 2


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def test_a_passing_trainer_that_deletes_its_payload_cannot_stall_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the node processes import tests.security.adversary_node
    held = {"swapped": False, "paused": False}

    def tick(control: Control) -> None:
        if not held["swapped"]:  # first tick: the nodes are still importing torch
            n = control.node(ADVERSARY)
            control.kill(ADVERSARY)
            n.cmd = [sys.executable, "-m", "tests.security.adversary_node", *n.cmd[3:], "--behaviour", "withhold"]
            n.cheat = "withhold"
            control.restart(ADVERSARY)
            held["swapped"] = True
        withheld = {ev["epoch"] for ev in control.node(ADVERSARY).events if ev.get("event") == "withholding"}
        pending = any(control.chain.epoch_status(control.run_id, e).phase is Phase.AUDITING and e not in withheld
                      for e in range(EPOCHS))
        if pending != held["paused"]:
            os.kill(control.node("coordinator0").proc.pid, signal.SIGSTOP if pending else signal.SIGCONT)
            held["paused"] = pending

    seen: dict[str, Any] = {}

    def inspect(chain: Chain, store: Any, run_id: int) -> None:
        ctx = open_run(chain, store, run_id)
        seen["slashed"] = chain.events(["Slashed"], run_id=run_id) + chain.events(["VerifierSlashed"], run_id=run_id)
        for e in range(EPOCHS):
            seen.setdefault("phases", []).append(chain.epoch_status(run_id, e).phase)
            seen.setdefault("included", []).append({t.lower() for t in passing_trainers(chain, run_id, e)})
            _, _, digest = build_global(chain, store, ctx, e)  # needs every included payload, from the store
            seen.setdefault("honest_model", []).append(digest == chain.epoch_times(run_id, e).model_digest)

    opts = DemoOptions(trainers=3, verifiers=2, quorum=1, epochs=EPOCHS, steps=4, workdir=tmp_path / "demo", timeout_s=480)
    s, log = run_network(opts, inspect=inspect, on_tick=tick)
    adversary = next(a for a, kind in s["cheaters"].items() if kind == "withhold").lower()
    logs = opts.workdir / "logs"
    withheld = {ev["epoch"]: ev["payload"] for ev in _events(logs / f"{ADVERSARY}.jsonl") if ev.get("event") == "withholding"}
    assert sorted(withheld) == list(range(EPOCHS)), log  # the attack ran in every epoch
    assert s["epochs_finalized"] == EPOCHS and seen["phases"] == [Phase.FINALIZED] * EPOCHS, log
    assert all(adversary in included for included in seen["included"])
    assert seen["honest_model"] == [True] * EPOCHS
    assert seen["slashed"] == [] and s["slashed"] == [], log
    republished = {(ev["epoch"], ev["payload"]) for i in range(opts.verifiers)
                   for ev in _events(logs / f"verifier{i}.jsonl") if ev.get("event") == "republished"}
    assert set(withheld.items()) <= republished, log
    alarms = [ev for i in range(opts.verifiers) for ev in _events(logs / f"verifier{i}.jsonl") if ev.get("event") == "alarm"]
    assert alarms == []
