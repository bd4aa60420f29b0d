"""Every step's boundary tensors kept on disk, so answering a shard audit replays one block, not whole steps.

A challenge file needs one block's state at the segment start and the tensors the block consumed
at each of its r steps (docs/protocol.md §5.3). Without this log the trainer has neither: it
replays whole steps from its last checkpoint to regain them, about 12 steps per challenge on
`small`, 0.19 of its training compute at H = 256. With it, the boundaries are read back and the
block's state is advanced alone (``replay_block``, the verifier's own code) from the checkpoint to
the segment start: about 1/B of a step per step replayed.

The price is disk, not CPU: 2 (B - 1) activation-sized tensors per step (20 MB on `small` at
8 x 64 tokens, 5 GB per epoch at H = 256), written once and deleted when the epoch's answer is sent.
The log is a cache, never trusted: an answer built from it is checked against the committed leaves
before it is published (trainer/shard_response.py), and anything missing, torn or altered makes the
trainer fall back to replaying whole steps.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from protocol.formats import write_state
from trainer.blockstep import BlockIO

SQ = "sq"  # every block's squared gradient norm, fp32, in block order


def _act(b: int) -> str:
    return f"act/{b}"


def _grad(b: int) -> str:
    return f"grad/{b}"


class BoundaryLog:
    """``<epoch dir>/bounds/step-<k>.safetensors``: what every block exchanged in step k (leaf k+1)."""

    def __init__(self, epoch_dir: Path) -> None:
        self.path = epoch_dir / "bounds"

    def _file(self, k: int) -> Path:
        return self.path / f"step-{k:06d}.safetensors"

    def put(self, k: int, ios: Sequence[BlockIO]) -> None:
        """Write step k's boundaries (atomically: a torn file is never read as whole)."""
        tensors: dict[str, Tensor] = {SQ: torch.stack([io.sq.to(torch.float32) for io in ios])}
        for b, io in enumerate(ios):
            if io.act is not None:
                tensors[_act(b)] = io.act.contiguous()
            if io.grad_in is not None:
                tensors[_grad(b)] = io.grad_in.contiguous()
        self.path.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".step-")
        os.close(fd)
        try:
            write_state(tensors, tmp)  # the canonical state file: safetensors, read back by safe_open
            os.replace(tmp, self._file(k))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def has(self, steps: range) -> bool:
        return all(self._file(k).exists() for k in steps)

    def block_inputs(self, k: int, b: int, n_blocks: int) -> tuple[Tensor | None, Tensor | None, list[Tensor]]:
        """Block b's inputs in step k: (input activations, output gradient, every block's squared norm)."""
        with safe_open(str(self._file(k)), framework="pt") as f:
            inp = f.get_tensor(_act(b - 1)) if b > 0 else None
            g_out = f.get_tensor(_grad(b + 1)) if b < n_blocks - 1 else None
            sqs = list(f.get_tensor(SQ).unbind())
        if len(sqs) != n_blocks:
            raise ValueError(f"boundary log step {k} holds {len(sqs)} norms for {n_blocks} blocks")
        return inp, g_out, sqs

    def bytes(self) -> int:
        """Disk bytes the log holds now."""
        return sum(p.stat().st_size for p in self.path.glob("step-*.safetensors"))

    def drop(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


__all__ = ["BoundaryLog"]
