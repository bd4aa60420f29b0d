"""A sharded trainer's answer to an audit (docs/protocol.md §5.3): which files, built from its engine.

The engine holds the state (trainer/engine.py); this module only decides what an audit reveals:
for each drawn segment, one block's parameters and moments at its first state leaf and, at every step,
the boundary tensors it consumed on the drawn group's rows, its running gradient sums around that
group, and the group leaves that bind them (checked against the trainer's own leaves before it goes
out); for the final
check, one block's parameters at the first leaf and its parameters and error buffer at the last; for the
start check of a continued start, the same of epoch e-1 for every block (no first-leaf parameters under
the merge rule; no file at all with error feedback in the parameters). Files go out through ``publish``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from dilocox.delay import StartRule
from dilocox.inner import EF, PARAM, State, TrainerError
from dilocox.round import RoundSpec
from protocol.chain.audit import final_check as final_drawn
from protocol.formats.codec import save_state
from protocol.leaf import StepLeaf, block_count, block_names
from protocol.shard_audit import (
    START_PREFIX,
    GroupOpening,
    SeedOf,
    ShardChallenge,
    ShardManifest,
    boundary_names,
    build_manifest,
    covers_merge,
    drawn_block,
    group_picks,
    open_groups,
    openings_error,
    required_leaves,
    shard_challenges,
    sum_names,
    unbound_input,
)
from protocol.types import Address, Cid
from trainer.checkpoints import EpochDir
from trainer.engine import BatchOf, Engine, Opened

Publish = Callable[[bytes], Cid]


def challenge_file(engine: Engine, d: EpochDir, start: int, end: int, b: int, picks: Sequence[int], batch_of: BatchOf,
                   leaves: Mapping[int, StepLeaf], spec: RoundSpec, merge: bool = False) -> tuple[State, tuple[GroupOpening, ...]]:
    """Block b's shard at ``start``, the opened group's boundaries and sums at each step (and its
    parameters at leaf 0 when the segment covers the merge rule's step, ``merge``), with the group
    openings, checked against this trainer's own leaves.

    An engine may build it from its boundary log (trainer/boundaries.py), a cache on disk: if that
    answer is not bound to the committed leaves (a torn or altered file), whole steps are replayed
    instead, so an honest trainer never publishes an answer its own commitments refute; the engine's
    ``log_error`` says so, for the node to warn.
    """
    n_blocks = block_count(spec.model)
    names = block_names(spec.model)[b]
    first = _start_params(engine, d, b) if merge else {}

    def build(logged: bool) -> tuple[State, tuple[GroupOpening, ...], int]:
        """The answer and how well it is bound: 2 wholly, 1 its openings only, 0 not even those."""
        shard, steps = engine.audit_block(d, start, end, b, picks, batch_of, logged=logged)
        out = {**_challenge(shard, steps, b, n_blocks, start, picks, names, spec.microbatches), **first}
        openings = open_groups({k: o.groups for k, o in zip(range(start, end), steps)}, start, end, b, picks, n_blocks)
        c = ShardChallenge(start, end, b, Cid(""), openings)
        if unbound_input(out, leaves, c, names, n_blocks, spec.microbatches) is None:
            return out, openings, 2
        return out, openings, int(openings_error(c, spec.microbatches, n_blocks, leaves) is None)

    logged = build(True)
    if logged[2] == 2:
        return logged[:2]
    engine.log_error = (f"epoch {d.epoch}: the answer log's segment {start}..{end} of block {b} does not match "
                        "this trainer's commitments (an altered or torn file); replayed whole steps")
    whole = build(False)
    return (whole if whole[2] >= logged[2] else logged)[:2]


def _start_params(engine: Engine, d: EpochDir, b: int) -> State:
    """Block b's parameters at leaf 0, as ``start.param/<p>``."""
    return {START_PREFIX + k: v for k, v in engine.block_state(d, 0, b, (PARAM,)).items() if k.startswith(PARAM)}


def _challenge(shard: State, steps: Sequence[Opened], b: int, n_blocks: int, start: int, picks: Sequence[int],
               names: Sequence[str], micro: int) -> State:
    """The file's tensors: the shard, then per step the opened group's rows of the boundaries and,
    with more than one group, the sums around it (zeros before group 0)."""
    out = dict(shard)
    bnames = iter(boundary_names(b, n_blocks, start, start + len(steps)))
    for k, (o, _) in enumerate(zip(steps, picks, strict=True), start):
        for t, needed in ((o.inp, b > 0), (o.g_out, b < n_blocks - 1)):
            if needed:
                if t is None:
                    raise TrainerError(f"step {k}: the engine kept no boundary of block {b}")
                out[next(bnames)] = t
        if micro > 1:
            if o.total is None:
                raise TrainerError(f"step {k}: the engine kept no total gradient for block {b}")
            before_keys, total_keys = sum_names(k, names)
            for n, bk, tk in zip(names, before_keys, total_keys):
                zero = torch.zeros_like(shard[PARAM + n])  # what an engine did not sum (a cheat's) goes out as zeros
                out[bk] = (o.before or {}).get(n, zero)
                out[tk] = o.total.get(n, zero)
    return {key: v.detach().cpu() for key, v in out.items()}


def transition_file(engine: Engine, d: EpochDir, last: int, b: int, ef_in_params: bool = False) -> State:
    """Block b's params at leaf 0, and its params and error buffer at leaf ``last``; with the error feedback
    in the parameters its params at ``last`` alone (``protocol.shard_audit.transition_spec``)."""
    end = engine.block_state(d, last, b, (PARAM,) if ef_in_params else (PARAM, EF))
    out = {} if ef_in_params else _start_params(engine, d, b)
    out.update({k: v for k, v in end.items() if k.startswith(PARAM if ef_in_params else (PARAM, EF))})
    return out


def start_file(engine: Engine, prev: EpochDir, last: int, spec: RoundSpec) -> State:
    """Epoch e-1's transition for every block (``protocol.shard_audit.start_spec``): its params at leaf 0
    (not under the merge rule), its params and error buffer at leaf ``last``."""
    out: State = {}
    for b in range(block_count(spec.model)):
        end = engine.block_state(prev, last, b, (PARAM, EF))
        if spec.rule is not StartRule.MERGE:
            out.update(_start_params(engine, prev, b))
        out.update({k: v for k, v in end.items() if k.startswith((PARAM, EF))})
    return out


Answer = tuple[Cid, tuple[GroupOpening, ...]]  # a published challenge file and its group openings


def _published(publish: Publish, answer: tuple[State, tuple[GroupOpening, ...]]) -> Answer:
    return publish(save_state(answer[0])), answer[1]


def answer_challenge(engine: Engine, spec: RoundSpec, epoch: int, trainer: str, d: EpochDir,
                     preimages: Sequence[bytes], seed: bytes, seed_of: SeedOf | None, batch_of: BatchOf,
                     publish: Publish, start: int, end: int, b: int) -> Answer:
    """One challenge's file, published, and its openings: from the audit seed's groups or (windowed) each
    step's window seed. ``preimages`` need reach leaf ``end`` only, so a windowed trainer answers a
    window while it trains the next."""
    n = block_count(spec.model)
    leaves = {k: StepLeaf.decode(preimages[k], n) for k in required_leaves([(start, end, b)], False, end + 1)}
    return _published(publish, challenge_file(
        engine, d, start, end, b, group_picks(seed, trainer, start, end, spec.microbatches, seed_of), batch_of,
        leaves, spec, covers_merge(start, end, spec.merge_step_in(epoch)) and not spec.ef_in_params))


def shard_response(
    *, engine: Engine, spec: RoundSpec, run_id: int, epoch: int, trainer: Address, d: EpochDir,
    preimages: Sequence[bytes], seed: bytes, steps: Sequence[int], final_bps: int, batch_of: BatchOf,
    publish: Publish, prev: EpochDir | None = None, prev_preimages: Sequence[bytes] = (),
    window: int = 0, seed_of: SeedOf | None = None, prebuilt: Mapping[tuple[int, int, int], Answer] | None = None,
) -> ShardManifest:
    """Publish the files the drawn challenges need and return the (validated) manifest.

    ``steps`` are the challenged transitions in draw order (the chain's, or in a windowed run the
    window draws, with ``seed_of`` giving each one's window seed); ``prev``/``prev_preimages`` are
    given when this epoch's start continued epoch e-1. ``prebuilt``: challenges answered already (a
    windowed trainer's, built while it trained and dropped from its log since).
    """
    n = block_count(spec.model)
    L = len(preimages)
    challenges = shard_challenges(seed, trainer, steps, L, spec.segment, n, seed_of)
    fin = final_drawn(seed, trainer, final_bps)
    built = prebuilt or {}
    cont = prev is not None and bool(prev_preimages)
    return build_manifest(
        run_id=run_id, epoch=epoch, trainer=trainer, preimages=preimages, segment=spec.segment,
        groups=spec.microbatches, challenges=challenges,
        cid_of_challenge=lambda s, e, b: built.get((s, e, b)) or answer_challenge(
            engine, spec, epoch, trainer, d, preimages, seed, seed_of, batch_of, publish, s, e, b),
        final_block=drawn_block(seed, trainer, "final-shard", 0, n) if fin else -1,
        cid_of_final=lambda b: publish(save_state(transition_file(engine, d, L - 1, b, spec.ef_in_params))),
        previous=prev_preimages if cont else (),
        # with error feedback in the parameters a continued start is checked by digest alone: no file
        cid_of_start=(lambda: publish(save_state(start_file(engine, prev, len(prev_preimages) - 1, spec))))
        if cont and prev and not spec.ef_in_params else None,
        n_blocks=n, window_width=window,
    )
