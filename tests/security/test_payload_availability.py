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

from coordinator.build import VerifiedGlobals
from coordinator.node import CoordinatorNode
from protocol import merkle
from protocol.chain import Phase, build_response
from protocol.config import RunConfig
from protocol.digest import keccak, state_digest
from protocol.formats import build_manifest, encode_manifest, save_state
from protocol.run import initial_model, open_run, params_of, passing_trainers, publish_run
from protocol.store import LocalStore
from protocol.types import Cid
from tests.fixtures.chain import PyEvmNet
from trainer.inner import configure_determinism
from trainer.round import RoundSpec, final_transition, replay_step, start_state
from trainer.schedule import Schedule
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


def _passed_and_deleted(tmp_path: Path) -> dict[str, Any]:
    """Epoch 0 in AUDITING: the trainer passed its audit, then deleted its payload from the store."""
    configure_determinism(1)
    net = PyEvmNet(accounts=3)
    store = LocalStore(tmp_path / "store")
    cfg = RunConfig(name="availability").replace(
        data={"corpus_bytes": 200_000, "batch_size": 4, "seq_len": 32},
        schedule={"epochs": 1, "h_initial": 4, "h_min": 2, "h_max": 8},
        audit={"steps": 2, "final_check_bps": 10_000, "quorum": 1},
        stakes={"min_trainers": 1},
    )
    run_id, cfg = publish_run(net.chain(COORDINATOR), store, cfg)
    ctx = open_run(net.chain(COORDINATOR), store, run_id)
    spec = RoundSpec.from_config(cfg)
    rank, steps = Schedule(net.chain(COORDINATOR), store, ctx, spec).for_epoch(0)
    net.chain(VERIFIER).join_verifier(run_id)
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
    m = build_manifest(run_id=run_id, epoch=0, trainer=me, trace=digests, transitions=a.steps,
                       final=a.final_check, cid_of_leaf=lambda k: store.put(save_state(states[k])))
    t.respond(run_id, 0, store.put(encode_manifest(m)), build_response(digests, seed, me, 2, 10_000))

    vlog = Log()
    verifier = VerifierNode(net.chain(VERIFIER), store, run_id, tmp_path / "verifier", log=vlog)
    verifier.ctx, verifier.spec = ctx, spec  # what run() sets up before its loop
    verifier.schedule = Schedule(verifier.chain, store, ctx, spec)
    verifier._audit_epoch(0)
    assert [v["passed"] for v in vlog.events("verified")] == [True], vlog.lines
    assert verifier.keeper.held(0) == [payload]  # kept before the vote

    store.path_of(payload).unlink()  # the attack: withdraw the payload once the pass is in
    clog = Log()
    coordinator = CoordinatorNode(net.chain(COORDINATOR), store, run_id, log=clog, evaluate=False)
    coordinator.ctx = ctx
    coordinator.globals = VerifiedGlobals(coordinator.chain, store, ctx)  # what run() sets up too
    return {"net": net, "store": store, "run_id": run_id, "trainer": me, "payload": Cid(payload),
            "verifier": verifier, "vlog": vlog, "coordinator": coordinator, "clog": clog, "cfg": cfg}


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


def test_without_a_keeper_the_coordinator_waits_until_the_deadline_aborts_the_epoch(tmp_path: Path) -> None:
    w = _passed_and_deleted(tmp_path)
    coordinator, chain, run_id = w["coordinator"], w["net"].chain(COORDINATOR), w["run_id"]
    w["verifier"].keeper.release(0)  # the only passing verifier is dishonest: nobody can produce it
    assert not coordinator._try_finalize(0)
    w["net"].advance(chain.epoch_times(run_id, 0).finalize_deadline - chain.now() + 1)
    assert coordinator._try_finalize(0)  # the loop moves on instead of waiting forever
    assert chain.epoch_status(run_id, 0).phase is Phase.ABORTED
    assert w["clog"].events("aborted") == [{"epoch": 0, "reason": "content still missing at the finalize deadline"}]
