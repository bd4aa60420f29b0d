"""Whole networks with adversaries everywhere the pure tests cannot reach end to end.

Five trainers — `lazy` (trainer/cheats.py), `forge-final` and `stale-copy` (trainer/adversaries.py),
two honest, one of them on a disk that refuses a mid-epoch checkpoint — two verifiers, and a
coordinator that finalizes the right trainers with a wrong model.
The demo's node programs are swapped for tests/security/adversary_node.py through run_demo's
fault-injection hook (the demo CLI only knows the cheats of trainer/cheats.py).

Expected (docs/security.md §8): every cheating trainer is slashed for a failed audit and never
aggregated in an epoch where it cheated; no honest trainer is slashed; the attestation committee
replaces the coordinator's wrong model on-chain and the coordinator, slashed and removed, leaves the
next epoch to a verifier's finalize.

A second network has a coordinator that finalizes the true aggregate times 1e30 (finite, but
training on it gives `loss is nan`). Every node recomputes the model itself (public/globals.py
`VerifiedGlobals`) and the committee corrects it on-chain, so the honest trainers train on the true
model, nobody but the coordinator is slashed, and every epoch finalizes.
A third network runs, next to two honest trainers, one with a planted epoch-0 start state (T16) and
one whose first continued start (epoch 1) carries a changed error buffer in one block (issue 30:
every block of a continued start is checked). A fourth network has quorum 3 but one verifier: no
epoch is audited, each aborts at its deadline, nobody is slashed, and the run says it is stalled.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from protocol import shard_audit
from protocol.chain.binding import Chain, Phase
from protocol.digest import state_digest
from protocol.leaf import block_count
from protocol.model import preset
from protocol.run import open_run
from public.globals import VerifiedGlobals, build_global, passing_trainers
from tests.fixtures.cli import run_cli
from tests.fixtures.network import (
    run_network,
    skip_to_verifier_finalize,
    skip_unaudited,
    skip_unrevealed,
)
from veriloco.netdemo import Control, DemoOptions

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SWAPS = {"trainer1": "forge-final", "trainer2": "stale-copy", "coordinator0": None}
FULL_DISK = "trainer3"  # honest, but its disk refuses one mid-epoch checkpoint (adversary_node --refuse-checkpoint)
EPOCHS = 2
FAILED_AUDIT = 3


def _swapper(swaps: dict[str, list[str]]) -> Callable[[Control], None]:
    """An on_tick hook: on the first tick (nodes still importing torch), restart the named nodes as
    adversary_node programs with the extra arguments given."""
    swapped: list[str] = []

    def swap(control: Control) -> None:
        if swapped:
            return
        for name, extra in swaps.items():
            n = control.node(name)
            control.kill(name)
            n.cmd = [sys.executable, "-m", "tests.security.adversary_node", *n.cmd[3:], *extra]
            if "--behaviour" in extra:
                n.cheat = extra[extra.index("--behaviour") + 1]
            control.restart(name)
            swapped.append(name)

    return swap


def _events(path: Path, kind: str) -> list[dict[str, Any]]:
    return [ev for ev in (json.loads(line) for line in path.read_text().splitlines() if line.startswith("{"))
            if ev.get("event") == kind]


def test_adversarial_trainers_are_slashed_and_a_wrong_aggregate_is_corrected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the node processes import tests.security.adversary_node
    swap = _swapper({**{name: ["--behaviour", b] if b else [] for name, b in SWAPS.items()},
                     FULL_DISK: ["--refuse-checkpoint", "4"]})

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
        seen["confirmed"] = {ev.args["epoch"]: ev.args for ev in chain.events(["ModelConfirmed"], run_id=run_id)}
        seen["finalizers"] = {ev.args["epoch"]: ev.tx_hash for ev in chain.events(["EpochFinalized"], run_id=run_id)}
        seen["coordinator"] = chain.member(run_id, chain.run_info(run_id).params.coordinator)

    opts = DemoOptions(trainers=5, verifiers=2, quorum=1, epochs=EPOCHS, steps=8, cheats=(("lazy", 1),),
                       workdir=tmp_path / "demo", timeout_s=480)
    # epoch 1 waits for a verifier's finalize, and for the reveal of a cheater that stopped, if one did
    skips = skip_unrevealed(EPOCHS), skip_to_verifier_finalize(EPOCHS)
    def tick(c: Control) -> None:
        swap(c)
        seen["full_disk"] = c.node(FULL_DISK).address
        for skip in skips:
            skip(c)

    s, log = run_network(opts, inspect=inspect, on_tick=tick)
    cheaters = s["cheaters"]  # address -> kind, including the swapped-in adversaries
    assert sorted(cheaters.values()) == ["forge-final", "lazy", "stale-copy"], log
    assert s["epochs_finalized"] == EPOCHS, log
    assert set(s["slashed"]) == set(cheaters), log  # every cheater, no honest trainer
    assert all(reason == FAILED_AUDIT for _, _, reason in seen["slashes"])
    by_kind = {kind: addr for addr, kind in cheaters.items()}
    slashed_in = {(t, e) for t, e, _ in seen["slashes"]}
    assert (by_kind["stale-copy"], 1) in slashed_in  # honest in epoch 0, caught copying in epoch 1
    for e, included in seen["included"].items():
        assert by_kind["lazy"] not in included and by_kind["forge-final"] not in included
        if e >= 1:
            assert by_kind["stale-copy"] not in included
    # C1: the attestation committee replaced epoch 0's wrong model and the coordinator paid for it;
    # removed, it could not finalize epoch 1, which a verifier finalized with the true aggregate
    assert seen["wrong_model"] == {e: False for e in range(EPOCHS)}
    assert seen["confirmed"][0]["corrected"] and seen["confirmed"][0]["slashed"] > 0
    assert not seen["confirmed"][1]["corrected"]
    assert seen["coordinator"].leave_epoch is not None
    finalized_by_verifier = [ev for i in range(opts.verifiers)
                             for ev in _events(opts.workdir / "logs" / f"verifier{i}.jsonl", "finalized")]
    assert [ev["epoch"] for ev in finalized_by_verifier] == [1]
    attested = [ev for i in range(opts.verifiers) for ev in _events(opts.workdir / "logs" / f"verifier{i}.jsonl", "attested")]
    assert {ev["epoch"]: ev["matches"] for ev in attested} == {0: False, 1: True}
    # the trainer whose disk refused epoch 0's d_4 said so, and lost only replay distance: it was
    # audited, passed and aggregated in both epochs like any honest trainer (and is not slashed, above)
    full_log = opts.workdir / "logs" / f"{FULL_DISK}.jsonl"
    warned = [ev for ev in _events(full_log, "warning") if ev.get("what") == "checkpoint"]
    assert [(ev["epoch"], ev["error"].split(":")[0]) for ev in warned] == [(0, "step 4")], log
    assert all(seen["full_disk"] in included for included in seen["included"].values())


def test_a_coordinator_finalizing_an_unusable_model_changes_no_honest_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three epochs, so that epoch 2 starts from the model epoch 0 finalized (one-step delay), with
    every audit's final and start checks on. The committee corrects epoch 0's model on-chain and the
    coordinator, slashed and removed, finalizes nothing more: a verifier finalizes epochs 1 and 2.
    The one-step delay, so trainers keep training while the takeover waits out its half window (under
    the merge rule they would wait at step 1: docs/security.md §13, 7)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    epochs = 3
    opts = DemoOptions(trainers=2, verifiers=1, quorum=1, epochs=epochs, steps=4, workdir=tmp_path / "demo", timeout_s=480,
                       merge_step=0)
    seen: dict[str, list[bytes]] = {}

    def inspect(chain: Chain, store: Any, run_id: int) -> None:
        ctx = open_run(chain, store, run_id)
        true = VerifiedGlobals(chain, store, ctx)
        seen["true"] = [state_digest(true.base(e)) for e in range(epochs + 1)]
        seen["posted"] = [bytes(chain.epoch_times(run_id, e).model_digest) for e in range(epochs)]

    swap, skip = _swapper({"coordinator0": ["--scale", "1e30"]}), skip_to_verifier_finalize(epochs)
    s, log = run_network(opts, inspect=inspect, on_tick=lambda c: (swap(c), skip(c)))
    assert s["epochs_finalized"] == epochs, log
    assert s["slashed"] == [], log
    assert all(seen["true"][e + 1] == seen["posted"][e] for e in range(epochs))  # every confirmed model is the true one
    for i in range(opts.trainers):
        path = opts.workdir / "logs" / f"trainer{i}.jsonl"
        trained = {ev["epoch"]: ev for ev in _events(path, "trained")}
        assert sorted(trained) == list(range(epochs)), f"trainer{i} trained epochs {sorted(trained)}"
        for e, ev in trained.items():
            assert ev["base_epoch"] == max(e - 1, 0)
            assert bytes.fromhex(ev["base_digest"]) == seen["true"][ev["base_epoch"]], f"trainer{i} epoch {e}"
        mismatches = [ev["epoch"] for ev in _events(path, "model-mismatch")]
        assert mismatches == [], f"trainer{i} saw wrong confirmed models of epochs {mismatches}"
    verifier_log = opts.workdir / "logs" / "verifier0.jsonl"
    assert _events(verifier_log, "alarm") == []
    assert {ev["epoch"]: ev["matches"] for ev in _events(verifier_log, "attested")} == {0: False, 1: True, 2: True}
    assert [ev["epoch"] for ev in _events(verifier_log, "finalized")] == [1, 2]


def test_planted_start_states_are_slashed_in_the_epoch_they_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two planted start states in one network of four trainers, three verifiers at quorum 3:

    - T16: trainer1 (`planted-start`) starts epoch 0 with a planted error buffer and otherwise trains,
      encodes and answers honestly. Its epoch-0 audit fails on the start check (and on the final
      check, whose file of a run without a buffer ships none: a planted one no longer hashes); it is
      slashed in epoch 0 and never aggregated there.
    - Issue 30: trainer0 (trainer/adversaries.py `planted-carry`) trains epoch 0 honestly, then at its
      continued start of epoch 1 changes the carried error buffer of one block (the last), and
      otherwise trains, encodes and answers honestly. Every block's buffer is checked at every
      continued start (docs/protocol.md §5.3 checks 5 and 6; the demo's runs keep none, so it must be
      zero), so its epoch-1 audit fails on the start
      check alone, by all three verifiers of quorum 3: it is slashed in epoch 1 and not aggregated there.

    Every epoch finalizes and nobody honest (trainer or verifier) is slashed."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    epochs = 3
    swap = _swapper({"trainer0": ["--behaviour", "planted-carry"], "trainer1": ["--behaviour", "planted-start"]})
    seen: dict[str, Any] = {}

    def inspect(chain: Chain, store: Any, run_id: int) -> None:
        seen["slashes"] = [(e.args["trainer"], e.args["epoch"], e.args["reason"])
                           for e in chain.events(["Slashed"], run_id=run_id)]
        seen["verifier_slashes"] = chain.events(["VerifierSlashed"], run_id=run_id)
        seen["included"] = {e: set(passing_trainers(chain, run_id, e)) for e in range(epochs)}
        seen["continued1"] = {ev.args["trainer"]: bool(shard_audit.decode_manifest(
            store.get(ev.args["manifestCid"]), block_count(preset("tiny")), max_bytes=1 << 20).previous)
                              for ev in chain.events(["Responded"], run_id=run_id, epoch=1)}

    opts = DemoOptions(trainers=4, verifiers=3, quorum=3, epochs=epochs, steps=4, workdir=tmp_path / "demo", timeout_s=600)
    s, log = run_network(opts, inspect=inspect, on_tick=swap)
    by_kind = {kind: addr for addr, kind in s["cheaters"].items()}
    assert sorted(by_kind) == ["planted-carry", "planted-start"], s["cheaters"]
    starter, carrier = by_kind["planted-start"], by_kind["planted-carry"]
    assert s["epochs_finalized"] == epochs, log
    # neither an honest trainer nor a verifier
    assert s["slashed"] == sorted([starter, carrier]) and seen["verifier_slashes"] == [], log
    assert (starter, 0, FAILED_AUDIT) in seen["slashes"]
    assert (carrier, 1, FAILED_AUDIT) in seen["slashes"], seen["slashes"]
    assert all(e >= 1 for t, e, _ in seen["slashes"] if t == carrier), seen["slashes"]
    # epoch 0: the planted start left out, the carrier honest and in; epochs 1, 2: the two honest trainers
    assert starter not in seen["included"][0] and carrier in seen["included"][0] and len(seen["included"][0]) == 3
    assert all(not {starter, carrier} & seen["included"][e] and len(seen["included"][e]) == 2 for e in (1, 2))
    # every epoch-1 start but the removed starter's was checked as continued, the carrier's too
    continued1 = {t: c for t, c in seen["continued1"].items() if t != starter}
    assert len(continued1) == 3 and carrier in continued1 and all(continued1.values()), seen["continued1"]
    verified = [ev for i in range(opts.verifiers) for ev in _events(opts.workdir / "logs" / f"verifier{i}.jsonl", "verified")]
    failed = [ev["failed"] for ev in verified if ev["trainer"] == starter and ev["epoch"] == 0]
    # the start check, and where the final check is drawn on a planted block, its zero buffer (the run keeps
    # the error feedback in the parameters, so the final check's file ships none: issue 47)
    assert failed and all(f[0].startswith("start:") and all(x.startswith(("start:", "final block")) for x in f)
                          for f in failed), failed
    last = block_count(preset("tiny")) - 1
    planted = _events(opts.workdir / "logs" / "trainer0.jsonl", "planting")
    assert [(ev["epoch"], ev["block"]) for ev in planted] == [(1, last)]
    carried = [ev for ev in verified if ev["trainer"] == carrier and ev["epoch"] == 1]
    assert len(carried) == opts.quorum, carried  # V = q: every verifier judged it
    for ev in carried:  # the start check naming the planted block (and the final check where it draws that block)
        assert not ev["passed"] and all(f.startswith(f"final block {last}:") for f in ev["failed"][1:]), ev
        assert ev["failed"][0].startswith("start:") and f"block(s) [{last}]" in ev["failed"][0], ev


def test_a_lazy_verifier_is_slashed_when_everyone_else_is_honest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """V3 as a network: two honest trainers, four verifiers at quorum 3 (so that the run keeps its
    quorum once the liar is gone), one of which passes everyone without fetching or replaying anything.
    Its verdicts agree with the honest ones, but its replay witness cannot: it is slashed (and
    removed) in the first epoch it is drawn for a trainer, every epoch finalizes, nobody else pays."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    swap = _swapper({"verifier2": ["--behaviour", "lazy"]})
    seen: dict[str, Any] = {}

    def inspect(chain: Chain, store: Any, run_id: int) -> None:
        seen["verifier_slashes"] = [(e.args["verifier"], e.args["epoch"]) for e in chain.events(["VerifierSlashed"], run_id=run_id)]
        seen["trainer_slashes"] = [e.args["trainer"] for e in chain.events(["Slashed"], run_id=run_id)]
        seen["list"] = chain.participants(run_id)[1]
        seen["trainers"] = {e.args["trainer"] for e in chain.events(["TrainerJoined"], run_id=run_id)}
        seen["witnesses"] = {(e.args["epoch"], e.args["verifier"], e.args["trainer"]): bytes(e.args["witness"])
                             for e in chain.events(["VerdictSubmitted"], run_id=run_id)}

    def note_and_swap(control: Control) -> None:
        seen.setdefault("lazy", control.node("verifier2").address)
        swap(control)

    opts = DemoOptions(trainers=2, verifiers=4, quorum=3, epochs=2, steps=4, workdir=tmp_path / "demo", timeout_s=480)
    s, log = run_network(opts, inspect=inspect, on_tick=note_and_swap)
    assert s["epochs_finalized"] == 2, log
    assert seen["trainer_slashes"] == [], log
    lazy = seen["lazy"]
    judged = sorted({e for (e, v, t) in seen["witnesses"] if v == lazy and t in seen["trainers"]})
    if not judged:  # drawn for no trainer in either epoch (1 in 256): it did no harm and is not slashed
        assert seen["verifier_slashes"] == [] and s["slashed"] == [], log
        return
    first = judged[0]
    # one VerifierSlashed per trainer it misjudged, all in that epoch
    assert {v for v, _ in seen["verifier_slashes"]} == {lazy} and {e for _, e in seen["verifier_slashes"]} == {first}
    assert s["slashed"] == [lazy]
    assert all(w == bytes(32) for (_, v, _), w in seen["witnesses"].items() if v == lazy)  # it had nothing to show
    if first == 0:
        assert lazy not in seen["list"]  # removed when epoch 1's audit was scheduled
    honest = [w for (e, v, t), w in seen["witnesses"].items() if e == first and v != lazy and t in seen["trainers"]]
    assert honest and all(w != bytes(32) for w in honest)


def test_a_quorum_three_run_with_one_verifier_audits_no_epoch_and_slashes_nobody(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 30 as a network: a run of quorum 3 with a single verifier. The contract refuses to
    schedule any audit (TooFewVerifiers), so no trainer is asked to respond and nobody judges: each
    epoch aborts unaudited at its deadline with nobody slashed, the nodes say why
    (`too-few-verifiers`), and `veriloco status` and `runs` call the run stalled while it runs.
    The demo refuses --verifiers below --quorum, so the test asks it for one verifier at quorum 1
    and has it publish the test's own run config, with quorum 3 (run_demo's `config`)."""
    epochs = 2
    opts = DemoOptions(trainers=2, verifiers=1, quorum=1, epochs=epochs, steps=4, windows_s=10,
                       workdir=tmp_path / "demo", timeout_s=300)
    config = opts.config().replace(audit={"quorum": 3, "test_run": False})
    devnet = str(opts.workdir / "devnet" / "devnet.json")
    asked: dict[str, Any] = {}

    def ask(control: Control) -> None:
        """Once an epoch waits in its audit phase: what the CLI says about the run."""
        if asked or control.chain.epoch_status(control.run_id, 0).phase is not Phase.AUDITING:
            return
        for cmd in (["status", "--run", str(control.run_id)], ["runs"]):
            code, out, err = run_cli(capsys, *cmd, "--json", "--devnet", devnet)
            assert code == 0, err
            asked[cmd[0]] = json.loads(out)

    seen: dict[str, Any] = {}

    def inspect(chain: Chain, store: Any, run_id: int) -> None:
        seen["slashed"] = chain.events(["Slashed", "VerifierSlashed"], run_id=run_id)
        seen["audits"] = chain.events(["AuditScheduled", "AuditStarted", "Responded", "VerdictSubmitted"], run_id=run_id)
        seen["phases"] = [chain.epoch_status(run_id, e).phase for e in range(epochs)]
        seen["revealed"] = [(chain.epoch_status(run_id, e).committed, chain.epoch_status(run_id, e).revealed)
                            for e in range(epochs)]
        seen["quorum"] = chain.run_info(run_id).params.quorum

    # each epoch's response and verdict windows pass unused: skip them once every trainer was refused
    skip = skip_unaudited(epochs)

    def ask_and_skip(control: Control) -> None:
        ask(control)
        skip(control)

    s, log = run_network(opts, inspect=inspect, on_tick=ask_and_skip, config=config)
    assert seen["quorum"] == 3 and s["verifiers"] == 1
    assert seen["phases"] == [Phase.ABORTED] * epochs, log
    # the trainers did their part (a trainer that started too late for a commit window sits that epoch out)
    assert all(0 < revealed == committed for committed, revealed in seen["revealed"]), (seen["revealed"], log)
    assert seen["audits"] == [] and s["verdicts"] == {"pass": 0, "fail": 0}, log
    assert seen["slashed"] == [] and s["slashed"] == [] and s["epochs_finalized"] == 0, log
    assert asked["status"]["run_state"] == "stalled" and "1 verifier(s) of its quorum 3" in asked["status"]["run_summary"]
    assert [r["state"] for r in asked["runs"]["runs"]] == ["stalled"]
    logs = opts.workdir / "logs"
    for name in ("verifier0", "trainer0", "trainer1", "coordinator0"):
        warned = [ev for ev in _events(logs / f"{name}.jsonl", "too-few-verifiers") if "epoch" not in ev]
        assert len(warned) == 1 and "of its quorum 3: no epoch is audited" in warned[0]["detail"], name
    for i in range(opts.trainers):
        # its tries to start each epoch's audit are refused: said once per epoch, as a warning, not an error
        refused = [ev for ev in _events(logs / f"trainer{i}.jsonl", "too-few-verifiers") if "epoch" in ev]
        assert sorted(ev["epoch"] for ev in refused) == list(range(epochs)), refused
        assert all("TooFewVerifiers" in ev["detail"] for ev in refused)
        errors = [ev["error"] for ev in _events(logs / f"trainer{i}.jsonl", "error")]
        # a try sent as the epoch aborted finds it aborted (phase 5)
        assert all(e.startswith("WrongPhase:") and "actual=5" in e for e in errors), errors
