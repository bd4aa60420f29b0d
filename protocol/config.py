"""A run's configuration: frozen dataclasses, loaded from TOML, published as canonical JSON.

The run config is the one document every participant must agree on: model shape, data, optimizer
settings, the local-step and compression schedule, audit policy, windows and stakes. It is stored
in the content store; its CID and keccak digest go on-chain, so a node that fetches it can prove it
holds the same config as everybody else. Real numbers are carried as decimal strings in the JSON
form (canonical JSON has no floats), so the digest never depends on float printing.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
import warnings
from dataclasses import dataclass, field, fields
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from protocol.chain.audit import RATE_ONE, RATE_SCAN, RATE_TAIL, min_cap, over_cap
from protocol.chain.binding import RunParams
from protocol.digest import keccak
from protocol.errors import VerilocoError
from protocol.formats.codec import FormatError, canonical_json, decode_canonical_json
from protocol.modelconfig import PRECISIONS, GPTConfig, preset
from protocol.numerics import CLASSES as NUMERICS_CLASSES
from protocol.numerics import CPU_CLASS
from protocol.types import Address, Cid, Digest, Wei

FORMAT = "veriloco.run.v1"
MAX_TRAINERS, MAX_VERIFIERS = 512, 128  # the contract's createRun bounds (docs/contract.md)


class ConfigError(VerilocoError):
    """A run config that is malformed or inconsistent."""


# Fields added after runs were first published carry this metadata: left out of the canonical JSON
# while they hold their default, so every config written before them keeps its bytes and digest.
_NEW = {"omit_default": True}
# A field renamed after runs were published keeps its old name on the wire (the canonical JSON, so every
# digest holds); a run.toml may still use the old name, with a warning naming the new one.
def _wired(old: str) -> dict[str, str]:
    return {"wire": old}


class ConfigWarning(UserWarning):
    """A run config that still reads but should change (an old key name)."""

# outer.aggregate's values (dilocox.outer.AGGREGATES, which implements them)
AGGREGATES = ("mean", "trimmed", "median")


@dataclass(frozen=True)
class ModelSection:
    preset: str = "tiny"  # a key of protocol.model.PRESETS (gpt2: tiny, small, gpt2-124m; llama: llama-*)
    init_seed: int = 0
    vocab_size: int = field(default=0, metadata=_NEW)  # 0: the preset's (256 bytes); a tokenized corpus sets its own
    precision: str = field(default="fp32", metadata=_NEW)  # "fp32" or "bf16" (autocast; protocol.model.PRECISIONS)


@dataclass(frozen=True)
class DataSection:
    corpus_digest: str = ""  # 0x-hex keccak of the canonical token file; "" = build the default corpus
    corpus_cid: str = ""  # where the token file can be fetched; "" = every node builds it locally
    corpus_bytes: int = 4_000_000  # size cap of the locally built default corpus
    batch_size: int = 8
    seq_len: int = 64
    val_fraction: float = 0.05
    run_seed: int = 1
    token_dtype: str = field(default="uint8", metadata=_NEW)  # uint8: bytes; uint16 / uint32: a tokenized corpus
    tokenizer_digest: str = field(default="", metadata=_NEW)  # 0x-hex keccak of the tokenizer JSON; "": bytes
    tokenizer_cid: str = field(default="", metadata=_NEW)  # where the tokenizer JSON can be fetched


@dataclass(frozen=True)
class InnerSection:
    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.1
    warmup_steps: int = 10
    total_steps: int = 1000  # cosine horizon over all epochs
    grad_clip: float = 1.0
    # micro-batches per inner step; part of the step's definition when audits are per shard
    # (dilocox/blockstep.py), so every trainer and verifier of a run uses the same number
    microbatches: int = field(default=1, metadata=_NEW)


@dataclass(frozen=True)
class OuterSection:
    lr: float = 0.7
    momentum: float = 0.9
    clip: float = 2.0  # norm cap per pseudo-gradient, × the lower median norm (0: off; docs/protocol.md §9)
    # how the clipped pseudo-gradients combine (§9): "mean"; "trimmed", per coordinate the mean without
    # the `trim` largest and smallest values; "median", per coordinate (docs/results-steering.md)
    aggregate: str = field(default="mean", metadata=_NEW)
    trim: int = field(default=1, metadata=_NEW)  # values dropped at each end with aggregate = "trimmed"


@dataclass(frozen=True)
class ScheduleSection:
    epochs: int = 3
    h_initial: int = 16  # local steps H in the first epoch
    h_min: int = 8
    h_max: int = 64
    one_step_delay: bool = True
    # > 0: each epoch continues its own end state and folds in the new global model after this many
    # steps instead of starting from it (docs/protocol.md §8, the merge rule); 0: the one-step delay
    merge_step: int = field(default=0, metadata=_NEW)
    # with merge_step > 0: epoch 1's merge step alone (-1: merge_step). 0 waits for G_1 before epoch 1's
    # first step, where the workers' first rounds from G_0 differ the most (docs/protocol.md §8)
    first_merge_step: int = field(default=-1, metadata=_NEW)

    def merge_step_in(self, epoch: int) -> int | None:
        """The step at which ``epoch`` folds in its global model (None: the run does not merge)."""
        return merge_step_for(epoch, self.merge_step, self.first_merge_step) if self.merge_step else None


def merge_step_for(epoch: int, merge_step: int, first_merge_step: int) -> int:
    """The merge rule's step in ``epoch``: ``first_merge_step`` in epoch 1 unless -1, else ``merge_step``."""
    return first_merge_step if epoch == 1 and first_merge_step >= 0 else merge_step


@dataclass(frozen=True)
class CompressionSection:
    rank_initial: int = 8
    rank_min: int = 2
    rank_max: int = 32
    bits: int = 4
    group_size: int = 64
    # where the compression residual waits for the next payload (docs/protocol.md §8): "buffer", a carried
    # error buffer (every continued start then ships a start file of parameters and buffer to verifiers);
    # "params" (the merge rule only), in the parameters: the merge step adds (G_e − G_{e-1}) plus the
    # trainer's own decoded payload of e-1, all public, so no buffer exists and no start file is sent
    error_feedback: str = field(default="buffer", metadata=_NEW)


@dataclass(frozen=True)
class AuditSection:
    # challenges (transitions drawn) per trainer per epoch; with a rate, the most an epoch may draw.
    # Published as "steps", its first name (`_wired`)
    challenges: int = field(default=2, metadata=_wired("steps"))
    # the chance that each transition is challenged, on its own (0: `challenges` draws an epoch, whatever H is).
    # Verification priced per step of work: over any n steps a trainer expects rate·n challenges at any H
    # (docs/protocol.md §5); kept in parts per million on-chain (auditRate)
    rate: float = field(default=0.0, metadata=_NEW)
    segment: int = 1  # inner steps a verifier replays from each sampled state (one state file covers them)
    final_check_bps: int = 5000  # probability (in basis points) of replaying end state → payload
    quorum: int = 3  # verifiers assigned per trainer and per model attestation; a majority decides (3+: no lone liar decides)
    # a test run may set quorum 1 or 2 (a lone verifier decides); the contract refuses that otherwise
    test_run: bool = field(default=False, metadata=_NEW)
    mode: str = "exact"  # "exact" (bitwise) or "tolerant"
    # max per-tensor relative error in tolerant mode: verifier.calibrate.CALIBRATED_TOLERANCE, measured
    # across thread counts, processes and pipeline splits (docs/results-verification.md)
    tolerance: float = 2e-5
    # "state": a challenge replays whole-model steps from published full states (docs/protocol.md §5);
    # "shard": one audit block of a segment from that block's state and boundary tensors (§5.3)
    unit: str = field(default="state", metadata=_NEW)
    # the device class exact replay is pinned to: "cpu" or "cuda:<GPU name as torch reports it>"
    # (dilocox/device.py); every trainer and verifier of an exact-mode run computes on it
    device: str = field(default="cpu", metadata=_NEW)
    # the CPU numerics class an exact run on "cpu" computes in (protocol/numerics.py: what decides the
    # bits besides the code), and the digest of the canary replay at the run's shapes under it
    # (dilocox/numerics.py), recorded when the run is published: every node matches both before it stakes
    numerics: str = field(default=CPU_CLASS, metadata=_NEW)
    numerics_digest: str = field(default="", metadata=_NEW)
    # torch compute threads of every node of an exact CPU run: reductions split across threads sum in
    # another order, so the count decides bits too (a node's --threads must equal it)
    threads: int = field(default=1, metadata=_NEW)
    # windowed challenges (docs/protocol.md §5.4): each window of `window` steps (a power of two) is
    # committed while the next trains and drawn at `rate` from a block after its post, so a trainer can
    # drop a window once answered; 0: every challenge is drawn after the epoch. The contract then draws
    # no step (its auditSteps is 0) and verifiers derive the draws from the window posts
    window: int = field(default=0, metadata=_NEW)
    # blocks that must cover a window's seed block before anyone acts on the seed (a reorg shallower
    # than this cannot move a draw somebody answered)
    window_depth: int = field(default=2, metadata=_NEW)

    @property
    def rate_ppm(self) -> int:
        """audit.rate as the contract holds it: parts per million of the transitions."""
        return round(self.rate * RATE_ONE)


@dataclass(frozen=True)
class WindowSection:
    """Seconds of chain time; the contract advances early when every participant has acted."""

    commit_s: int = 600
    reveal_s: int = 300
    response_s: int = 300  # trainers answer audits
    verdict_s: int = 300  # verifiers judge
    finalize_s: int = 300  # the coordinator finalizes, else anyone may settle the epoch as aborted
    unbonding_s: int = 3600


@dataclass(frozen=True)
class StakeSection:
    trainer_wei: int = 10**18
    verifier_wei: int = 10**18
    slash_bps: int = 5000
    max_trainers: int = 256
    max_verifiers: int = 64
    min_trainers: int = 1


@dataclass(frozen=True)
class RewardSection:
    """Wei paid out of the run's pool per finalized epoch (docs/contract.md, "Rewards")."""

    trainer_wei: int = 0  # per included trainer
    verifier_wei: int = 0  # per verdict cast with the majority on a decided trainer
    pool_wei: int = 0  # what the creator funds the pool with at createRun (anyone may top it up)


@dataclass(frozen=True)
class RunConfig:
    """Everything a run's participants agree on. Sections mirror the TOML tables."""

    name: str = "veriloco-run"
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    inner: InnerSection = field(default_factory=InnerSection)
    outer: OuterSection = field(default_factory=OuterSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    compression: CompressionSection = field(default_factory=CompressionSection)
    audit: AuditSection = field(default_factory=AuditSection)
    windows: WindowSection = field(default_factory=WindowSection)
    stakes: StakeSection = field(default_factory=StakeSection)
    rewards: RewardSection = field(default_factory=RewardSection)

    def __post_init__(self) -> None:
        problems = _check(self)
        if problems:
            raise ConfigError("invalid run config: " + "; ".join(problems))

    def replace(self, **sections: Any) -> RunConfig:
        """A copy with some fields changed, e.g. `cfg.replace(schedule={"epochs": 2})` (old key names too)."""
        return from_dict(_merge(to_dict(self), _renamed(RunConfig, sections, "", None)))

    def to_json(self) -> bytes:
        """Canonical JSON bytes: sorted keys, no whitespace, reals as decimal strings; renamed fields under
        their wire (first) names."""
        return canonical_json({"format": FORMAT, **to_dict(self, wire=True)})

    def digest(self) -> Digest:
        return keccak(self.to_json())

    def model_config(self) -> GPTConfig:
        """The model every participant builds: the preset, with the run's vocabulary when it sets one
        and the run's precision."""
        m, base = self.model, preset(self.model.preset)
        return dataclasses.replace(base, vocab_size=m.vocab_size or base.vocab_size, precision=m.precision)

    def to_run_params(self, config_cid: str, init_model_cid: str, init_model_digest: bytes, coordinator: str) -> RunParams:
        """The fields the contract enforces, for `Chain.create_run` (whose reward_pool is rewards.pool_wei)."""
        w, a, st, rw = self.windows, self.audit, self.stakes, self.rewards
        return RunParams(
            config_cid=Cid(config_cid), config_digest=self.digest(),
            init_model_cid=Cid(init_model_cid), init_model_digest=Digest(init_model_digest),
            coordinator=Address(coordinator),
            min_trainers=st.min_trainers, max_trainers=st.max_trainers, max_verifiers=st.max_verifiers,
            commit_window=w.commit_s, reveal_window=w.reveal_s, response_window=w.response_s,
            verdict_window=w.verdict_s, finalize_window=w.finalize_s, unbonding_delay=w.unbonding_s,
            audit_steps=0 if a.window else a.challenges, final_check_bps=a.final_check_bps, quorum=a.quorum, slash_bps=st.slash_bps,
            trainer_stake=Wei(st.trainer_wei), verifier_stake=Wei(st.verifier_wei),
            trainer_reward=Wei(rw.trainer_wei), verifier_reward=Wei(rw.verifier_wei), test_run=a.test_run,
            audit_rate=a.rate_ppm,
        )


def _check(cfg: RunConfig) -> list[str]:
    p: list[str] = []
    s, c, a, st = cfg.schedule, cfg.compression, cfg.audit, cfg.stakes
    if s.epochs < 1:
        p.append("schedule.epochs must be at least 1")
    if not 1 <= s.h_min <= s.h_initial <= s.h_max:
        p.append(f"need 1 <= schedule.h_min <= h_initial <= h_max, got {s.h_min}, {s.h_initial}, {s.h_max}")
    if s.merge_step < 0 or (s.merge_step and not s.one_step_delay) or s.merge_step >= s.h_min:
        p.append(f"schedule.merge_step must be 0 (off) or within 1..h_min-1 = {s.h_min - 1} with one_step_delay = true "
                 f"(every epoch folds the global model in inside its steps), got {s.merge_step}")
    if s.first_merge_step != -1 and not (s.merge_step > 0 and 0 <= s.first_merge_step < s.h_min):
        p.append(f"schedule.first_merge_step must be -1 (as merge_step) or, with merge_step > 0, within "
                 f"0..h_min-1 = {s.h_min - 1}, got {s.first_merge_step}")
    if not 1 <= c.rank_min <= c.rank_initial <= c.rank_max:
        p.append(f"need 1 <= compression.rank_min <= rank_initial <= rank_max, got {c.rank_min}, {c.rank_initial}, {c.rank_max}")
    if c.bits not in (4, 8):
        p.append(f"compression.bits must be 4 or 8, got {c.bits}")
    if c.error_feedback not in ("buffer", "params"):
        p.append(f"compression.error_feedback must be 'buffer' or 'params', got {c.error_feedback!r}")
    elif c.error_feedback == "params" and not s.merge_step:
        p.append("compression.error_feedback = 'params' keeps the residual in the parameters through the merge rule's "
                 "step: it needs schedule.merge_step > 0")
    if a.mode not in ("exact", "tolerant"):
        p.append(f"audit.mode must be 'exact' or 'tolerant', got {a.mode!r}")
    if not 0 <= a.final_check_bps <= 10_000 or not 0 <= st.slash_bps <= 10_000:
        p.append("basis-point fields (audit.final_check_bps, stakes.slash_bps) must be within 0..10000")
    if not 1 <= a.threads <= 256:
        p.append(f"audit.threads must be within 1..256, got {a.threads}")
    if a.numerics not in NUMERICS_CLASSES:
        p.append(f"audit.numerics must be one of {sorted(NUMERICS_CLASSES)}, got {a.numerics!r}")
    if a.numerics_digest and not re.fullmatch(r"0x[0-9a-f]{64}", a.numerics_digest):
        p.append(f"audit.numerics_digest must be 0x and 64 lowercase hex digits (or empty), got {a.numerics_digest!r}")
    if a.device != "cpu" and not (a.device.startswith("cuda:") and len(a.device) > len("cuda:")):
        p.append(f"audit.device must be 'cpu' or 'cuda:<GPU name>' (e.g. 'cuda:NVIDIA H100 80GB HBM3'), got {a.device!r}")
    if a.segment < 1:
        p.append("audit.segment must be at least 1")
    if a.unit not in ("state", "shard"):
        p.append(f"audit.unit must be 'state' or 'shard', got {a.unit!r}")
    if a.unit == "shard" and a.mode != "exact":
        p.append("audit.unit = 'shard' replays one block bit for bit: it needs audit.mode = 'exact'")
    if cfg.inner.microbatches < 1 or cfg.data.batch_size % cfg.inner.microbatches:
        p.append(f"inner.microbatches must divide data.batch_size {cfg.data.batch_size}, got {cfg.inner.microbatches}")
    if a.mode == "tolerant" and (a.segment > 16 or a.tolerance <= 0):
        # honest divergence compounds over replayed steps: past 16 it outgrows the calibrated bound
        p.append("tolerant mode needs audit.tolerance > 0 and audit.segment <= 16 (the calibrated range)")
    if not 0 <= a.rate <= 1 or a.rate_ppm / RATE_ONE != a.rate:
        p.append(f"audit.rate is a probability in whole parts per million (0..1, e.g. 0.0165), got {a.rate}")
    elif a.rate and s.h_max > RATE_SCAN:
        p.append(f"audit.rate draws among the first {RATE_SCAN} steps of an epoch (the contract's bound): "
                 f"schedule.h_max = {s.h_max} would leave the rest unchallenged; lower it or use audit.challenges alone")
    elif a.rate and not a.window and 1 <= a.challenges <= 64 and (tail := over_cap(a.rate_ppm, s.h_max, a.challenges)) > RATE_TAIL:
        p.append(f"audit.challenges = {a.challenges} caps the challenges an epoch of up to schedule.h_max = {s.h_max} steps draws "
                 f"at audit.rate = {a.rate}, and the cap would bind with probability {tail:.1e} (> {RATE_TAIL:.0e}), "
                 f"cutting the epoch's last steps out of the draw: raise audit.challenges to {min_cap(a.rate_ppm, s.h_max)}")
    if a.window and (a.window & (a.window - 1) or a.window > RATE_SCAN or a.unit != "shard" or not a.rate):
        p.append(f"audit.window must be 0 (challenges drawn after the epoch) or a power of two up to {RATE_SCAN} with "
                 f"audit.unit = 'shard' and a per-step audit.rate > 0 (each window's steps are drawn at that rate), "
                 f"got window {a.window}, unit {a.unit!r}, rate {a.rate}")
    if not 1 <= a.window_depth <= 64:
        p.append(f"audit.window_depth must be within 1..64 blocks, got {a.window_depth}")
    if not 1 <= a.challenges <= 64 or not 1 <= a.quorum <= 7:
        p.append("need 1 <= audit.challenges <= 64 and 1 <= audit.quorum <= 7 (the contract's limits: past 7 no availability "
                 "committee can form among the 16 verifiers it draws from)")
    elif st.max_verifiers < 2 * a.quorum + 1:
        p.append(f"stakes.max_verifiers = {st.max_verifiers} leaves no availability committee at audit.quorum = {a.quorum}: "
                 f"a report needs {a.quorum} verifiers besides the trainer's {a.quorum} and the reporter, so at least "
                 f"{2 * a.quorum + 1} places (the contract refuses fewer)")
    elif a.quorum < 3 and not a.test_run:
        p.append(f"audit.quorum = {a.quorum} lets one verifier decide alone: use 3 or more, or set audit.test_run = true "
                 "for a devnet or test run (the contract refuses a quorum below 3 otherwise)")
    if min(cfg.windows.commit_s, cfg.windows.reveal_s, cfg.windows.response_s, cfg.windows.verdict_s, cfg.windows.finalize_s) < 1:
        p.append("every window (windows.*_s) must be at least 1 second")
    if not 1 <= st.min_trainers <= st.max_trainers:
        p.append("need 1 <= stakes.min_trainers <= stakes.max_trainers")
    if st.max_trainers > MAX_TRAINERS or st.max_verifiers > MAX_VERIFIERS:
        p.append(f"stakes.max_trainers <= {MAX_TRAINERS} and stakes.max_verifiers <= {MAX_VERIFIERS} (the contract's "
                 "bounds: a verifier's reveal of one verdict per trainer and finalize's scan of every slot must fit a block)")
    if not (cfg.outer.clip == 0 or cfg.outer.clip >= 1):
        p.append(f"outer.clip must be 0 (off) or at least 1 (1 caps every norm at the median), got {cfg.outer.clip}")
    if cfg.outer.aggregate not in AGGREGATES:
        p.append(f"outer.aggregate must be one of {', '.join(AGGREGATES)}, got {cfg.outer.aggregate!r}")
    if cfg.outer.trim < 1:
        p.append(f"outer.trim must be at least 1 (values dropped at each end of a coordinate), got {cfg.outer.trim}")
    rw = cfg.rewards
    if not (0 <= rw.trainer_wei < 2**96 and 0 <= rw.verifier_wei < 2**96):
        p.append(f"rewards.trainer_wei and rewards.verifier_wei must be within 0..2^96-1 (the contract's limit), got {rw.trainer_wei}, {rw.verifier_wei}")
    if not 0 <= rw.pool_wei < 2**128:
        p.append(f"rewards.pool_wei must be within 0..2^128-1 (the contract's limit), got {rw.pool_wei}")
    if rw.pool_wei > 0 and rw.trainer_wei == rw.verifier_wei == 0:
        p.append("rewards.pool_wei is funded but rewards.trainer_wei and verifier_wei are 0: the pool would never pay out")
    if cfg.data.batch_size < 1 or cfg.data.seq_len < 1:
        p.append("data.batch_size and data.seq_len must be positive")
    d = cfg.data
    if d.token_dtype not in ("uint8", "uint16", "uint32"):
        p.append(f"data.token_dtype must be uint8, uint16 or uint32, got {d.token_dtype!r}")
    elif d.token_dtype != "uint8" and not cfg.model.vocab_size:
        p.append("a tokenized corpus (data.token_dtype != uint8) needs model.vocab_size (its tokenizer's vocabulary)")
    if cfg.model.precision not in PRECISIONS:
        p.append(f"model.precision must be one of {list(PRECISIONS)}, got {cfg.model.precision!r}")
    if not 0 <= cfg.model.vocab_size <= 2**32:
        p.append(f"model.vocab_size must be within 0..2^32 (0: the preset's), got {cfg.model.vocab_size}")
    if bool(d.tokenizer_cid) and not d.tokenizer_digest:
        p.append("data.tokenizer_cid needs data.tokenizer_digest (the content is checked against it)")
    return p


# --- dict / JSON / TOML conversion -------------------------------------------------------------

T = TypeVar("T")


def to_dict(obj: Any, wire: bool = False) -> dict[str, Any]:
    """Plain nested dict; floats become decimal strings (the canonical JSON form); `wire`: renamed fields
    under their published names."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        v, name = getattr(obj, f.name), f.metadata.get("wire", f.name) if wire else f.name
        if f.metadata.get("omit_default") and v == f.default:
            continue
        if dataclasses.is_dataclass(v):
            out[name] = to_dict(v, wire)
        elif isinstance(v, float):
            out[name] = _decimal_str(v)
        else:
            out[name] = v
    return out


def _renamed(cls: Any, data: Any, where: str, warn: Any) -> Any:
    """`data` with every renamed field's old (wire) name replaced by its name; both at once is an error.
    `warn(old, new)`, if given, hears each old name met (a run.toml's, not the published JSON's)."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    hints = get_type_hints(cls)
    for f in fields(cls):
        old = f.metadata.get("wire")
        if old and old in out:
            if f.name in out:
                raise ConfigError(f"{where}{old} and {where}{f.name} are one setting (its old and new name): keep {where}{f.name}")
            out[f.name] = out.pop(old)
            if warn is not None:
                warn(where + old, where + f.name)
        kind = hints.get(f.name)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind) and f.name in out:
            out[f.name] = _renamed(kind, out[f.name], where + f.name + ".", warn)
    return out


def _decimal_str(x: float) -> str:
    if not math.isfinite(x):
        raise ConfigError(f"non-finite number {x} in run config")
    return format(Decimal(repr(x)).normalize(), "f")


def _build(cls: type[T], data: Any, where: str) -> T:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a table, got {type(data).__name__}")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known - ({"format"} if cls is RunConfig else set()))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(where + k for k in unknown)}; known: {', '.join(sorted(known))}")
    kwargs: dict[str, Any] = {}
    for name in known & set(data):
        kind, value, key = hints[name], data[name], where + name
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            kwargs[name] = _build(kind, value, key + ".")
        elif kind is float:
            try:
                kwargs[name] = float(Decimal(str(value))) if not isinstance(value, bool) else _bad(key, value, "a number")
            except ArithmeticError:
                _bad(key, value, "a number")
        elif kind is int:
            kwargs[name] = value if isinstance(value, int) and not isinstance(value, bool) else _bad(key, value, "an integer")
        elif kind is bool:
            kwargs[name] = value if isinstance(value, bool) else _bad(key, value, "true or false")
        else:
            kwargs[name] = value if isinstance(value, str) else _bad(key, value, "a string")
    return cls(**kwargs)


def _bad(key: str, value: Any, want: str) -> Any:
    raise ConfigError(f"{key} must be {want}, got {value!r}")


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def from_dict(data: dict[str, Any], warn: Any = None) -> RunConfig:
    """A run config from plain data, old key names included (`_renamed`; `warn` hears them)."""
    if "format" in data and data["format"] != FORMAT:
        raise ConfigError(f"run config format is {data['format']!r}, this build reads {FORMAT!r}")
    return _build(RunConfig, _renamed(RunConfig, data, "", warn), "")


def from_json(raw: bytes) -> RunConfig:
    """Parse and validate a published run config (untrusted bytes from the store)."""
    try:
        data = decode_canonical_json(raw)
    except FormatError as exc:
        raise ConfigError(f"run config: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("run config must be a JSON object")
    cfg = from_dict(data)
    if cfg.to_json() != raw:
        raise ConfigError("run config JSON is not in canonical form (sorted keys, no spaces, decimal strings)")
    return cfg


def load_toml(path: str | Path) -> RunConfig:
    """Read a run.toml; missing tables and keys take the defaults above."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"run config {path} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"run config {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"run config {path} is not UTF-8 text; it must be a TOML file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read run config {path}: {exc.strerror or exc}") from None

    def renamed(old: str, new: str) -> None:
        warnings.warn(f"{path}: {old} is now {new} (same meaning; the old name still reads)", ConfigWarning, stacklevel=3)

    return from_dict(data, renamed)
