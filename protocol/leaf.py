"""The step leaf of a sharded trace (docs/protocol.md §3.1): one commitment over every audit block.

With ``audit.unit = "shard"`` leaf k of a trace is not the digest of the whole state after k steps
but a commitment to each audit block's part of it and to what the blocks exchanged in step k-1, so
a verifier can check one block of one step from that block's state and its boundary tensors, and
the leaf's preimage (a few hundred bytes per block) proves which bytes to expect. Tensor bytes are
hashed with the §2 state digest, so names, dtypes and shapes are bound as well as values.

Cost: a leaf hashes the boundary tensors of every step, but the parameters and moments only every
``segment`` steps (and at the last leaf): the *state leaves*, where audits start and end. The error
buffer never changes inside an epoch, so its digest is the one of leaf 0 throughout.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from protocol.digest import keccak
from protocol.digest import part_digest as _part
from protocol.digest import part_digests as _parts
from protocol.errors import VerilocoError
from protocol.model import GPTConfig, half_of, param_shapes
from protocol.types import Digest

LEAF_TAG = b"veriloco.step.v3"
ZERO = Digest(bytes(32))
ENTRY_BYTES = 5 * 32 + 4
_PARAM, _MOM1, _MOM2, _EF = "param/", "adam.m/", "adam.v/", "ef/"


class Boundary(Protocol):
    """What one block exchanged in a step (``trainer.blockstep.BlockIO``)."""

    act: torch.Tensor | None
    grad_in: torch.Tensor | None
    sq: torch.Tensor


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
    (state leaves only); act: its output activations in the step that ended here (not the head);
    grad: the gradient at its input in that step (not the embeddings); sq: its squared gradient norm
    in that step, fp32 little-endian (zero at leaf 0).
    """

    params: Digest = ZERO
    opt: Digest = ZERO
    ef: Digest = ZERO
    act: Digest = ZERO
    grad: Digest = ZERO
    sq: bytes = bytes(4)

    def encode(self) -> bytes:
        return self.params + self.opt + self.ef + self.act + self.grad + self.sq

    @property
    def sq_tensor(self) -> torch.Tensor:
        return torch.tensor(struct.unpack("<f", self.sq)[0], dtype=torch.float32)


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
            p, opt, ef, act, grad = (Digest(data[o + 32 * j : o + 32 * (j + 1)]) for j in range(5))
            entries.append(BlockEntry(p, opt, ef, act, grad, data[o + 160 : o + 164]))
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

    Hashes on as many threads as the step runs on (``protocol.digest.part_digests``).
    """

    def __init__(self, cfg: GPTConfig, segment: int, leaf_count: int, blocks: Sequence[int] | None = None) -> None:
        self.groups = block_names(cfg)
        self.blocks = list(range(len(self.groups))) if blocks is None else list(blocks)
        self.segment, self.leaf_count = segment, leaf_count
        self._ef: dict[int, Digest] = {}

    def state_parts(self, state: Mapping[str, torch.Tensor]) -> dict[int, tuple[Digest, Digest, Digest]]:
        if not self._ef:
            self._ef = dict(zip(self.blocks, _parts([_select(state, self.groups[b], (_EF,)) for b in self.blocks])))
        parts = iter(_parts([_select(state, self.groups[b], prefixes)
                             for b in self.blocks for prefixes in ((_PARAM,), (_MOM1, _MOM2))]))
        return {b: (next(parts), next(parts), self._ef[b]) for b in self.blocks}

    def entries(
        self, k: int, state: Mapping[str, torch.Tensor], ios: Mapping[int, Boundary] | Sequence[Boundary] | None,
    ) -> list[BlockEntry]:
        """This committer's blocks' entries of leaf k: the state after k steps, the boundaries of step k-1
        (None at k = 0), indexed by block."""
        parts = self.state_parts(state) if is_state_leaf(k, self.segment, self.leaf_count) else {}
        if ios is None:
            return [BlockEntry(*parts.get(b, (ZERO, ZERO, ZERO))) for b in self.blocks]
        tensors = [t for b in self.blocks for t in (ios[b].act, ios[b].grad_in)]
        digests = iter(_parts([{"x": t} for t in tensors if t is not None]))
        bounds = [ZERO if t is None else next(digests) for t in tensors]
        return [
            BlockEntry(*parts.get(b, (ZERO, ZERO, ZERO)), bounds[2 * i], bounds[2 * i + 1], sq_bytes(ios[b].sq))
            for i, b in enumerate(self.blocks)
        ]

    def leaf(self, k: int, state: Mapping[str, torch.Tensor], ios: Sequence[Boundary] | None) -> StepLeaf:
        """Leaf k of a committer over every block."""
        step = int(state["meta/step"].item())
        rng = int(state["meta/rng"].item())
        return StepLeaf(step, rng, tuple(self.entries(k, state, ios)))
