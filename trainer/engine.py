"""Where a sharded trainer's state lives: the engine the trainer node drives in ``audit.unit = "shard"`` runs.

The node never touches training tensors itself in a sharded run; it asks an engine to start an
epoch, step, compress and answer audits, and gets back leaves (hashes), payload bytes and the few
block tensors an audit reveals. ``LocalEngine`` keeps the whole state in this process (S = 1);
``trainer.stages.StagedEngine`` gives each pipeline stage process its own blocks. Both run the same
block-wise step (dilocox/blockstep.py), so their leaves and payloads are bitwise equal.

Files (in the epoch's ``EpochDir``): ``state-<k>`` checkpoints every ``every`` steps and at both
ends, ``carried`` (the state the next epoch continues from) and, under the merge rule, ``merged``
(the G_e folded in at step m). A checkpoint is enough to reproduce any later state and boundary
tensor of the epoch: steps are bitwise reproducible, and a replay crossing step m repeats the merge.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from dilocox.blockstep import (
    Batch,
    BlockIO,
    Capture,
    OnPartial,
    Totals,
    blockwise_step,
    group_pass,
    replay_block,
    step_update,
)
from dilocox.compress import CompressionStats, compress
from dilocox.delay import (
    MergeBase,
    StartRule,
    add_offset,
    carry,
    merged_pseudo_gradient,
    pseudo_gradient,
)
from dilocox.inner import EF, MOM1, MOM2, PARAM, RNG, STEP, Params, State, TrainerError, section
from dilocox.round import RoundSpec, merged_if_due, start_state
from protocol.leaf import GroupLeaf, LeafCommitter, PartialSums, StepLeaf, block_names
from trainer.boundaries import GRADIENTS, BoundaryLog, ByteBudget, LogHeadroom
from trainer.checkpoints import Checkpointer, CheckpointRule, EpochDir

MERGED = "merged"  # the file of G_e an epoch folded in at its merge step (schedule.merge_step)
# with error feedback in the parameters, the file of what the merge step added (dilocox.delay.merge_offset)
OFFSET = "merge-offset"

BatchOf = Callable[[int], Batch]  # inner step k of this epoch -> its batch


class Engine(Protocol):
    """What a sharded trainer node needs from wherever its state lives."""

    #: whether ``audit_block`` and the block accessors may run on another thread while ``step`` runs
    #: (the node then answers audits while the next epoch trains)
    concurrent_audits: bool
    #: the last failed write of the boundary log (trainer/boundaries.py), for the node to report
    log_error: str | None
    #: which states the epoch keeps: its latest (where a restart resumes) and the last that could not be
    #: written (answers and a restart then replay from the one before), for the node to report
    checkpoints: Checkpointer

    def begin(self, d: EpochDir, steps: int, g: Params, prev: EpochDir | None) -> StepLeaf:
        """Build S_e (continuing ``prev``'s states when given, else fresh from ``g``); checkpoint 0; leaf 0."""

    def resume(self, d: EpochDir, steps: int, k: int) -> None:
        """Continue an interrupted epoch from its checkpoint at step ``k``."""

    def step(self, d: EpochDir, k: int, batch: Batch) -> tuple[float, StepLeaf]:
        """Train step k (checkpointing when due); (its loss, leaf k+1)."""

    def merge(self, d: EpochDir, g: Params, offset: Params | None = None) -> None:
        """Fold G_e into the live state before the merge rule's step (docs/protocol.md §8); keep G_e in
        ``d`` so that replays crossing that step, and the final Δ = G_e − E_e, repeat it. With error
        feedback in the parameters the step adds ``offset`` instead (kept in ``d`` too)."""

    def finish(self, d: EpochDir, rank: int, seed: int) -> tuple[bytes, CompressionStats]:
        """Compress Δ of the epoch with the error buffer; save the carried state; the raw payload."""

    def has_states(self, d: EpochDir) -> bool:
        """Whether ``d`` holds the start and carried states a next epoch continues from."""

    def block_state(self, d: EpochDir, k: int, b: int, prefixes: tuple[str, ...]) -> State:
        """Audit block b's ``prefixes`` entries (plus meta) at checkpoint leaf k (0 or the last)."""

    def audit_block(self, d: EpochDir, start: int, end: int, b: int, picks: Sequence[int], batch_of: BatchOf, *,
                    logged: bool = True) -> tuple[State, list[Opened]]:
        """Block b's params and moments at leaf ``start`` and, per step start..end-1, what opening group
        ``picks[k - start]`` needs (``Opened``).

        ``logged``: read them from the engine's boundary log where it has one (trainer/boundaries.py);
        False replays whole steps (what a caller does when the log's answer failed its check)."""

    def boundary_log_bytes(self, d: EpochDir) -> tuple[int, int]:
        """(memory, disk) bytes the boundary log of ``d`` holds now (trainer/boundaries.py)."""

    def forget_boundaries(self, d: EpochDir) -> None:
        """Drop what the engine kept of ``d``'s steps only to answer its audit (sent, or no longer due)."""

    def drop_before(self, d: EpochDir, k: int) -> int:
        """Drop what answers of steps before k needed (a windowed run's answered windows); bytes freed."""

    def unlogged_steps(self, d: EpochDir) -> int:
        """Steps of ``d`` its boundary log left out, over its memory and disk budgets."""

    def log_kind(self, d: EpochDir) -> str | None:
        """What the log of ``d`` keeps: "boundaries", "gradients" (trainer/boundaries.py), or None (no log)."""

    def held_bytes(self) -> list[int]:
        """Training-state bytes per process (this one first), each from that process's own live tensors."""

    def close(self) -> None: ...

    @property
    def timings(self) -> dict[str, float]:
        """Cumulative CPU seconds: ``compute_s`` (the steps), ``commit_s`` (hashing the leaves), ``log_s``
        (the answer log); ``answer_cpu_s`` where audit answers run in processes other than the node's."""


def tensor_bytes(obj: object) -> int:
    """Bytes of the tensors reachable from ``obj`` through dicts, lists and tuples (numel x element size)."""
    if isinstance(obj, Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def restrict(state: Mapping[str, Tensor], names: list[str], prefixes: tuple[str, ...]) -> State:
    out: State = {p + n: state[p + n] for p in prefixes for n in names}
    out[STEP], out[RNG] = state[STEP], state[RNG]
    return out


def save_merged(d: EpochDir, g: Mapping[str, Tensor], name: str = MERGED) -> None:
    d.save(name, {PARAM + n: t.detach().cpu() for n, t in g.items()})


def merge_step_of(spec: RoundSpec, epoch: int) -> int:
    """The step at which ``epoch`` folds in G_e; an engine is asked to merge only under the merge rule."""
    m = spec.merge_step_in(epoch)
    if m is None:
        raise TrainerError("only the merge rule (schedule.merge_step) folds a global model in mid-epoch")
    return m


def merged_before(
    spec: RoundSpec, state: State, k: int, epoch: int, load: Callable[[str, list[str]], State]
) -> State:
    """``state`` as step k of ``epoch`` trains from it: at the merge rule's step, params + (G_e − S_e.param),
    or + the saved offset with error feedback in the parameters, for the parameters ``state`` holds (a
    whole state, a stage's blocks or one audit block).

    ``load(name, keys)`` reads entries of an epoch file (``MERGED``, ``state-000000``, ``OFFSET``) on the
    state's device."""
    if not spec.merges_at(k, epoch):
        return state
    keys = [PARAM + n for n in section(state, PARAM)]
    if spec.ef_in_params:
        return add_offset(state, section(load(OFFSET, keys), PARAM))
    return dict(merged_if_due(state, spec, k, epoch, MergeBase(section(load(MERGED, keys), PARAM), load("state-000000", keys))))


def epoch_delta(spec: RoundSpec, start: State, end: State, merged: Callable[[], State]) -> Params:
    """The epoch's pseudo-gradient: S_e − E_e, or G_e − E_e under the merge rule (``merged()`` reads G_e's file)."""
    if spec.rule is not StartRule.MERGE:
        return pseudo_gradient(start, end)
    return merged_pseudo_gradient(section(merged(), PARAM), end)


@dataclass
class Opened:
    """Block b in one step of an answered segment: its boundaries on the opened group's rows (input
    activations, output gradient), its gradient through the group before the opened one and its total
    (``dilocox.blockstep.Capture``; None at M = 1 or group 0), and the group leaves of blocks b−1, b,
    b+1 (the openings)."""

    inp: Tensor | None
    g_out: Tensor | None
    before: Params | None
    total: Params | None
    groups: dict[int, list[GroupLeaf]]

    def flat(self) -> dict[str, Tensor]:
        """Every tensor by a fixed name, and the group leaves as bytes: two ways of answering compare by it."""
        out = {k: t for k, t in (("inp", self.inp), ("g_out", self.g_out)) if t is not None}
        for what, sums in (("before", self.before), ("total", self.total)):
            out.update({f"{what}/{n}": t for n, t in (sums or {}).items()})
        raw = b"".join(g.encode() for b in sorted(self.groups) for g in self.groups[b])
        out["groups"] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        return out


def neighbours(groups: Mapping[int, Sequence[GroupLeaf]], b: int) -> dict[int, list[GroupLeaf]]:
    return {j: list(groups[j]) for j in (b - 1, b, b + 1) if j in groups}


def boundary_of(ios: list[BlockIO], b: int) -> tuple[Tensor | None, Tensor | None]:
    """Block b's inputs in a step: the previous block's output and the next block's input gradient."""
    return (ios[b - 1].act if b > 0 else None), (ios[b + 1].grad_in if b < len(ios) - 1 else None)


def group_rows(t: Tensor | None, micro: int, m: int) -> Tensor | None:
    """Group m's rows of a whole-batch boundary tensor (what an answer ships)."""
    return None if t is None else t.chunk(micro)[m].contiguous()


def own_cpu() -> float:
    """CPU seconds of this thread (its leaves hash on it too: ``protocol.digest.part_digests``).

    Not ``time.process_time``: a trainer may answer audits on another thread while it trains, and
    that replay is not the step's cost. With torch's intra-op threads (``threads > 1``) the step's
    work is spread over threads this cannot see, so the whole process is counted (and the node
    then answers audits inline: nothing else runs beside the step).
    """
    if torch.get_num_threads() > 1:
        return time.process_time()
    return time.thread_time()


class LocalEngine:
    """S = 1: this process holds the whole state. Its audit answers read only checkpoints and run
    pure steps, so they may run on another thread beside ``step``."""

    concurrent_audits = True

    def __init__(self, spec: RoundSpec, every: int, *, every_logged: int | None = None, keep_boundaries: bool = True,
                 log_ram_bytes: int = 0, log_disk_bytes: int | None = None, device: torch.device | str = "cpu",
                 log_headroom: LogHeadroom = (None, None)) -> None:
        self.spec, self.checkpoints = spec, Checkpointer(CheckpointRule.of(every, every_logged))
        # where the steps run; files, leaves, the log and compression stay on the CPU, so on a GPU only
        # the live state and the step's tensors live there (dilocox/device.py says which devices may)
        self.device = torch.device(device)
        self.keep_boundaries = keep_boundaries
        # shared by the epochs' logs (two overlap while one is audited), within the machine's headroom
        self.log_budget = ByteBudget(log_ram_bytes, log_headroom[0])
        self.log_disk = ByteBudget(log_disk_bytes, log_headroom[1])  # the same on disk (None: as much as the disk holds)
        self._logs: dict[Path, BoundaryLog] = {}
        self.log_error: str | None = None  # the last boundary log write that failed (answers then replay whole steps)
        self.groups = block_names(spec.model)
        self.state: State | None = None
        self.committer: LeafCommitter | None = None
        self.steps = 0
        self._timings = {"compute_s": 0.0, "commit_s": 0.0, "log_s": 0.0, "checkpoint_s": 0.0}

    @property
    def timings(self) -> dict[str, float]:
        return self._timings

    def _on(self, tensors: Mapping[str, Tensor]) -> State:
        """``tensors`` on the engine's device (the same dict's tensors, uncopied, on the CPU)."""
        return {k: v.to(self.device) for k, v in tensors.items()}

    def _step(self, state: State, batch: Batch, on_partial: OnPartial | None = None) -> tuple[State, float, list[BlockIO]]:
        x, y = batch
        new, loss, ios = blockwise_step(self._on(state), (x.to(self.device), y.to(self.device)), self.spec.model,
                                        self.spec.inner, self.spec.microbatches, on_partial)
        if self.device.type != "cpu":  # leaves hash on the CPU and the log lives there: one copy each
            ios = [BlockIO(None if io.act is None else io.act.cpu(), None if io.grad_in is None else io.grad_in.cpu(),
                           io.sq.cpu()) for io in ios]
        return new, loss, ios

    def start(self, d: EpochDir, g: Params, prev: EpochDir | None) -> State:
        """S_e by the start rule (docs/protocol.md §8), computed on the CPU as a verifier does."""
        if prev is not None and self.has_states(prev):
            return start_state(self.spec, g, prev.load("state-000000"), prev.load("carried"))
        return start_state(self.spec, g, None, None)

    def begin(self, d: EpochDir, steps: int, g: Params, prev: EpochDir | None) -> StepLeaf:
        state = self.start(d, g, prev)
        self.state, self.steps = self._on(state), steps
        self.committer = LeafCommitter(self.spec.model, self.spec.segment, steps + 1, micro=self.spec.microbatches)
        d.save_step(0, state)
        self.checkpoints.begin(steps)
        return self.committer.leaf(0, state, None)

    def resume(self, d: EpochDir, steps: int, k: int) -> None:
        self.state, self.steps = self._on(d.load(f"state-{k:06d}")), steps
        self.checkpoints.begin(steps, k)
        self.committer = LeafCommitter(self.spec.model, self.spec.segment, steps + 1, micro=self.spec.microbatches)
        self.committer.state_parts(d.load("state-000000"))  # the error buffer's digests, fixed since leaf 0

    def step(self, d: EpochDir, k: int, batch: Batch) -> tuple[float, StepLeaf]:
        if self.state is None or self.committer is None:
            raise TrainerError("the engine has no epoch begun or resumed")
        t = own_cpu()
        sums = PartialSums(self.spec.microbatches)
        totals = Totals(self.spec.microbatches, sums)
        self.state, loss, ios = self._step(self.state, batch, totals)
        t_step = own_cpu()
        groups = self.committer.group_leaves(ios, sums.digests)
        leaf = self.committer.leaf(k + 1, self.state, ios, groups)
        t_leaf = own_cpu()
        logged = False
        if self.keep_boundaries:
            try:
                logged = self._log(d).put(k, ios, groups, totals.totals)
            except OSError as exc:  # a full disk costs the cheap answer for this step, never the step
                self.log_error = f"step {k}: {exc}"
        self._timings["compute_s"] += t_step - t - sums.seconds
        self._timings["commit_s"] += t_leaf - t_step + sums.seconds
        self._timings["log_s"] += own_cpu() - t_leaf
        t_save, state = own_cpu(), self.state
        self.checkpoints.after_step(k, logged, lambda: d.save_step(k + 1, state))  # what answers replay from
        self._timings["checkpoint_s"] += own_cpu() - t_save
        return loss, leaf

    def _merged(self, d: EpochDir, state: State, k: int) -> State:
        return merged_before(self.spec, state, k, d.epoch, lambda name, keys: self._on(d.load_part(name, keys)))

    def merge(self, d: EpochDir, g: Params, offset: Params | None = None) -> None:
        if self.state is None:
            raise TrainerError("the engine has no epoch begun or resumed")
        save_merged(d, g)
        if offset is not None:
            save_merged(d, offset, OFFSET)
        self.state = self._merged(d, self.state, merge_step_of(self.spec, d.epoch))

    def finish(self, d: EpochDir, rank: int, seed: int) -> tuple[bytes, CompressionStats]:
        if self.state is None:
            raise TrainerError("the engine has no epoch to finish")
        start, end = d.load("state-000000"), {k: v.cpu() for k, v in self.state.items()}
        c = compress(epoch_delta(self.spec, start, end, lambda: d.load(MERGED)), section(end, EF), rank, seed,
                     self.spec.compression)
        d.save("carried", carry(end, c.new_ef))
        return c.payload, c.stats

    def has_states(self, d: EpochDir) -> bool:
        return d.has("state-000000") and d.has("carried")

    def block_state(self, d: EpochDir, k: int, b: int, prefixes: tuple[str, ...]) -> State:
        return restrict(d.load(f"state-{k:06d}"), self.groups[b], prefixes)

    def audit_block(self, d: EpochDir, start: int, end: int, b: int, picks: Sequence[int], batch_of: BatchOf, *,
                    logged: bool = True) -> tuple[State, list[Opened]]:
        base = max((c for c in d.checkpoints() if c <= start), default=None)
        log = self._log(d)
        if logged and self.keep_boundaries and base is not None and log.has(range(base, end)):
            try:
                if log.kind == GRADIENTS:
                    return self._gradient_block(d, log, base, start, end, b, picks, batch_of)
                return self._logged_block(d, log, base, start, end, b, picks, batch_of)
            except Exception as exc:  # noqa: BLE001 - the log is a cache: a file it cannot read means whole steps
                self.log_error = f"epoch {d.epoch} boundary log unreadable ({type(exc).__name__}: {exc}); replaying whole steps"
        state = d.state_at(start, lambda st, j: self._step(self._merged(d, st, j), batch_of(j))[:2])
        shard = restrict(state, self.groups[b], (PARAM, MOM1, MOM2))
        micro = self.spec.microbatches
        committer = LeafCommitter(self.spec.model, self.spec.segment, 2, micro=micro)
        out = []
        for j, m in zip(range(start, end), picks, strict=True):
            cap = Capture(b, m, micro, sums := PartialSums(micro))
            state, _, ios = self._step(self._merged(d, state, j), batch_of(j), cap)
            inp, g_out = boundary_of(ios, b)
            out.append(Opened(group_rows(inp, micro, m), group_rows(g_out, micro, m), cap.before, cap.total if micro > 1 else None,
                              neighbours(committer.group_leaves(ios, sums.digests), b)))
        return shard, out

    def _logged_block(self, d: EpochDir, log: BoundaryLog, base: int, start: int, end: int, b: int,
                      picks: Sequence[int], batch_of: BatchOf) -> tuple[State, list[Opened]]:
        """Block b alone from checkpoint ``base`` through the segment on the logged boundaries."""
        n, cfg = len(self.groups), self.spec
        state = self._on(d.load_part(f"state-{base:06d}", [p + name for p in (PARAM, MOM1, MOM2) for name in self.groups[b]] + [STEP, RNG]))
        dev = self.device
        shard: State = {}
        out = []
        for j in range(base, end):
            if j == start:
                shard = restrict(state, self.groups[b], (PARAM, MOM1, MOM2))
            inp, g_out, sqs = log.block_inputs(j, b, n)
            x, y = batch_of(j)
            cap = Capture(b, picks[j - start] if j >= start else -1, cfg.microbatches)
            state = self._merged(d, state, j)
            state, _ = replay_block(state, b, (x.to(dev), y.to(dev)), cfg.model, cfg.inner, cfg.microbatches,
                                    None if inp is None else inp.to(dev), None if g_out is None else g_out.to(dev),
                                    [q.to(dev) for q in sqs], on_partial=cap)
            if j >= start:
                m = picks[j - start]
                out.append(Opened(group_rows(inp, cfg.microbatches, m), group_rows(g_out, cfg.microbatches, m), cap.before, cap.total if cfg.microbatches > 1 else None,
                                  neighbours(log.groups(j), b)))
        return shard, out

    def _gradient_block(self, d: EpochDir, log: BoundaryLog, base: int, start: int, end: int, b: int,
                        picks: Sequence[int], batch_of: BatchOf) -> tuple[State, list[Opened]]:
        """Every block advanced from checkpoint ``base`` by AdamW alone on the logged total gradients;
        at each step of the segment, groups 0..m of the whole model for group m's boundaries and the
        sum before it: (m + 1) / M of a step per step, whatever the batch."""
        n, cfg, micro = len(self.groups), self.spec, self.spec.microbatches
        state = self._on(d.load(f"state-{base:06d}"))
        shard: State = {}
        out = []
        for j in range(base, end):
            if j == start:
                shard = restrict(state, self.groups[b], (PARAM, MOM1, MOM2))
            state = self._merged(d, state, j)
            totals, sqs = log.totals(j)
            totals, sqs = self._on(totals), [q.to(self.device) for q in sqs]
            if j >= start:
                m = picks[j - start]
                cap = Capture(b, m, micro)
                run = group_pass(state, batch_of(j), cfg.model, micro, m, cap)
                inp = run.acts[b - 1][m].cpu() if b > 0 else None
                g_out = run.gins[b + 1][m].cpu() if b < n - 1 else None
                total = {name: totals[name] for name in self.groups[b]} if micro > 1 else None
                out.append(Opened(inp, g_out, cap.before, total, neighbours(log.groups(j), b)))
            state = step_update(state, totals, cfg.inner, sqs)
        return shard, out

    def _log(self, d: EpochDir) -> BoundaryLog:
        if d.path not in self._logs:
            self._logs[d.path] = BoundaryLog(d.path, self.log_budget, self.log_disk, self.steps)
        return self._logs[d.path]

    def boundary_log_bytes(self, d: EpochDir) -> tuple[int, int]:
        log = self._logs.get(d.path) or BoundaryLog(d.path)  # asking does not open a log
        return log.ram_bytes, log.disk_bytes()

    def forget_boundaries(self, d: EpochDir) -> None:
        self._logs.pop(d.path, BoundaryLog(d.path)).drop()

    def drop_before(self, d: EpochDir, k: int) -> int:
        """Keep only what answers from step k on need: the latest checkpoint at or before k (and the
        first), the log since it. Returns the bytes freed."""
        base = max((c for c in d.checkpoints() if c <= k), default=0)
        return d.drop_before(base) + self._log(d).drop_before(base)

    def unlogged_steps(self, d: EpochDir) -> int:
        """Steps of the epoch over both log budgets (their challenges replay whole steps)."""
        log = self._logs.get(d.path)
        return 0 if log is None else len(log.unlogged)

    def log_kind(self, d: EpochDir) -> str | None:
        log = self._logs.get(d.path)
        return log.kind if log is not None and any(self.boundary_log_bytes(d)) else None  # None: it kept nothing

    def held_bytes(self) -> list[int]:
        return [tensor_bytes(self.state)]

    def close(self) -> None:
        self.state = None


__all__ = [
    "MERGED",
    "OFFSET",
    "BatchOf",
    "Engine",
    "LocalEngine",
    "Opened",
    "boundary_of",
    "epoch_delta",
    "group_rows",
    "merged_before",
    "neighbours",
    "own_cpu",
    "restrict",
    "save_merged",
    "tensor_bytes",
]
