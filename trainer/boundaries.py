"""Every step's boundary tensors kept (or, at large batches, its total gradients), so answering a
shard audit does not replay whole steps.

A challenge file needs one block's state at the segment start and the tensors the block consumed
at each of its r steps (docs/protocol.md §5.3). Without this log the trainer has neither: it
replays whole steps from its last checkpoint to regain them, about 12 steps per challenge on
`small`, 0.19 of its training compute at H = 256. With it, the boundaries are read back and the
block's state is advanced alone (``replay_block``, the verifier's own code) from the checkpoint to
the segment start: about 1/B of a step per step replayed.

The price is memory or disk: 2 (B - 1) activation-sized tensors per step (20 MB on `small` at
8 x 64 tokens, 5 GB per epoch at H = 256), kept until the epoch's answer is sent. Up to a byte
budget shared by a trainer's logs (``ByteBudget``) a step's tensors are simply kept: the step made
them and nothing else holds them, so keeping them costs no copy. Past the budget they are written
to ``<epoch dir>/bounds/`` (a copy into the page cache: 7 ms per 20 MB alone here, several times that
on a machine whose memory bandwidth other processes share), up to a second budget for disk. Past
both, a step is not logged at all; a challenge reaching an unlogged step replays whole steps.

Boundaries grow with tokens per step (80 GB per step for a 124M model at 0.5M tokens); a step's total
gradients do not (4 bytes a parameter). Where the boundaries are the larger and an epoch of them
would not fit the budgets, the log keeps the totals instead (the *gradient log*): an answer then
advances every block by AdamW alone from the checkpoint and runs groups 0..m of each challenged
step through the whole model, (m + 1) / M of a step (docs/audit-scaling.md §3). The log is a cache,
never trusted: an answer built from it is checked against the committed leaves before it is
published (trainer/shard_response.py), and anything missing, torn or altered makes the trainer fall
back to replaying whole steps.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from dilocox.blockstep import BlockIO
from protocol.formats.codec import iter_state
from protocol.leaf import GroupLeaf
from trainer.direct_io import write_file

SQ = "sq"  # every block's squared gradient norm, fp32, in block order
TOTAL = "total/"  # a parameter's total gradient in the step (what AdamW used), fp32: the gradient log
BOUNDARIES, GRADIENTS = "boundaries", "gradients"
_PREFIX = {BOUNDARIES: "step-", GRADIENTS: "grad-"}
GROUPS = "groups"  # the logged blocks' group leaves (protocol.leaf.GroupLeaf), uint8 [blocks, M, 96]
GROUP_BLOCKS = "group_blocks"  # which blocks GROUPS holds, in order (a stage logs its own), int64


def _act(b: int) -> str:
    return f"act/{b}"


def _grad(b: int) -> str:
    return f"grad/{b}"


Headroom = Callable[[], "int | None"]  # bytes the machine can still give a log now (None: unknown, no check)
LogHeadroom = tuple[Headroom | None, Headroom | None]  # (memory, disk): what a log's two budgets are also held to


class ByteBudget:
    """Bytes of boundary tensors a trainer's logs may keep in memory (or on disk), together (epochs
    overlap). ``limit`` None: no limit. ``headroom`` (the machine's, read at each step) also bounds
    it: a budget is this node's share, but nodes sharing a machine each have one, so a log also stops
    where the machine would run short (``memory_headroom``, ``DiskHeadroom``)."""

    def __init__(self, limit: int | None, headroom: Headroom | None = None) -> None:
        self.limit, self.used = (None if limit is None else max(0, limit)), 0
        self.headroom = headroom

    def room(self) -> float:
        """Bytes left (inf where neither the limit nor the machine bounds it)."""
        left = math.inf if self.limit is None else self.limit - self.used
        spare = None if self.headroom is None else self.headroom()
        return left if spare is None else min(left, max(0, spare))

    def fits(self, size: int) -> bool:
        return size <= self.room()


def memory_headroom() -> int | None:
    """Memory a log may still take on this machine: what it has available less a quarter of its
    physical memory, kept for the processes beside it (None where the kernel does not say)."""
    try:
        with open("/proc/meminfo") as f:
            info = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f if ":" in line)}
        return info["MemAvailable"] - info["MemTotal"] // 4
    except (OSError, KeyError, ValueError):
        return None


@dataclass(frozen=True)
class DiskHeadroom:
    """Disk a log may still take where ``path`` lives: what is free less a tenth of the file system,
    kept so that nodes sharing a disk cannot fill it."""

    path: Path

    def __call__(self) -> int | None:
        try:
            use = shutil.disk_usage(self.path)
        except OSError:
            return None
        return use.free - use.total // 10


def quarter_of_free_disk(path: Path) -> int:
    """The node's default disk budget: a quarter of what is free where its state folder lives now."""
    path.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(path).free // 4


def quarter_of_memory() -> int:
    """The node's default budget: a quarter of this machine's physical memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):
        return 0


class BoundaryLog:
    """What one epoch's audit answers need of each step k (leaf k+1): in memory within ``budget``, else
    ``<epoch dir>/bounds/<step|grad>-<k>.safetensors``.

    It keeps one of two things, chosen at the first step kept and fixed for the epoch (``kind``):

    - ``boundaries``: every block's boundary tensors. An answer then replays one block alone, about
      1/B of a step per step, but they cost ``2 (B − 1) · T · d`` floats a step, growing with tokens
      per step T.
    - ``gradients``: every parameter's total gradient (4 bytes a parameter a step, whatever the batch).
      An answer advances the whole state from a checkpoint by AdamW alone and runs only groups 0..m of
      each challenged step, about (m + 1) / M of a step (docs/audit-scaling.md §3, "gradient log").

    Boundaries are kept when they are no larger, or when the whole epoch's (``steps`` of them) fits
    both budgets; otherwise gradients. ``kind`` fixes the choice (a pipeline stage keeps gradients:
    its blocks' boundaries at the stage borders live in other processes). ``name`` is the folder
    under the epoch directory (one per stage).
    """

    def __init__(self, epoch_dir: Path, budget: ByteBudget | None = None, disk: ByteBudget | None = None,
                 steps: int | None = None, *, name: str = "bounds", kind: str | None = None) -> None:
        self.path = epoch_dir / name
        self.budget, self.disk, self.steps = budget, disk, steps
        self._ram: dict[int, dict[str, Tensor]] = {}
        self.ram_bytes = 0
        self._disk_sizes: dict[int, int] = {}  # what this log charged to ``disk``, by step
        self.unlogged: list[int] = []  # steps over both budgets, not kept
        on_disk = [kind for kind, pre in _PREFIX.items() if any(self.path.glob(f"{pre}*.safetensors"))]
        self.kind: str | None = on_disk[0] if len(on_disk) == 1 else kind  # a restarted node keeps its files' kind

    def _file(self, k: int) -> Path:
        return self.path / f"{_PREFIX[self.kind or BOUNDARIES]}{k:06d}.safetensors"

    def _room(self) -> float:
        """Bytes both budgets have left (inf where one has no limit)."""
        return (0.0 if self.budget is None else self.budget.room()) + (math.inf if self.disk is None else self.disk.room())

    def _choose(self, bound: int, grad: int) -> str:
        if grad >= bound or self.steps is None or bound * self.steps <= self._room():
            return BOUNDARIES
        return GRADIENTS

    def put(self, k: int, ios: Sequence[BlockIO], groups: Mapping[int, Sequence[GroupLeaf]],
            totals: Mapping[int, Mapping[str, Tensor]] | None = None) -> bool:
        """Keep step k's boundaries or, with ``totals`` (the logged blocks' total gradients) when those
        are chosen, its totals, with the group leaves of ``groups``' blocks and every block's norm (from
        ``ios``, one per block), in memory if the budget allows, else written (atomically: a torn file is
        never read as whole) if the disk budget allows; False if neither."""
        logged = sorted(groups)
        raw = b"".join(g.encode() for b in logged for g in groups[b])
        tensors: dict[str, Tensor] = {
            SQ: torch.stack([io.sq.to(torch.float32).cpu() for io in ios]),
            GROUPS: torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(len(logged), -1, 96),
            GROUP_BLOCKS: torch.tensor(logged, dtype=torch.int64),
        }
        bound: dict[str, Tensor] = {}
        for b, io in enumerate(ios):
            if io.act is not None:
                bound[_act(b)] = io.act.contiguous()
            if io.grad_in is not None:
                bound[_grad(b)] = io.grad_in.contiguous()
        grads = {TOTAL + n: t for b in sorted(totals or {}) for n, t in (totals or {})[b].items()}
        if self.kind is None:
            self.kind = GRADIENTS if grads and self._choose(_bytes(bound), _bytes(grads)) == GRADIENTS else BOUNDARIES
        if self.kind == GRADIENTS and not grads:
            raise ValueError(f"step {k}: a gradient log needs the step's total gradients")
        tensors.update({n: t.detach().cpu().contiguous() for n, t in grads.items()} if self.kind == GRADIENTS else bound)
        size = _bytes(tensors)
        if self.budget is not None and self.budget.fits(size) and k not in self._ram:
            self._ram[k] = tensors
            self.ram_bytes += size
            self.budget.used += size
            return True
        if self.disk is not None and k not in self._disk_sizes and not self.disk.fits(size):
            self.unlogged.append(k)
            return False
        self.path.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".step-")
        os.close(fd)
        try:
            write_file(iter_state(tensors), tmp)  # the canonical state file (safetensors, read back by safe_open), past the page cache
            os.replace(tmp, self._file(k))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if self.disk is not None and k not in self._disk_sizes:
            self._disk_sizes[k] = size
            self.disk.used += size
        return True

    def has(self, steps: range) -> bool:
        return all(k in self._ram or self._file(k).exists() for k in steps)

    def block_inputs(self, k: int, b: int, n_blocks: int) -> tuple[Tensor | None, Tensor | None, list[Tensor]]:
        """Block b's inputs in step k: (input activations, output gradient, every block's squared norm)."""
        kept = self._ram.get(k)
        if kept is not None:
            inp, g_out, sq = (kept[_act(b - 1)] if b > 0 else None), (kept[_grad(b + 1)] if b < n_blocks - 1 else None), kept[SQ]
        else:
            with safe_open(str(self._file(k)), framework="pt") as f:
                inp = f.get_tensor(_act(b - 1)) if b > 0 else None
                g_out = f.get_tensor(_grad(b + 1)) if b < n_blocks - 1 else None
                sq = f.get_tensor(SQ)
        sqs = list(sq.unbind())
        if len(sqs) != n_blocks:
            raise ValueError(f"boundary log step {k} holds {len(sqs)} norms for {n_blocks} blocks")
        return inp, g_out, sqs

    def totals(self, k: int) -> tuple[dict[str, Tensor], list[Tensor]]:
        """Step k's total gradient of every parameter and every block's squared norm (a gradient log)."""
        kept = self._ram.get(k)
        if kept is None:
            with safe_open(str(self._file(k)), framework="pt") as f:
                kept = {n: f.get_tensor(n) for n in f.keys() if n.startswith(TOTAL) or n == SQ}  # noqa: SIM118 - a safe_open handle is not iterable
        totals = {n[len(TOTAL):]: t for n, t in kept.items() if n.startswith(TOTAL)}
        if self.kind != GRADIENTS or not totals:
            raise ValueError(f"the log of step {k} holds no total gradients")
        return totals, list(kept[SQ].unbind())

    def groups(self, k: int) -> dict[int, list[GroupLeaf]]:
        """The logged blocks' group leaves in step k."""
        kept = self._ram.get(k)
        if kept is not None:
            raw, blocks = kept[GROUPS], kept[GROUP_BLOCKS]
        else:
            with safe_open(str(self._file(k)), framework="pt") as f:
                raw, blocks = f.get_tensor(GROUPS), f.get_tensor(GROUP_BLOCKS)
        return {int(b): [GroupLeaf.decode(bytes(row.tolist())) for row in block] for b, block in zip(blocks, raw, strict=True)}

    def disk_bytes(self) -> int:
        """Disk bytes the log holds now."""
        return sum(p.stat().st_size for pre in _PREFIX.values() for p in self.path.glob(f"{pre}*.safetensors"))

    def drop_before(self, k: int) -> int:
        """Forget steps before k (a windowed run's answered windows): memory back to the budget, files
        deleted. Returns the bytes freed."""
        freed = 0
        for j in [j for j in self._ram if j < k]:
            size = _bytes(self._ram.pop(j))
            self.ram_bytes -= size
            freed += size
            if self.budget is not None:
                self.budget.used -= size
        for pre in _PREFIX.values():
            for p in self.path.glob(f"{pre}*.safetensors"):
                j = int(p.stem[len(pre):])
                if j < k:
                    freed += p.stat().st_size
                    p.unlink()
                    if self.disk is not None:
                        self.disk.used -= self._disk_sizes.pop(j, 0)
        return freed

    def drop(self) -> None:
        """Forget every step: memory back to the budget, files deleted."""
        self.drop_before(sys.maxsize)
        if self.disk is not None:  # what was charged for files gone meanwhile
            self.disk.used -= sum(self._disk_sizes.values())
        self._disk_sizes.clear()
        shutil.rmtree(self.path, ignore_errors=True)


def _bytes(tensors: Mapping[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


__all__ = ["BOUNDARIES", "GRADIENTS", "BoundaryLog", "ByteBudget", "DiskHeadroom", "Headroom", "LogHeadroom", "memory_headroom",
           "quarter_of_free_disk", "quarter_of_memory"]
