"""The checks of a shard audit (docs/protocol.md §5.3): one block of one segment, the final check of
one block, and the start check of a continued start over every block. Pure functions over the
manifest's leaves, the revealed files and public data; like verifier/replay.py they return Findings
and never raise on a trainer's data.

What each check binds: a block's revealed tensors to the digests in the leaves' preimages; its
boundary inputs on the opened group to the group leaves its neighbours committed; its replayed
outputs on that group and its running gradient sum to its own group leaves, its norm to its entry,
at every step of the segment; its end state to the segment's last state leaf. A trainer that forged
anything the replay reads or writes fails here; one that forged only an unopened group of a step
does not (docs/security.md §1: 1/M per replayed step).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dilocox.blockstep import accumulate, block_update, replay_group
from dilocox.compress import compress
from dilocox.delay import Offset, StartRule, add_offset, merge_global
from dilocox.inner import EF, MOM1, MOM2, PARAM, RNG, STEP
from dilocox.round import RoundSpec, compress_seed, epoch_batch, start_state
from protocol.chain.audit import final_check
from protocol.chain.outage import TRANSIENT
from protocol.data import Corpus
from protocol.formats.codec import TensorSpec
from protocol.formats.payload import parse, unwrap
from protocol.leaf import (
    ZERO,
    LeafCommitter,
    StepLeaf,
    block_names,
    part_digest,
    partial_digest,
    sq_bytes,
    tensor_digest,
)
from protocol.model import param_shapes
from protocol.shard_audit import (
    START_PREFIX,
    SeedOf,
    ShardChallenge,
    ShardManifest,
    boundary_names,
    challenge_spec,
    covers_merge,
    drawn_block,
    group_picks,
    opened,
    shard_challenges,
    start_spec,
    sum_names,
    transition_spec,
    unbound_input,
)
from verifier.replay import Finding, _fail, gradient_digest

_P, _O, _E = (PARAM,), (MOM1, MOM2), (EF,)


def check_segment(
    leaves: Mapping[int, StepLeaf], c: ShardChallenge, file: Mapping[str, Tensor],
    spec: RoundSpec, corpus: Corpus, epoch: int, slot: int, grad_digests: list[bytes] | None = None,
    device: torch.device | None = None, merged: Mapping[str, Tensor] | None = None, offset: Offset | None = None,
) -> Finding:
    """Replay block b over steps start..end-1 from the revealed shard (on ``device``, default the CPU),
    one opened group per step: its outputs against the group leaf, its gradient against the running
    sum's link (``before + g_m`` is the committed ``after``, or at the last group the step's total),
    then the block's AdamW step from the total, whose squared norm and, at the segment's end, state
    the leaves commit. At the merge rule's step the block first adds G_e − S_e.param (``merged`` = G_e;
    S_e.param is the file's ``start.param/``, bound to leaf 0), or with error feedback in the parameters
    the public ``offset()`` (``dilocox.delay.merge_offset``; at least the block's entries)."""
    start, end, b = c.start, c.end, c.block
    name = f"block {b} steps {start}->{end}"
    names = block_names(spec.model)[b]
    n_blocks = len(block_names(spec.model))
    micro = spec.microbatches
    try:
        unbound = unbound_input(file, leaves, c, names, n_blocks, micro)
        if unbound is not None:
            return Finding(name, False, unbound)
        dev = device or torch.device("cpu")
        state = {k: v.to(dev) for k, v in file.items() if k.startswith((PARAM, MOM1, MOM2)) or k in (STEP, RNG)}
        got = opened(c)
        bnames = iter(boundary_names(b, n_blocks, start, end))
        for k, m in zip(range(start, end), c.picks, strict=True):
            here, nxt = leaves[k], leaves[k + 1]
            if (nxt.step, nxt.rng) != (here.step + 1, here.rng):
                return Finding(name, False, f"leaf {k + 1}'s step counter does not follow leaf {k}'s")
            inp = file[next(bnames)].to(dev) if b > 0 else None
            g_out = file[next(bnames)].to(dev) if b < n_blocks - 1 else None
            if spec.merges_at(k, epoch) and spec.ef_in_params:
                if offset is None:
                    raise ValueError(f"step {k} adds the public merge offset, and the verifier was given none")
                state = add_offset(state, offset())
            elif spec.merges_at(k, epoch):
                if merged is None:
                    raise ValueError(f"step {k} merges G_e, and the verifier was given none")
                first = {PARAM + n: file[f"{START_PREFIX}{PARAM}{n}"].to(dev) for n in names}
                state = merge_global(state, {n: merged[n].to(dev) for n in names}, first)
            x, y = epoch_batch(spec, corpus, epoch, slot, k)
            g_m, act, g_in = replay_group(state, b, (x.to(dev), y.to(dev)), spec.model, micro, m, inp, g_out)
            mine = got[(k, b, m)]
            if tensor_digest(act) != mine.act:
                return Finding(name, False, f"step {k}: block {b}'s output activations on group {m} differ from its commitment")
            if tensor_digest(g_in) != mine.grad:
                return Finding(name, False, f"step {k}: block {b}'s input gradient on group {m} differs from its commitment")
            total = g_m
            if micro > 1:
                before_keys, total_keys = sum_names(k, names)
                total = {n: file[key].to(dev) for n, key in zip(names, total_keys)}
                after = dict(g_m) if m == 0 else accumulate({n: file[key].to(dev) for n, key in zip(names, before_keys)}, g_m)
                if partial_digest(after) != (mine.after if m < micro - 1 else partial_digest(total)):
                    return Finding(name, False, f"step {k}: block {b}'s gradient summed through group {m} differs from "
                                   + ("its commitment" if m < micro - 1 else "the step's revealed total"))
            if grad_digests is not None:
                grad_digests.append(gradient_digest(total))
            state, sq = block_update(state, b, total, spec.inner, [q.to(dev) for q in nxt.sqs])
            if sq_bytes(sq) != nxt.blocks[b].sq:
                return Finding(name, False, f"step {k}: block {b}'s squared gradient norm differs from its commitment")
        last = leaves[end].blocks[b]
        if part_digest(state, names, _P) != last.params or part_digest(state, names, _O) != last.opt:
            return Finding(name, False, f"replaying block {b} does not reach its state in leaf {end}")
        if [e.ef for e in leaves[end].blocks] != [e.ef for e in leaves[start].blocks]:
            return Finding(name, False, "an error buffer changed inside the epoch")
    except Exception as exc:  # noqa: BLE001 - any failure on a trainer's data is a failed check
        return _fail(name, exc)
    return Finding(name, True, "bitwise match at every step")


def _transition(file: Mapping[str, Tensor], names: Sequence[str]) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """(first-leaf params, last-leaf params, last-leaf error buffer) of a transition file, bare names. A
    file of a run with the error feedback in the parameters has no first leaf (empty) and a zero buffer."""
    p1 = {n: file[PARAM + n] for n in names}
    if EF + names[0] not in file:
        return {}, p1, {n: torch.zeros_like(t) for n, t in p1.items()}
    return {n: file[f"{START_PREFIX}{PARAM}{n}"] for n in names}, p1, {n: file[EF + n] for n in names}


def _bound(first: StepLeaf, last: StepLeaf, b: int, file: Mapping[str, Tensor], names: Sequence[str]) -> bool:
    """The file is block b of leaves 0 and L-1: its tensors (and a zero buffer where it ships none) hash
    to their digests."""
    p0, p1, ef = _transition(file, names)
    return ((not p0 or part_digest({PARAM + n: t for n, t in p0.items()}, names, _P) == first.blocks[b].params)
            and part_digest({PARAM + n: t for n, t in p1.items()}, names, _P) == last.blocks[b].params
            and part_digest({EF + n: t for n, t in ef.items()}, names, _E) == last.blocks[b].ef)


def payload_sections(payload: bytes) -> dict[str, tuple[tuple[object, ...], bytes]]:
    """Each tensor's header fields and section bytes: what a block's re-encoding is compared with."""
    return {e.name: ((e.dtype, e.shape, e.kind, e.bits, e.scale_dtype, e.group, e.rank), bytes(payload[e.offset:e.offset + e.length]))
            for e in parse(payload, max_bytes=max(len(payload), 1))}


def check_final_block(
    first: StepLeaf, last: StepLeaf, b: int, file: Mapping[str, Tensor], publication: bytes, spec: RoundSpec,
    run_id: int, epoch: int, slot: int, trainer: str, rank: int, merged: Mapping[str, Tensor] | None = None,
) -> Finding:
    """Block b of end state -> payload: re-encoding its Δ with its error buffer gives the payload's records
    (Δ = G_e − E_e under the merge rule, ``merged`` = G_e). Every block's error buffer digest at L-1 must
    be leaf 0's: the buffer the payload was encoded with is the one the start check bound."""
    name = f"final block {b}"
    names = block_names(spec.model)[b]
    try:
        if [e.ef for e in first.blocks] != [e.ef for e in last.blocks]:
            return Finding(name, False, "an error buffer changed inside the epoch (leaves 0 and L-1 differ)")
        if not _bound(first, last, b, file, names):
            return Finding(name, False, f"the revealed tensors are not block {b} of leaves 0 and L-1")
        p0, p1, ef = _transition(file, names)
        mine = compress(_delta(spec, p0, p1, merged, names), ef, rank, compress_seed(spec.run_seed, epoch, slot),
                        spec.compression)
        body = unwrap(publication, run_id=run_id, epoch=epoch, trainer=trainer).body
        theirs, ours = payload_sections(bytes(body)), payload_sections(mine.payload)
        if any(theirs.get(n) != ours[n] for n in names):
            return Finding(name, False, f"re-encoding block {b} does not give the payload's records")
    except Exception as exc:  # noqa: BLE001 - any failure on a trainer's data is a failed check
        return _fail(name, exc)
    return Finding(name, True, f"block {b}'s records re-encoded bit for bit")


def _delta(spec: RoundSpec, p0: Mapping[str, Tensor], p1: Mapping[str, Tensor], merged: Mapping[str, Tensor] | None,
           names: Sequence[str]) -> dict[str, Tensor]:
    """A block's pseudo-gradient: first − last params, or G − last under the merge rule (``merged`` = G)."""
    if spec.rule is not StartRule.MERGE:
        return {n: p0[n] - p1[n] for n in names}
    if merged is None:
        raise ValueError("the merge rule's Δ is G_e − E_e, and the verifier was given no G_e")
    return {n: merged[n] - p1[n] for n in names}


def check_start_fresh(leaf0: StepLeaf, spec: RoundSpec, g: Mapping[str, Tensor]) -> Finding:
    """A fresh start is public: leaf 0 recomputed whole from G, no file."""
    try:
        expected = LeafCommitter(spec.model, spec.segment, 2).leaf(0, start_state(spec, g, None, None), None)
    except Exception as exc:  # noqa: BLE001 - any failure on a trainer's data is a failed check
        return _fail("start", exc)
    ok = expected.digest == leaf0.digest
    return Finding("start", ok, "leaf 0 is the fresh start from the global model" if ok else
                   "leaf 0 is not the fresh start from the global model")


def _not_carried(leaf0: StepLeaf, prev_last: StepLeaf, *, params: bool) -> str | None:
    """Why leaf 0 does not carry e-1's last leaf over, every block (step and rng words, moments, and
    with ``params`` the parameters), or commits boundaries of a step that never ran; None if it does."""
    if (leaf0.step, leaf0.rng) != (prev_last.step, prev_last.rng):
        return "leaf 0's step counter or rng word is not e-1's last"
    if [e.opt for e in leaf0.blocks] != [e.opt for e in prev_last.blocks]:
        return "leaf 0's optimizer moments are not the ones e-1 ended with"
    if params and [e.params for e in leaf0.blocks] != [e.params for e in prev_last.blocks]:
        return "leaf 0's parameters are not the ones e-1 ended with (the merge rule continues them)"
    if any((e.groups, e.sq) != (ZERO, bytes(4)) for e in leaf0.blocks):
        return "leaf 0 commits boundary tensors of a step that never ran"
    return None


def check_start_carried(
    leaf0: StepLeaf, prev_last: StepLeaf, start_cid: str, shapes: Mapping[str, tuple[int, ...]], spec: RoundSpec,
) -> Finding:
    """A continued start with error feedback in the parameters (no buffer), every block, by digest
    alone: parameters, moments, step and rng carried from e-1's last leaf, an all-zero error buffer,
    and no start file (there is nothing a file could add: the merge step's offset is public)."""
    try:
        if start_cid:
            return Finding("start", False, "a start file under error feedback in the parameters (the start carries over "
                           "by digest and needs none)")
        why = _not_carried(leaf0, prev_last, params=True)
        if why is not None:
            return Finding("start", False, why)
        zero = [part_digest({EF + n: torch.zeros(shapes[n]) for n in bn}, bn, _E) for bn in block_names(spec.model)]
        bad = [b for b, e in enumerate(leaf0.blocks) if e.ef != zero[b]]
    except Exception as exc:  # noqa: BLE001 - any failure on a trainer's data is a failed check
        return _fail("start", exc)
    if bad:
        return Finding("start", False, f"block(s) {bad} of leaf 0 carry an error buffer (the run keeps none)")
    return Finding("start", True, "leaf 0 continues e-1's last leaf (every block's parameters, moments, step, rng) "
                   "with no error buffer")


def check_start_continued(
    leaf0: StepLeaf, prev0: StepLeaf, prev_last: StepLeaf, file: Mapping[str, Tensor], spec: RoundSpec,
    g: Mapping[str, Tensor], epoch: int, slot: int, prev_rank: int,
) -> Finding:
    """A continued start, every block: moments, step and rng carried (by digest); the error buffer
    unchanged through e-1 (leaf 0's and L'-1's digests); and each block's parameters and error buffer
    recomputed by the start rule from epoch e-1's revealed tensors (``file``: ``start_spec``), i.e.
    e-1's whole Δ re-encoded with its buffer. No block is left to a draw: a buffer planted in any
    block fails here, in the epoch it is planted.

    Under the merge rule the parameters carry over too (S_e = E_{e-1}), so they are checked by digest,
    and e-1's Δ that made the error buffer is G_{e-1} − E_{e-1} (``g`` is G_{e-1})."""
    groups = block_names(spec.model)
    merge = spec.rule is StartRule.MERGE
    try:
        why = _not_carried(leaf0, prev_last, params=merge)
        if why is not None:
            return Finding("start", False, why)
        if [e.ef for e in prev0.blocks] != [e.ef for e in prev_last.blocks]:
            return Finding("start", False, "an error buffer changed inside epoch e-1 (its leaves 0 and L'-1 differ)")
        names = [n for bn in groups for n in bn]
        p1 = {n: file[PARAM + n] for n in names}
        ef = {n: file[EF + n] for n in names}
        p0 = {n: file[f"{START_PREFIX}{PARAM}{n}"] for n in names} if not merge else {}
        for b, bn in enumerate(groups):
            if (part_digest(file, bn, _P) != prev_last.blocks[b].params or part_digest(file, bn, _E) != prev_last.blocks[b].ef
                    or (not merge and part_digest({PARAM + n: p0[n] for n in bn}, bn, _P) != prev0.blocks[b].params)):
                return Finding("start", False, f"the revealed tensors are not block {b} of e-1's leaves 0 and L-1")
        c = compress(_delta(spec, p0, p1, g, names), ef, prev_rank, compress_seed(spec.run_seed, epoch - 1, slot),
                     spec.compression)
        carried = {**{PARAM + n: p1[n] for n in names}, **{EF + n: c.new_ef[n] for n in names}}
        s = carried if merge else start_state(spec, {n: g[n] for n in names}, {PARAM + n: p0[n] for n in names}, carried)
        bad = [b for b, bn in enumerate(groups)
               if (part_digest(s, bn, _P), part_digest(s, bn, _E)) != (leaf0.blocks[b].params, leaf0.blocks[b].ef)]
    except Exception as exc:  # noqa: BLE001 - any failure on a trainer's data is a failed check
        return _fail("start", exc)
    if bad:
        return Finding("start", False, f"block(s) {bad} of leaf 0 are not the start rule's (parameters or error buffer)")
    return Finding("start", True, "leaf 0 follows the start rule (every block's parameters and error buffer "
                   "recomputed; moments, step, rng carried)")


Fetch = Callable[[str, Mapping[str, TensorSpec]], dict[str, Tensor]]


@dataclass(frozen=True)
class Chained:
    """What the chain says about the audited submission (and the trainer's epoch e-1, if revealed)."""

    trace_root: bytes
    leaf_count: int
    seed: bytes
    steps: tuple[int, ...]
    final_bps: int
    prev_revealed: bool = False
    prev_root: bytes = bytes(32)
    prev_leaf_count: int = 0
    window: int = 0  # the run's W (0: challenges drawn after the epoch)
    seed_of: SeedOf | None = None  # windowed: each transition's window seed (public.windowaudit)


def audit_findings(
    m: ShardManifest, chained: Chained, fetch: Fetch, spec: RoundSpec, corpus: Corpus, g: Mapping[str, Tensor],
    publication: bytes, *, run_id: int, epoch: int, slot: int, trainer: str, rank: int, prev_rank: int,
    grad_digests: list[bytes] | None = None, device: torch.device | None = None,
    merged: Mapping[str, Tensor] | None = None, offset: Offset | None = None,
) -> list[Finding]:
    """Every check of a shard audit, given a decoded (validated) manifest: bound to the chain and to the
    drawn challenges first, then each segment, the final check and the start check. ``g`` is the
    model epoch e starts from; ``merged`` is G_e under the merge rule, ``offset`` what its step adds
    with error feedback in the parameters."""
    n = len(block_names(spec.model))
    shapes = param_shapes(spec.model)
    groups = block_names(spec.model)
    micro = spec.microbatches
    want = shard_challenges(chained.seed, trainer, chained.steps, chained.leaf_count, spec.segment, n, chained.seed_of)
    fin = final_check(chained.seed, trainer, chained.final_bps)
    got = [(c.start, c.end, c.block) for c in m.challenges]
    picks_ok = all(c.picks == group_picks(chained.seed, trainer, c.start, c.end, micro, chained.seed_of)
                   for c in m.challenges)
    bound = ((m.run_id, m.epoch, m.trainer.lower(), m.trace_root, m.leaf_count, m.segment, m.groups, m.window_width) ==
             (run_id, epoch, trainer.lower(), chained.trace_root, chained.leaf_count, spec.segment, micro, chained.window)
             and got == want and picks_ok and (m.final.block >= 0) == fin
             and (not fin or m.final.block == drawn_block(chained.seed, trainer, "final-shard", 0, n)))
    out = [Finding("manifest", bound, "answers the drawn segments, blocks and groups of the committed trace" if bound
                   else "manifest does not match the on-chain trace or the drawn segments, blocks and groups")]
    if not bound:
        return out
    leaves = {p.index: p.leaf(n) for p in m.leaves}
    group_shape = (spec.batch_size // micro, spec.seq_len, spec.model.d_model)
    out.append(_start(m, chained, fetch, spec, g, n, shapes, leaves[0], epoch, slot, prev_rank))
    for c in m.challenges:
        try:
            file = fetch(c.cid, challenge_spec(shapes, groups[c.block], c.block, n, c.start, c.end, group_shape,
                                               covers_merge(c.start, c.end, spec.merge_step_in(epoch))
                                               and not spec.ef_in_params, micro))
        except TRANSIENT:
            raise
        except Exception as exc:  # noqa: BLE001 - a file that cannot be read or has the wrong layout fails
            out.append(_fail(f"block {c.block} steps {c.start}->{c.end}", exc))
            continue
        out.append(check_segment(leaves, c, file, spec, corpus, epoch, slot, grad_digests, device, merged, offset))
    if fin:
        try:
            file = fetch(m.final.cid, transition_spec(shapes, groups[m.final.block], spec.ef_in_params))
            out.append(check_final_block(leaves[0], leaves[m.leaf_count - 1], m.final.block, file, publication, spec,
                                         run_id, epoch, slot, trainer, rank, merged))
        except TRANSIENT:
            raise
        except Exception as exc:  # noqa: BLE001
            out.append(_fail(f"final block {m.final.block}", exc))
    return out


def _start(
    m: ShardManifest, chained: Chained, fetch: Fetch, spec: RoundSpec, g: Mapping[str, Tensor], n: int,
    shapes: Mapping[str, tuple[int, ...]], leaf0: StepLeaf, epoch: int, slot: int, prev_rank: int,
) -> Finding:
    """The start check: a fresh start by digest alone, a continued one over every block (its start file)."""
    if not m.previous:
        return check_start_fresh(leaf0, spec, g)
    if not chained.prev_revealed or (m.previous_root, m.previous_leaf_count) != (chained.prev_root, chained.prev_leaf_count):
        return Finding("start", False, "previous-epoch leaves are not from the trace the trainer revealed for e-1")
    if spec.ef_in_params:
        return check_start_carried(leaf0, m.previous[1].leaf(n), m.start_cid, shapes, spec)
    if not m.start_cid:
        return Finding("start", False, "a continued start names no start file (the run carries an error buffer)")
    try:
        file = fetch(m.start_cid, start_spec(shapes, spec.rule is StartRule.MERGE))
        p0, pl = m.previous[0].leaf(n), m.previous[1].leaf(n)
    except TRANSIENT:
        raise
    except Exception as exc:  # noqa: BLE001
        return _fail("start", exc)
    return check_start_continued(leaf0, p0, pl, file, spec, g, epoch, slot, prev_rank)
