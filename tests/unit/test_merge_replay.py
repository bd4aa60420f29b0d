"""The merge rule in the protocol (schedule.merge_step, docs/protocol.md §8): a trainer's two epochs
and a verifier's replay of them. Epoch 1 continues epoch 0's carried end state and folds in G_1 at
step m; the segment covering m replays only with G_1 and the recomputed start, and every way of
getting the merge wrong (skipping it, another model, another step) fails that segment alone."""

import dataclasses

import pytest
import torch

from dilocox.delay import MergeBase, StartRule, add_offset, merge_offset
from dilocox.inner import TrainerError, configure_determinism
from dilocox.round import RoundSpec, final_transition, replay_step, start_state, train_epoch
from protocol.config import ConfigError, RunConfig
from protocol.data import build_corpus
from protocol.digest import keccak, state_digest
from protocol.formats.payload import decode, unwrap
from protocol.model import init_params, param_shapes
from verifier.replay import check_final, check_start_state, check_step

pytestmark = pytest.mark.unit

TRAINER = "0x" + "ab" * 20
M, H = 2, 4


@pytest.fixture(scope="module")
def run():
    """Epoch 0 and 1 of one trainer under merge_step = 2, with a made-up G_1 (any public model will do)."""
    configure_determinism(1)
    cfg = RunConfig().replace(schedule={"h_initial": H, "h_min": 4, "h_max": 8, "merge_step": M})
    spec = RoundSpec.from_config(cfg)
    corpus, _ = build_corpus(max_bytes=200_000)
    g0 = init_params(spec.model, 0)
    g1 = {n: t + 1e-3 * torch.randn_like(t, generator=torch.Generator().manual_seed(1)) for n, t in g0.items()}
    s0 = start_state(spec, g0, None, None)
    t0 = train_epoch(s0, spec, corpus, 0, 1, H, merge=MergeBase(g0, s0))
    carried = final_transition(s0, t0.end, spec, 7, 0, 1, TRAINER, 4, merged=g0).carried
    s1 = start_state(spec, g0, s0, carried)
    g2 = {n: t - 1e-3 for n, t in g1.items()}
    states: list = []  # the states after steps 1..H of epoch 1
    t1 = train_epoch(s1, spec, corpus, 1, 1, H, merge=MergeBase(g1, s1), on_step=lambda k, st, _: states.append(st))
    return spec, corpus, (g0, g1, g2), (s0, t0), (s1, t1), states


def test_the_config_turns_the_rule_on_within_its_limits() -> None:
    spec = RoundSpec.from_config(RunConfig().replace(schedule={"merge_step": 1}))
    assert spec.rule is StartRule.MERGE and spec.merges_at(1, 1) and not spec.merges_at(0, 1)
    assert RoundSpec.from_config(RunConfig()).rule is StartRule.DELAYED
    for bad, why in (({"merge_step": 8}, "h_min-1"), ({"merge_step": -1}, "h_min-1"),
                     ({"merge_step": 1, "one_step_delay": False}, "one_step_delay")):
        with pytest.raises(ConfigError, match=why):
            RunConfig().replace(schedule=bad)
    assert RoundSpec.from_config(RunConfig().replace(schedule={"merge_step": 1}, audit={"unit": "shard"})).shard
    first0 = RoundSpec.from_config(RunConfig().replace(schedule={"merge_step": 2, "first_merge_step": 0}))
    assert [first0.merge_step_in(e) for e in range(3)] == [2, 0, 2] and spec.first_merge_step == -1
    assert RoundSpec.from_config(RunConfig()).merge_step_in(1) is None
    for bad in ({"first_merge_step": 0}, {"merge_step": 1, "first_merge_step": 8},
                {"merge_step": 1, "first_merge_step": -2}):
        with pytest.raises(ConfigError, match="first_merge_step"):
            RunConfig().replace(schedule=bad)
    assert b'first_merge_step' not in RunConfig().replace(schedule={"merge_step": 1}).to_json()  # old digests hold


def test_epoch_one_continues_and_merges_at_step_m(run) -> None:
    spec, corpus, (g0, g1, _), (s0, t0), (s1, t1), seen = run
    assert state_digest(s1) == state_digest(final_transition(s0, t0.end, spec, 7, 0, 1, TRAINER, 4, merged=g0).carried)
    # steps before m are plain steps from the carried state; step m folds G_1 − S_1 in first
    plain, _ = replay_step(s1, spec, corpus, 1, 1, 0)
    assert state_digest(plain) == t1.digests[1]
    at_m = seen[M - 1]
    merged, _ = replay_step(at_m, spec, corpus, 1, 1, M, merge=MergeBase(g1, s1))
    assert state_digest(merged) == t1.digests[M + 1]
    unmerged, _ = replay_step(at_m, dataclasses.replace(spec, merge_step=0), corpus, 1, 1, M)
    assert state_digest(unmerged) != t1.digests[M + 1]
    with pytest.raises(TrainerError, match="needs G_e"):
        replay_step(at_m, spec, corpus, 1, 1, M)
    # its pseudo-gradient is G_1 − E_1
    fin = final_transition(s1, t1.end, spec, 7, 1, 1, TRAINER, 4, merged=g1)
    assert check_final(s1, t1.end, keccak(fin.publication), spec, 7, 1, 1, TRAINER, 4, g1).passed
    assert not check_final(s1, t1.end, keccak(fin.publication), spec, 7, 1, 1, TRAINER, 4, g0).passed
    with pytest.raises(TrainerError, match="G_e − E_e"):
        final_transition(s1, t1.end, spec, 7, 1, 1, TRAINER, 4)


def test_the_start_check_recomputes_the_carried_state_with_the_merged_model(run) -> None:
    spec, _, (g0, g1, _), (s0, t0), (s1, _), _ = run
    f, start = check_start_state(state_digest(s1), spec, g0, s0, t0.end, 7, 1, 1, TRAINER, 4)
    assert f.passed and start is not None and state_digest(start) == state_digest(s1)
    # the carried error buffer comes from compressing G_0 − E_0: recomputed with another model it differs
    f, _ = check_start_state(state_digest(s1), spec, g1, s0, t0.end, 7, 1, 1, TRAINER, 4)
    assert not f.passed


def test_only_the_segment_covering_the_merge_needs_it_and_every_wrong_merge_fails_it(run) -> None:
    spec, corpus, (_, g1, g2), _, (s1, t1), seen = run
    by_leaf = [s1, *seen[:H]]
    good = MergeBase(g1, s1)

    def segment(k: int, steps: int, merge: MergeBase | None) -> bool:
        return check_step(by_leaf[k], k, t1.digests[k + steps], spec, corpus, 1, 1, steps=steps, merge=merge).passed

    assert segment(0, M, None) and segment(M + 1, H - M - 1, None)  # before and after the merge: plain steps
    assert segment(0, H, good) and segment(M, 1, good)
    assert not segment(M, 1, None)  # skipped
    assert not segment(M, 1, MergeBase(g2, s1))  # another model merged
    assert not segment(M, 1, MergeBase(g1, by_leaf[1]))  # measured from another base
    # a trainer that merges one step late commits a leaf after step m that an honest replay does not produce
    late, _ = replay_step(by_leaf[M], dataclasses.replace(spec, merge_step=M + 1), corpus, 1, 1, M)
    assert not check_step(by_leaf[M], M, state_digest(late), spec, corpus, 1, 1, merge=good).passed


# --- compression.error_feedback = "params" (docs/protocol.md §8) ------------------------------------


def test_error_feedback_in_the_parameters_is_a_merge_rule_option_left_out_at_its_default() -> None:
    cfg = RunConfig().replace(schedule={"merge_step": 1}, compression={"error_feedback": "params"})
    spec = RoundSpec.from_config(cfg)
    assert spec.ef_in_params and not spec.compression.error_feedback
    assert not RoundSpec.from_config(RunConfig().replace(schedule={"merge_step": 1})).ef_in_params
    assert b"error_feedback" not in RunConfig().replace(schedule={"merge_step": 1}).to_json()  # old digests hold
    assert b"error_feedback" in cfg.to_json()
    with pytest.raises(ConfigError, match="needs schedule.merge_step"):
        RunConfig().replace(compression={"error_feedback": "params"})
    with pytest.raises(ConfigError, match="'buffer' or 'params'"):
        RunConfig().replace(schedule={"merge_step": 1}, compression={"error_feedback": "none"})


def test_the_public_offset_lands_on_the_global_model_less_the_residual() -> None:
    """S_e = G_{e-1} − Δ; after d of own progress the merge gives G_e − (Δ − decode(P)) + d: the residual
    the payload left out stays in the parameters, where the next Δ = G_e − E_e picks it up."""
    gen = torch.Generator().manual_seed(3)
    shape = (6, 5)
    g_prev, g_e, delta, sent, drift = (torch.randn(shape, generator=gen) for _ in range(5))
    running = {"param/w": (g_prev - delta) + drift, "adam.m/w": torch.ones(shape)}
    merged = add_offset(running, merge_offset({"w": g_e}, {"w": g_prev}, {"w": sent}))
    assert torch.allclose(merged["param/w"], g_e - (delta - sent) + drift, atol=1e-5)
    assert torch.equal(merged["adam.m/w"], running["adam.m/w"])
    with pytest.raises(TrainerError, match="no entry"):
        add_offset({"param/v": torch.zeros(2)}, {"w": torch.zeros(2)})


def test_whole_state_audits_replay_the_public_merge_and_a_buffer_free_start() -> None:
    """Two epochs under error feedback in the parameters, whole-state audits: the carried state has no
    buffer, the start check recomputes it, the merge step replays only with the offset built from the
    trainer's own e-1 payload, and the buffer rule's merge or another payload fails it."""
    configure_determinism(1)
    cfg = RunConfig().replace(schedule={"h_initial": H, "h_min": 4, "h_max": 8, "merge_step": M},
                              compression={"error_feedback": "params"})
    spec = RoundSpec.from_config(cfg)
    corpus, _ = build_corpus(max_bytes=200_000)
    g0 = init_params(spec.model, 0)
    g1 = {n: t + 1e-3 * torch.randn_like(t, generator=torch.Generator().manual_seed(1)) for n, t in g0.items()}
    s0 = start_state(spec, g0, None, None)
    t0 = train_epoch(s0, spec, corpus, 0, 1, H, merge=MergeBase(g0, s0, lambda: merge_offset(g0, g0, None)))
    fin0 = final_transition(s0, t0.end, spec, 7, 0, 1, TRAINER, 4, merged=g0)
    assert all(not t.any() for k, t in fin0.carried.items() if k.startswith("ef/"))
    s1 = start_state(spec, g0, s0, fin0.carried)
    f, _ = check_start_state(state_digest(s1), spec, g0, s0, t0.end, 7, 1, 1, TRAINER, 4)
    assert f.passed
    own = decode(unwrap(fin0.publication).body, param_shapes(spec.model))
    good = MergeBase(g1, s1, lambda: merge_offset(g1, g0, own))
    seen: list = []
    t1 = train_epoch(s1, spec, corpus, 1, 1, H, merge=good, on_step=lambda k, st, _: seen.append(st))
    at_m = seen[M - 1]

    def replays(merge: MergeBase) -> bool:
        return check_step(at_m, M, t1.digests[M + 1], spec, corpus, 1, 1, merge=merge).passed

    assert replays(good)
    assert not replays(MergeBase(g1, s1))  # the buffer rule's G_e − S_e
    assert not replays(MergeBase(g1, s1, lambda: merge_offset(g1, g0, None)))  # as if e-1 sent nothing
    fin1 = final_transition(s1, t1.end, spec, 7, 1, 1, TRAINER, 4, merged=g1)
    assert check_final(s1, t1.end, keccak(fin1.publication), spec, 7, 1, 1, TRAINER, 4, g1).passed
