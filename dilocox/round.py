"""One trainer epoch as pure functions: plan, train with a digest trace, compress, carry over.

The trainer node runs these; the verifier replays single pieces of them (one inner step, the final
state → payload transition, the start-state rule), so everything a verifier must reproduce is a
function of the run config, public chain/store data and the trainer's committed states. No I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from torch import Tensor

from dilocox.compress import (
    CompressionConfig,
    CompressionStats,
    EpochRecord,
    adapt,
    compress,
    compression_seed,
)
from dilocox.delay import (
    MergeBase,
    StartRule,
    carry,
    merged_pseudo_gradient,
    next_start,
    pseudo_gradient,
)
from dilocox.inner import EF, InnerConfig, State, TrainerError, section, train_step
from protocol import merkle
from protocol.config import RunConfig, merge_step_for
from protocol.data import Corpus, batch
from protocol.digest import state_digest
from protocol.formats.payload import wrap
from protocol.model import GPTConfig
from protocol.types import Digest

Batch = tuple[Tensor, Tensor]
StepHook = Callable[[int, State, float], None]  # (step just finished, state after it, loss)


@dataclass(frozen=True)
class RoundSpec:
    """The parts of a run config that fix what one trainer epoch computes."""

    model: GPTConfig
    inner: InnerConfig
    compression: CompressionConfig
    rule: StartRule
    run_seed: int
    batch_size: int
    seq_len: int
    microbatches: int = 1
    shard: bool = False  # audit.unit = "shard": block-wise steps and step leaves (protocol.leaf)
    segment: int = 1
    merge_step: int = 0  # the MERGE rule's step m (schedule.merge_step): step m opens by folding in G_e
    first_merge_step: int = -1  # epoch 1's m where it differs (schedule.first_merge_step; -1: merge_step)

    @classmethod
    def from_config(cls, cfg: RunConfig) -> RoundSpec:
        model = cfg.model_config()
        if cfg.data.seq_len > model.seq_len:
            raise TrainerError(
                f"data.seq_len={cfg.data.seq_len} exceeds the {cfg.model.preset} context {model.seq_len}"
            )
        i, c, s = cfg.inner, cfg.compression, cfg.schedule
        return cls(
            model=model,
            inner=InnerConfig(
                lr=i.lr, beta1=i.beta1, beta2=i.beta2, weight_decay=i.weight_decay,
                warmup_steps=i.warmup_steps, total_steps=i.total_steps, grad_clip=i.grad_clip,
            ),
            compression=CompressionConfig(
                bits=c.bits, group_size=c.group_size, rank_initial=c.rank_initial,
                rank_min=c.rank_min, rank_max=c.rank_max,
                h_initial=s.h_initial, h_min=s.h_min, h_max=s.h_max,
                error_feedback=c.error_feedback == "buffer",
            ),
            rule=StartRule.MERGE if s.merge_step else StartRule.DELAYED if s.one_step_delay else StartRule.BLOCKING,
            run_seed=cfg.data.run_seed,
            batch_size=cfg.data.batch_size,
            seq_len=cfg.data.seq_len,
            microbatches=i.microbatches,
            shard=cfg.audit.unit == "shard",
            segment=cfg.audit.segment,
            merge_step=s.merge_step,
            first_merge_step=s.first_merge_step,
        )

    def merge_step_in(self, epoch: int) -> int | None:
        """The step m whose transition opens with the merge in ``epoch`` (None: not the merge rule)."""
        return merge_step_for(epoch, self.merge_step, self.first_merge_step) if self.rule is StartRule.MERGE else None

    @property
    def ef_in_params(self) -> bool:
        """``compression.error_feedback = "params"``: no error buffer; the merge step adds the public
        offset (G_e − G_{e-1}) + decode(P_{e-1}) (``dilocox.delay.merge_offset``, docs/protocol.md §8)."""
        return self.rule is StartRule.MERGE and not self.compression.error_feedback

    def merges_at(self, k: int, epoch: int) -> bool:
        """Whether transition k → k+1 of ``epoch`` opens with the merge (docs/protocol.md §8)."""
        return k == self.merge_step_in(epoch)


def epoch_batch(spec: RoundSpec, corpus: Corpus, epoch: int, slot: int, step: int) -> Batch:
    """The batch a trainer in `slot` trains on at inner step `step` (0-based) of `epoch`."""
    return batch(corpus, spec.run_seed, epoch, slot, step, spec.batch_size, spec.seq_len)


def plan(spec: RoundSpec, history: Sequence[EpochRecord]) -> tuple[int, int]:
    """(rank, H) for an epoch, from the records of epochs public when it starts (dilocox.delay)."""
    return adapt(history, spec.compression)


@dataclass
class Trace:
    """An epoch's states summarised: digests d_0..d_H (the Merkle leaves), losses, the end state."""

    end: State
    digests: list[Digest] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    @property
    def root(self) -> Digest:
        return merkle.root(self.digests)

    @property
    def leaf_count(self) -> int:
        return len(self.digests)


def merged_if_due(
    state: Mapping[str, Tensor], spec: RoundSpec, k: int, epoch: int, merge: MergeBase | None
) -> Mapping[str, Tensor]:
    """The state step k of ``epoch`` trains from: under the merge rule, step m first folds in G_e."""
    if not spec.merges_at(k, epoch):
        return state
    if merge is None:
        raise TrainerError(f"step {k} folds in the global model G_e (schedule.merge_step): it needs G_e and the start state")
    return merge.apply(state)


def replay_step(
    state: Mapping[str, Tensor], spec: RoundSpec, corpus: Corpus, epoch: int, slot: int, k: int,
    on_grads: Callable[[Mapping[str, Tensor]], None] | None = None, merge: MergeBase | None = None,
) -> tuple[State, float]:
    """Transition k → k+1 of an epoch: exactly what the trainer ran and what a verifier re-runs
    (``on_grads`` lets the verifier digest the unpublished gradients into its witness; ``merge`` is
    what the merge rule's step folds in, needed only by that step)."""
    state = merged_if_due(state, spec, k, epoch, merge)
    return train_step(state, epoch_batch(spec, corpus, epoch, slot, k), spec.model, spec.inner, on_grads)


def train_epoch(
    start: State,
    spec: RoundSpec,
    corpus: Corpus,
    epoch: int,
    slot: int,
    steps: int,
    on_step: StepHook | None = None,
    first_step: int = 0,
    digests: Sequence[Digest] | None = None,
    merge: MergeBase | None = None,
) -> Trace:
    """Run inner steps first_step..steps-1 from `start` (the state after `first_step` steps).

    `first_step`/`digests` resume an interrupted epoch from a checkpoint: `digests` are d_0..d_first.
    """
    trace = Trace(end=start, digests=list(digests) if digests else [state_digest(start)])
    if len(trace.digests) != first_step + 1:
        raise TrainerError(f"resuming at step {first_step} needs {first_step + 1} digests, got {len(trace.digests)}")
    state = start
    for k in range(first_step, steps):
        state, loss = replay_step(state, spec, corpus, epoch, slot, k, merge=merge)
        trace.digests.append(state_digest(state))
        trace.losses.append(loss)
        if on_step is not None:
            on_step(k + 1, state, loss)
    trace.end = state
    return trace


compress_seed = compression_seed  # the compressor's public sketch seed (docs/compression.md)


@dataclass(frozen=True)
class Final:
    """The end of an epoch: the wrapped payload to publish, and the state the next epoch carries."""

    publication: bytes
    carried: State
    stats: CompressionStats


def final_transition(
    start: Mapping[str, Tensor], end: Mapping[str, Tensor], spec: RoundSpec,
    run_id: int, epoch: int, slot: int, trainer: str, rank: int, merged: Mapping[str, Tensor] | None = None,
) -> Final:
    """Δ = start − end (under the merge rule G_e − end, ``merged`` = G_e), compressed with the end
    state's error buffer, wrapped for (run, epoch, trainer)."""
    if spec.rule is StartRule.MERGE:
        if merged is None:
            raise TrainerError("the merge rule's pseudo-gradient is G_e − E_e: it needs the global model it merged")
        delta = merged_pseudo_gradient(merged, end)
    else:
        delta = pseudo_gradient(start, end)
    c = compress(delta, section(end, EF), rank, compress_seed(spec.run_seed, epoch, slot), spec.compression)
    return Final(wrap(run_id, epoch, trainer, c.payload), carry(end, c.new_ef), c.stats)


def start_state(
    spec: RoundSpec, latest_global: Mapping[str, Tensor],
    prev_start: Mapping[str, Tensor] | None, carried: Mapping[str, Tensor] | None,
) -> State:
    """S_e from the latest public global model and the trainer's own previous epoch (protocol.md §8)."""
    return next_start(spec.rule, latest_global, prev_start, carried)
