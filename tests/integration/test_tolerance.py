"""Tolerant mode with the calibrated bound: honest replays at another thread count pass, forgeries fail.

The bound is verifier.calibrate.CALIBRATED_TOLERANCE, chosen by benchmarks/verification.py from
measured honest divergence; this test also pins it to the committed measurement.
"""

import json
from pathlib import Path

import pytest
import torch

from dilocox.inner import PARAM, STEP, State, configure_determinism
from dilocox.round import RoundSpec, replay_step, start_state
from protocol.config import RunConfig
from protocol.data import default_corpus
from protocol.digest import state_digest
from protocol.model import init_params
from verifier import calibrate as cal
from verifier.replay import check_step

pytestmark = pytest.mark.integration

TOL = cal.CALIBRATED_TOLERANCE
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "verification.json"


@pytest.fixture(scope="module")
def tiny():
    spec = RoundSpec.from_config(RunConfig())
    corpus = default_corpus(200_000)
    return spec, corpus, start_state(spec, init_params(spec.model, 0), None, None)


def _check(spec, corpus, state: State, k: int, nxt: State, slot: int):
    return check_step(state, k, state_digest(nxt), spec, corpus, 0, slot, mode="tolerant", tolerance=TOL, next_state=nxt)


@pytest.mark.parametrize("trainer_threads, verifier_threads", [(2, 1), (1, 2)])
def test_honest_replays_across_thread_counts_pass(tiny, trainer_threads: int, verifier_threads: int) -> None:
    spec, corpus, state = tiny
    slot, non_bitwise = 11 + trainer_threads, 0
    try:
        for k in range(3):
            configure_determinism(trainer_threads)
            nxt, _ = replay_step(state, spec, corpus, 0, slot, k)
            configure_determinism(verifier_threads)
            f = _check(spec, corpus, state, k, nxt, slot)
            assert f.passed, f.detail
            non_bitwise += "within tolerance" in f.detail
            state = nxt
    finally:
        configure_determinism(1)
    assert non_bitwise > 0  # the thread change really perturbed the floats: tolerant mode was exercised


def test_forged_step_fails(tiny) -> None:
    spec, corpus, s0 = tiny
    s1, _ = replay_step(s0, spec, corpus, 0, 3, 0)
    forged = dict(s1)
    forged[STEP] = s1[STEP] + 1  # cheats.Lazy: the counter advances, nothing is trained
    f = _check(spec, corpus, s1, 1, forged, 3)
    assert not f.passed and "beyond tolerance" in f.detail


def test_nudge_beyond_the_bound_fails_and_inside_passes(tiny) -> None:
    spec, corpus, s0 = tiny
    honest, _ = replay_step(s0, spec, corpus, 0, 4, 0)
    target = init_params(spec.model, 99)
    name = max(target, key=lambda n: target[n].numel())
    for factor, ok in ((0.5, True), (2.0, False)):
        a = cal.max_nudge({PARAM + name: honest[PARAM + name]}, {name: target[name]}, factor * TOL)
        pub = dict(honest)
        pub[PARAM + name] = honest[PARAM + name] + a * (target[name] - honest[PARAM + name])
        assert not torch.equal(pub[PARAM + name], honest[PARAM + name])
        f = _check(spec, corpus, s0, 0, pub, 4)
        assert f.passed is ok, f.detail


def test_bound_matches_the_committed_calibration() -> None:
    r = json.loads(RESULTS.read_text())["calibration"]
    assert r["tolerance"] == TOL
    assert r["honest_replays"] >= 1000 and r["false_positives"] == 0
    assert max(r["max_by_condition"].values()) * cal.SAFETY_FACTOR <= TOL
    assert r["min_forged_divergence"] > 100 * TOL
