"""Every node recomputes the global model itself: a wrong finalized model changes nobody's base.

A real run on in-process py-evm with a LocalStore and real payloads: epoch 0 passes both trainers
and the coordinator finalizes the honest aggregate x 1e30, which a lying attestation committee (the
one verifier) confirms, the case the contract cannot catch; epoch 1 passes one trainer and is
finalized honestly on top of the *true* epoch-0 model. `VerifiedGlobals` must yield the true
models, name the wrong epoch once, resume from its disk cache without the payloads, reject a
corrupted cache file, and refuse (not guess) when content is missing or an epoch is still open.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from dilocox.aggregate import aggregate
from dilocox.inner import configure_determinism
from dilocox.outer import PARAM, OuterConfig, init_global
from dilocox.round import RoundSpec, final_transition, replay_step, start_state
from protocol import merkle
from protocol.chain.binding import build_response
from protocol.config import RunConfig
from protocol.digest import keccak, state_digest
from protocol.formats.payload import decode, unwrap
from protocol.run import initial_model, open_run, params_of, publish_run
from protocol.store.backends import LocalStore
from public.globals import ModelUnavailable, VerifiedGlobals, build_global
from public.schedule import Schedule
from tests.fixtures.chain import PyEvmNet

pytestmark = pytest.mark.integration

CREATOR, VERIFIER, TRAINERS = 0, 1, (2, 3)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    configure_determinism(1)
    root = tmp_path_factory.mktemp("verified-globals")
    net = PyEvmNet(accounts=4)
    store = LocalStore(root / "store")
    cfg = RunConfig(name="verified-globals").replace(
        data={"corpus_bytes": 200_000, "batch_size": 4, "seq_len": 32},
        schedule={"epochs": 3, "h_initial": 2, "h_min": 1, "h_max": 4},
        audit={"steps": 1, "final_check_bps": 10_000, "quorum": 1, "test_run": True},
        stakes={"min_trainers": 1},
    )
    creator = net.chain(CREATOR)
    run_id, cfg = publish_run(creator, store, cfg)
    ctx = open_run(creator, store, run_id)
    spec = RoundSpec.from_config(cfg)
    rank, steps = Schedule(creator, store, ctx, spec).for_epoch(0)
    verifier = net.chain(VERIFIER)
    verifier.join_verifier(run_id)
    creator.stake_coordinator(run_id)
    trainers = [net.chain(i) for i in TRAINERS]
    for c in trainers:
        c.join_trainer(run_id)
    s0 = start_state(spec, params_of(initial_model(cfg)), None, None)
    o = cfg.outer
    outer = OuterConfig(lr=o.lr, momentum=o.momentum, clip=o.clip)
    deltas: dict[int, dict[str, Any]] = {}

    def epoch(e: int, passing: set[str]) -> None:
        """Every trainer trains `steps` steps from G_0's start state, publishes, commits, reveals, responds."""
        reveals, traces = {}, {}
        for c in trainers:
            slot = c.member(run_id, c.sender).slot
            states = [s0]
            for k in range(steps):
                states.append(replay_step(states[-1], spec, ctx.corpus, e, slot, k)[0])
            pub = final_transition(s0, states[-1], spec, run_id, e, slot, c.sender, rank).publication
            deltas.setdefault(e, {})[c.sender] = decode(unwrap(pub, run_id=run_id, epoch=e, trainer=c.sender).body,
                                                        ctx.param_shapes)
            traces[c.sender] = [state_digest(s) for s in states]
            salt = os.urandom(32)
            root_ = merkle.root(traces[c.sender])
            c.commit(run_id, e, c.commitment_for(run_id, e, keccak(pub), root_, len(states), salt))
            reveals[c.sender] = (store.put(pub), keccak(pub), root_, len(states), salt)
        for c in trainers:
            c.reveal(run_id, e, *reveals[c.sender])
        seed = creator.fix_audit_seed(run_id, e)
        assert seed is not None
        for c in trainers:
            c.respond(run_id, e, store.put(b"manifest"), build_response(traces[c.sender], seed, c.sender, 1, 10_000))
        verdicts = [(c.sender, c.sender in passing, bytes(32)) for c in trainers]
        verifier.commit_verdicts(run_id, e, verdicts, b"\x01" * 32)  # the only verifier: reveals open at once
        verifier.submit_verdicts(run_id, e, verdicts, b"\x01" * 32, store.put(b"evidence"))

    everyone = {c.sender for c in trainers}
    epoch(0, everyone)
    g1 = aggregate(init_global(params_of(initial_model(cfg))), [deltas[0][t] for t in sorted(everyone, key=lambda a: int(a, 16))], outer)
    wrong = {k: v * 1e30 if k.startswith(PARAM) else v for k, v in g1.items()}
    wrong_cid = store.put(b"wrong model")
    creator.finalize(run_id, 0, wrong_cid, state_digest(wrong), sorted(everyone, key=lambda a: int(a, 16)))
    verifier.attest_model(run_id, 0, state_digest(wrong), wrong_cid)
    first = trainers[0].sender
    epoch(1, {first})
    g2 = aggregate(g1, [deltas[1][first]], outer)
    _, included, digest = build_global(creator, store, ctx, 1)
    assert included == [first] and digest == state_digest(g2)
    creator.finalize(run_id, 1, store.put(b"model 2"), digest, included)
    verifier.attest_model(run_id, 1, digest, "unused: the committee confirms the finalizer's digest")
    return {"chain": creator, "store": store, "ctx": ctx, "g1": g1, "g2": g2, "wrong": wrong, "root": root}


def test_the_bases_are_the_true_models_and_the_wrong_epoch_is_named_once(world: dict[str, Any]) -> None:
    logged: list[tuple[str, dict[str, Any]]] = []
    vg = VerifiedGlobals(world["chain"], world["store"], world["ctx"], world["root"] / "cache",
                         log=lambda event, **kv: logged.append((event, kv)))
    assert _same(vg.base(1), world["g1"])
    assert _same(vg.base(2), world["g2"])
    assert _same(vg.base(2), world["g2"])  # asked again: nothing recomputed, nothing logged again
    assert logged == [("model-mismatch", {"epoch": 0, "chain_digest": "0x" + state_digest(world["wrong"]).hex(),
                                          "recomputed_digest": "0x" + state_digest(world["g1"]).hex()})]


def test_a_restart_reads_the_cache_without_any_payload(world: dict[str, Any], tmp_path: Path) -> None:
    cache = world["root"] / "cache-restart"
    VerifiedGlobals(world["chain"], world["store"], world["ctx"], cache).base(2)
    empty = LocalStore(tmp_path / "empty")
    assert _same(VerifiedGlobals(world["chain"], empty, world["ctx"], cache).base(2), world["g2"])
    with pytest.raises(ModelUnavailable, match="payload"):
        VerifiedGlobals(world["chain"], empty, world["ctx"]).base(2)


def test_a_corrupted_cache_file_is_recomputed(world: dict[str, Any], tmp_path: Path) -> None:
    cache = world["root"] / "cache-corrupt"
    VerifiedGlobals(world["chain"], world["store"], world["ctx"], cache).base(2)
    (newest,) = cache.glob("base-000002-*.safetensors")
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0xFF
    newest.write_bytes(bytes(data))
    with pytest.raises(ModelUnavailable, match="payload"):  # the bad file is not used; recomputing needs content
        VerifiedGlobals(world["chain"], LocalStore(tmp_path / "empty"), world["ctx"], cache).base(2)
    assert _same(VerifiedGlobals(world["chain"], world["store"], world["ctx"], cache).base(2), world["g2"])


def test_an_open_epoch_has_no_base_yet(world: dict[str, Any]) -> None:
    with pytest.raises(ModelUnavailable, match="not terminal"):
        VerifiedGlobals(world["chain"], world["store"], world["ctx"]).base(3)


def test_asking_for_the_two_newest_bases_in_turn_recomputes_nothing(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verifier asks for G_{e-1} and G_e in turn for every trainer it audits: after the first
    answers, neither G_0 nor any payload nor the disk cache is read again (a model-sized cost per
    audit otherwise: on the 107B, rebuilding and hashing 428 GB per trainer audited)."""
    from public import globals as build

    vg = VerifiedGlobals(world["chain"], world["store"], world["ctx"], tmp_path / "cache")
    assert _same(vg.base(2), world["g2"]) and _same(vg.base(1), world["g1"])
    work = {"initial": 0, "read": 0, "update": 0}

    def count(name: str, f: Any) -> Any:
        def counted(*a: Any, **kw: Any) -> Any:
            work[name] += 1
            return f(*a, **kw)
        return counted

    monkeypatch.setattr(build, "initial_global", count("initial", build.initial_global))
    monkeypatch.setattr(build, "epoch_update", count("update", build.epoch_update))
    monkeypatch.setattr(vg, "_read", count("read", vg._read))
    for _ in range(3):
        assert _same(vg.base(1), world["g1"]) and _same(vg.base(2), world["g2"])
    assert work == {"initial": 0, "read": 0, "update": 0}
    assert _same(vg.base(0), build.initial_global(world["store"], world["ctx"]))  # older than the two: rebuilt
