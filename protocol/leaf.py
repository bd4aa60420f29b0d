"""The step leaf of a sharded trace (docs/protocol.md §3.1): one commitment over every audit block.

With ``audit.unit = "shard"`` leaf k of a trace is not the digest of the whole state after k steps
but a commitment to each audit block's part of it and to what the blocks exchanged in step k-1, so
a verifier can check one block of one step from that block's state and the tensors of *one group*
(micro-batch) of that step, whatever the batch. Tensor bytes are hashed with the §2 state digest,
so names, dtypes and shapes are bound as well as values.

v4 (issue 31): what a block exchanged in a step is committed per group m of the step's M
micro-batches, as a Merkle root over *group leaves* ``keccak(GROUP_TAG ‖ act_m ‖ grad_m ‖ after_m)``:
the digests of the group's output activations and input gradient, and of the block's gradient
accumulated through group m (the last group's is the step's total, which the state chain binds, so
it is ZERO there). A verifier replays one group and checks the link ``after_{m-1} + g_m = after_m``;
a part cannot vouch for the sum (docs/audit-scaling.md §2a), but a forged sum breaks one link.

Cost: a leaf hashes the boundary tensors of every step and M − 1 partial sums per block (none at
M = 1), but the parameters and moments only every ``segment`` steps (and at the last leaf): the
*state leaves*, where audits start and end. The error buffer never changes inside an epoch, so its
digest is the one of leaf 0 throughout.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from protocol import merkle
from protocol.digest import keccak
from protocol.digest import part_digest as _part
from protocol.digest import part_digests as _parts
from protocol.errors import VerilocoError
from protocol.model import GPTConfig, half_of, param_shapes
from protocol.types import Digest

LEAF_TAG = b"veriloco.step.v4"
GROUP_TAG = b"veriloco.group.v1"
ZERO = Digest(bytes(32))
ENTRY_BYTES = 4 * 32 + 4
_PARAM, _MOM1, _MOM2, _EF = "param/", "adam.m/", "adam.v/", "ef/"


class Boundary(Protocol):
    """What one block exchanged in a step (``dilocox.blockstep.BlockIO``)."""

    act: torch.Tensor | None
    grad_in: torch.Tensor | None
    sq: torch.Tensor


Partials = Mapping[int, Sequence[Digest]]  # per block, the digests of its gradient after groups 0..M-2


class LeafError(VerilocoError):
    """A leaf preimage that is malformed or does not fit the model."""


def block_of(name: str, n_layer: int) -> int:
    """The audit block a parameter belongs to.

    0 the embeddings; ``1 + 2i`` the attention half of transformer block i and ``2 + 2i`` its MLP
    half (``protocol.model.half_of``); ``2 n_layer + 1`` the final norm and head. Halves, not whole
    blocks: an audit reveals one block's parameters and moments, so halving the largest block
    halves the price of a challenge and buys twice the challenges for the same bytes.
    """
    if name.startswith("blocks."):
        _, i, module = name.split(".")[:3]
        return 1 + 2 * int(i) + half_of(module)
    if name.startswith(("wte.", "wpe.")):
        return 0
    return 2 * n_layer + 1


def block_names(cfg: GPTConfig) -> list[list[str]]:
    """Parameter names per audit block, each list sorted bytewise (the model's own names)."""
    out: list[list[str]] = [[] for _ in range(block_count(cfg))]
    for n in param_shapes(cfg):
        out[block_of(n, cfg.n_layer)].append(n)
    return [sorted(g, key=lambda s: s.encode()) for g in out]


def block_count(cfg: GPTConfig) -> int:
    return 2 * cfg.n_layer + 2


def is_state_leaf(k: int, segment: int, leaf_count: int) -> bool:
    """Leaves that commit the block states: multiples of ``segment`` and the last one."""
    return k % segment == 0 or k == leaf_count - 1


@dataclass(frozen=True)
class BlockEntry:
    """One audit block in one leaf; digests are §2 state digests, ZERO where nothing is committed.

    params: the block's ``param/`` tensors; opt: its ``adam.m/`` and ``adam.v/``; ef: its ``ef/``
    (state leaves only); groups: the Merkle root over its group leaves in the step that ended here
    (``GroupLeaf``; ZERO at leaf 0); sq: its squared gradient norm in that step, fp32 little-endian
    (zero at leaf 0).
    """

    params: Digest = ZERO
    opt: Digest = ZERO
    ef: Digest = ZERO
    groups: Digest = ZERO
    sq: bytes = bytes(4)

    def encode(self) -> bytes:
        return self.params + self.opt + self.ef + self.groups + self.sq

    @property
    def sq_tensor(self) -> torch.Tensor:
        return torch.tensor(struct.unpack("<f", self.sq)[0], dtype=torch.float32)


@dataclass(frozen=True)
class GroupLeaf:
    """What one block exchanged with one group of a step, and its gradient accumulated through it.

    act: its output activations on the group's rows (ZERO for the head); grad: the gradient at its
    input on those rows (ZERO for the embeddings); after: ``partial_digest`` of g_0 + ... + g_m
    (ZERO for the last group: the total is bound by the state it produces and by ``sq``).
    """

    act: Digest = ZERO
    grad: Digest = ZERO
    after: Digest = ZERO

    def encode(self) -> bytes:
        return self.act + self.grad + self.after

    @property
    def value(self) -> Digest:
        return keccak(GROUP_TAG + self.encode())

    @classmethod
    def decode(cls, data: bytes) -> GroupLeaf:
        if len(data) != 96:
            raise LeafError(f"a group leaf is 96 bytes, got {len(data)}")
        return cls(Digest(data[:32]), Digest(data[32:64]), Digest(data[64:]))


def group_root(groups: Sequence[GroupLeaf]) -> Digest:
    """The ``groups`` field of a block entry: the Merkle root (protocol.merkle) over group leaf values."""
    return merkle.root([g.value for g in groups])


def partial_digest(grads: Mapping[str, torch.Tensor]) -> Digest:
    """A block's (partial) gradient as the part digest of ``grad/<name>`` entries."""
    return _part({f"grad/{n}": t for n, t in grads.items()})


class PartialSums:
    """A step's ``on_partial`` hook (dilocox.blockstep): the digest of each block's gradient after
    groups 0..M-2, hashed while the sum exists (keeping M copies would cost M block gradients).

    ``seconds``: the thread time spent hashing, which is commitment cost, not the step's compute.
    """

    def __init__(self, micro: int) -> None:
        self.micro = micro
        self.digests: dict[int, list[Digest]] = {}
        self.seconds = 0.0

    def __call__(self, b: int, m: int, acc: Mapping[str, torch.Tensor]) -> None:
        if m < self.micro - 1:
            t = time.thread_time()
            self.digests.setdefault(b, []).append(partial_digest(acc))
            self.seconds += time.thread_time() - t


@dataclass(frozen=True)
class StepLeaf:
    """The preimage of a sharded trace leaf: step counter, rng word, one entry per audit block."""

    step: int
    rng: int
    blocks: tuple[BlockEntry, ...]

    def encode(self) -> bytes:
        head = LEAF_TAG + struct.pack("<QqI", self.step, self.rng, len(self.blocks))
        return head + b"".join(e.encode() for e in self.blocks)

    @property
    def digest(self) -> Digest:
        return keccak(self.encode())

    @classmethod
    def decode(cls, data: bytes, n_blocks: int | None = None) -> StepLeaf:
        head = len(LEAF_TAG) + 20
        if len(data) < head or data[: len(LEAF_TAG)] != LEAF_TAG:
            raise LeafError(f"not a {LEAF_TAG.decode()} leaf preimage")
        step, rng, n = struct.unpack_from("<QqI", data, len(LEAF_TAG))
        if n_blocks is not None and n != n_blocks:
            raise LeafError(f"leaf has {n} blocks, the model has {n_blocks}")
        if len(data) != head + n * ENTRY_BYTES:
            raise LeafError(f"leaf preimage is {len(data)} bytes, expected {head + n * ENTRY_BYTES} for {n} blocks")
        entries = []
        for i in range(n):
            o = head + i * ENTRY_BYTES
            p, opt, ef, groups = (Digest(data[o + 32 * j : o + 32 * (j + 1)]) for j in range(4))
            entries.append(BlockEntry(p, opt, ef, groups, data[o + 128 : o + 132]))
        return cls(step, rng, tuple(entries))

    @property
    def sqs(self) -> list[torch.Tensor]:
        return [e.sq_tensor for e in self.blocks]


def part_digest(state: Mapping[str, torch.Tensor], names: Sequence[str], prefixes: Sequence[str]) -> Digest:
    """Part digest (``protocol.digest.part_digest``) of the ``prefix + name`` entries of ``state``:
    a block's params, moments or buffer."""
    return _part(_select(state, names, prefixes))


def _select(state: Mapping[str, torch.Tensor], names: Sequence[str], prefixes: Sequence[str]) -> dict[str, torch.Tensor]:
    return {p + n: state[p + n] for p in prefixes for n in names}


def tensor_digest(t: torch.Tensor | None) -> Digest:
    """A boundary tensor's digest: the part digest of the one-entry state ``{"x": t}``; ZERO for none."""
    return ZERO if t is None else _part({"x": t})


def sq_bytes(sq: torch.Tensor) -> bytes:
    return struct.pack("<f", float(sq.to(torch.float32)))


class LeafCommitter:
    """Builds the leaf entries of one trainer epoch for some blocks (all by default: a pipeline stage
    passes its own); keeps the error buffer's digests, which are fixed within an epoch.

    ``micro`` is the step's group count M (its micro-batches). Hashes on as many threads as the step
    runs on (``protocol.digest.part_digests``).
    """

    def __init__(self, cfg: GPTConfig, segment: int, leaf_count: int, blocks: Sequence[int] | None = None,
                 micro: int = 1) -> None:
        self.groups = block_names(cfg)
        self.blocks = list(range(len(self.groups))) if blocks is None else list(blocks)
        self.segment, self.leaf_count, self.micro = segment, leaf_count, micro
        self._ef: dict[int, Digest] = {}

    def state_parts(self, state: Mapping[str, torch.Tensor]) -> dict[int, tuple[Digest, Digest, Digest]]:
        if not self._ef:
            self._ef = dict(zip(self.blocks, _parts([_select(state, self.groups[b], (_EF,)) for b in self.blocks])))
        parts = iter(_parts([_select(state, self.groups[b], prefixes)
                             for b in self.blocks for prefixes in ((_PARAM,), (_MOM1, _MOM2))]))
        return {b: (next(parts), next(parts), self._ef[b]) for b in self.blocks}

    def group_leaves(self, ios: Mapping[int, Boundary] | Sequence[Boundary], partials: Partials) -> dict[int, list[GroupLeaf]]:
        """Each of this committer's blocks' M group leaves in one step: its boundaries cut into the M
        groups' rows (one hashing pass, as many bytes as the whole tensors) and ``partials[b]``, the
        digests of its gradient after groups 0..M-2."""
        M = self.micro
        chunks = [t.chunk(M) if t is not None else None for b in self.blocks for t in (ios[b].act, ios[b].grad_in)]
        flat = iter(_parts([{"x": c} for cs in chunks if cs is not None for c in cs]))
        digests = [[next(flat) for _ in range(M)] if cs is not None else [ZERO] * M for cs in chunks]
        out = {}
        for i, b in enumerate(self.blocks):
            after = list(partials.get(b, ())) if M > 1 else []
            if len(after) != M - 1:
                raise LeafError(f"block {b}: {len(after)} partial-sum digests for {M} groups")
            after.append(ZERO)
            out[b] = [GroupLeaf(digests[2 * i][m], digests[2 * i + 1][m], after[m]) for m in range(M)]
        return out

    def entries(
        self, k: int, state: Mapping[str, torch.Tensor], ios: Mapping[int, Boundary] | Sequence[Boundary] | None,
        groups: Mapping[int, Sequence[GroupLeaf]] | None = None,
    ) -> list[BlockEntry]:
        """This committer's blocks' entries of leaf k: the state after k steps, and step k-1's boundaries
        and norms (None at k = 0) with its group leaves (``group_leaves``), indexed by block."""
        parts = self.state_parts(state) if is_state_leaf(k, self.segment, self.leaf_count) else {}
        if ios is None:
            return [BlockEntry(*parts.get(b, (ZERO, ZERO, ZERO))) for b in self.blocks]
        if groups is None:
            raise LeafError(f"leaf {k} needs the group leaves of step {k - 1}")
        return [BlockEntry(*parts.get(b, (ZERO, ZERO, ZERO)), group_root(groups[b]), sq_bytes(ios[b].sq))
                for b in self.blocks]

    def leaf(self, k: int, state: Mapping[str, torch.Tensor], ios: Sequence[Boundary] | None,
             groups: Mapping[int, Sequence[GroupLeaf]] | None = None) -> StepLeaf:
        """Leaf k of a committer over every block."""
        step = int(state["meta/step"].item())
        rng = int(state["meta/rng"].item())
        return StepLeaf(step, rng, tuple(self.entries(k, state, ios, groups)))
