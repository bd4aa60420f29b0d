"""The start-state check as a verifier node runs it, over two epochs on in-process py-evm (T16).

Every trainer works honestly in epoch 0; in epoch 1 each starts one way and answers its audit with a
real manifest. `VerifierNode.verify` must pass the public start rules (a start that continues epoch
0, and a fresh start from G for a trainer that lost its states) and fail, on the start check alone,
a planted error buffer and a "previous epoch" borrowed from another trainer's revealed trace.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import pytest

from dilocox.inner import State, configure_determinism
from dilocox.round import RoundSpec, final_transition, replay_step, start_state
from protocol import merkle
from protocol.chain.binding import Phase, build_response
from protocol.config import RunConfig
from protocol.digest import keccak, state_digest
from protocol.formats.codec import build_state_manifest, encode_manifest, save_state
from protocol.run import initial_model, open_run, params_of, publish_run
from protocol.store.backends import LocalStore
from protocol.types import Address, Cid
from public.globals import build_global
from public.schedule import Schedule
from tests.fixtures.chain import PyEvmNet
from trainer.adversaries import plant_error_buffer
from verifier.node import VerifierNode

pytestmark = pytest.mark.integration

CREATOR, VERIFIER, FIRST_TRAINER = 0, 1, 2
# how each trainer starts epoch 1 (all are honest in epoch 0)
STARTS = ("continued", "fresh", "planted", "borrowed")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    configure_determinism(1)
    root = tmp_path_factory.mktemp("start-states")
    net = PyEvmNet(accounts=FIRST_TRAINER + len(STARTS))
    store = LocalStore(root / "store")
    cfg = RunConfig(name="start-states").replace(
        data={"corpus_bytes": 200_000, "batch_size": 4, "seq_len": 32},
        schedule={"epochs": 2, "h_initial": 2, "h_min": 1, "h_max": 4},
        audit={"steps": 1, "final_check_bps": 0, "quorum": 1, "test_run": True},  # the start check must not need the final one
        stakes={"min_trainers": 1},
    )
    creator = net.chain(CREATOR)
    run_id, cfg = publish_run(creator, store, cfg)
    ctx = open_run(creator, store, run_id)
    spec = RoundSpec.from_config(cfg)
    schedule = Schedule(creator, store, ctx, spec)
    net.chain(VERIFIER).join_verifier(run_id)
    creator.stake_coordinator(run_id)
    chains = {n: net.chain(FIRST_TRAINER + i) for i, n in enumerate(STARTS)}
    for c in chains.values():
        c.join_trainer(run_id)
    who = {n: Address(str(c.sender)) for n, c in chains.items()}
    slots = {n: c.member(run_id, who[n]).slot for n, c in chains.items()}
    g0 = params_of(initial_model(cfg))  # the one-step delay: epochs 0 and 1 both build on G_0
    traces: dict[tuple[str, int], list[State]] = {}

    node = VerifierNode(net.chain(VERIFIER), store, run_id, root / "verifier")
    node.ctx, node.spec, node.schedule = ctx, spec, Schedule(node.chain, store, ctx, spec)

    def finalize_0() -> None:
        """Epoch 1 reveals only once epoch 0 is done: the verifier judges it, the creator (coordinator)
        finalizes, and the verifier, its attestation committee, confirms the model."""
        node._audit_epoch(0)
        model, included, digest = build_global(creator, store, ctx, 0)
        assert len(included) == len(STARTS)  # every honest epoch 0 passed, start check included
        creator.finalize(run_id, 0, store.put(save_state(model)), digest, included)
        node._check_aggregate(0)

    def publish(states: list[State], k: int) -> Cid:
        return store.put(save_state(states[k]))

    def play(e: int, starts: dict[str, State], before_reveal: Callable[[], None] = lambda: None) -> dict[str, Cid]:
        """Train, commit, reveal and answer epoch e from the given start states; manifest CIDs by name."""
        rank, steps = schedule.for_epoch(e)
        reveals = {}
        for name, s in starts.items():
            c = chains[name]
            states = [s]
            for k in range(steps):
                states.append(replay_step(states[-1], spec, ctx.corpus, e, slots[name], k)[0])
            traces[name, e] = states
            pub = final_transition(s, states[-1], spec, run_id, e, slots[name], who[name], rank).publication
            digests = [state_digest(x) for x in states]
            salt = os.urandom(32)
            c.commit(run_id, e, c.commitment_for(run_id, e, keccak(pub), merkle.root(digests), len(digests), salt))
            reveals[name] = (store.put(pub), keccak(pub), merkle.root(digests), len(digests), salt)
        before_reveal()
        for name, args in reveals.items():
            chains[name].reveal(run_id, e, *args)
        seed = creator.fix_audit_seed(run_id, e)
        assert seed is not None
        manifests = {}
        for name, c in chains.items():
            digests = [state_digest(x) for x in traces[name, e]]
            a = creator.assignment(run_id, e, who[name])
            prev_of = {"continued": name, "planted": name, "borrowed": "continued"}.get(name) if e else None
            prev = traces[prev_of, e - 1] if prev_of else []
            m = build_state_manifest(
                run_id=run_id, epoch=e, trainer=who[name], trace=digests, transitions=a.transitions, final=a.final_check,
                cid_of_leaf=functools.partial(publish, traces[name, e]),
                previous_trace=[state_digest(x) for x in prev],
                previous_cid_of_leaf=functools.partial(publish, prev) if prev else None,
            )
            mcid = store.put(encode_manifest(m))
            c.respond(run_id, e, mcid, build_response(digests, seed, who[name], 1, 0))
            manifests[name] = mcid
        return manifests

    m0 = play(0, {n: start_state(spec, g0, None, None) for n in STARTS})
    assert creator.epoch_status(run_id, 0).phase is Phase.AUDITING

    def continued(name: str) -> State:
        s0, end = traces[name, 0][0], traces[name, 0][-1]
        rank0, _ = schedule.for_epoch(0)
        return start_state(spec, g0, s0, final_transition(s0, end, spec, run_id, 0, slots[name], who[name], rank0).carried)

    m1 = play(1, {
        "continued": continued("continued"),
        "fresh": start_state(spec, g0, None, None),  # revealed epoch 0, then lost its local states
        "planted": plant_error_buffer(continued("planted")),
        "borrowed": continued("continued"),  # the "continued" trainer's epoch-0 progress, claimed as its own
    }, before_reveal=finalize_0)
    return {"node": node, "who": who, "manifests": {0: m0, 1: m1}}


def _failed(world: dict[str, Any], e: int, name: str) -> list[str]:
    findings = world["node"].verify(e, world["who"][name], world["manifests"][e][name])
    assert any(f.check == "start" for f in findings), [f.to_json() for f in findings]
    return [f"{f.check}: {f.detail}" for f in findings if not f.passed]


@pytest.mark.parametrize("name", STARTS)
def test_honest_epoch_0_passes_its_start_check(world: dict[str, Any], name: str) -> None:
    assert _failed(world, 0, name) == []


@pytest.mark.parametrize("name", ["continued", "fresh"])
def test_the_public_start_rules_pass_in_epoch_1(world: dict[str, Any], name: str) -> None:
    assert _failed(world, 1, name) == []


def test_a_buffer_planted_in_epoch_1_fails_the_start_check(world: dict[str, Any]) -> None:
    failed = _failed(world, 1, "planted")
    assert len(failed) == 1 and failed[0].startswith("start:") and "start rule" in failed[0]


def test_another_trainers_previous_epoch_fails_the_start_check(world: dict[str, Any]) -> None:
    failed = _failed(world, 1, "borrowed")
    assert len(failed) == 1 and "not from the trace the trainer revealed" in failed[0]
