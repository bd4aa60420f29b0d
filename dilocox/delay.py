"""Where each epoch starts (docs/protocol.md §8): blocking DiLoCo or the one-step-delay overlap.

Both rules are pure functions of public data (the finalized global models) and the trainer's own
committed states of the previous epoch, so a verifier can recompute any start state and check the
"previous end → next start" transition like an inner step.

- Blocking: epoch e starts from G_e, the global model that folds in epoch e-1's update; the
  trainer waits for aggregation.
- One-step delay (default): epoch e starts from G_{e-1} − Δ_{e-1} — the latest global model a
  trainer can hold without waiting (G_{e-1} is finalized while epoch e-1 trains) plus its own
  progress of epoch e-1. Epoch e-1's averaged update lands one round late, inside G_e.
- Merge at step m (``MERGE``): epoch e continues from its own end state E_{e-1} and, after m of its
  steps, folds in G_e: params += G_e − S_e.param. Its pseudo-gradient is G_e − E_e (all H steps of
  own progress, on the fresh base). m = H is the one-step delay (up to rounding), m = 0 blocking: the
  exchange and the global update of epoch e-1 hide behind only m steps, and the trajectory is m
  steps stale instead of H.
- Eager (diagnostic, simulation only): epoch e starts from G_{e-1} − (Δ_{e-1}/K + (1 − 1/K) u),
  u = G_{e-2} − G_{e-1} the last public outer step. The own pseudo-gradient stands in for one
  trainer's share of the unknown average, the last round's step for the others' (eager updates,
  Kale et al. 2025); it starts closer to G_e when trainers' rounds differ more than consecutive
  rounds do.

In every rule, Adam moments and the step counter carry over from the end state E_{e-1}, and the error
buffer is the one the compressor left when encoding epoch e-1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from torch import Tensor

from dilocox.inner import (
    EF,
    PARAM,
    Params,
    State,
    TrainerError,
    section,
    state_from_params,
    with_section,
)

# the merge offset of error feedback in the parameters (``merge_offset``), computed when a step first merges
Offset = Callable[[], Mapping[str, Tensor]]


class StartRule(str, Enum):
    BLOCKING = "blocking"
    DELAYED = "delayed"
    EAGER = "eager"
    MERGE = "merge"

    @property
    def overlaps(self) -> bool:
        """Whether epoch e trains while epoch e-1 is aggregated (it starts before G_e exists)."""
        return self is not StartRule.BLOCKING


def global_index(rule: StartRule, epoch: int) -> int:
    """Which finalized global model G_i epoch ``epoch`` starts from."""
    if epoch < 0:
        raise TrainerError(f"epoch must be >= 0, got {epoch}")
    return epoch if rule is StartRule.BLOCKING else max(epoch - 1, 0)


def public_history_end(rule: StartRule, epoch: int) -> int:
    """Epochs ``< public_history_end`` are aggregated (their payloads public) when ``epoch`` starts.

    The adaptive rank/H rule for ``epoch`` may read only those: e-1 for blocking, e-2 with the delay.
    """
    return max(epoch - (0 if rule is StartRule.BLOCKING else 1), 0)


def merge_global(
    running: Mapping[str, Tensor], g_e: Mapping[str, Tensor], start: Mapping[str, Tensor]
) -> State:
    """The ``MERGE`` rule's mid-epoch transition: params + (G_e − S_e.param), each term fp32.

    Everything but the params carries over: the moments keep the epoch's own history."""
    s = section(start, PARAM)
    r = section(running, PARAM)
    if g_e.keys() != s.keys() or r.keys() != s.keys():
        raise TrainerError("global model and trainer state have different parameters")
    return with_section(running, PARAM, {n: r[n] + (g_e[n] - s[n]) for n in s})


def merge_offset(g_e: Mapping[str, Tensor], g_prev: Mapping[str, Tensor], own: Mapping[str, Tensor] | None) -> Params:
    """What the ``MERGE`` rule with error feedback in the parameters (``compression.error_feedback =
    "params"``) adds at its merge step: (G_e − G_{e-1}) + decode(P_{e-1}), each term fp32.

    ``own`` is the trainer's own epoch e-1 payload as everyone decodes it (None after a fresh start:
    nothing to add back).
    Since S_e = E_{e-1} = G_{e-1} − Δ_{e-1}, the merged parameters are G_e − (Δ_{e-1} − decode(P_{e-1}))
    plus the steps before the merge: the global model offset by the residual the payload left out, so
    the next Δ_e = G_e − E_e carries that residual as an error buffer would, with no buffer to carry.
    Every term is public: a verifier replays the merge without any of the trainer's start state."""
    if g_e.keys() != g_prev.keys() or (own is not None and own.keys() != g_e.keys()):
        raise TrainerError("global models and payload have different parameters")
    if own is None:
        return {n: g_e[n] - g_prev[n] for n in g_e}
    return {n: (g_e[n] - g_prev[n]) + own[n].to(g_e[n].dtype) for n in g_e}


def epoch_merge_offset(
    e: int, continued: bool, g_e: Mapping[str, Tensor], model: Callable[[int], Mapping[str, Tensor]],
    own_payload: Callable[[], Mapping[str, Tensor]],
) -> Params:
    """Epoch e's ``merge_offset`` as a trainer and its verifiers both derive it: zero at epoch 0,
    G_e − G_{e-1} after a fresh start, plus the trainer's own decoded e-1 payload (``own_payload()``,
    read only then) when it continues its epoch e-1. ``model(i)`` is the global model G_i."""
    if e == 0:
        return merge_offset(g_e, g_e, None)
    return merge_offset(g_e, model(e - 1), own_payload() if continued else None)


def add_offset(running: Mapping[str, Tensor], offset: Mapping[str, Tensor]) -> State:
    """params + offset (``merge_offset``), for the parameters ``running`` holds (a state, a stage's
    blocks or one audit block); everything but the params carries over."""
    r = section(running, PARAM)
    missing = sorted(set(r) - set(offset))
    if missing:
        raise TrainerError(f"the merge offset has no entry for parameters {missing[:3]}")
    return with_section(running, PARAM, {n: r[n] + offset[n].to(r[n].device) for n in r})


@dataclass(frozen=True)
class MergeBase:
    """What the ``MERGE`` rule folds in at its merge step: G_e, and the epoch's start state S_e
    (params + G_e − S_e.param); or, with error feedback in the parameters, the public offset
    ``offset()`` (``merge_offset``; ``start`` is then unused), computed only when a step merges."""

    global_params: Mapping[str, Tensor]
    start: Mapping[str, Tensor]
    offset: Offset | None = None

    def apply(self, running: Mapping[str, Tensor]) -> State:
        if self.offset is not None:
            return add_offset(running, self.offset())
        return merge_global(running, self.global_params, self.start)


def merged_pseudo_gradient(g_e: Mapping[str, Tensor], end: Mapping[str, Tensor]) -> Params:
    """Δ_e = G_e − E_e under ``MERGE``: the epoch's own progress measured from the base it ended on."""
    e = section(end, PARAM)
    if g_e.keys() != e.keys():
        raise TrainerError("global model and trainer state have different parameters")
    return {n: g_e[n] - e[n] for n in e}


def pseudo_gradient(start: Mapping[str, Tensor], end: Mapping[str, Tensor]) -> Params:
    """Δ = start.param − end.param (bare names, fp32): what the trainer compresses and sends."""
    s, e = section(start, PARAM), section(end, PARAM)
    if s.keys() != e.keys():
        raise TrainerError("start and end states have different parameters; they are not one epoch")
    return {n: s[n] - e[n] for n in s}


def carry(end: Mapping[str, Tensor], new_ef: Mapping[str, Tensor]) -> State:
    """The end state with the error buffer the compressor left (the state after the final transition)."""
    return with_section(end, EF, new_ef)


def first_start(global_params: Mapping[str, Tensor], rng: int = 0) -> State:
    """Epoch 0 under either rule: G_0 with zero moments, zero error buffer and step 0."""
    return state_from_params(
        global_params, rng=rng, device=next(iter(global_params.values())).device.type
    )


def blocking_start(g_e: Mapping[str, Tensor], carried: Mapping[str, Tensor]) -> State:
    """S_e: params = G_e; everything else from the carried end state of epoch e-1."""
    return with_section(carried, PARAM, {n: t.clone() for n, t in g_e.items()})


def delayed_start(
    g_prev: Mapping[str, Tensor], prev_start: Mapping[str, Tensor], carried: Mapping[str, Tensor],
    own_weight: float = 1.0,
) -> State:
    """S_e: params = G_{e-1} − Δ_{e-1}, with Δ_{e-1} = S_{e-1}.param − E_{e-1}.param computed first (fp32).

    ``own_weight`` w != 1 (a simulation-only diagnostic) starts from G_{e-1} − w Δ_{e-1}: less of the
    trainer's own progress, which is noisier than the average it stands in for."""
    delta = pseudo_gradient(prev_start, carried)
    if g_prev.keys() != delta.keys():
        raise TrainerError("global model and trainer state have different parameters")
    # w = 1 (the protocol's rule) is bitwise G_{e-1} − Δ_{e-1}: 1.0 * x is exact
    return with_section(carried, PARAM, {n: g_prev[n] - own_weight * delta[n] for n in delta})


def eager_start(
    g_prev: Mapping[str, Tensor],
    g_prev2: Mapping[str, Tensor],
    prev_start: Mapping[str, Tensor],
    carried: Mapping[str, Tensor],
    trainers: int,
) -> State:
    """S_e: params = G_{e-1} − (Δ_{e-1} / K + (1 − 1/K)(G_{e-2} − G_{e-1})), each term in fp32."""
    if trainers < 1:
        raise TrainerError(f"trainers must be >= 1, got {trainers}")
    delta = pseudo_gradient(prev_start, carried)
    if g_prev.keys() != delta.keys() or g_prev2.keys() != delta.keys():
        raise TrainerError("global models and trainer state have different parameters")
    own, rest = 1.0 / trainers, 1.0 - 1.0 / trainers
    return with_section(
        carried,
        PARAM,
        {n: g_prev[n] - (own * delta[n] + rest * (g_prev2[n] - g_prev[n])) for n in delta},
    )


def next_start(
    rule: StartRule,
    latest_global: Mapping[str, Tensor],
    prev_start: Mapping[str, Tensor] | None,
    carried: Mapping[str, Tensor] | None,
    earlier_global: Mapping[str, Tensor] | None = None,
    trainers: int = 1,
    own_weight: float = 1.0,
) -> State:
    """Start state of the next epoch; ``latest_global`` must be G_{global_index(rule, epoch)}.

    ``prev_start``/``carried`` are None for epoch 0. The eager rule also reads G_{e-2}
    (``earlier_global``, None at epoch 1, where it falls back to the delayed rule) and the number of
    trainers whose updates are averaged.
    """
    if carried is None or prev_start is None:
        return first_start(latest_global)
    if rule is StartRule.MERGE:  # continue; G_e is folded in after the merge step (merge_global)
        return {k: t.clone() for k, t in carried.items()}
    if rule is StartRule.BLOCKING:
        return blocking_start(latest_global, carried)
    if rule is StartRule.EAGER and earlier_global is not None:
        return eager_start(latest_global, earlier_global, prev_start, carried, trainers)
    return delayed_start(latest_global, prev_start, carried, own_weight)
