"""A verifier must turn anything a trainer publishes into failed findings, never a crash.

A real run on in-process py-evm with a LocalStore: one honest trainer (whose audit answer passes, so
the failures below are meaningful) and trainers whose committed traces are digests of crafted states
— wrong shapes, wrong dtypes, missing or extra entries, absurd counters or values — each answering
its audit with Merkle-valid manifests pointing at those states. `VerifierNode.verify` is called on
each answer and on garbage manifests; it must return findings with at least one failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from dilocox.inner import EF, MOM1, MOM2, PARAM, RNG, STEP, State, configure_determinism
from dilocox.round import RoundSpec, final_transition, replay_step, start_state
from protocol import merkle
from protocol.chain.binding import build_response
from protocol.config import RunConfig
from protocol.cpumeter import RPC
from protocol.digest import keccak, state_digest
from protocol.formats.codec import (
    AUDIT_FORMAT,
    build_state_manifest,
    decode_manifest,
    encode_dataclass,
    encode_manifest,
    save_state,
)
from protocol.run import initial_model, open_run, params_of, publish_run
from protocol.store.backends import LocalStore
from public.schedule import Schedule
from tests.fixtures.chain import PyEvmNet
from trainer.adversaries import plant_error_buffer
from verifier.node import VerifierNode

pytestmark = pytest.mark.integration

CREATOR, VERIFIER, FIRST_TRAINER = 0, 1, 2


def _map(s: State, prefix: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> State:
    return {k: fn(v) if k.startswith(prefix) else v for k, v in s.items()}


CRAFTED: dict[str, Callable[[State], State]] = {
    "transposed-params": lambda s: _map(s, PARAM, lambda t: t.t().contiguous() if t.dim() == 2 else t),
    "params-only": lambda s: {k: v for k, v in s.items() if k.startswith(PARAM)},
    "float64-state": lambda s: _map(s, "", lambda t: t.double() if t.is_floating_point() else t),
    "int-params": lambda s: _map(s, PARAM, lambda t: torch.ones_like(t, dtype=torch.int64)),
    "extra-entry": lambda s: {**s, "param/evil": torch.ones(3)},
    "empty-state": lambda s: {},
    "huge-values": lambda s: _map(s, PARAM, lambda t: t * 1e30),
    "huge-step": lambda s: {**s, STEP: torch.tensor([2**62])},
    "scalar-counters": lambda s: {**s, STEP: torch.tensor(3), RNG: torch.tensor(0)},
    "negative-moments": lambda s: _map(s, MOM2, lambda t: t - 1.0),
    "missing-ef": lambda s: {k: v for k, v in s.items() if not k.startswith(EF)},
    "float16-moments": lambda s: _map(s, MOM1, lambda t: t.half()),
}


# trainers that train honestly; the next two then lie about their trace length or their payload's CID,
# the last one starts from a planted error buffer (trainer/adversaries.py PlantedStartNode)
HONEST_WORK = ("honest", "short-trace", "wrong-payload-cid", "planted-start")


@dataclass
class Answer:
    trainer: str
    manifest_cid: str


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    configure_determinism(1)
    root = tmp_path_factory.mktemp("verifier-robustness")
    net = PyEvmNet(accounts=FIRST_TRAINER + len(HONEST_WORK) + len(CRAFTED))
    store = LocalStore(root / "store")
    cfg = RunConfig(name="security").replace(
        data={"corpus_bytes": 200_000, "batch_size": 4, "seq_len": 32},
        schedule={"epochs": 1, "h_initial": 4, "h_min": 2, "h_max": 8},
        audit={"steps": 2, "final_check_bps": 10_000, "quorum": 1, "test_run": True},
        stakes={"min_trainers": 1},
    )
    creator = net.chain(CREATOR)
    run_id, cfg = publish_run(creator, store, cfg)
    ctx = open_run(creator, store, run_id)
    spec = RoundSpec.from_config(cfg)
    rank, steps = Schedule(creator, store, ctx, spec).for_epoch(0)
    net.chain(VERIFIER).join_verifier(run_id)
    names = [*HONEST_WORK, *CRAFTED]
    chains = {n: net.chain(FIRST_TRAINER + i) for i, n in enumerate(names)}
    for c in chains.values():
        c.join_trainer(run_id)
    s0 = start_state(spec, params_of(initial_model(cfg)), None, None)
    traces: dict[str, list[State]] = {}
    reveals: dict[str, tuple[Any, ...]] = {}
    for name, c in chains.items():
        slot = c.member(run_id, c.sender).slot
        if name in HONEST_WORK:
            states = [plant_error_buffer(s0) if name == "planted-start" else s0]
            for k in range(steps - 2 if name == "short-trace" else steps):
                states.append(replay_step(states[-1], spec, ctx.corpus, 0, slot, k)[0])
            pub = final_transition(states[0], states[-1], spec, run_id, 0, slot, c.sender, rank).publication
        else:
            states = [s0] + [CRAFTED[name](s0)] * steps
            pub = b"VLCW" + os.urandom(64)  # its payload is garbage too
        traces[name] = states
        digests = [state_digest(s) for s in states]
        salt = os.urandom(32)
        root_ = merkle.root(digests)
        cid = store.put(b"someone else's file" if name == "wrong-payload-cid" else pub)
        c.commit(run_id, 0, c.commitment_for(run_id, 0, keccak(pub), root_, len(digests), salt))
        reveals[name] = (cid, keccak(pub), root_, len(digests), salt)
    for name, c in chains.items():
        c.reveal(run_id, 0, *reveals[name])
    seed = creator.fix_audit_seed(run_id, 0)
    assert seed is not None
    answers: dict[str, Answer] = {}
    for name, c in chains.items():
        digests = [state_digest(s) for s in traces[name]]
        a = creator.assignment(run_id, 0, c.sender)
        m = build_state_manifest(run_id=run_id, epoch=0, trainer=c.sender, trace=digests, transitions=a.transitions,
                           final=a.final_check, cid_of_leaf=lambda k, n=name: store.put(save_state(traces[n][k])))
        mcid = store.put(encode_manifest(m))
        c.respond(run_id, 0, mcid, build_response(digests, seed, c.sender, 2, 10_000))
        answers[name] = Answer(c.sender, mcid)
    node = VerifierNode(net.chain(VERIFIER), store, run_id, root / "verifier")
    # what VerifierNode.run() sets up before its loop (the loop itself never returns)
    node.ctx, node.spec = ctx, spec
    node.schedule = Schedule(node.chain, store, ctx, spec)
    return {"node": node, "answers": answers, "store": store, "run_id": run_id}


def test_honest_answer_passes(world: dict[str, Any]) -> None:
    a = world["answers"]["honest"]
    findings = world["node"].verify(0, a.trainer, a.manifest_cid)
    assert findings and all(f.passed for f in findings), [f.to_json() for f in findings if not f.passed]


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_states_fail_without_crashing(world: dict[str, Any], case: str) -> None:
    a = world["answers"][case]
    findings = world["node"].verify(0, a.trainer, a.manifest_cid)
    failed = [f for f in findings if not f.passed]
    assert failed, f"{case}: every check passed"
    assert any(f.check == "payload" for f in failed)  # the garbage payload is reported as well


@pytest.mark.parametrize("garbage", ["missing", "empty", "random", "other-trainers", "not-json-object"])
def test_garbage_manifests_fail_without_crashing(world: dict[str, Any], garbage: str) -> None:
    store, honest = world["store"], world["answers"]["honest"]
    cid = {
        "missing": "QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG",
        "empty": store.put(b""),
        "random": store.put(os.urandom(512)),
        "other-trainers": world["answers"]["huge-step"].manifest_cid,
        "not-json-object": store.put(b"[1,2,3]"),
    }[garbage]
    findings = world["node"].verify(0, honest.trainer, cid)
    assert findings and not all(f.passed for f in findings)


def test_state_that_does_not_hash_to_its_leaf_fails(world: dict[str, Any]) -> None:
    """A manifest may only name states whose digest is the proven leaf: a swapped file is a failed fetch."""
    store, honest = world["store"], world["answers"]["honest"]
    m = decode_manifest(store.get(honest.manifest_cid))
    swapped_cid = m.states[-1].cid
    states = tuple(type(s)(s.leaf_index, swapped_cid, s.digest, s.proof) for s in m.states)
    bad = store.put(encode_dataclass(type(m)(**{**m.__dict__, "states": states}), AUDIT_FORMAT))
    findings = world["node"].verify(0, honest.trainer, bad)
    assert not all(f.passed for f in findings)
    assert any("does not hash to its committed leaf" in f.detail for f in findings)


def test_a_trace_shorter_than_the_schedule_fails(world: dict[str, Any]) -> None:
    """Doing fewer inner steps than the public schedule's H: honest steps, but the leaf count lies."""
    a = world["answers"]["short-trace"]
    failed = [f for f in world["node"].verify(0, a.trainer, a.manifest_cid) if not f.passed]
    assert [f.check for f in failed] == ["leaf-count"]


def test_a_payload_cid_that_does_not_match_the_revealed_digest_fails(world: dict[str, Any]) -> None:
    a = world["answers"]["wrong-payload-cid"]
    findings = world["node"].verify(0, a.trainer, a.manifest_cid)
    assert not all(f.passed for f in findings)


def test_a_planted_start_state_fails_the_start_check_alone(world: dict[str, Any]) -> None:
    """T16: honest steps and payload from a start with a planted error buffer; the final check is
    drawn and passes, and the start check (epoch 0, recomputed from G_0, no state file) fails."""
    a = world["answers"]["planted-start"]
    findings = world["node"].verify(0, a.trainer, a.manifest_cid)
    assert [f.check for f in findings if not f.passed] == ["start"], [f.to_json() for f in findings]
    assert any(f.check == "final" and f.passed for f in findings)


def test_duties_are_read_once_per_auditing_epoch(world: dict[str, Any]) -> None:
    """Who a verifier judges and what it checks are fixed while an epoch audits: read once, not every
    poll round (a round used to ask for every revealed trainer's assignment again), and as the chain says."""
    node, run_id = world["node"], world["run_id"]
    seed = node.chain.epoch_times(run_id, 0).seed
    first = node._duties_of(0, seed)
    assert set(first) == {a.trainer for a in world["answers"].values()}  # one verifier, quorum 1: drawn to all
    reads = RPC.calls
    assert node._duties_of(0, seed) is first and RPC.calls == reads
    assert node._duties_of(0, bytes(32)) is not first and RPC.calls > reads  # another seed (a reorg): read again
    node._duties_of(0, seed)
    for t, duty in first.items():
        assert duty.assignment == node.chain.assignment(run_id, 0, t)
        assert duty.reveal["payloadCid"] == node.chain.revealed(run_id, 0, t)[0].args["payloadCid"]
