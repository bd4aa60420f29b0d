"""One whole network with adversaries everywhere the pure tests cannot reach end to end.

Five trainers — `lazy` (trainer/cheats.py), `forge-final` and `stale-copy` (trainer/adversaries.py),
two honest — two verifiers, and a coordinator that finalizes the right trainers with a wrong model.
The demo's node programs are swapped for tests/security/adversary_node.py through run_demo's
fault-injection hook (the demo CLI only knows the cheats of trainer/cheats.py).

Expected (docs/security.md §8): every cheating trainer is slashed for a failed audit and never
aggregated in an epoch where it cheated; no honest trainer is slashed; the contract accepts the
wrong models, and every verifier raises an alarm for every finalized epoch. A second, smaller
network runs a trainer with a planted epoch-0 start state (T16) next to two honest ones.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from coordinator.build import build_global, passing_trainers
from protocol.chain import Chain, Phase
from protocol.formats import decode_manifest
from protocol.run import open_run
from veriloco.netdemo import Control, DemoOptions, run_demo

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SWAPS = {"trainer1": "forge-final", "trainer2": "stale-copy", "coordinator0": None}
EPOCHS = 2
FAILED_AUDIT = 3


def test_adversarial_trainers_are_slashed_and_a_wrong_aggregate_raises_alarms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the node processes import tests.security.adversary_node
    swapped: list[str] = []

    def swap(control: Control) -> None:
        """On the first tick (nodes still importing torch), restart three nodes as adversaries."""
        if swapped:
            return
        for name, behaviour in SWAPS.items():
            n = control.node(name)
            control.kill(name)
            n.cmd = [sys.executable, "-m", "tests.security.adversary_node", *n.cmd[3:]]
            if behaviour:
                n.cmd += ["--behaviour", behaviour]
                n.cheat = behaviour
            control.restart(name)
            swapped.append(name)

    seen: dict[str, Any] = {}

    def inspect(chain: Chain, store: Any, run_id: int) -> None:
        ctx = open_run(chain, store, run_id)
        seen["slashes"] = [(e.args["trainer"], e.args["epoch"], e.args["reason"])
                           for e in chain.events(["Slashed"], run_id=run_id)]
        for e in range(EPOCHS):
            if chain.epoch_status(run_id, e).phase is not Phase.FINALIZED:
                continue
            _, included, digest = build_global(chain, store, ctx, e)
            assert included == passing_trainers(chain, run_id, e)
            seen.setdefault("included", {})[e] = set(included)
            seen.setdefault("wrong_model", {})[e] = digest != chain.epoch_times(run_id, e).model_digest

    opts = DemoOptions(trainers=5, verifiers=2, epochs=EPOCHS, steps=8, cheats=(("lazy", 1),),
                       workdir=tmp_path / "demo", timeout_s=480)
    log = io.StringIO()
    try:
        s = run_demo(opts, out=log, inspect=inspect, on_tick=swap)
    except Exception:
        print(log.getvalue())
        raise
    cheaters = s["cheaters"]  # address -> kind, including the swapped-in adversaries
    assert sorted(cheaters.values()) == ["forge-final", "lazy", "stale-copy"], log.getvalue()
    assert s["epochs_finalized"] == EPOCHS, log.getvalue()
    assert set(s["slashed"]) == set(cheaters), log.getvalue()  # every cheater, no honest trainer
    assert all(reason == FAILED_AUDIT for _, _, reason in seen["slashes"])
    by_kind = {kind: addr for addr, kind in cheaters.items()}
    slashed_in = {(t, e) for t, e, _ in seen["slashes"]}
    assert (by_kind["stale-copy"], 1) in slashed_in  # honest in epoch 0, caught copying in epoch 1
    for e, included in seen["included"].items():
        assert by_kind["lazy"] not in included and by_kind["forge-final"] not in included
        if e >= 1:
            assert by_kind["stale-copy"] not in included
    assert seen["wrong_model"] == {e: True for e in range(EPOCHS)}
    for i in range(opts.verifiers):
        events = [json.loads(line) for line in (opts.workdir / "logs" / f"verifier{i}.jsonl").read_text().splitlines()
                  if line.startswith("{")]
        alarms = {ev["epoch"] for ev in events if ev.get("event") == "alarm"}
        assert alarms == set(range(EPOCHS)), f"verifier{i} raised alarms for epochs {alarms}"


def test_a_planted_start_state_is_slashed_in_epoch_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """T16 as a network: one trainer starts epoch 0 with a planted error buffer and otherwise trains,
    encodes and answers honestly. Its epoch-0 audit fails on the start check alone; it is slashed in
    epoch 0 and never aggregated there; no honest trainer or verifier is slashed."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    swapped: list[str] = []

    def swap(control: Control) -> None:
        if swapped:
            return
        n = control.node("trainer0")
        control.kill("trainer0")
        n.cmd = [sys.executable, "-m", "tests.security.adversary_node", *n.cmd[3:], "--behaviour", "planted-start"]
        n.cheat = "planted-start"
        control.restart("trainer0")
        swapped.append("trainer0")

    seen: dict[str, Any] = {}

    def inspect(chain: Chain, store: Any, run_id: int) -> None:
        seen["slashes"] = [(e.args["trainer"], e.args["epoch"], e.args["reason"])
                           for e in chain.events(["Slashed"], run_id=run_id)]
        seen["included0"] = set(passing_trainers(chain, run_id, 0))
        seen["continued1"] = {ev.args["trainer"]: bool(decode_manifest(store.get(ev.args["manifestCid"])).previous)
                              for ev in chain.events(["Responded"], run_id=run_id, epoch=1)}

    opts = DemoOptions(trainers=3, verifiers=2, epochs=2, steps=4, workdir=tmp_path / "demo", timeout_s=480)
    log = io.StringIO()
    try:
        s = run_demo(opts, out=log, inspect=inspect, on_tick=swap)
    except Exception:
        print(log.getvalue())
        raise
    (planter,) = s["cheaters"]
    assert s["epochs_finalized"] == 2, log.getvalue()
    assert s["slashed"] == [planter], log.getvalue()  # neither an honest trainer nor a verifier
    assert (planter, 0, FAILED_AUDIT) in seen["slashes"]
    assert planter not in seen["included0"] and len(seen["included0"]) == 2
    honest1 = {t: c for t, c in seen["continued1"].items() if t != planter}
    assert len(honest1) == 2 and all(honest1.values())  # honest epoch-1 starts were checked as continued
    events = [json.loads(line) for i in range(opts.verifiers)
              for line in (opts.workdir / "logs" / f"verifier{i}.jsonl").read_text().splitlines() if line.startswith("{")]
    failed = [ev["failed"] for ev in events
              if ev.get("event") == "verified" and ev["trainer"] == planter and ev["epoch"] == 0]
    assert failed and all(len(f) == 1 and f[0].startswith("start:") for f in failed)
