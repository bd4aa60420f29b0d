"""A passing trainer that deletes its payload cannot stall the epoch (docs/security.md T17).

A real run on in-process py-evm with one shared LocalStore: one honest trainer answers its audit,
the real `VerifierNode` passes it, and the trainer then deletes its payload from the store. The
real `CoordinatorNode` must neither crash nor finalize without it: it logs one line and waits.
The verifier's kept copy is put back (`_keep`), and the epoch finalizes with the trainer included;
without anyone to put it back, the coordinator waits until the finalize deadline aborts the epoch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from coordinator.node import CoordinatorNode
from dilocox.inner import configure_determinism
from dilocox.round import RoundSpec, final_transition, replay_step, start_state
from protocol import merkle
from protocol.chain.binding import Phase, build_response
from protocol.config import RunConfig
from protocol.digest import keccak, state_digest
from protocol.formats.codec import build_state_manifest, encode_manifest, save_state
from protocol.run import initial_model, open_run, params_of, passing_trainers, publish_run
from protocol.store.backends import LocalStore
from protocol.types import Cid
from public.globals import VerifiedGlobals
from public.schedule import Schedule
from tests.fixtures.chain import PyEvmNet
from verifier.node import VerifierNode

pytestmark = pytest.mark.integration

COORDINATOR, VERIFIER, TRAINER = 0, 1, 2


class Log:
    """A node's log, kept in memory."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))

    def events(self, name: str) -> list[dict[str, Any]]:
        return [f for e, f in self.lines if e == name]


def _passed_and_deleted(tmp_path: Path, verifiers: int = 1, committed: Any = None, **coordinator_kw: Any) -> dict[str, Any]:
    """Epoch 0 in AUDITING: the trainer passed its audit, then deleted its payload from the store.

    With two verifiers (quorum 1) the one the seed assigns is `verifier`, the other `bystander`:
    the trainer's availability committee."""
    configure_determinism(1)
    net = PyEvmNet(accounts=2 + verifiers)
    store = LocalStore(tmp_path / "store")
    cfg = RunConfig(name="availability").replace(
        data={"corpus_bytes": 200_000, "batch_size": 4, "seq_len": 32},
        schedule={"epochs": 1, "h_initial": 4, "h_min": 2, "h_max": 8},
        audit={"steps": 2, "final_check_bps": 10_000, "quorum": 1, "test_run": True},
        stakes={"min_trainers": 1},
    )
    run_id, cfg = publish_run(net.chain(COORDINATOR), store, cfg)
    ctx = open_run(net.chain(COORDINATOR), store, run_id)
    spec = RoundSpec.from_config(cfg)
    rank, steps = Schedule(net.chain(COORDINATOR), store, ctx, spec).for_epoch(0)
    vaccounts = [VERIFIER, *range(TRAINER + 1, TRAINER + verifiers)]
    for v in vaccounts:
        net.chain(v).join_verifier(run_id)
    net.chain(COORDINATOR).stake_coordinator(run_id)
    t = net.chain(TRAINER)
    t.join_trainer(run_id)
    me = t.sender
    assert me is not None
    slot = t.member(run_id, me).slot
    states = [start_state(spec, params_of(initial_model(cfg)), None, None)]
    for k in range(steps):
        states.append(replay_step(states[-1], spec, ctx.corpus, 0, slot, k)[0])
    pub = final_transition(states[0], states[-1], spec, run_id, 0, slot, me, rank).publication
    digests = [state_digest(s) for s in states]
    salt, root = os.urandom(32), merkle.root(digests)
    payload = store.put(pub)
    t.commit(run_id, 0, t.commitment_for(run_id, 0, keccak(pub), root, len(digests), salt))
    t.reveal(run_id, 0, payload, keccak(pub), root, len(digests), salt)
    seed = t.fix_audit_seed(run_id, 0)
    assert seed is not None
    a = t.assignment(run_id, 0, me)
    m = build_state_manifest(run_id=run_id, epoch=0, trainer=me, trace=digests, transitions=a.transitions,
                       final=a.final_check, cid_of_leaf=lambda k: store.put(save_state(states[k])))
    t.respond(run_id, 0, store.put(encode_manifest(m)), build_response(digests, seed, me, 2, 10_000))

    nodes: list[tuple[VerifierNode, Log]] = []
    for v in vaccounts:
        log = Log()
        node = VerifierNode(net.chain(v), store, run_id, tmp_path / f"verifier{v}", log=log)
        node.ctx, node.spec = ctx, spec  # what run() sets up before its loop
        node.schedule = Schedule(node.chain, store, ctx, spec)
        nodes.append((node, log))
    for round_ in range(2):  # judge and commit, then reveal once every verifier has committed
        for node, _log in nodes:
            node._audit_epoch(0)
        if round_ == 0 and committed is not None:
            committed(nodes)
    nodes.sort(key=lambda n: n[0].me not in a.verifiers)  # the assigned verifier first
    (verifier, vlog), others = nodes[0], nodes[1:]
    assert [v["passed"] for v in vlog.events("verified")] == [True], vlog.lines
    (ev,) = vlog.events("verified")  # its cost, split at the node's edges (protocol/cpumeter.py)
    assert ev["fetched_bytes"] > 0 and ev["rpc_calls"] > 0 and 0 <= ev["rpc_cpu_s"] + ev["store_cpu_s"] <= ev["cpu_s"] + 0.01
    assert verifier.keeper.held(0) == [payload]  # kept before the vote

    store.path_of(payload).unlink()  # the attack: withdraw the payload once the pass is in
    clog = Log()
    coordinator = CoordinatorNode(net.chain(COORDINATOR), store, run_id, log=clog, evaluate=False, **coordinator_kw)
    coordinator.ctx = ctx
    coordinator.globals = VerifiedGlobals(coordinator.chain, store, ctx)  # what run() sets up too
    return {"net": net, "store": store, "run_id": run_id, "trainer": me, "payload": Cid(payload),
            "verifier": verifier, "vlog": vlog, "coordinator": coordinator, "clog": clog, "cfg": cfg,
            "bystander": others[0] if others else None, "others": others, "publication": pub}


def test_the_verifier_puts_the_payload_back_and_the_epoch_finalizes(tmp_path: Path) -> None:
    w = _passed_and_deleted(tmp_path)
    coordinator, verifier, chain, run_id = w["coordinator"], w["verifier"], w["net"].chain(COORDINATOR), w["run_id"]
    assert not coordinator._try_finalize(0)  # no crash, no finalize without the payload
    assert not coordinator._try_finalize(0)
    missing = w["clog"].events("content-missing")
    assert len(missing) == 1 and w["payload"] in missing[0]["error"]  # one line, however long it waits
    assert chain.epoch_status(run_id, 0).phase is Phase.AUDITING

    verifier._keep()
    assert w["vlog"].events("republished") == [{"epoch": 0, "payload": w["payload"]}]
    assert coordinator._try_finalize(0)
    assert chain.epoch_status(run_id, 0).phase is Phase.CONFIRMING
    verifier._check_aggregate(0)  # the verifier is the attestation committee: it recomputes and attests
    assert [e["matches"] for e in w["vlog"].events("attested")] == [True]
    assert chain.epoch_status(run_id, 0).phase is Phase.FINALIZED
    assert chain.events(["EpochFinalized"], run_id=run_id, epoch=0)[0].args["included"] == 1
    assert passing_trainers(chain, run_id, 0) == [w["trainer"]]  # the contract's passing set, exactly
    assert "waited_for_content_s" in w["clog"].events("finalized")[0]

    verifier._check_aggregate(0)
    assert w["vlog"].events("aggregate-checked") == [{"epoch": 0, "matches": True}]
    verifier._keep()  # final and re-checked: the copy may go
    assert verifier.keeper.epochs() == [] and w["vlog"].events("released") == [{"epoch": 0}]
    assert not chain.events(["Slashed"], run_id=run_id)


def test_a_coordinator_that_loses_the_finalize_race_says_so_calmly_and_moves_on(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 46 item 9: another instance with the coordinator's key (or a stand-in past half the window)
    finalizes between this one's phase check and its transaction. The refusal is the race, not an
    error: one INFO line, no ERROR, and the next polls follow the epoch to its end."""
    from protocol.chain.binding import Chain
    from veriloco.logs import level

    w = _passed_and_deleted(tmp_path)
    coordinator, verifier, net, run_id = w["coordinator"], w["verifier"], w["net"], w["run_id"]
    verifier._keep()  # the payload is back: both instances can build the model
    twin = CoordinatorNode(Chain(net.w3, net.address, net.accounts[COORDINATOR]), w["store"], run_id, evaluate=False)
    twin.ctx, twin.globals = coordinator.ctx, VerifiedGlobals(twin.chain, w["store"], coordinator.ctx)
    send = coordinator.chain.finalize

    def raced(*args: Any, **kw: Any) -> Any:
        assert twin._try_finalize(0)  # the other instance's transaction lands first
        return send(*args, **kw)

    monkeypatch.setattr(coordinator.chain, "finalize", raced)
    assert not coordinator._try_finalize(0)
    (lost,) = w["clog"].events("finalize-lost")
    assert "finalized epoch 0 first" in lost["detail"] and level("finalize-lost", lost) == "INFO"
    assert not w["clog"].events("finalize-failed")
    verifier._check_aggregate(0)  # the committee confirms the (identical) model
    assert coordinator._try_finalize(0) and net.chain(COORDINATOR).epoch_status(run_id, 0).phase is Phase.FINALIZED


def test_without_a_keeper_the_coordinator_waits_until_the_deadline_aborts_the_epoch(tmp_path: Path) -> None:
    w = _passed_and_deleted(tmp_path)
    coordinator, chain, run_id = w["coordinator"], w["net"].chain(COORDINATOR), w["run_id"]
    w["verifier"].keeper.release(0)  # the only passing verifier is dishonest: nobody can produce it
    assert not coordinator._try_finalize(0)
    w["net"].advance(chain.epoch_times(run_id, 0).finalize_deadline - chain.now() + 1)
    assert coordinator._try_finalize(0)  # the loop moves on instead of waiting forever
    assert chain.epoch_status(run_id, 0).phase is Phase.ABORTED
    assert w["clog"].events("aborted") == [{"epoch": 0, "reason": "content still missing at the finalize deadline"}]


class Clock:
    """The coordinator's clock for how long a payload has been missing, moved by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _reported(tmp_path: Path, attack: str) -> dict[str, Any]:
    """Nobody keeps the deleted (or corrupted) payload; the coordinator reports it once past its grace."""
    clock = Clock()
    w = _passed_and_deleted(tmp_path, verifiers=2, clock=clock)
    coordinator, chain, run_id, store = w["coordinator"], w["net"].chain(COORDINATOR), w["run_id"], w["store"]
    w["verifier"].keeper.release(0)  # the passing verifier is dishonest: it keeps no copy
    if attack == "corrupted":  # bytes under the payload's name that are not its bytes
        path = store.path_of(w["payload"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"not the payload")
    for _ in range(3):  # within the grace: missing, not yet reported (it may only be slow)
        assert not coordinator._try_finalize(0)
        clock.t += 1.0
    assert chain.events(["AvailabilityReported"], run_id=run_id) == []
    assert len(w["clog"].events("content-missing")) == 1
    left = chain.epoch_times(run_id, 0).finalize_deadline - chain.now()
    clock.t += coordinator.report_after * left
    assert not coordinator._try_finalize(0)
    assert not coordinator._try_finalize(0)  # reported once
    reports = chain.events(["AvailabilityReported"], run_id=run_id)
    assert [(r.args["trainer"], r.args["reporter"]) for r in reports] == [(w["trainer"], coordinator.chain.sender)]
    assert [r["trainer"] for r in w["clog"].events("reported-unavailable")] == [w["trainer"]]
    assert chain.availability(run_id, 0, w["trainer"]).committee == []  # drawn once the report's block is past
    w["net"].advance(1)
    a = chain.availability(run_id, 0, w["trainer"])
    bystander, _ = w["bystander"]
    assert a.committee == [bystander.me] and a.decision is None  # the verifier that did not vouch for it
    return w


@pytest.mark.parametrize("attack", ["deleted", "corrupted"])
def test_a_payload_nobody_keeps_is_judged_unavailable_and_left_out(tmp_path: Path, attack: str) -> None:
    w = _reported(tmp_path, attack)
    coordinator, chain, run_id = w["coordinator"], w["net"].chain(COORDINATOR), w["run_id"]
    bystander, blog = w["bystander"]
    w["verifier"]._judge_availability(0)  # not on the committee: does nothing
    assert w["vlog"].events("availability-voted") == []
    bystander._judge_availability(0)
    bystander._judge_availability(0)  # votes once
    assert [(v["trainer"], v["available"]) for v in blog.events("availability-voted")] == [(w["trainer"], False)]
    assert chain.availability(run_id, 0, w["trainer"]).decision is False
    assert bystander.keeper.held(0) == []
    slashed = [(e.args["trainer"], e.args["reason"]) for e in chain.events(["Slashed"], run_id=run_id)]
    assert slashed == [(w["trainer"], 4)]  # SLASH_UNAVAILABLE; the reporter is not slashed
    assert [e.args["verifier"] for e in chain.events(["VerifierSlashed"], run_id=run_id)] == [w["verifier"].me]
    assert passing_trainers(chain, run_id, 0) == []
    assert coordinator._try_finalize(0)  # the aggregate leaves it out; the content bookkeeping lets it go on
    assert chain.events(["EpochFinalized"], run_id=run_id, epoch=0)[0].args["included"] == 0


def test_a_payload_that_was_only_slow_costs_the_reporter(tmp_path: Path) -> None:
    w = _reported(tmp_path, "deleted")
    coordinator, chain, run_id, store = w["coordinator"], w["net"].chain(COORDINATOR), w["run_id"], w["store"]
    bystander, blog = w["bystander"]
    assert store.put(w["publication"]) == w["payload"]  # the trainer serves it after all, late
    bystander._judge_availability(0)
    assert [(v["trainer"], v["available"]) for v in blog.events("availability-voted")] == [(w["trainer"], True)]
    assert bystander.keeper.held(0) == [w["payload"]]  # an available vote keeps the copy, like a pass
    slashed = [(e.args["trainer"], e.args["reason"]) for e in chain.events(["Slashed"], run_id=run_id)]
    assert slashed == [(coordinator.chain.sender, 5)]  # SLASH_FALSE_REPORT
    store.path_of(w["payload"]).unlink()  # gone again: the committee member puts its copy back
    bystander._keep()
    assert coordinator._try_finalize(0)
    assert chain.events(["EpochFinalized"], run_id=run_id, epoch=0)[0].args["included"] == 1


def test_past_the_coordinators_window_a_verifier_reports_and_finalizes(tmp_path: Path) -> None:
    """Liveness without the coordinator: it never runs here; a verifier that did not pass the
    trainer reports the payload past the coordinator's half of the window, the third verifier (the
    committee: neither the assigned one nor the reporter) votes, and the reporter finalizes."""
    w = _passed_and_deleted(tmp_path, verifiers=3)
    chain, run_id = w["net"].chain(COORDINATOR), w["run_id"]
    w["verifier"].keeper.release(0)
    bystander, blog = w["bystander"]
    bystander._finalize_for_a_silent_coordinator(0)  # still the coordinator's turn: nothing
    assert chain.events(["AvailabilityReported"], run_id=run_id) == []
    half = chain.epoch_times(run_id, 0).finalize_deadline - chain.run_info(run_id).params.finalize_window // 2
    w["net"].advance(half - chain.now() + 1)
    bystander._finalize_for_a_silent_coordinator(0)
    bystander._finalize_for_a_silent_coordinator(0)  # reports once
    assert [ev.args["reporter"] for ev in chain.events(["AvailabilityReported"], run_id=run_id)] == [bystander.me]
    assert len(blog.events("reported-unavailable")) == 1
    w["net"].advance(1)  # the committee is drawn from the report block's hash
    for node, _ in w["others"]:
        node._judge_availability(0)
    assert chain.availability(run_id, 0, w["trainer"]).decision is False
    bystander._finalize_for_a_silent_coordinator(0)
    assert chain.events(["EpochFinalized"], run_id=run_id, epoch=0)[0].args["included"] == 0
    assert [(e.args["trainer"], e.args["reason"]) for e in chain.events(["Slashed"], run_id=run_id)] == [(w["trainer"], 4)]


def test_a_pass_voter_puts_a_reported_payload_back_and_nobody_is_slashed(tmp_path: Path) -> None:
    """Issue 30: the report was true when made (the trainer withdrew its payload); the verifier that
    passed it still keeps a copy, puts it back and says so on chain; the committee then fetches it,
    decides "available", and neither the reporter nor anyone else is slashed."""
    w = _passed_and_deleted(tmp_path, verifiers=2)
    coordinator, chain, run_id, store = w["coordinator"], w["net"].chain(COORDINATOR), w["run_id"], w["store"]
    assert not store.has(w["payload"])
    coordinator.chain.report_unavailable(run_id, 0, w["trainer"])
    w["net"].advance(1)
    w["verifier"]._judge_availability(0)
    assert [p["trainer"] for p in w["vlog"].events("payload-put-back")] == [w["trainer"]]
    assert store.has(w["payload"])
    bystander, blog = w["bystander"]
    bystander._judge_availability(0)
    assert [(v["trainer"], v["available"]) for v in blog.events("availability-voted")] == [(w["trainer"], True)]
    assert chain.availability(run_id, 0, w["trainer"]).decision is True
    assert chain.events(["Slashed"], run_id=run_id) == []
    assert coordinator._try_finalize(0)
    assert chain.events(["EpochFinalized"], run_id=run_id, epoch=0)[0].args["included"] == 1


def test_evidence_is_published_only_after_the_reveal(tmp_path: Path) -> None:
    """Issue 30 item 6: a verifier's evidence (its pass or fail per trainer) used to be in the store
    from judging time, so a verifier yet to commit could read it and copy. Now the reveal names it and
    the store gets it only once the reveal is mined; an empty verdict list is revealed too."""
    seen: dict[str, Any] = {}

    def committed(nodes: list[tuple[VerifierNode, Log]]) -> None:
        batches = [node._done()["verdicts:0"] for node, _ in nodes]
        seen["before"] = [(b["evidence"], nodes[0][0].store.has(b["evidence"]), bool(b.get("revealed"))) for b in batches]

    w = _passed_and_deleted(tmp_path, verifiers=2, committed=committed)
    chain, run_id, store = w["net"].chain(COORDINATOR), w["run_id"], w["store"]
    # the first committed before reveals opened: unpublished; the last one's commit opened them, so it
    # revealed (and published) at once
    assert [(has, rev) for _, has, rev in seen["before"]] == [(False, False), (True, True)]
    revealed = {ev.args["verifier"]: ev.args["evidenceCid"] for ev in chain.events(["VerdictsRevealed"], run_id=run_id, epoch=0)}
    assert set(revealed) == {w["verifier"].me, w["bystander"][0].me}  # the one with nothing assigned too
    assert sorted(revealed.values()) == sorted(cid for cid, _, _ in seen["before"])
    assert all(store.has(cid) for cid in revealed.values())
