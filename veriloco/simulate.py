"""Local simulation: K trainers' DiLoCoX rounds in one process, no chain, no store.

It drives the same pure pieces the nodes use (``dilocox.inner.train_step``, ``dilocox.delay``,
``dilocox.compress``, ``protocol.formats.payload.decode``, ``dilocox.aggregate``) so that the benchmark
and ``veriloco simulate`` measure the real engine, and compares training methods at an equal token
budget (every worker runs the same number of inner steps on batches of the same size):

- ``allreduce``: data-parallel AdamW, gradients averaged every step (ring all-reduce, fp32);
- ``diloco``: H local AdamW steps, fp32 pseudo-gradients all-reduced, blocking;
- ``dilocox``: one-step-delay overlap + adaptive low-rank int4 compression with error feedback;
- the field's compressors at the shipped codec's bytes, on the shipped method's start rule
  (``fixed_rank_merge_b1``: round 1's exchange awaited, later ones merged after ``merge_step``, H
  fixed): ``sparseloco_merge`` (SparseLoCo-style top-k of 4096-element chunks, 2-bit values) and
  ``demo_merge`` (DeMo-style top-k of 64 x 64 DCT blocks, 2-bit values: of the DeMo variants the best
  at equal bytes in ``benchmarks/results/codec-baselines.json``), both with error feedback in the
  state's EF section and k fitted once (``SparseBaseline``), and ``sparseloco_paper_merge``, SparseLoCo
  at its own operating point (k held at 1.56% of a chunk, whatever the bytes, its accumulator decayed).
  Baselines (``veriloco/sparsecodec.py``), not protocol codecs;
- ablations: ``dilocox_blocking`` (no overlap), ``dilocox_eager`` (eager start), ``lowrank_only`` (fp32 factors), ``quant_only``
  (dense int4, no low rank), ``fixed_rank`` (no rank/H adaptation) and ``fixed_rank_blocking`` (the
  same without the delay: with ``fixed_rank`` and ``diloco`` it splits the gap into delay and
  compression on one (rank, H) path).

Traffic model (bytes *sent* per worker): ring all-reduce of ``B`` bytes sends ``2 (K-1)/K B``; a
compressed payload cannot be summed in flight, so it is all-gathered: ``(K-1) P``. Every method's
bytes go through one ``Link`` (bandwidth plus per-message latency). Workers are run one after
another; a round's compute time is the slowest worker's plus the aggregation. Simulated wall time
(``simulated_seconds``) adds the exchange per round, or hides the exchange of round r behind the
compute of round r+1 where the method overlaps. AllReduce overlaps as DDP does: gradients are
all-reduced in buckets (reverse layer order), each bucket's exchange running while the backward pass
of the layers before it continues, so only what is left after the backward is exposed
(``ddp_step_seconds``).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from dilocox.aggregate import aggregate, mean_delta
from dilocox.blockstep import blockwise_step
from dilocox.delay import (
    MergeBase,
    StartRule,
    carry,
    global_index,
    merge_offset,
    merged_pseudo_gradient,
    next_start,
    pseudo_gradient,
    public_history_end,
)
from dilocox.inner import (
    EF,
    PARAM,
    InnerConfig,
    Params,
    apply_update,
    compute_grads,
    init_state,
    section,
    train_step,
)
from dilocox.outer import GlobalState, OuterConfig, from_section, global_params, init_global
from protocol.config import RunConfig, merge_step_for
from protocol.data import Corpus, batch, eval_loss, val_batches
from protocol.errors import VerilocoError
from protocol.model import GPTConfig, init_params, loss_fn, n_params, param_shapes
from veriloco.traffic import ring_allreduce_bytes  # torch-free there: the dashboard uses it

Progress = Callable[[str], None]


class SimulationError(VerilocoError):
    """A simulation request that cannot run (unknown method, impossible budget)."""


# torch DDP's defaults: bucket_cap_mb=25, and a 1 MiB first bucket so communication starts early.
DDP_BUCKET_BYTES = 25 * 2**20
DDP_FIRST_BUCKET_BYTES = 2**20
# Share of a training step's compute in the backward pass (backward ~ 2x forward FLOPs).
BACKWARD_FRACTION = 2 / 3


@dataclass(frozen=True)
class Link:
    """The one network model every method's exchange goes through: per-worker send bandwidth
    plus a fixed latency per message (a ring all-reduce step or an all-gather hop)."""

    bandwidth_bps: float = 1e9
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.bandwidth_bps <= 0 or self.latency_s < 0:
            raise SimulationError(f"link needs bandwidth > 0 and latency >= 0: {self}")

    def seconds(self, nbytes: int, messages: int = 1) -> float:
        """Time to send ``nbytes`` in ``messages`` sequential messages."""
        return nbytes * 8 / self.bandwidth_bps + (messages * self.latency_s if nbytes else 0.0)

    def ring_allreduce_seconds(self, nbytes: int, k: int) -> float:
        """Ring all-reduce of ``nbytes`` among ``k`` peers: 2(K-1) steps of B/K each."""
        return self.seconds(ring_allreduce_bytes(nbytes, k), 2 * (k - 1))

    def allgather_seconds(self, payload_bytes: int, k: int) -> float:
        """All-gather of one ``payload_bytes`` payload per peer: (K-1) hops."""
        return self.seconds((k - 1) * payload_bytes, k - 1)


def ddp_buckets(
    shapes: dict[str, tuple[int, ...]],
    bucket_bytes: int = DDP_BUCKET_BYTES,
    first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES,
    bytes_per_param: int = 4,
) -> list[tuple[float, int]]:
    """DDP's gradient buckets: parameters in reverse registration order (the order backward
    finishes them), packed up to the cap (the first bucket smaller). Each bucket is
    (fraction of the backward pass done when its last gradient is ready, bytes); the readiness
    assumes backward time proportional to parameter count."""
    sizes = [math.prod(s) * bytes_per_param for s in reversed(list(shapes.values()))]
    total = sum(sizes)
    if total == 0:
        return []
    out: list[tuple[float, int]] = []
    done = cur = 0
    cap = first_bucket_bytes
    for b in sizes:
        cur += b
        done += b
        if cur >= cap:
            out.append((done / total, cur))
            cur, cap = 0, bucket_bytes
    if cur:
        out.append((1.0, cur))
    return out


def ddp_step_seconds(
    compute_s: float,
    buckets: list[tuple[float, float]],
    backward_fraction: float = BACKWARD_FRACTION,
) -> float:
    """Forward + backward + bucketed exchange of one data-parallel step.

    ``buckets`` are (backward fraction done when ready, seconds on the link), in backward order.
    A bucket's exchange starts when its gradients are ready and the link is free; the step ends
    when both the backward and the last exchange are done, so only communication left over after
    the backward is exposed (all of the last bucket's, at least).
    """
    fwd = compute_s * (1 - backward_fraction)
    bwd = compute_s * backward_fraction
    link_free = 0.0
    for ready, comm in buckets:
        link_free = max(fwd + bwd * ready, link_free) + comm
    return max(compute_s, link_free)


@dataclass(frozen=True)
class SparseBaseline:
    """A local method's compression by one of the field's codecs (``veriloco.sparsecodec.SparseCodec``,
    a baseline, not a protocol codec) at the shipped codec's bytes.

    k is chosen once, deterministically: the largest whose payload of the first trainer's first round
    x = Δ + ef (ef = 0 then) fits ``shipped_budget(shapes, rank)``, and is then held for the run. The
    entropy-coded indices make later payloads vary by a few bytes around it: one that would exceed the
    budget keeps the largest k below that fits instead (the decoder reads k from the bytes; error
    feedback keeps what it drops), so no payload is larger than the shipped codec's. Error feedback as
    the ``CompressionConfig`` path keeps it: x = Δ + ef, payload = encode(x), new ef = x − decode(payload)."""

    transform: str  # SparseCodec.transform: "topk" (SparseLoCo-style) | "dct" (DeMo-style)
    values: str  # SparseCodec.values: "2bit" | "int4" | "int8"
    rank: int  # the byte budget: the shipped low-rank int4 payload at this rank
    # SparseLoCo's own operating point instead of the budget: k kept per full chunk, held (0: fitted
    # to the budget), and the error accumulator decayed by ``decay`` before each round's Δ is added
    # (x = Δ + decay · ef; SparseLoCo's accumulator stands in for outer momentum; 1.0: plain feedback)
    k: int = 0
    decay: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"the error feedback decay must be in (0, 1], got {self.decay}")
        if self.k < 0:
            raise ValueError(f"k must be 0 (fitted) or positive, got {self.k}")


def shipped_budget(shapes: Mapping[str, tuple[int, ...]], rank: int) -> int:
    """Bytes of the shipped codec's payload (low-rank int4, ``dilocox.compress``) at a fixed ``rank``."""
    from dilocox.compress import CompressionConfig, payload_size

    return payload_size(shapes, rank, CompressionConfig(bits=4, rank_initial=rank, rank_min=rank, rank_max=rank))


@dataclass(frozen=True)
class Method:
    """How one method trains and communicates. ``compression`` None means fp32 pseudo-gradients."""

    name: str
    kind: str  # "allreduce" | "local"
    rule: StartRule = StartRule.BLOCKING
    compression: object | None = None  # dilocox.compress.CompressionConfig | SparseBaseline
    description: str = ""
    own_weight: float = 1.0  # the delayed start's share of the trainer's own Δ (dilocox.delay.delayed_start)
    merge_step: int | None = None  # StartRule.MERGE: steps into an epoch at which G_e is folded in
    # StartRule.MERGE: the merge step of epoch 1 alone (None: merge_step); 0 waits for round 1's
    # exchange, where the workers' first rounds, all from G_0, differ the most
    first_merge_step: int | None = None
    # the outer aggregation rule (OuterConfig.aggregate) this method runs with; None: the SimConfig's
    aggregate: str | None = None
    # StartRule.MERGE with error feedback in the parameters (dilocox.delay.merge_offset): no buffer is
    # carried; the merge adds G_e − G_{e-1} plus the trainer's own decoded payload of e-1
    ef_in_params: bool = False

    def merge_step_at(self, epoch: int) -> int | None:
        """The steps into ``epoch`` at which G_e folds in (None: the rule has no merge), as
        ``schedule.merge_step`` / ``first_merge_step`` say in the protocol."""
        if self.merge_step is None:
            return None
        first = -1 if self.first_merge_step is None else self.first_merge_step
        return merge_step_for(epoch, self.merge_step, first)

    @property
    def overlaps(self) -> bool:
        return self.kind == "local" and self.rule.overlaps


def from_run_config(cfg: RunConfig, trainers: int, eval_rows: int = 512, eval_split: str = "selection") -> tuple[SimConfig, Method]:
    """The simulation of a run config's training with ``trainers`` workers (slots 0..K-1 in join order):
    its model and seeds, batches, inner and outer optimizers, schedule, compression, start rule and
    aggregation, and the block-wise step in its groups where the run is shard-audited. Its models are
    the ones the network's trainers and coordinator compute (a fixed rank keeps H at h_initial; an
    adaptive one moves H with the payloads' history on both sides alike)."""
    from dilocox.round import RoundSpec

    spec = RoundSpec.from_config(cfg)
    o, sch = cfg.outer, cfg.schedule
    sim = SimConfig(
        model=spec.model, trainers=trainers, steps=sch.epochs * sch.h_initial, batch_size=spec.batch_size,
        seq_len=spec.seq_len, h=sch.h_initial, rank=spec.compression.rank_initial, merge_step=sch.merge_step,
        inner=spec.inner, outer=from_section(o),
        run_seed=spec.run_seed, init_seed=cfg.model.init_seed, eval_rows=eval_rows, eval_split=eval_split,
        microbatches=spec.microbatches if spec.shard else 0, epochs=sch.epochs,
    )
    method = Method(
        name=f"config:{cfg.name}", kind="local", rule=spec.rule, compression=spec.compression,
        description=f"run config {cfg.name!r} as its nodes train it", merge_step=sch.merge_step if sch.merge_step else None,
        first_merge_step=sch.first_merge_step if sch.merge_step and sch.first_merge_step >= 0 else None,
        aggregate=o.aggregate, ef_in_params=spec.ef_in_params,
    )
    return sim, method


# SparseLoCo's operating point (arXiv 2508.15706: 1-3% density, 2-bit values, decayed error feedback):
# 64 of each 4,096-element chunk kept (1.56%), the accumulator decayed by 0.95 each round
SPARSELOCO_K, SPARSELOCO_DECAY = 64, 0.95


def methods(h: int = 16, rank: int = 8, merge_step: int = 1) -> dict[str, Method]:
    """The compared methods; ``h`` and ``rank`` are the initial local steps and rank, ``merge_step``
    the step at which the ``*_merge`` methods fold the previous round's global model in.

    ``dilocox_e80`` is DiLoCoX whose rank rule aims at 80% of the pseudo-gradient's energy instead of
    the default 50%, with the ceiling at twice the initial rank (a diagnostic: does holding more of
    each update per round close the gap?)."""
    from dilocox.compress import CompressionConfig

    # a rank above the schedule's usual ceiling raises the ceiling to it (the adaptive rule may then keep it)
    base = CompressionConfig(rank_initial=rank, rank_max=max(CompressionConfig.rank_max, rank),
                             h_initial=h, h_min=max(1, h // 2), h_max=4 * h)
    fixed = replace(base, adaptive=False)
    return {
        "allreduce": Method(
            "allreduce", "allreduce", description="data-parallel, fp32 gradients every step"
        ),
        "diloco": Method(
            "diloco", "local", StartRule.BLOCKING, None, f"H={h}, fp32 pseudo-gradients, blocking"
        ),
        "dilocox": Method(
            "dilocox", "local", StartRule.DELAYED, base, "one-step delay + adaptive low-rank int4"
        ),
        "dilocox_blocking": Method(
            "dilocox_blocking",
            "local",
            StartRule.BLOCKING,
            base,
            "adaptive low-rank int4, blocking",
        ),
        "dilocox_e80": Method(
            "dilocox_e80",
            "local",
            StartRule.DELAYED,
            replace(base, energy_target=0.8, rank_max=max(base.rank_max, 2 * rank)),
            "one-step delay + adaptive low-rank int4 aiming at 80% of the energy",
        ),
        "dilocox_eager": Method(
            "dilocox_eager",
            "local",
            StartRule.EAGER,
            base,
            "eager start (own delta / K + last outer step) + adaptive low-rank int4",
        ),
        "lowrank_only": Method(
            "lowrank_only",
            "local",
            StartRule.DELAYED,
            replace(base, bits=32, dense_bits=32),
            "low-rank fp32 factors",
        ),
        "quant_only": Method(
            "quant_only",
            "local",
            StartRule.DELAYED,
            replace(fixed, lowrank=False, dense_bits=4),
            "dense int4, fixed H",
        ),
        "fixed_rank": Method(
            "fixed_rank",
            "local",
            StartRule.DELAYED,
            fixed,
            f"low-rank int4, rank {rank}, H={h} fixed",
        ),
        "fixed_rank_half": Method(
            "fixed_rank_half",
            "local",
            StartRule.DELAYED,
            fixed,
            f"low-rank int4, rank {rank}, H={h} fixed, delayed start with half the own pseudo-gradient",
            own_weight=0.5,
        ),
        "dilocox_merge": Method(
            "dilocox_merge",
            "local",
            StartRule.MERGE,
            base,
            f"adaptive low-rank int4, the previous round merged after step {merge_step} (delay {merge_step} steps)",
            merge_step=merge_step,
        ),
        "dilocox_merge_b1": Method(
            "dilocox_merge_b1",
            "local",
            StartRule.MERGE,
            base,
            f"adaptive low-rank int4, round 1's exchange awaited, later ones merged after step {merge_step}",
            merge_step=merge_step,
            first_merge_step=0,
        ),
        "fixed_rank_merge": Method(
            "fixed_rank_merge",
            "local",
            StartRule.MERGE,
            fixed,
            f"low-rank int4, rank {rank}, H={h} fixed, the previous round merged after step {merge_step}",
            merge_step=merge_step,
        ),
        "fixed_rank_merge_b1": Method(
            "fixed_rank_merge_b1",
            "local",
            StartRule.MERGE,
            fixed,
            f"low-rank int4, rank {rank}, H={h} fixed, round 1's exchange awaited, later ones merged after step {merge_step}",
            merge_step=merge_step,
            first_merge_step=0,
        ),
        "sparseloco_merge": Method(
            "sparseloco_merge",
            "local",
            StartRule.MERGE,
            SparseBaseline("topk", "2bit", rank),
            f"SparseLoCo-style top-k, 2-bit values, error feedback, at the bytes of low-rank int4 rank {rank}; "
            f"H={h} fixed, round 1's exchange awaited, later ones merged after step {merge_step}",
            merge_step=merge_step,
            first_merge_step=0,
        ),
        "sparseloco_paper_merge": Method(
            "sparseloco_paper_merge",
            "local",
            StartRule.MERGE,
            SparseBaseline("topk", "2bit", rank, k=SPARSELOCO_K, decay=SPARSELOCO_DECAY),
            f"SparseLoCo-style at its own operating point: top-{SPARSELOCO_K} of 4096 ({SPARSELOCO_K / 4096:.2%}), "
            f"2-bit values, error accumulator decayed by {SPARSELOCO_DECAY}; "
            f"H={h} fixed, round 1's exchange awaited, later ones merged after step {merge_step}",
            merge_step=merge_step,
            first_merge_step=0,
        ),
        "demo_merge": Method(
            "demo_merge",
            "local",
            StartRule.MERGE,
            SparseBaseline("dct", "2bit", rank),
            f"DeMo-style 64x64 DCT top-k, 2-bit values, error feedback, at the bytes of low-rank int4 rank {rank}; "
            f"H={h} fixed, round 1's exchange awaited, later ones merged after step {merge_step}",
            merge_step=merge_step,
            first_merge_step=0,
        ),
        "fixed_rank_blocking": Method(
            "fixed_rank_blocking",
            "local",
            StartRule.BLOCKING,
            fixed,
            f"low-rank int4, rank {rank}, H={h} fixed, blocking",
        ),
    }


# a local method's name with one of these suffixes runs it with that robust outer aggregation rule
# (dilocox/aggregate.py), e.g. fixed_rank_merge_b1_trimmed; the clip is the SimConfig's
ROBUST_SUFFIXES = {"_trimmed": "trimmed", "_median": "median"}
# a compressed merge-rule method with this suffix keeps its error feedback in the parameters
# (Method.ef_in_params), e.g. fixed_rank_merge_b1_inparams_trimmed
IN_PARAMS = "_inparams"


def resolve_method(name: str, table: Mapping[str, Method]) -> Method | None:
    """``table[name]``, or a local method of ``table`` with a ``ROBUST_SUFFIXES`` suffix at that rule,
    optionally after ``IN_PARAMS`` (a compressed ``MERGE`` method); None when ``name`` is neither."""
    if name in table:
        return table[name]
    for suffix, rule in ROBUST_SUFFIXES.items():
        base = resolve_method(name[: -len(suffix)], table) if name.endswith(suffix) else None
        if base is not None and base.kind == "local" and base.aggregate is None:
            return replace(base, name=name, aggregate=rule, description=f"{base.description}; outer aggregate {rule}")
    if name.endswith(IN_PARAMS):
        from dilocox.compress import CompressionConfig

        base = table.get(name[: -len(IN_PARAMS)])
        if base is not None and base.rule is StartRule.MERGE and base.compression is not None:
            ccfg = base.compression
            return replace(base, name=name, ef_in_params=True,
                           compression=replace(ccfg, error_feedback=False) if isinstance(ccfg, CompressionConfig) else ccfg,
                           description=f"{base.description}; error feedback in the parameters, no buffer")
    return None


@dataclass(frozen=True)
class SimConfig:
    """One comparison: model, workers, token budget (inner steps per worker) and optimizers."""

    model: GPTConfig
    trainers: int = 4
    steps: int = (
        256  # inner steps per worker (the token budget is steps * batch * seq_len * trainers)
    )
    batch_size: int = 8
    seq_len: int | None = None  # training/eval row length; default the model context
    h: int = 16
    rank: int = 8
    merge_step: int = 1  # the *_merge methods (StartRule.MERGE)
    inner: InnerConfig = field(default_factory=InnerConfig)
    outer: OuterConfig = field(default_factory=OuterConfig)
    run_seed: int = 1
    init_seed: int = 0
    eval_rows: int = 64
    # protocol.data.EVAL_SPLITS: "selection" (the rows every choice so far was made on) or "heldout"
    # (the rows between them, disjoint, for confirming a choice)
    eval_split: str = "selection"
    bandwidth_bps: float = 1e9
    latency_s: float = 0.0  # per message, for every method's exchange
    bucket_bytes: int = DDP_BUCKET_BYTES  # AllReduce's gradient buckets (DDP's default cap)
    # where the workers' steps and the eval run; the global model, payloads and aggregation stay on
    # the CPU, as in the protocol (dilocox/device.py)
    device: str = "cpu"
    # 0: the plain inner step (dilocox.inner.train_step). M >= 1: the block-wise step of a shard-audited
    # run in M groups (dilocox.blockstep.blockwise_step), the step its trainer nodes take: the same math,
    # other float rounding, so a simulation of a run config computes the network's models bit for bit
    microbatches: int = 0
    # > 0: run this many rounds at the H the schedule gives each (as a run config's nodes do, whatever
    # the token budget comes to), instead of rounds until ``steps`` are trained (the last one cut short)
    epochs: int = 0

    def __post_init__(self) -> None:
        if self.trainers < 1 or self.steps < 1 or self.batch_size < 1 or self.h < 1:
            raise SimulationError(f"trainers, steps, batch_size and h must be positive: {self}")
        if self.merge_step < 0:
            raise SimulationError(f"merge_step must be >= 0 (0 merges before the first step), got {self.merge_step}")
        if self.seq_len is not None and not 1 <= self.seq_len <= self.model.seq_len:
            raise SimulationError(f"seq_len must be in 1..{self.model.seq_len} (the model context)")

    @property
    def rows(self) -> int:
        """Tokens per training row."""
        return self.seq_len or self.model.seq_len

    @property
    def link(self) -> Link:
        return Link(self.bandwidth_bps, self.latency_s)


@dataclass
class RoundTiming:
    """Measured seconds of one round (a step, for allreduce) on the critical path."""

    steps: int  # inner steps per worker in the round
    train_s: float  # slowest worker's training time
    codec_s: float  # slowest worker's compression time
    agg_s: float  # after the exchange: decoding the payloads, averaging, the optimizer update
    comm_s: float  # bytes sent per worker over the link
    # AllReduce only: per gradient bucket (backward fraction done when ready, link seconds); the
    # exchange then overlaps the backward pass instead of following the round
    buckets: tuple[tuple[float, float], ...] = ()
    # overlapping methods: steps of this round that may run before the previous round's global model
    # is needed (None: all of them, the one-step delay; StartRule.MERGE: the merge step)
    hide_steps: int | None = None


@dataclass
class MethodResult:
    name: str
    description: str
    final_eval_loss: float
    bytes_per_worker: int
    compute_seconds: float
    comm_seconds: float
    simulated_seconds_1gbps: float
    rounds: int
    steps_per_worker: int
    curve: list[tuple[int, float]]  # (inner steps per worker so far, eval loss of the global model)
    schedule: list[tuple[int, int]]  # (rank, H) per round; rank 0 = uncompressed
    payload_bytes: list[int]  # per round, mean over workers
    rel_error: list[float]  # per round, mean compression error
    rounds_detail: list[RoundTiming] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)  # every measured worker step
    overlaps: bool = False
    # compressed methods: the final global model with the workers' mean error buffer applied (what the
    # compressor still held back at the end; a diagnostic, not a model the protocol produces)
    unsent_eval_loss: float | None = None
    # SparseBaseline methods: the codec as run (transform, values, the held k per full chunk and the
    # chunk size, the budget's rank and bytes, the fitting payload's bytes, the largest payload sent,
    # the payloads sent and the k of those that kept fewer to fit the budget)
    codec: dict[str, object] | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _mean(grads: list[Params]) -> Params:
    shapes = {n: tuple(g.shape) for n, g in grads[0].items()}
    return mean_delta(grads, shapes)


def _to(tensors: Params, device: str) -> Params:
    return {n: t.to(device) for n, t in tensors.items()}


def _batch_on(xy: tuple[Tensor, Tensor], device: str) -> tuple[Tensor, Tensor]:
    return xy[0].to(device), xy[1].to(device)


class _Evaluator:
    def __init__(self, cfg: SimConfig, corpus: Corpus) -> None:
        self.cfg = cfg
        self.batches = [_batch_on(xy, cfg.device) for xy in val_batches(corpus, cfg.rows, cfg.eval_rows, split=cfg.eval_split)]

    def __call__(self, params: Params) -> float:
        on = _to(params, self.cfg.device)
        return eval_loss(lambda x, y: loss_fn(self.cfg.model, on, x, y), self.batches)


def _work_wait(r: RoundTiming, step_seconds: float | None) -> tuple[float, float]:
    train = r.steps * step_seconds if step_seconds is not None else r.train_s
    if r.buckets:  # AllReduce: the exchange runs inside the step; the optimizer update follows it
        if step_seconds is not None:  # the common step time includes the update; take it out
            train = max(train - r.agg_s, 0.0)
        return ddp_step_seconds(train, list(r.buckets)) + r.codec_s, r.agg_s
    return train + r.codec_s, r.comm_s + r.agg_s


def simulated_timeline(
    rounds: list[RoundTiming], overlaps: bool, step_seconds: float | None = None
) -> list[float]:
    """When each round's result (the new global model) is available, in simulated seconds.

    Per round the critical path is training (``steps * step_seconds`` when given, so methods
    measured under different machine load compare fairly, else the measured time) plus encoding.
    Blocking methods then wait for the exchange and the aggregation; overlapping ones run round r's
    exchange + aggregation during round r+1's training, so round r+1 ends when both have.
    """
    ww = [_work_wait(r, step_seconds) for r in rounds]
    out: list[float] = []
    t = 0.0
    if not overlaps:
        for w, x in ww:
            t += w + x
            out.append(t)
        return out
    prev_wait = 0.0
    for r, (w, x) in zip(rounds, ww):
        if r.hide_steps is None or r.steps == 0:
            t += max(w, prev_wait)  # this round's training alongside the previous exchange
        else:  # the exchange hides behind the first hide_steps steps; the round stalls for the rest
            frac = min(r.hide_steps, r.steps) / r.steps
            t += w + max(prev_wait - frac * (w - r.codec_s), 0.0)
        out.append(t + x)
        prev_wait = x
    return out


def simulated_seconds(
    rounds: list[RoundTiming], overlaps: bool, step_seconds: float | None = None
) -> float:
    """Wall time of a run over the modelled link (see ``simulated_timeline``); the last exchange
    is always exposed."""
    tl = simulated_timeline(rounds, overlaps, step_seconds)
    return tl[-1] if tl else 0.0


def curve_times(result: MethodResult, step_seconds: float | None = None) -> list[float]:
    """Simulated time of each point of ``result.curve`` (0 for the initial model)."""
    return points_times(result.rounds_detail, result.overlaps, result.curve, step_seconds)


def points_times(
    rounds: list[RoundTiming], overlaps: bool, curve: Sequence[Sequence[float]], step_seconds: float | None = None
) -> list[float]:
    """Simulated time of each (inner steps, loss) point of ``curve`` under ``rounds``' timing."""
    tl = simulated_timeline(rounds, overlaps, step_seconds)
    at: dict[int, float] = {0: 0.0}
    done = 0
    for r, t in zip(rounds, tl):
        done += r.steps
        at[done] = t
    return [at[int(s)] for s, _ in curve]


def round_timings(rows: Sequence[Mapping[str, Any]]) -> list[RoundTiming]:
    """``RoundTiming``s back from their JSON form (``dataclasses.asdict``; buckets as lists)."""
    return [RoundTiming(**{**r, "buckets": tuple((float(a), float(b)) for a, b in r["buckets"])}) for r in rows]


def normalise_times(results: dict[str, MethodResult]) -> float:
    """Recompute every result's simulated time with one per-step training time (the median step).

    Methods run one after another on a shared machine see different load; using one step time
    makes their simulated times differ only by what they do differently (encoding, exchange,
    overlap). AllReduce's per-step optimizer update likewise takes its median, so a slow first
    step or a burst of load does not count against it. Returns the step time used.
    """
    steps = [t for r in results.values() for t in r.step_seconds]
    if not steps:
        return 0.0
    step_s = statistics.median(steps)
    for r in results.values():
        updates = [x.agg_s for x in r.rounds_detail if x.buckets]
        if updates:  # every AllReduce step's update is the same work: one (median) time for all
            u = statistics.median(updates)
            r.rounds_detail = [replace(x, agg_s=u) if x.buckets else x for x in r.rounds_detail]
        r.simulated_seconds_1gbps = simulated_seconds(r.rounds_detail, r.overlaps, step_s)
    return step_s


def _result(
    name: str,
    description: str,
    curve: list[tuple[int, float]],
    sent: int,
    rounds: list[RoundTiming],
    step_times: list[float],
    overlaps: bool,
    schedule: list[tuple[int, int]] | None = None,
    payload_bytes: list[int] | None = None,
    rel_error: list[float] | None = None,
    unsent_eval_loss: float | None = None,
    codec: dict[str, object] | None = None,
) -> MethodResult:
    return MethodResult(
        name=name,
        description=description,
        final_eval_loss=curve[-1][1],
        bytes_per_worker=sent,
        compute_seconds=sum(r.train_s + r.codec_s + r.agg_s for r in rounds),
        comm_seconds=sum(r.comm_s for r in rounds),
        simulated_seconds_1gbps=simulated_seconds(rounds, overlaps),
        rounds=len(rounds),
        steps_per_worker=sum(r.steps for r in rounds),
        curve=curve,
        schedule=schedule or [],
        payload_bytes=payload_bytes or [],
        rel_error=rel_error or [],
        rounds_detail=rounds,
        step_seconds=step_times,
        overlaps=overlaps,
        unsent_eval_loss=unsent_eval_loss,
        codec=codec,
    )


def run_allreduce(cfg: SimConfig, corpus: Corpus, progress: Progress) -> MethodResult:
    """Data-parallel baseline: K gradients per step, fp32 mean in slot order, one AdamW update."""
    m = cfg.model
    evaluate = _Evaluator(cfg, corpus)
    state = init_state(m, cfg.init_seed, device=cfg.device)
    per_step_bytes = ring_allreduce_bytes(4 * n_params(m), cfg.trainers)
    buckets = tuple(
        (ready, cfg.link.ring_allreduce_seconds(nbytes, cfg.trainers))
        for ready, nbytes in ddp_buckets(param_shapes(m), cfg.bucket_bytes)
    )
    comm_step = sum(c for _, c in buckets)
    rounds: list[RoundTiming] = []
    step_times: list[float] = []
    curve = [(0, evaluate(section(state, PARAM)))]
    for step in range(cfg.steps):
        grads, times = [], []
        for k in range(cfg.trainers):
            t0 = time.perf_counter()
            xy = _batch_on(batch(corpus, cfg.run_seed, 0, k, step, cfg.batch_size, cfg.rows), cfg.device)
            grads.append(compute_grads(section(state, PARAM), xy, m)[0])
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        state = apply_update(state, _mean(grads), cfg.inner)
        update = time.perf_counter() - t0
        step_times += [t + update for t in times]
        rounds.append(
            RoundTiming(
                steps=1,
                train_s=max(times),
                codec_s=0.0,
                agg_s=update,
                comm_s=comm_step,
                buckets=buckets,
            )
        )
        if (step + 1) % cfg.h == 0 or step + 1 == cfg.steps:
            curve.append((step + 1, evaluate(section(state, PARAM))))
            progress(f"allreduce        step {step + 1:5d}/{cfg.steps}  eval {curve[-1][1]:.4f}")
    desc = methods()["allreduce"].description
    return _result(
        "allreduce", desc, curve, per_step_bytes * cfg.steps, rounds, step_times, overlaps=False
    )


# the coordinator's step in ``run_local``: (round, global state, decoded pseudo-gradients in worker
# order, outer config) -> the next global state; a benchmark may replace it to tamper or observe
Aggregator = Callable[[int, GlobalState, list[Params], OuterConfig], GlobalState]


def _aggregate(epoch: int, g: GlobalState, deltas: list[Params], outer: OuterConfig) -> GlobalState:
    return aggregate(g, deltas, outer)


def run_local(method: Method, cfg: SimConfig, corpus: Corpus, progress: Progress,
              aggregator: Aggregator = _aggregate) -> MethodResult:
    """DiLoCo-family method: local rounds, (compressed) pseudo-gradients, outer Nesterov."""
    from dilocox.compress import (
        CompressionConfig,
        EpochRecord,
        adapt,
        compress,
        compression_seed,
        payload_profile,
    )
    from protocol.formats.payload import decode
    from veriloco.sparsecodec import SparseCodec, baseline_decode, baseline_encode, largest_k

    m = cfg.model
    ccfg = method.compression
    outer = replace(cfg.outer, aggregate=method.aggregate) if method.aggregate else cfg.outer
    if ccfg is not None and not isinstance(ccfg, (CompressionConfig, SparseBaseline)):
        raise SimulationError(f"method {method.name}: compression must be a CompressionConfig or a SparseBaseline")
    evaluate = _Evaluator(cfg, corpus)
    shapes = param_shapes(m)
    sparse = ccfg if isinstance(ccfg, SparseBaseline) else None
    # the byte budget k is fitted to (0: none, a baseline at its own operating point holds its k)
    budget = shipped_budget(shapes, sparse.rank) if sparse is not None and not sparse.k else 0
    codec: SparseCodec | None = None  # fitted on the first payload, then held
    codec_info: dict[str, object] | None = None
    max_sent = 0  # the largest baseline payload of the run
    lowered: list[int] = []  # the k of each payload that kept fewer than the held k to fit the budget
    dense_bytes = 4 * n_params(m)
    g = init_global(init_params(m, cfg.init_seed))
    globals_: list[Params] = [global_params(g)]  # G_0, G_1, ...
    starts: list[dict[str, Tensor] | None] = [None] * cfg.trainers
    carried: list[dict[str, Tensor] | None] = [None] * cfg.trainers
    own: list[Params | None] = [None] * cfg.trainers  # ef_in_params: each trainer's last payload, decoded
    history: list[EpochRecord] = []
    curve = [(0, evaluate(globals_[0]))]
    rounds: list[RoundTiming] = []
    step_times: list[float] = []
    schedule: list[tuple[int, int]] = []
    payload_sizes: list[int] = []
    rel_errors: list[float] = []
    sent = done = epoch = 0
    while epoch < cfg.epochs if cfg.epochs else done < cfg.steps:
        if isinstance(ccfg, CompressionConfig):
            rank, h = adapt(history[: public_history_end(method.rule, epoch)], ccfg)
        elif sparse is not None:
            rank, h = sparse.rank, cfg.h  # the budget's rank, fixed H
        else:
            rank, h = 0, cfg.h
        h = h if cfg.epochs else min(h, cfg.steps - done)
        gi = global_index(method.rule, epoch)
        latest, earlier = _to(globals_[gi], cfg.device), (_to(globals_[gi - 1], cfg.device) if gi >= 1 else None)
        deltas: list[Params] = []
        payloads: list[bytes] = []
        sizes, errs, train_t, codec_t = [], [], [], []
        for k in range(cfg.trainers):
            t0 = time.perf_counter()
            start = next_start(method.rule, latest, starts[k], carried[k], earlier, cfg.trainers, method.own_weight)
            s = start
            fresh = _to(globals_[epoch], cfg.device) if method.rule is StartRule.MERGE else None
            # G_e folds in before step merge_at (at the round's end when the merge step is past it)
            merge_at = min(method.merge_step_at(epoch) or 0, h) if fresh is not None and epoch > 0 else None
            base = None
            if fresh is not None and merge_at is not None:
                mine = own[k]
                offset = (functools.partial(merge_offset, fresh, _to(globals_[epoch - 1], cfg.device), _to(mine, cfg.device))
                          if method.ef_in_params and mine is not None else None)
                base = MergeBase(fresh, start, offset)
            for i in range(h):
                if i == merge_at and base is not None:
                    s = base.apply(s)
                t1 = time.perf_counter()
                xy = _batch_on(batch(corpus, cfg.run_seed, epoch, k, i, cfg.batch_size, cfg.rows), cfg.device)
                s, _ = (blockwise_step(s, xy, m, cfg.inner, cfg.microbatches)[:2] if cfg.microbatches
                        else train_step(s, xy, m, cfg.inner))
                step_times.append(time.perf_counter() - t1)
            if merge_at == h and base is not None:
                s = base.apply(s)
            delta = pseudo_gradient(start, s) if fresh is None else merged_pseudo_gradient(fresh, s)
            train_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            if ccfg is None:
                carried[k] = s
                deltas.append(_to(delta, "cpu"))
                sizes.append(dense_bytes)
            elif sparse is not None:
                ef = section(s, EF)
                x = {n: delta[n].detach().to("cpu", torch.float32)
                     + (0.0 if method.ef_in_params else sparse.decay * ef[n].detach().to("cpu", torch.float32)) for n in delta}
                if not all(bool(torch.isfinite(t).all()) for t in x.values()):
                    raise SimulationError(f"method {method.name}: the pseudo-gradient has NaN/Inf values; lower the learning rate")
                if codec is None:
                    kept = sparse.k or largest_k(x, budget, sparse.transform, sparse.values)
                    if kept == 0:
                        raise SimulationError(f"method {method.name}: not even k = 1 fits the {budget}-byte budget of rank {sparse.rank}")
                    codec = SparseCodec(sparse.transform, kept, sparse.values)
                    codec_info = {"transform": codec.transform, "values": codec.values, "k": codec.k, "chunk": codec.full,
                                  "decay": sparse.decay, "budget_rank": sparse.rank if budget else None,
                                  "budget_bytes": budget or None}
                payload, _ = baseline_encode(x, codec)
                if budget and len(payload) > budget:  # the coded indices came out a few bytes larger: keep fewer this time
                    fewer = largest_k(x, budget, codec.transform, codec.values, hi=codec.k - 1)
                    if fewer == 0:
                        raise SimulationError(f"method {method.name}: not even k = 1 fits the {budget}-byte budget")
                    payload, _ = baseline_encode(x, replace(codec, k=fewer))
                    lowered.append(fewer)
                dec = baseline_decode(payload, shapes, codec)
                new_ef = {n: x[n] - dec[n] for n in x}
                carried[k] = carry(s, _to({n: torch.zeros_like(t) for n, t in new_ef.items()} if method.ef_in_params
                                          else new_ef, cfg.device))
                own[k] = dec
                payloads.append(payload)
                sizes.append(len(payload))
                x2 = sum(float(t.double().square().sum()) for t in x.values())
                r2 = sum(float(t.double().square().sum()) for t in new_ef.values())
                errs.append(math.sqrt(r2 / x2) if x2 > 0 else 0.0)
            else:
                assert isinstance(ccfg, CompressionConfig)
                comp = compress(
                    delta, section(s, EF), rank, compression_seed(cfg.run_seed, epoch, k), ccfg
                )
                carried[k] = carry(s, _to(comp.new_ef, cfg.device))
                if method.ef_in_params:
                    own[k] = decode(comp.payload, shapes)
                payloads.append(comp.payload)
                sizes.append(len(comp.payload))
                errs.append(comp.stats.rel_error)
            codec_t.append(time.perf_counter() - t0)
            starts[k] = start
        t0 = time.perf_counter()  # after the exchange: decode every payload, average, outer step
        if codec is not None:
            deltas += [baseline_decode(p, shapes, codec) for p in payloads]
        else:
            deltas += [decode(p, shapes) for p in payloads]
        g = aggregator(epoch, g, deltas, outer)
        agg = time.perf_counter() - t0
        globals_.append(global_params(g))
        if ccfg is None:
            per_worker = ring_allreduce_bytes(dense_bytes, cfg.trainers)
            comm = cfg.link.ring_allreduce_seconds(dense_bytes, cfg.trainers)
        else:
            per_worker = (cfg.trainers - 1) * max(sizes)
            comm = cfg.link.allgather_seconds(max(sizes), cfg.trainers)
            if isinstance(ccfg, CompressionConfig):
                history.append(EpochRecord(rank=rank, h=h, profiles=tuple(payload_profile(p) for p in payloads)))
            if codec_info is not None:
                codec_info.setdefault("fit_bytes", sizes[0])  # round 1, trainer 0: the payload k was fitted on
                max_sent = max(max_sent, max(sizes))
        sent += per_worker
        rounds.append(RoundTiming(h, max(train_t), max(codec_t), agg, comm, hide_steps=method.merge_step_at(epoch)))
        schedule.append((rank, h))
        payload_sizes.append(sum(sizes) // len(sizes))
        rel_errors.append(sum(errs) / len(errs) if errs else 0.0)
        done += h
        epoch += 1
        curve.append((done, evaluate(globals_[-1])))
        extra = (
            f"  {f'k {codec.k:4d}' if codec is not None else f'rank {rank:2d}'}  payload {payload_sizes[-1] / 1024:8.1f} KiB"
            if ccfg is not None
            else ""
        )
        progress(
            f"{method.name:16s} round {epoch:3d}  H {h:3d}  steps {done:5d}/{cfg.steps}  eval {curve[-1][1]:.4f}{extra}"
        )
    if codec_info is not None:
        codec_info["max_payload_bytes"] = max_sent
        codec_info["payloads"] = len(payload_sizes) * cfg.trainers
        codec_info["lowered_k"] = lowered  # in send order; empty when every payload kept k
    unsent = None
    if ccfg is not None:  # G_E - lr * mean(ef): the update the error buffers still hold
        held = _mean([_to(section(c, EF), "cpu") for c in carried if c is not None])
        unsent = evaluate({n: t - outer.lr * held[n] for n, t in globals_[-1].items()})
    return _result(
        method.name,
        method.description,
        curve,
        sent,
        rounds,
        step_times,
        method.overlaps,
        schedule,
        payload_sizes,
        rel_errors,
        unsent,
        codec_info,
    )


def run_method(
    name: str, cfg: SimConfig, corpus: Corpus, progress: Progress = lambda _: None
) -> MethodResult:
    """Run one method by name (see ``methods``; ``resolve_method`` for a robust-aggregation variant)."""
    method = resolve_method(name, methods(cfg.h, cfg.rank, cfg.merge_step))
    if method is None:
        raise SimulationError(f"unknown method {name!r}; choose from {sorted(methods())} "
                              f"(a local one may end in {' or '.join(ROBUST_SUFFIXES)})")
    torch.manual_seed(cfg.init_seed)  # nothing should read the global RNG; pin it anyway
    if method.kind == "allreduce":
        return run_allreduce(cfg, corpus, progress)
    return run_local(method, cfg, corpus, progress)


def compare(
    names: list[str], cfg: SimConfig, corpus: Corpus, progress: Progress = lambda _: None
) -> dict[str, MethodResult]:
    """Run several methods on the same model, data and budget."""
    return {n: run_method(n, cfg, corpus, progress) for n in names}


def summary(
    results: dict[str, MethodResult], baseline: str = "allreduce"
) -> dict[str, dict[str, float]]:
    """Ratios against ``baseline``: loss gap (relative), traffic reduction and simulated speed-up."""
    if baseline not in results:
        return {}
    b = results[baseline]
    out = {}
    for n, r in results.items():
        out[n] = {
            "loss_gap": r.final_eval_loss / b.final_eval_loss - 1.0,
            "traffic_reduction": b.bytes_per_worker / r.bytes_per_worker
            if r.bytes_per_worker
            else math.inf,
            "speedup_1gbps": b.simulated_seconds_1gbps / r.simulated_seconds_1gbps,
        }
    return out


def markdown_table(results: dict[str, MethodResult], baseline: str = "allreduce") -> str:
    """One row per method with the ratios against the baseline."""
    ratios = summary(results, baseline)
    rows = [
        "| method | final eval loss | vs allreduce | bytes/worker | traffic reduction | compute s | sim. s @1 Gbps | speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in results.items():
        q = ratios.get(n, {})
        rows.append(
            f"| {n} | {r.final_eval_loss:.4f} | {q.get('loss_gap', 0.0) * 100:+.2f}% | {human_bytes(r.bytes_per_worker)} "
            f"| {q.get('traffic_reduction', 1.0):,.0f}x | {r.compute_seconds:.1f} | {r.simulated_seconds_1gbps:.1f} "
            f"| {q.get('speedup_1gbps', 1.0):.2f}x |"
        )
    return "\n".join(rows)


def human_bytes(n: float) -> str:
    """A byte count for tables: B, KiB, MiB, ..."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)
