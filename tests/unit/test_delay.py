"""Start-state rules of docs/protocol.md §8: which global each epoch uses and how the state carries over."""

import pytest
import torch

from dilocox.delay import (
    StartRule,
    blocking_start,
    carry,
    delayed_start,
    first_start,
    global_index,
    merge_global,
    merged_pseudo_gradient,
    next_start,
    pseudo_gradient,
    public_history_end,
)
from dilocox.inner import EF, MOM1, PARAM, STEP, TrainerError, section, state_from_params
from protocol.digest import state_digest

pytestmark = pytest.mark.unit


def _params(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)}


def _end(start: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A stand-in 'trained' end state: params moved, moments and step changed."""
    end = dict(start)
    for n, p in _params(seed).items():
        end[PARAM + n] = start[PARAM + n] + 0.1 * p
        end[MOM1 + n] = p
    end[STEP] = start[STEP] + 5
    return end


def test_global_index_and_history() -> None:
    assert [global_index(StartRule.BLOCKING, e) for e in range(4)] == [0, 1, 2, 3]
    assert [global_index(StartRule.DELAYED, e) for e in range(4)] == [0, 0, 1, 2]
    assert [public_history_end(StartRule.BLOCKING, e) for e in range(4)] == [0, 1, 2, 3]
    assert [public_history_end(StartRule.DELAYED, e) for e in range(4)] == [0, 0, 1, 2]
    with pytest.raises(TrainerError):
        global_index(StartRule.DELAYED, -1)


def test_first_start_is_fresh() -> None:
    g0 = _params(0)
    s = first_start(g0)
    assert torch.equal(s[PARAM + "w"], g0["w"]) and int(s[STEP]) == 0
    assert not s[EF + "w"].any() and not s[MOM1 + "w"].any()
    assert state_digest(next_start(StartRule.DELAYED, g0, None, None)) == state_digest(s)


def test_blocking_start_takes_global_params_and_carries_the_rest() -> None:
    s0 = first_start(_params(0))
    e0 = _end(s0, 1)
    new_ef = {n: torch.full_like(t, 0.5) for n, t in section(s0, PARAM).items()}
    c = carry(e0, new_ef)
    g1 = _params(2)
    s1 = blocking_start(g1, c)
    assert torch.equal(s1[PARAM + "w"], g1["w"])
    assert torch.equal(s1[MOM1 + "w"], e0[MOM1 + "w"]) and int(s1[STEP]) == 5
    assert torch.equal(s1[EF + "b"], new_ef["b"])
    g1["w"].add_(1.0)  # the start state must not alias the caller's global tensors
    assert not torch.equal(s1[PARAM + "w"], g1["w"])


def test_delayed_start_is_previous_global_minus_own_delta() -> None:
    g0 = _params(0)
    s0 = first_start(g0)
    e0 = _end(s0, 1)
    c0 = carry(e0, section(e0, EF))
    d0 = state_digest(c0)
    s1 = delayed_start(g0, s0, c0)
    assert state_digest(c0) == d0  # pure
    delta = pseudo_gradient(s0, c0)
    assert torch.equal(s1[PARAM + "w"], g0["w"] - delta["w"])  # exact op order of the spec
    torch.testing.assert_close(s1[PARAM + "w"], e0[PARAM + "w"])  # with S_0 = G_0 it is E_0
    # epoch 2: the newer global replaces the old base, own progress is kept
    e1 = _end(s1, 3)
    g1 = _params(4)
    s2 = next_start(StartRule.DELAYED, g1, s1, carry(e1, section(e1, EF)))
    torch.testing.assert_close(s2[PARAM + "b"], g1["b"] - (s1[PARAM + "b"] - e1[PARAM + "b"]))
    assert int(s2[STEP]) == 10
    half = next_start(StartRule.DELAYED, g1, s1, carry(e1, section(e1, EF)), own_weight=0.5)
    torch.testing.assert_close(half[PARAM + "b"], g1["b"] - 0.5 * (s1[PARAM + "b"] - e1[PARAM + "b"]))


def test_eager_start_mixes_own_delta_with_the_last_outer_step() -> None:
    g0, g1 = _params(0), _params(5)
    s1 = first_start(g0)
    e1 = _end(s1, 3)
    c1 = carry(e1, section(e1, EF))
    own = pseudo_gradient(s1, c1)
    s2 = next_start(StartRule.EAGER, g1, s1, c1, earlier_global=g0, trainers=4)
    want = g1["w"] - (0.25 * own["w"] + 0.75 * (g0["w"] - g1["w"]))
    assert torch.equal(s2[PARAM + "w"], want)
    assert int(s2[STEP]) == int(e1[STEP]) and StartRule.EAGER.overlaps and not StartRule.BLOCKING.overlaps
    # without G_{e-2} (epoch 1) it is the delayed rule
    assert torch.equal(next_start(StartRule.EAGER, g1, s1, c1, None, 4)[PARAM + "b"],
                       delayed_start(g1, s1, c1)[PARAM + "b"])
    with pytest.raises(TrainerError, match="trainers"):
        next_start(StartRule.EAGER, g1, s1, c1, earlier_global=g0, trainers=0)


def test_merge_rule_continues_then_swaps_the_stale_base_for_the_fresh_global() -> None:
    g0, g1 = _params(0), _params(6)
    s0 = first_start(g0)
    c0 = carry(_end(s0, 1), section(s0, EF))
    s1 = next_start(StartRule.MERGE, g0, s0, c0)  # epoch 1 continues from its own end state
    assert state_digest(s1) == state_digest(c0) and s1[PARAM + "w"] is not c0[PARAM + "w"]
    assert StartRule.MERGE.overlaps and global_index(StartRule.MERGE, 1) == 0
    assert public_history_end(StartRule.MERGE, 2) == 1  # e-1 is still being aggregated at the start
    mid = _end(s1, 7)  # m steps into epoch 1
    merged = merge_global(mid, g1, s1)
    assert torch.equal(merged[PARAM + "w"], mid[PARAM + "w"] + (g1["w"] - s1[PARAM + "w"]))
    assert torch.equal(merged[MOM1 + "b"], mid[MOM1 + "b"]) and int(merged[STEP]) == int(mid[STEP])
    end = _end(merged, 8)
    assert torch.equal(merged_pseudo_gradient(g1, end)["b"], g1["b"] - end[PARAM + "b"])
    # merging before the first step is the blocking start; at the end, the one-step delay
    torch.testing.assert_close(merge_global(s1, g1, s1)[PARAM + "w"], blocking_start(g1, c0)[PARAM + "w"])
    e1 = _end(s1, 9)
    late = merge_global(e1, g1, s1)
    torch.testing.assert_close(late[PARAM + "w"], delayed_start(g1, s1, e1)[PARAM + "w"])
    torch.testing.assert_close(merged_pseudo_gradient(g1, late)["w"], pseudo_gradient(s1, e1)["w"])
    with pytest.raises(TrainerError, match="different parameters"):
        merge_global(mid, {"w": g1["w"]}, s1)


def test_mismatched_states_are_errors() -> None:
    s = state_from_params(_params(0))
    other = state_from_params({"w": torch.zeros(4, 3)})
    with pytest.raises(TrainerError, match="different parameters"):
        pseudo_gradient(s, other)
    with pytest.raises(TrainerError, match="different parameters"):
        delayed_start({"w": torch.zeros(4, 3)}, s, s)
