"""Attacks on verification, run through the verifier's pure checks (verifier/replay.py) on a tiny epoch.

Each test plays a trainer that cheats in one way and shows which check catches it — or, for attacks
verification cannot stop outright, measures the bound docs/security.md states (escape probability
of a sampled audit, drift under tolerant mode).
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from dilocox.aggregate import clip_scales, delta_norm
from dilocox.compress import compress
from dilocox.inner import PARAM, STEP, configure_determinism
from dilocox.round import (
    RoundSpec,
    compress_seed,
    final_transition,
    replay_step,
    start_state,
    train_epoch,
)
from protocol.chain.audit import assigned_verifiers, challenged_steps, final_check
from protocol.config import RunConfig
from protocol.data import build_corpus
from protocol.digest import keccak, state_digest
from protocol.formats.codec import (
    AUDIT_FORMAT,
    FormatError,
    build_state_manifest,
    decode_manifest,
    encode_dataclass,
    encode_manifest,
)
from protocol.formats.payload import decode, unwrap, wrap
from protocol.model import init_params
from trainer.adversaries import boost_publication, plant_error_buffer, rebind_publication
from verifier.replay import check_final, check_payload, check_start, check_step

pytestmark = pytest.mark.unit

RUN, H, RANK = 7, 8, 4
HONEST, COPIER = "0x" + "ab" * 20, "0x" + "cd" * 20
SLOT, COPIER_SLOT = 1, 2


@pytest.fixture(scope="module")
def epoch():
    """A tiny honest epoch (H=8) of trainer HONEST in slot 1, and its published payload."""
    configure_determinism(1)
    cfg = RunConfig().replace(schedule={"h_initial": H, "h_min": 4, "h_max": 16})
    spec = RoundSpec.from_config(cfg)
    corpus, _ = build_corpus(max_bytes=200_000)
    s0 = start_state(spec, init_params(spec.model, 0), None, None)
    states = [s0]
    for k in range(H):
        states.append(replay_step(states[-1], spec, corpus, 0, SLOT, k)[0])
    pub = final_transition(s0, states[-1], spec, RUN, 0, SLOT, HONEST, RANK).publication
    shapes = {k[len(PARAM):]: tuple(v.shape) for k, v in s0.items() if k.startswith(PARAM)}
    return spec, corpus, states, pub, shapes


def _escape_rate(f_steps: set[int], leaf_count: int, audit_steps: int, seeds: int = 3000) -> float:
    """Share of audit seeds whose sampled transitions all miss the forged ones."""
    rng = random.Random(1)
    miss = 0
    for _ in range(seeds):
        seed = rng.randbytes(32)
        if not f_steps & set(challenged_steps(seed, HONEST, audit_steps, leaf_count)):
            miss += 1
    return miss / seeds


@pytest.mark.parametrize("forged", [{3}, {1, 4, 6, 7}])
def test_lazy_trainer_is_caught_exactly_on_its_forged_steps(epoch, forged: set[int]) -> None:
    """Faking a fraction f of steps: each forged transition fails replay, each honest one passes, and a
    uniform sample of s transitions misses every forged one with probability (1 - f)^s."""
    spec, corpus, _, _, _ = epoch
    states = [epoch[2][0]]
    for k in range(H):
        if k in forged:  # trainer/cheats.py Lazy: advance the step counter, skip the work
            fake = dict(states[-1])
            fake[STEP] = states[-1][STEP] + 1
            states.append(fake)
        else:
            states.append(replay_step(states[-1], spec, corpus, 0, SLOT, k)[0])
    digests = [state_digest(s) for s in states]
    verdicts = {k: check_step(states[k], k, digests[k + 1], spec, corpus, 0, SLOT).passed for k in range(H)}
    assert {k for k, ok in verdicts.items() if not ok} == forged
    f = len(forged) / H
    for s in (1, 3):
        assert abs(_escape_rate(forged, H + 1, s) - (1 - f) ** s) < 0.035


def test_noise_payload_is_well_formed_but_fails_the_final_check(epoch) -> None:
    spec, _, states, _, shapes = epoch
    g = torch.Generator().manual_seed(5)
    noise = {n: torch.randn(s, generator=g) * 0.05 for n, s in shapes.items()}
    body = compress(noise, {}, RANK, compress_seed(spec.run_seed, 0, SLOT), spec.compression).payload
    pub = wrap(RUN, 0, HONEST, body)
    assert check_payload(pub, RUN, 0, HONEST, shapes).passed  # shape and binding checks cannot tell
    f = check_final(states[0], states[-1], keccak(pub), spec, RUN, 0, SLOT, HONEST, RANK)
    assert not f.passed and "does not give the revealed payload" in f.detail


def test_forged_final_payload_escapes_only_when_the_final_check_is_not_drawn(epoch) -> None:
    """Honest steps, boosted payload: every step check passes; only the final replay catches it."""
    spec, corpus, states, pub, shapes = epoch
    forged = boost_publication(pub, RUN, 0, HONEST, shapes, 25.0)
    digests = [state_digest(s) for s in states]
    assert all(check_step(states[k], k, digests[k + 1], spec, corpus, 0, SLOT).passed for k in range(H))
    assert check_payload(forged, RUN, 0, HONEST, shapes).passed
    assert not check_final(states[0], states[-1], keccak(forged), spec, RUN, 0, SLOT, HONEST, RANK).passed
    assert check_final(states[0], states[-1], keccak(pub), spec, RUN, 0, SLOT, HONEST, RANK).passed
    # the payload format bounds nothing but finiteness: the forged update is 25x the honest one
    honest = decode(unwrap(pub).body, shapes)
    boosted = decode(unwrap(forged).body, shapes)
    ratio = sum(float(boosted[n].norm()) for n in shapes) / sum(float(honest[n].norm()) for n in shapes)
    assert ratio == pytest.approx(25.0, rel=1e-4)
    # escape probability per epoch is 1 - finalCheckBps / 10 000
    rng = random.Random(2)
    for bps in (5_000, 9_000, 10_000):
        drawn = sum(final_check(rng.randbytes(32), HONEST, bps) for _ in range(4000)) / 4000
        assert abs(drawn - bps / 10_000) < 0.03


def test_payload_copied_after_its_reveal(epoch) -> None:
    """The wrapper binds the copy to its author; re-binding it passes the format check but not the
    final replay from the copier's own end state."""
    spec, corpus, states, pub, shapes = epoch
    assert not check_payload(pub, RUN, 1, COPIER, shapes).passed  # as published: someone else's
    stolen = rebind_publication(pub, RUN, 1, COPIER)
    assert check_payload(stolen, RUN, 1, COPIER, shapes).passed
    own = train_epoch(states[0], spec, corpus, epoch=1, slot=COPIER_SLOT, steps=2)
    f = check_final(states[0], own.end, keccak(stolen), spec, RUN, 1, COPIER_SLOT, COPIER, RANK)
    assert not f.passed


@pytest.mark.parametrize("share", [0.9, 1.1])
def test_tolerance_abuse_passes_every_step_and_accumulates(epoch, share: float) -> None:
    """Nudging every step by `share` of the tolerant bound towards a target: just inside, every replay
    passes and, over this short epoch, the end state drifts about H times one step's allowance (long
    epochs amplify it further, docs/results-verification.md); just outside, the first step fails."""
    spec, corpus, honest, _, _ = epoch
    tol = 1e-3
    name = next(k for k in honest[0] if k.startswith(PARAM) and honest[0][k].dim() == 2)
    g = torch.Generator().manual_seed(9)
    target = torch.randn(honest[0][name].shape, generator=g)
    states = [honest[0]]
    results = []
    for k in range(H):
        replayed = replay_step(states[-1], spec, corpus, 0, SLOT, k)[0]
        nudged = dict(replayed)
        r = replayed[name]
        u = (target - r) / (target - r).norm()
        nudged[name] = r + share * tol * r.norm() * u
        f = check_step(states[-1], k, state_digest(nudged), spec, corpus, 0, SLOT, mode="tolerant",
                       tolerance=tol, next_state=nudged)
        results.append(f.passed)
        assert not check_step(states[-1], k, state_digest(nudged), spec, corpus, 0, SLOT).passed  # exact mode
        states.append(nudged)
    if share > 1:
        assert not any(results)
        return
    assert all(results)
    drift = float((states[-1][name] - honest[-1][name]).norm() / honest[-1][name].norm())
    assert 2 * tol < drift <= 1.2 * H * tol  # accumulates past one step's bound, but linearly at most
    towards = float(((states[-1][name] - honest[-1][name]) * (target - honest[-1][name])).sum())
    assert towards > 0  # and it goes where the attacker wants


def test_manifest_with_states_that_do_not_match_the_trace(epoch) -> None:
    """An answer whose states are not the committed leaves cannot be encoded or decoded as a manifest."""
    _, _, states, _, _ = epoch
    digests = [state_digest(s) for s in states]
    cids = {i: "QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG" for i in range(H + 1)}
    m = build_state_manifest(run_id=RUN, epoch=0, trainer=HONEST, trace=digests, transitions=[2], final=True,
                       cid_of_leaf=cids)
    assert decode_manifest(encode_manifest(m)) == m
    lie = keccak(os.urandom(8))
    forged_states = tuple(type(x)(x.leaf_index, x.cid, lie if x.leaf_index == 2 else x.digest, x.proof) for x in m.states)
    forged_ends = tuple(type(x)(x.leaf_index, x.cid, lie, x.proof) for x in m.ends)  # leaf 3, proven by digest
    for bad, where in (({"states": forged_states}, "state 2"), ({"ends": forged_ends}, "end 3")):
        forged = type(m)(**{**m.__dict__, **bad})
        with pytest.raises(FormatError, match=f"{where}: Merkle proof"):
            encode_manifest(forged)
        with pytest.raises(FormatError, match=f"{where}: Merkle proof"):
            decode_manifest(encode_dataclass(forged, AUDIT_FORMAT))
    withheld = type(m)(**{**m.__dict__, "states": tuple(x for x in m.states if x.leaf_index != 2)})
    with pytest.raises(FormatError, match="need exactly"):
        decode_manifest(encode_dataclass(withheld, AUDIT_FORMAT))


def test_verifiers_that_join_back_to_back_gain_nothing() -> None:
    """V2: the q verifiers of a trainer are distinct draws of a shuffle keyed by the seed (docs/protocol.md
    §5), so two colluders who join one after the other judge the same trainer with the 2/(V(V-1)) of
    any pair. (With q consecutive list entries from a random offset, the earlier rule, it was 1/V.)"""
    verifiers = ["0x" + f"{i:040x}" for i in range(1, 9)]  # V = 8, join order
    colluders = {verifiers[3], verifiers[4]}  # joined one after the other (all-digit addresses: checksum-neutral)
    rng = random.Random(4)
    n = 8000
    draws = [assigned_verifiers(rng.randbytes(32), HONEST, verifiers, 2) for _ in range(n)]
    assert all(len(set(d)) == 2 for d in draws)
    together = sum(set(d) == colluders for d in draws) / n
    assert abs(together - 2 / (8 * 7)) < 0.012  # 3.6%, not the 12.5% of adjacent entries
    scattered = {verifiers[0], verifiers[5]}
    assert abs(sum(set(d) == scattered for d in draws) / n - together) < 0.015
    firsts = [sum(d[0] == v for d in draws) / n for v in verifiers]
    assert max(abs(p - 1 / 8) for p in firsts) < 0.025  # every position equally likely


def test_one_forged_transition_steers_the_payload_past_the_final_check(epoch) -> None:
    """The payload is a function of leaves 0 and L-1 only: a trainer that swaps in an end state of its
    choosing and encodes *that* honestly passes the final check and every step but the last one, so
    it escapes with the lazy bound for f = 1/H, whatever q_final is."""
    spec, corpus, states, pub, shapes = epoch
    start, end = states[0], states[-1]
    steered = {k: (start[k] - 25.0 * (start[k] - v) if k.startswith(PARAM) else v) for k, v in end.items()}
    forged = states[:-1] + [steered]
    digests = [state_digest(s) for s in forged]
    fin = final_transition(start, steered, spec, RUN, 0, SLOT, HONEST, RANK).publication
    assert check_final(start, steered, keccak(fin), spec, RUN, 0, SLOT, HONEST, RANK).passed
    assert check_payload(fin, RUN, 0, HONEST, shapes).passed
    failing = {k for k in range(H) if not check_step(forged[k], k, digests[k + 1], spec, corpus, 0, SLOT).passed}
    assert failing == {H - 1}
    honest = decode(unwrap(pub).body, shapes)
    big = decode(unwrap(fin).body, shapes)
    ratio = sum(float(big[n].norm()) for n in shapes) / sum(float(honest[n].norm()) for n in shapes)
    assert ratio > 20
    assert abs(_escape_rate({H - 1}, H + 1, 2) - (1 - 1 / H) ** 2) < 0.035  # 77% for H = 8, s = 2
    # what an escape buys: with the run default outer.clip = 2, the steered payload enters the mean
    # at no more than twice an honest norm (three honest trainers beside it)
    others = [{n: t * f for n, t in honest.items()} for f in (0.9, 1.0, 1.1)]
    clip = RunConfig().outer.clip
    scales = clip_scales([big, *others], clip)
    assert scales[1:] == [1.0, 1.0, 1.0] and scales[0] < 1
    assert delta_norm({n: t * scales[0] for n, t in big.items()}) <= clip * delta_norm(others[1])


def test_a_planted_start_state_is_caught_in_the_epoch_it_is_planted(epoch) -> None:
    """T16: epoch 0 from G_0 with a planted error buffer, then honest work. Every step and the final
    check pass (they replay from the planted state) and the payload carries the planted direction;
    only the start check fails it, and it runs in every audit. From epoch 1 on the continued rule
    carries an unchecked buffer forward faithfully, which is why epoch 0 itself must be checked;
    a buffer planted in epoch 1 fails that epoch's start check, continued or claimed fresh."""
    spec, corpus, honest, _, shapes = epoch
    g0 = init_params(spec.model, 0)
    planted = [plant_error_buffer(honest[0])]
    for k in range(2):
        planted.append(replay_step(planted[-1], spec, corpus, 0, SLOT, k)[0])
    digests = [state_digest(s) for s in planted]
    assert all(check_step(planted[k], k, digests[k + 1], spec, corpus, 0, SLOT).passed for k in range(2))
    fin0 = final_transition(planted[0], planted[-1], spec, RUN, 0, SLOT, HONEST, RANK)
    assert check_final(planted[0], planted[-1], keccak(fin0.publication), spec, RUN, 0, SLOT, HONEST, RANK).passed
    honest_fin = final_transition(honest[0], honest[2], spec, RUN, 0, SLOT, HONEST, RANK).publication
    extra = {n: t - decode(unwrap(honest_fin).body, shapes)[n] for n, t in decode(unwrap(fin0.publication).body, shapes).items()}
    towards = sum(float((extra[n] * g0[n]).sum()) for n in shapes)
    assert towards > 0  # the payload moves the model where the planted buffer points (towards zero)
    # epoch 0: the manifest proves leaf 0 by digest in every audit; the verifier recomputes the start
    m = build_state_manifest(run_id=RUN, epoch=0, trainer=HONEST, trace=digests, transitions=[1], final=False,
                       cid_of_leaf=lambda k: "QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG")
    assert m.start.digest == digests[0]
    f = check_start(m.start.digest, spec, g0, None, None, RUN, 0, SLOT, HONEST, 0)
    assert not f.passed and "error buffer" in f.detail
    assert check_start(state_digest(honest[0]), spec, g0, None, None, RUN, 0, SLOT, HONEST, 0).passed
    # epoch 1 continued from the planted epoch 0: the rule alone cannot tell
    carried0 = fin0.carried
    assert check_start(state_digest(start_state(spec, g0, planted[0], carried0)), spec, g0, planted[0], planted[-1],
                       RUN, 1, SLOT, HONEST, RANK).passed
    # epoch 1 planted on top of an honest epoch 0: continued, or claimed as a fresh start
    s1 = start_state(spec, g0, honest[0], final_transition(honest[0], honest[-1], spec, RUN, 0, SLOT, HONEST, RANK).carried)
    assert check_start(state_digest(s1), spec, g0, honest[0], honest[-1], RUN, 1, SLOT, HONEST, RANK).passed
    assert not check_start(state_digest(plant_error_buffer(s1)), spec, g0, honest[0], honest[-1],
                           RUN, 1, SLOT, HONEST, RANK).passed
    fresh1 = start_state(spec, g0, None, None)
    assert check_start(state_digest(fresh1), spec, g0, None, None, RUN, 1, SLOT, HONEST, 0).passed  # lost its state
    assert not check_start(state_digest(plant_error_buffer(fresh1)), spec, g0, None, None, RUN, 1, SLOT, HONEST, 0).passed
