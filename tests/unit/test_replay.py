"""A trainer epoch and the verifier's replay of it: honest work passes every check, forgeries fail."""

import pytest
import torch

from dilocox.inner import EF, MOM1, MOM2, PARAM, RNG, STEP, configure_determinism
from dilocox.round import RoundSpec, final_transition, start_state, train_epoch
from protocol.config import RunConfig
from protocol.data import build_corpus
from protocol.digest import keccak, state_digest
from protocol.model import init_params
from verifier.replay import check_final, check_leaf_count, check_payload, check_start, check_step

pytestmark = pytest.mark.unit

TRAINER = "0x" + "ab" * 20


@pytest.fixture(scope="module", params=["tiny", "llama-tiny"])
def setup(request):
    """One honest epoch, for each architecture: every check below holds for GPT-2 and Llama alike."""
    configure_determinism(1)
    cfg = RunConfig().replace(schedule={"h_initial": 8, "h_min": 4, "h_max": 16}, model={"preset": request.param})
    spec = RoundSpec.from_config(cfg)
    corpus, _ = build_corpus(max_bytes=200_000)
    g0 = init_params(spec.model, 0)
    s0 = start_state(spec, g0, None, None)
    trace = train_epoch(s0, spec, corpus, epoch=0, slot=1, steps=4)
    return spec, corpus, g0, s0, trace


def test_honest_steps_replay_bitwise(setup) -> None:
    spec, corpus, _, s0, trace = setup
    again = train_epoch(s0, spec, corpus, epoch=0, slot=1, steps=4)
    assert again.digests == trace.digests and len(trace.digests) == 5
    f = check_step(s0, 0, trace.digests[1], spec, corpus, 0, 1)
    assert f.passed, f.detail


def test_wrong_batch_or_forged_state_fails(setup) -> None:
    spec, corpus, _, s0, trace = setup
    assert not check_step(s0, 0, trace.digests[1], spec, corpus, 0, slot=2).passed  # another trainer's shard
    forged = dict(s0)
    name = next(k for k in s0 if k.startswith(PARAM))
    forged[name] = s0[name] + 1e-3
    assert not check_step(forged, 0, trace.digests[1], spec, corpus, 0, 1).passed


def test_tolerant_mode_accepts_tiny_noise_and_rejects_large(setup) -> None:
    spec, corpus, _, s0, _ = setup
    from dilocox.round import replay_step

    nxt, _ = replay_step(s0, spec, corpus, 0, 1, 0)
    name = next(k for k in nxt if k.startswith(PARAM))
    for eps, ok in ((1e-7, True), (1e-1, False)):
        noisy = dict(nxt)
        noisy[name] = nxt[name] * (1 + eps)
        f = check_step(s0, 0, keccak(b"other"), spec, corpus, 0, 1, mode="tolerant", tolerance=1e-5, next_state=noisy)
        assert f.passed is ok, f.detail


def test_final_and_payload_checks(setup) -> None:
    spec, _, _, s0, trace = setup
    fin = final_transition(s0, trace.end, spec, 7, 0, 1, TRAINER, rank=4)
    assert check_final(s0, trace.end, keccak(fin.publication), spec, 7, 0, 1, TRAINER, 4).passed
    assert not check_final(s0, trace.end, keccak(fin.publication), spec, 7, 0, 1, TRAINER, 2).passed
    shapes = {k[len(PARAM):]: tuple(v.shape) for k, v in s0.items() if k.startswith(PARAM)}
    assert check_payload(fin.publication, 7, 0, TRAINER, shapes).passed
    assert not check_payload(fin.publication, 7, 1, TRAINER, shapes).passed  # replayed into another epoch
    assert not check_payload(fin.publication[:-3], 7, 0, TRAINER, shapes).passed
    assert not check_payload(b"garbage", 7, 0, TRAINER, shapes).passed


def test_start_rule_check(setup) -> None:
    spec, _, g0, s0, trace = setup
    carried = final_transition(s0, trace.end, spec, 7, 0, 1, TRAINER, rank=4).carried
    s1 = start_state(spec, g0, s0, carried)
    assert check_start(state_digest(s1), spec, g0, s0, trace.end, 7, 1, 1, TRAINER, 4).passed
    poisoned = dict(s1)
    name = next(k for k in s1 if k.startswith(PARAM))
    poisoned[name] = s1[name] + torch.ones_like(s1[name])
    assert not check_start(state_digest(poisoned), spec, g0, s0, trace.end, 7, 1, 1, TRAINER, 4).passed
    # a continued start is not a fresh one, and the other way round
    assert not check_start(state_digest(s1), spec, g0, None, None, 7, 1, 1, TRAINER, 0).passed
    assert not check_start(state_digest(s0), spec, g0, s0, trace.end, 7, 1, 1, TRAINER, 4).passed


@pytest.mark.parametrize("component", [PARAM, MOM1, MOM2, EF, STEP, RNG])
def test_fresh_start_check_covers_every_component(setup, component: str) -> None:
    """Epoch 0 (and any fresh start) is G with zero moments, zero error buffer, step 0, rng 0: a
    function of G alone, checked by digest, so a change in any one component fails."""
    spec, _, g0, s0, _ = setup
    assert check_start(state_digest(s0), spec, g0, None, None, 7, 0, 1, TRAINER, 0).passed
    planted = {k: v + 1 if k.startswith(component) else v for k, v in s0.items()}
    assert any(k.startswith(component) for k in s0)
    f = check_start(state_digest(planted), spec, g0, None, None, 7, 0, 1, TRAINER, 0)
    assert not f.passed and "not the fresh start" in f.detail


def test_leaf_count() -> None:
    assert check_leaf_count(9, 8).passed and not check_leaf_count(3, 8).passed


def test_segment_replay_covers_every_step_it_spans(setup) -> None:
    spec, corpus, _, s0, trace = setup
    assert check_step(s0, 0, trace.digests[3], spec, corpus, 0, 1, steps=3).passed
    assert not check_step(s0, 0, trace.digests[2], spec, corpus, 0, 1, steps=3).passed  # wrong end leaf


def test_replay_witness_is_reproducible_private_and_leaves_the_step_unchanged(setup) -> None:
    """Two replays of the same steps give the same witness; the witness is none of the published
    state digests; watching the gradients leaves the trainer's digests bit-identical."""
    from verifier.replay import NO_WITNESS, replay_witness

    spec, corpus, _, s0, trace = setup
    runs = []
    for _ in range(2):
        digests: list[bytes] = []
        f = check_step(s0, 0, trace.digests[2], spec, corpus, 0, 1, steps=2, grad_digests=digests)
        assert f.passed, f.detail
        runs.append(digests)
    assert len(runs[0]) == 2 and runs[0] == runs[1]
    w = replay_witness(runs[0])
    assert len(w) == 32 and w != NO_WITNESS and w not in trace.digests
    assert replay_witness([]) == NO_WITNESS
    other: list[bytes] = []
    check_step(s0, 0, trace.digests[1], spec, corpus, 0, slot=2, grad_digests=other)  # another shard
    assert replay_witness(other) != replay_witness(runs[0][:1])


@pytest.mark.parametrize(
    "preset_name", ["small", "llama-small", pytest.param("llama-125m", marks=pytest.mark.slow)]
)
def test_larger_presets_replay_one_step_bitwise(preset_name: str) -> None:
    """Bitwise replay does not depend on size: one step of the larger presets (up to llama-125m,
    76M parameters, what this CPU box trains in seconds) replays to the same digest."""
    configure_determinism(1)
    cfg = RunConfig().replace(model={"preset": preset_name}, data={"batch_size": 2, "seq_len": 128})
    spec = RoundSpec.from_config(cfg)
    corpus, _ = build_corpus(max_bytes=200_000)
    s0 = start_state(spec, init_params(spec.model, 0), None, None)
    trace = train_epoch(s0, spec, corpus, epoch=0, slot=1, steps=1)
    assert trace.digests[1] != trace.digests[0]
    f = check_step(s0, 0, trace.digests[1], spec, corpus, 0, 1)
    assert f.passed, f.detail
