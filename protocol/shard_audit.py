"""Audits of one block of one segment (docs/protocol.md §5.3): the draws, the manifest, the files.

In a run with ``audit.unit = "shard"`` each on-chain challenge k_j (drawn exactly as in §5) becomes
the segment of its state leaves around it, ``start = k_j - k_j mod r`` to ``end = min(start + r,
L - 1)``, of one audit block ``b_j`` drawn from the same seed. The trainer reveals that block's
parameters and moments at ``start`` and, for every step k of the segment, one *group* m_k of the
step's M micro-batches (drawn per step and block): the two boundary tensors the block consumed on
the group's rows (its input activations and the gradient arriving at its output) and, when M > 1,
its gradient accumulated through group m_k − 1 (``before``) and the step's total (``total``); plus
the preimages of leaves ``start..end`` and the *openings* of the group leaves that bind those
tensors (protocol.leaf.GroupLeaf), each with its Merkle proof to its block entry. So a challenge
costs ``3·P_b + r·(2·P_b [M > 1] + 2·U·d)`` floats for U tokens per group, whatever the batch.

The final check (end state -> payload) uses one block, drawn under its own label, and reveals
that block's parameters at the first leaf and its parameters and error buffer at the last
(``transition file``). The start check of a continued epoch covers every block: its file
(``start file``) is the transition file of epoch e-1 for the whole model, less the first-leaf
parameters under the merge rule, which does not read them. A fresh start needs no file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from protocol import merkle, windows
from protocol.chain.audit import draw
from protocol.digest import keccak
from protocol.errors import VerilocoError
from protocol.formats.codec import TensorSpec, decode_dataclass, encode_dataclass
from protocol.leaf import GroupLeaf, LeafError, StepLeaf, part_digest, partial_digest, tensor_digest
from protocol.store.unixfs import CidError, validate_cid
from protocol.types import Address, Cid, Digest

SHARD_AUDIT_FORMAT = "veriloco.audit.shard.v6"
START_PREFIX = "start."  # a transition or start file's first-leaf parameters: "start.param/<p>"


class ShardAuditError(VerilocoError):
    """A shard audit manifest that is malformed or does not answer the drawn challenges."""


def segment_of(k: int, segment: int, leaf_count: int) -> tuple[int, int]:
    """The state leaves a challenge of transition k spans: (k - k mod r, min(that + r, L - 1))."""
    start = k - k % segment
    return start, min(start + segment, leaf_count - 1)


def drawn_block(seed: bytes, trainer: str, label: str, j: int, n_blocks: int) -> int:
    """The audit block of draw j under ``label`` ("shard", "final-shard")."""
    return draw(seed, trainer, label, j) % n_blocks


def drawn_group(seed: bytes, trainer: str, k: int, micro: int) -> int:
    """The group (micro-batch) of step k that every challenge of that step opens, whatever its block:
    a drawn block and its data ends (``shard_challenges``) must look at the same rows."""
    return draw(seed, trainer, "group", k) % micro


def opening_keys(start: int, end: int, b: int, picks: Sequence[int], n_blocks: int) -> list[tuple[int, int, int]]:
    """(step, block, group) of every group leaf a challenge opens, in order: per step k with group m,
    block b−1's m (binds the input), b's m−1 (binds ``before``), b's m, b+1's m (binds the output gradient)."""
    out = []
    for k, m in zip(range(start, end), picks, strict=True):
        for bb, mm in ((b - 1, m), (b, m - 1), (b, m), (b + 1, m)):
            if 0 <= bb < n_blocks and mm >= 0:
                out.append((k, bb, mm))
    return out


def data_ends(b: int, n_blocks: int) -> tuple[int, ...]:
    """The blocks a challenge of block b replays beside it: the first (token ids in) and the last
    (targets in), the only blocks that read the run's data. A middle block's replay takes its input
    and output gradient from its neighbours' commitments, so it cannot tell a group computed
    consistently on other rows or other targets from an honest one; its ends can (docs/security.md §16)."""
    return tuple(sorted({0, b, n_blocks - 1}))


SeedOf = Callable[[int], bytes]  # transition k -> the seed of its window's draw (a windowed run)


def shard_challenges(
    seed: bytes, trainer: str, steps: Sequence[int], leaf_count: int, segment: int, n_blocks: int,
    seed_of: SeedOf | None = None,
) -> list[tuple[int, int, int]]:
    """(start, end, block) of every challenge, sorted and distinct; ``steps`` in the chain's draw order.
    Each draw j becomes its segment of the drawn block and of the data ends (``data_ends``), on the
    same opened groups (``group_picks``). In a windowed run (``seed_of``) the block of the draw of k
    comes from k's window seed under index k, as every draw there is keyed by its step."""
    out: set[tuple[int, int, int]] = set()
    for j, k in enumerate(steps):
        s, i = (seed, j) if seed_of is None else (seed_of(k), k)
        start, end = segment_of(k, segment, leaf_count)
        out.update((start, end, b) for b in data_ends(drawn_block(s, trainer, "shard", i, n_blocks), n_blocks))
    return sorted(out)


def group_picks(seed: bytes, trainer: str, start: int, end: int, micro: int, seed_of: SeedOf | None = None) -> list[int]:
    """The opened group of each step of a segment: from the audit seed, or (windowed) from each step's
    own window seed, so two draws that share a segment open the same rows."""
    return [drawn_group(seed if seed_of is None else seed_of(k), trainer, k, micro) for k in range(start, end)]


@dataclass(frozen=True)
class ProvenLeaf:
    """A leaf's preimage (protocol.leaf.StepLeaf.encode) and its Merkle proof."""

    index: int
    preimage: bytes
    proof: tuple[Digest, ...]

    def leaf(self, n_blocks: int) -> StepLeaf:
        try:
            return StepLeaf.decode(self.preimage, n_blocks)
        except LeafError as exc:
            raise ShardAuditError(f"leaf {self.index}: {exc}") from None


@dataclass(frozen=True)
class GroupOpening:
    """Group leaf ``group`` of ``block`` in step ``step`` (leaf step+1): its 96-byte preimage
    (protocol.leaf.GroupLeaf.encode) and its Merkle proof to that block entry's ``groups`` root."""

    step: int
    block: int
    group: int
    leaf: bytes
    proof: tuple[Digest, ...]

    def value(self) -> GroupLeaf:
        try:
            return GroupLeaf.decode(self.leaf)
        except LeafError as exc:
            raise ShardAuditError(f"group {self.group} of block {self.block} in step {self.step}: {exc}") from None


@dataclass(frozen=True)
class ShardChallenge:
    """One challenged segment of one block, the CID of its shard file, and the group leaves it opens
    (``opening_keys`` of the drawn groups)."""

    start: int
    end: int
    block: int
    cid: Cid
    openings: tuple[GroupOpening, ...]

    @property
    def picks(self) -> list[int]:
        """The group opened in each step of the segment (the block's own opening at each step)."""
        own = {o.step: o.group for o in self.openings if o.block == self.block}  # m−1 then m: the last wins
        return [own.get(k, -1) for k in range(self.start, self.end)]


@dataclass(frozen=True)
class BlockTransition:
    """The block a final check covers, and its transition file (block -1, cid "" when not drawn)."""

    block: int
    cid: Cid


@dataclass(frozen=True)
class ShardManifest:
    """A trainer's answer to a shard audit (format ``veriloco.audit.shard.v2``).

    ``groups``: M, the groups (micro-batches) of every step. ``leaves``: every leaf the checks read (0, ``start..end`` of each challenge, ``L-1`` with the final
    check), sorted, distinct, proven against ``trace_root``. ``final``: block -1 when not drawn.
    ``previous``: leaves 0 and ``L'-1`` of epoch e-1, proven against ``previous_root``, when the start
    continued e-1 (then ``start_cid`` is its start file, every block: ``start_spec``, or empty when the run
    keeps its error feedback in the parameters), else empty.
    ``window_width``: the run's W when its challenges are drawn per window (docs/protocol.md §5.4),
    then ``window_roots`` are the trace's window roots, which must rebuild ``trace_root``; else 0, ().
    (v1 named one drawn block of e-1 for the start check; v2 has no start draw; v3 opens one group
    per step instead of revealing the whole batch; v6 names the window roots.)
    """

    run_id: int
    epoch: int
    trainer: Address
    trace_root: Digest
    leaf_count: int
    segment: int
    groups: int
    leaves: tuple[ProvenLeaf, ...]
    challenges: tuple[ShardChallenge, ...]
    final: BlockTransition
    previous_root: Digest
    previous_leaf_count: int
    previous: tuple[ProvenLeaf, ...]
    start_cid: Cid
    window_width: int = 0
    window_roots: tuple[Digest, ...] = ()

    def leaf(self, index: int, n_blocks: int) -> StepLeaf:
        for p in self.leaves:
            if p.index == index:
                return p.leaf(n_blocks)
        raise ShardAuditError(f"the manifest has no leaf {index}")


def required_leaves(challenges: Sequence[tuple[int, int, int]], final: bool, leaf_count: int) -> list[int]:
    need = {0}
    for start, end, _ in challenges:
        need.update(range(start, end + 1))
    if final:
        need.add(leaf_count - 1)
    return sorted(need)


def _check_proofs(root: Digest, count: int, leaves: Sequence[ProvenLeaf], what: str) -> None:
    depth = merkle.proof_length(count)
    for p in leaves:
        if len(p.proof) != depth or any(len(h) != 32 for h in p.proof) or not merkle.verify(
            root, merkle_leaf_value(p.preimage), p.index, count, p.proof
        ):
            raise ShardAuditError(f"{what} leaf {p.index}: its Merkle proof does not lead to the root")


def openings_error(c: ShardChallenge, micro: int, n_blocks: int, leaves: Mapping[int, StepLeaf]) -> str | None:
    """Why a challenge's openings are not exactly ``opening_keys`` of one group per step, each proven
    to its block entry's ``groups`` root in ``leaves``; None when they are."""
    picks = c.picks
    if any(not 0 <= m < micro for m in picks):
        return f"challenge {c.start} block {c.block}: a step opens no group, or one outside 0..{micro - 1}"
    keys = [(o.step, o.block, o.group) for o in c.openings]
    if keys != opening_keys(c.start, c.end, c.block, picks, n_blocks):
        return f"challenge {c.start} block {c.block}: the group openings are not those of the opened groups"
    depth = merkle.proof_length(micro)
    for o in c.openings:
        root = leaves[o.step + 1].blocks[o.block].groups
        if len(o.proof) != depth or any(len(h) != 32 for h in o.proof) or not merkle.verify(
                root, o.value().value, o.group, micro, o.proof):
            return f"group {o.group} of block {o.block} in step {o.step}: its proof does not lead to the leaf's root"
    return None


def _check_windows(m: ShardManifest) -> None:
    if not m.window_width:
        if m.window_roots:
            raise ShardAuditError("window roots without a window width")
        return
    try:
        if windows.root_from_windows(m.window_roots, m.leaf_count, m.window_width) != m.trace_root:
            raise ShardAuditError("the window roots do not rebuild the trace root")
    except windows.WindowError as exc:
        raise ShardAuditError(f"window roots: {exc}") from None


def merkle_leaf_value(preimage: bytes) -> Digest:
    """The trace value committed for a leaf: keccak of its preimage (protocol.leaf.StepLeaf.digest)."""
    return keccak(preimage)


def _cid_ok(cid: str, what: str) -> None:
    try:
        validate_cid(cid)
    except CidError as exc:
        raise ShardAuditError(f"{what}: {exc}") from None


def validate(m: ShardManifest, n_blocks: int) -> None:
    """Internal consistency and every proof; whether it answers *the drawn* challenges is the verifier's check."""
    if m.run_id < 0 or m.epoch < 0 or not re.fullmatch(r"0x[0-9a-fA-F]{40}", m.trainer) or len(m.trace_root) != 32:
        raise ShardAuditError("manifest run_id, epoch, trainer or trace_root is malformed")
    if not 2 <= m.leaf_count <= 1 << 24 or not 1 <= m.segment <= 1 << 24 or not 1 <= m.groups <= 1 << 16:
        raise ShardAuditError(f"leaf_count {m.leaf_count}, segment {m.segment} or groups {m.groups} out of range")
    keys = [(c.start, c.end, c.block) for c in m.challenges]
    if keys != sorted(set(keys)):
        raise ShardAuditError("challenges must be sorted by (start, end, block) and distinct")
    for c in m.challenges:
        if (c.start, c.end) != segment_of(c.start, m.segment, m.leaf_count) or not 0 <= c.block < n_blocks:
            raise ShardAuditError(f"challenge {c.start}..{c.end} of block {c.block} is not a segment of this trace")
        _cid_ok(c.cid, f"challenge {c.start} block {c.block}")
    final = m.final.block >= 0
    drawn_ok = 0 <= m.final.block < n_blocks and bool(m.final.cid)
    if not (drawn_ok if final else m.final == BlockTransition(-1, Cid(""))):
        raise ShardAuditError("final must name a block and a file, or block -1 and no file")
    if final:
        _cid_ok(m.final.cid, "final")
    idx = [p.index for p in m.leaves]
    need = required_leaves(keys, final, m.leaf_count)
    if idx != need:
        raise ShardAuditError(f"manifest reveals leaves {idx[:8]}..., the challenges need exactly {need[:8]}...")
    _check_proofs(m.trace_root, m.leaf_count, m.leaves, "trace")
    _check_windows(m)
    leaves = {p.index: p.leaf(n_blocks) for p in m.leaves}
    for c in m.challenges:
        why = openings_error(c, m.groups, n_blocks, leaves)
        if why is not None:
            raise ShardAuditError(why)
    if not m.previous:
        if m.previous_leaf_count or m.previous_root != bytes(32) or m.start_cid:
            raise ShardAuditError("a fresh start carries no previous root, leaf count or start file")
        return
    if m.epoch == 0 or not 2 <= m.previous_leaf_count <= 1 << 24:
        raise ShardAuditError("previous-epoch leaves in epoch 0, or a previous leaf count out of range")
    if [p.index for p in m.previous] != [0, m.previous_leaf_count - 1]:
        raise ShardAuditError("previous leaves must be 0 and previous_leaf_count-1")
    if m.start_cid:  # none with error feedback in the parameters (the verifier knows which the run keeps)
        _cid_ok(m.start_cid, "start")
    _check_proofs(m.previous_root, m.previous_leaf_count, m.previous, "previous")


def encode_manifest(m: ShardManifest, n_blocks: int) -> bytes:
    validate(m, n_blocks)
    return encode_dataclass(m, SHARD_AUDIT_FORMAT)


def decode_manifest(data: bytes, n_blocks: int, *, max_bytes: int) -> ShardManifest:
    try:
        m = decode_dataclass(ShardManifest, data, SHARD_AUDIT_FORMAT, max_bytes=max_bytes)
    except VerilocoError as exc:
        raise ShardAuditError(f"not a shard audit manifest: {exc}") from None
    validate(m, n_blocks)
    if encode_dataclass(m, SHARD_AUDIT_FORMAT) != bytes(data):
        raise ShardAuditError("shard audit manifest is not in canonical form")
    return m


def proven(preimages: Sequence[bytes], indices: Sequence[int]) -> tuple[ProvenLeaf, ...]:
    trace = [merkle_leaf_value(p) for p in preimages]
    return tuple(ProvenLeaf(i, preimages[i], tuple(merkle.prove(trace, i))) for i in indices)


def build_manifest(
    *, run_id: int, epoch: int, trainer: Address, preimages: Sequence[bytes], segment: int, groups: int,
    challenges: Sequence[tuple[int, int, int]],
    cid_of_challenge: Callable[[int, int, int], tuple[Cid, tuple[GroupOpening, ...]]],
    final_block: int, cid_of_final: Callable[[int], Cid],
    previous: Sequence[bytes] = (), cid_of_start: Callable[[], Cid] | None = None, n_blocks: int,
    window_width: int = 0,
) -> ShardManifest:
    """Assemble and validate the answer; files are published through the ``cid_of_*`` callbacks
    (``cid_of_challenge`` also gives the challenge's group openings; ``cid_of_start``: the start
    file of a continued start, every block, None when the run keeps no error buffer). ``previous``:
    e-1's preimages when this epoch continued it, else empty."""
    L = len(preimages)
    final = final_block >= 0
    cont = bool(previous)
    m = ShardManifest(
        run_id=run_id, epoch=epoch, trainer=trainer, trace_root=merkle.root([merkle_leaf_value(p) for p in preimages]),
        leaf_count=L, segment=segment, groups=groups,
        leaves=proven(preimages, required_leaves(challenges, final, L)),
        challenges=tuple(ShardChallenge(s, e, b, *cid_of_challenge(s, e, b)) for s, e, b in sorted(set(challenges))),
        final=BlockTransition(final_block, cid_of_final(final_block)) if final else BlockTransition(-1, Cid("")),
        previous_root=merkle.root([merkle_leaf_value(p) for p in previous]) if cont else Digest(bytes(32)),
        previous_leaf_count=len(previous) if cont else 0,
        previous=proven(previous, [0, len(previous) - 1]) if cont else (),
        start_cid=cid_of_start() if cont and cid_of_start else Cid(""),
        window_width=window_width,
        window_roots=tuple(windows.window_roots([merkle_leaf_value(p) for p in preimages], window_width))
        if window_width else (),
    )
    validate(m, n_blocks)
    return m


# ---- shard files: which tensors, with which shapes --------------------------------------------


def boundary_names(b: int, n_blocks: int, start: int, end: int) -> list[str]:
    """The boundary tensors of block b over steps start..end-1 (the opened group's rows): ``in/<k>``, ``gout/<k>``."""
    out = []
    for k in range(start, end):
        if b > 0:
            out.append(f"in/{k:08d}")
        if b < n_blocks - 1:
            out.append(f"gout/{k:08d}")
    return out


def sum_names(k: int, names: Sequence[str]) -> tuple[list[str], list[str]]:
    """Step k's ``before/<k>/<p>`` (the block's gradient through group m−1, zeros for m = 0) and
    ``total/<k>/<p>`` entries, carried when a step has more than one group."""
    return [f"before/{k:08d}/{n}" for n in names], [f"total/{k:08d}/{n}" for n in names]


def covers_merge(start: int, end: int, merge_step: int | None) -> bool:
    """Whether segment start..end replays the merge rule's step (``merge_step`` None: no merge rule)."""
    return merge_step is not None and start <= merge_step < end


def challenge_spec(
    shapes: Mapping[str, tuple[int, ...]], names: Sequence[str], b: int, n_blocks: int,
    start: int, end: int, group_shape: tuple[int, ...], merge: bool = False, micro: int = 1,
) -> dict[str, TensorSpec]:
    """Exactly the entries of a challenge's shard file: param/adam at ``start``, meta, each step's
    boundaries on one group's rows (``group_shape``: rows/M, seq, d), with ``micro`` > 1 each step's
    ``before`` and ``total`` sums, and when the segment covers the merge rule's step (``merge``) the
    block's parameters at leaf 0 (``start.param/<p>``): the merge adds G_e − S_e.param."""
    prefixes = ("param/", "adam.m/", "adam.v/", f"{START_PREFIX}param/") if merge else ("param/", "adam.m/", "adam.v/")
    spec = {f"{p}{n}": TensorSpec(torch.float32, shapes[n]) for p in prefixes for n in names}
    spec["meta/step"] = spec["meta/rng"] = TensorSpec(torch.int64, (1,))
    for name in boundary_names(b, n_blocks, start, end):
        spec[name] = TensorSpec(torch.float32, group_shape)
    if micro > 1:
        for k in range(start, end):
            before, total = sum_names(k, names)
            for key, n in [*zip(before, names), *zip(total, names)]:
                spec[key] = TensorSpec(torch.float32, shapes[n])
    return spec


def open_groups(
    groups: Mapping[int, Mapping[int, Sequence[GroupLeaf]]], start: int, end: int, b: int, picks: Sequence[int],
    n_blocks: int,
) -> tuple[GroupOpening, ...]:
    """The openings of ``opening_keys`` from every step's group leaves (``groups[k][block]``, all M)."""
    out = []
    for k, bb, m in opening_keys(start, end, b, picks, n_blocks):
        leaves = groups[k][bb]
        out.append(GroupOpening(k, bb, m, leaves[m].encode(), tuple(merkle.prove([g.value for g in leaves], m))))
    return tuple(out)


def opened(c: ShardChallenge) -> dict[tuple[int, int, int], GroupLeaf]:
    """A challenge's openings by (step, block, group)."""
    return {(o.step, o.block, o.group): o.value() for o in c.openings}


def unbound_input(
    file: Mapping[str, torch.Tensor], leaves: Mapping[int, StepLeaf], c: ShardChallenge, names: Sequence[str],
    n_blocks: int, micro: int,
) -> str | None:
    """Why a challenge file's inputs are not what leaves ``start..end`` and its openings commit; None
    when all are bound.

    The shard must be block b of state leaf ``start`` (parameters, moments, step counter, rng word),
    each boundary tensor the one its neighbour committed for the opened group, and each ``before``
    sum the one the block committed after the previous group (zeros for group 0); start parameters,
    where the file has them, block b's of leaf 0. The verifier asks this before it replays; the
    trainer asks it of its answer before publishing.
    """
    start, end, b = c.start, c.end, c.block
    why = openings_error(c, micro, n_blocks, leaves)
    if why is not None:
        return why
    first = leaves[start]
    if (part_digest(file, names, ("param/",)) != first.blocks[b].params
            or part_digest(file, names, ("adam.m/", "adam.v/")) != first.blocks[b].opt):
        return f"the revealed shard is not block {b} of state leaf {start}"
    if f"{START_PREFIX}param/{names[0]}" in file and part_digest(
            {f"param/{n}": file[f"{START_PREFIX}param/{n}"] for n in names}, names, ("param/",)) != leaves[0].blocks[b].params:
        return f"the revealed start parameters are not block {b} of leaf 0"
    if (int(file["meta/step"].item()), int(file["meta/rng"].item())) != (first.step, first.rng):
        return f"the revealed step counter or rng word is not leaf {start}'s"
    got = opened(c)
    bnames = iter(boundary_names(b, n_blocks, start, end))
    for k, m in zip(range(start, end), c.picks, strict=True):
        if b > 0 and tensor_digest(file[next(bnames)]) != got[(k, b - 1, m)].act:
            return f"step {k}: the revealed input of group {m} is not what block {b - 1} committed"
        if b < n_blocks - 1 and tensor_digest(file[next(bnames)]) != got[(k, b + 1, m)].grad:
            return f"step {k}: the revealed output gradient of group {m} is not what block {b + 1} committed"
        if micro > 1:
            before = {n: file[key] for n, key in zip(names, sum_names(k, names)[0])}
            if m == 0 and any(bool(t.any()) for t in before.values()):
                return f"step {k}: group 0 has no sum before it, and the revealed one is not zero"
            if m > 0 and partial_digest(before) != got[(k, b, m - 1)].after:
                return f"step {k}: the revealed sum before group {m} is not what block {b} committed"
    return None


def transition_spec(shapes: Mapping[str, tuple[int, ...]], names: Sequence[str], ef_in_params: bool = False) -> dict[str, TensorSpec]:
    """A final check's file: the block's params at the first leaf, params and buffer at the last. With the
    error feedback in the parameters (the merge rule's Δ = G_e − E_e reads no first leaf, and the buffer is
    zero, bound by the leaf's digest), the last leaf's params alone: a third of the bytes (issue 47)."""
    spec = {}
    for n in names:
        spec[f"param/{n}"] = TensorSpec(torch.float32, shapes[n])
        if not ef_in_params:
            spec[f"{START_PREFIX}param/{n}"] = spec[f"ef/{n}"] = spec[f"param/{n}"]
    return spec


def start_spec(shapes: Mapping[str, tuple[int, ...]], merge: bool) -> dict[str, TensorSpec]:
    """A continued start's file: epoch e-1's params and error buffer at its last leaf for every
    parameter, and its params at leaf 0 (``start.param/``) unless the merge rule (``merge``) runs,
    whose Δ_{e-1} = G_{e-1} − E_{e-1} does not read them. 12 bytes per parameter, 8 under merge."""
    prefixes = ("param/", "ef/") if merge else (f"{START_PREFIX}param/", "param/", "ef/")
    return {f"{p}{n}": TensorSpec(torch.float32, shape) for p in prefixes for n, shape in shapes.items()}


__all__ = [
    "SHARD_AUDIT_FORMAT",
    "START_PREFIX",
    "BlockTransition",
    "GroupOpening",
    "ProvenLeaf",
    "ShardAuditError",
    "ShardChallenge",
    "ShardManifest",
    "boundary_names",
    "build_manifest",
    "challenge_spec",
    "covers_merge",
    "data_ends",
    "decode_manifest",
    "drawn_block",
    "drawn_group",
    "encode_manifest",
    "open_groups",
    "opened",
    "opening_keys",
    "openings_error",
    "required_leaves",
    "segment_of",
    "shard_challenges",
    "start_spec",
    "sum_names",
    "transition_spec",
    "unbound_input",
]
