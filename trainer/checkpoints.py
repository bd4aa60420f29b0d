"""A trainer's local memory of its epochs: what it committed to, and states to reproduce any leaf.

Audits may challenge any transition of a trace, so the trainer must be able to produce any state
d_k it committed to. Keeping every state costs H full states per epoch; instead it keeps some
(``CheckpointRule``: always d_0 and d_H) and replays forward from the nearest one, which is exact
because inner steps are bitwise reproducible. The metadata file (salt, CIDs, digests, status) is
written atomically before each chain transaction, so a killed node resumes without losing a reveal
or sending anything twice.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import safe_open

from dilocox.inner import State
from protocol.formats.codec import iter_state, load_state_file
from trainer.direct_io import write_file


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _step_of(checkpoint: Path) -> int:
    """k of ``state-<k>.safetensors`` or of a stage's part ``state-<k>.stage<s>.safetensors``."""
    return int(checkpoint.stem.split("-")[1].split(".")[0])


@dataclass(frozen=True)
class CheckpointRule:
    """Which states of an epoch a trainer keeps, besides d_0 and d_H.

    A checkpoint is where an audit answer (and a restart) replays from. Across steps the answer log
    holds, an answer advances one block, or every block by AdamW alone, so a distant checkpoint costs
    little and ``logged`` (the wider spacing) saves state writes and disk; across a step it left out,
    an answer replays whole steps, so ``every`` is kept there. ``logged`` is a multiple of ``every``:
    the two spacings meet, and a stretch that loses its log mid-way is checkpointed at the next
    ``every`` step."""

    every: int
    logged: int

    @classmethod
    def of(cls, every: int, logged: int | None = None) -> CheckpointRule:
        e = max(1, every)
        return cls(e, e if logged is None else max(e, -(-logged // e) * e))

    def due(self, k: int, steps: int, logged_since: bool) -> bool:
        """Whether d_k is kept, ``logged_since`` saying whether the log holds every step since the last."""
        return k == steps or k % (self.logged if logged_since else self.every) == 0


def worst_replay(steps: int, checkpoints: Sequence[int]) -> int:
    """The most whole steps one audit answer replays when a step it reaches is not in the answer log: from
    the nearest kept state at or before the step through the step, so the widest gap between consecutive
    kept states (d_0 and d_H always among them)."""
    kept = sorted({0, steps, *checkpoints})
    return max(b - a for a, b in itertools.pairwise(kept)) if steps else 0


ANSWER_SHARE = 0.5  # of the response window a replay may take: the rest uploads the answer and sends it


class Checkpointer:
    """The checkpoint bookkeeping of the epoch an engine trains, one for both engines, so that a local
    and a staged trainer keep the same states and survive a full disk alike.

    ``last`` is the latest state kept, where answers start and a restart resumes (the node records its
    leaves there); ``error`` is the last mid-epoch state that could not be written, for the node to
    report: it costs replay distance, never the epoch. The epoch's last state must be written (its
    final check reads it), so its failure still raises."""

    def __init__(self, rule: CheckpointRule) -> None:
        self.rule = rule
        self.steps = self.last = 0
        self.error: str | None = None
        self._logged_since = True

    def begin(self, steps: int, k: int = 0) -> None:
        """An epoch of ``steps`` steps (re)starts from its kept state d_k."""
        self.steps, self.last, self._logged_since = steps, k, True

    def after_step(self, k: int, logged: bool, save: Callable[[], object],
                   refused: type[Exception] | tuple[type[Exception], ...] = OSError) -> bool:
        """Step k is done (``logged``: the answer log holds it): ``save`` d_{k+1} if the rule wants it.
        A mid-epoch ``save`` that raises ``refused`` is skipped and said in ``error``. Whether d_{k+1}
        was kept."""
        self._logged_since = self._logged_since and logged
        if not self.rule.due(k + 1, self.steps, self._logged_since):
            return False
        try:
            save()
        except refused as exc:
            if k + 1 == self.steps:
                raise
            self.error = f"step {k + 1}: {exc}"
            return False
        self.begin(self.steps, k + 1)
        return True


class EpochDir:
    """workdir/epoch-<e>/: meta.json, state-<k>.safetensors checkpoints, carried.safetensors, payload.bin."""

    def __init__(self, root: Path, epoch: int) -> None:
        self.epoch = epoch
        self.path = root / f"epoch-{epoch:06d}"
        self.path.mkdir(parents=True, exist_ok=True)
        self._meta_path = self.path / "meta.json"

    @property
    def meta(self) -> dict[str, Any]:
        try:
            return json.loads(self._meta_path.read_text())
        except FileNotFoundError:
            return {}

    def update(self, **fields: Any) -> dict[str, Any]:
        meta = {**self.meta, **fields}
        _atomic_write(self._meta_path, json.dumps(meta, sort_keys=True, indent=1).encode())
        return meta

    def save(self, name: str, state: State) -> None:
        """Write ``name`` atomically, past the page cache (read back rarely: trainer/direct_io.py)."""
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{name}.")
        os.close(fd)
        try:
            write_file(iter_state(state), tmp)
            os.replace(tmp, self.path / f"{name}.safetensors")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load(self, name: str) -> State:
        return load_state_file(self.path / f"{name}.safetensors", allow_nonfinite=True)

    def load_part(self, name: str, keys: list[str]) -> State:
        """Only ``keys`` of a state file (an audited block's share of a checkpoint: read, not the rest)."""
        with safe_open(str(self.path / f"{name}.safetensors"), framework="pt") as f:
            return {k: f.get_tensor(k) for k in keys}

    def has(self, name: str) -> bool:
        return (self.path / f"{name}.safetensors").exists()

    def checkpoints(self) -> list[int]:
        """Steps with a checkpoint: ``state-<k>`` or, in a staged run, its parts ``state-<k>.stage<s>``."""
        return sorted({_step_of(p) for p in self.path.glob("state-*.safetensors")})

    def drop_between(self) -> int:
        """Remove the checkpoints strictly between the epoch's first and last: once its audit is over
        they serve nothing (the next start check reads the first and the last, a restart resumes a later
        epoch), and they were most of a trainer's disk (64 states an epoch at 4 steps, H = 256).
        Returns the bytes freed."""
        ks = self.checkpoints()
        return self.drop_before(ks[-1]) if ks else 0

    def drop_before(self, k: int) -> int:
        """Remove the checkpoints strictly between the first and k (a windowed run's answered windows: the
        first stays for the start and final checks). Returns the bytes freed."""
        freed = 0
        for p in self.path.glob("state-*.safetensors"):
            if 0 < _step_of(p) < k:
                freed += p.stat().st_size
                p.unlink()
        return freed

    def held_bytes(self) -> int:
        """Bytes of the checkpoints past the first (what answering keeps beside the live state)."""
        return sum(p.stat().st_size for p in self.path.glob("state-*.safetensors") if _step_of(p) > 0)

    def save_step(self, k: int, state: State) -> None:
        self.save(f"state-{k:06d}", state)

    def state_at(self, k: int, step: Callable[[State, int], tuple[State, float]]) -> State:
        """d_k's state: the nearest checkpoint at or before k, advanced with `step(state, j)`."""
        base = max((c for c in self.checkpoints() if c <= k), default=None)
        if base is None:
            raise FileNotFoundError(f"no checkpoint at or before step {k} of epoch {self.epoch}")
        state = self.load(f"state-{base:06d}")
        for j in range(base, k):
            state, _ = step(state, j)
        return state

    def write_bytes(self, name: str, data: bytes) -> None:
        _atomic_write(self.path / name, data)

    def read_bytes(self, name: str) -> bytes:
        return (self.path / name).read_bytes()

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
