"""The adaptive pseudo-gradient compressor: low-rank + int4 factors, int8 vectors, error feedback.

`compress` turns a pseudo-gradient (plus the error-feedback buffer) into payload bytes
(protocol/formats/payload.py) and the new error buffer. It is pure and deterministic: the only randomness
is a sketch matrix seeded from the caller's `seed` and the tensor name, and there is no warm-start
state, so a verifier holding the end state can recompute the payload byte for byte.

`adapt` is the public rule that picks the next epoch's rank and local steps H from statistics every
participant can read from the accepted payloads; docs/compression.md explains the rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from eth_abi import encode as abi_encode

from protocol.digest import keccak
from protocol.errors import VerilocoError
from protocol.formats.payload import (
    DEFAULT_MAX_BYTES,
    KIND_NAMES,
    LOWRANK,
    QUANT,
    RAW,
    Record,
    all_finite,
    encode,
    encode_lowrank,
    encode_quant,
    encode_raw,
    encoded_size,
    merge,
    parse,
    reconstruct,
)

SEED_TAG = b"veriloco.compress.v1"


class CompressError(VerilocoError):
    """The compressor was given something it cannot encode (non-finite values, mismatched buffers)."""


@dataclass(frozen=True)
class CompressionConfig:
    """How pseudo-gradients are compressed, and the bounds of the adaptive rank/H rule.

    Field names follow the run config's `compression` and `schedule` sections.
    """

    lowrank: bool = True  # low-rank factorise matrices (off: quantize everything densely)
    bits: int = 4  # factor bits: 4 or 8, or 32 for float32 factors
    dense_bits: int = 8  # 1-D and small tensors: 4 or 8, or 32 for raw float32
    group_size: int = 64
    oversample: int = 4  # extra sketch columns beyond the rank (randomized range finder)
    power_iters: int = 1  # subspace iterations: the first halves the error gap, more barely help (docs)
    min_saving: float = 2.0  # low-rank only when at least this many times smaller than the dense encoding
    error_feedback: bool = True
    # adaptive rule (docs/compression.md)
    adaptive: bool = True
    energy_target: float = 0.5  # fraction of ||X||^2 the chosen rank should capture
    rank_initial: int = 8
    rank_min: int = 2
    rank_max: int = 32
    h_initial: int = 16
    h_min: int = 8
    h_max: int = 64

    def __post_init__(self) -> None:
        if self.bits not in (4, 8, 32) or self.dense_bits not in (4, 8, 32):
            raise CompressError(f"bits and dense_bits must be 4, 8 or 32, got {self.bits}, {self.dense_bits}")
        if self.group_size < 1 or self.oversample < 0 or self.power_iters < 0 or self.min_saving <= 0:
            raise CompressError("group_size must be >= 1, oversample and power_iters >= 0, min_saving > 0")
        if not 1 <= self.rank_min <= self.rank_initial <= self.rank_max:
            raise CompressError(
                f"need 1 <= rank_min <= rank_initial <= rank_max, got {self.rank_min}, {self.rank_initial}, {self.rank_max}"
            )
        if not 1 <= self.h_min <= self.h_initial <= self.h_max:
            raise CompressError(f"need 1 <= h_min <= h_initial <= h_max, got {self.h_min}, {self.h_initial}, {self.h_max}")
        if not 0.0 < self.energy_target < 1.0:
            raise CompressError(f"energy_target must be in (0, 1), got {self.energy_target}")


@dataclass(frozen=True)
class TensorStats:
    kind: str  # "raw" | "quant" | "lowrank"
    rank: int
    rel_error: float  # ||x - decoded|| / ||x|| (0 for a zero tensor)
    energy: float  # ||x||^2
    spectrum: tuple[float, ...]  # leading squared singular values (lowrank only)
    residual: float = 0.0  # ||x - decoded||^2, kept so parts' statistics merge exactly (merge_compressed)


@dataclass(frozen=True)
class EnergyProfile:
    """Energy captured by the top-k components, summed over a payload's low-rank tensors.

    `captured[k-1]` is the sum over tensors of their k largest squared singular values (as many as
    each tensor carries); `total` is the sum of their ||X||^2. Readable from any payload.
    """

    total: float
    captured: tuple[float, ...]

    def needed_rank(self, target: float) -> int | None:
        """Smallest k whose top-k components hold `target` of the energy, or None if the carried k do not."""
        if self.total <= 0.0:
            return 1
        for k, c in enumerate(self.captured, start=1):
            if c >= target * self.total:
                return k
        return None


@dataclass(frozen=True)
class CompressionStats:
    payload_bytes: int
    dense_bytes: int  # the same tensors as float32
    rel_error: float  # over all tensors together
    tensors: dict[str, TensorStats]
    profile: EnergyProfile


@dataclass(frozen=True)
class Compressed:
    payload: bytes
    new_ef: dict[str, torch.Tensor]
    stats: CompressionStats


def compression_seed(run_seed: int, epoch: int, slot: int) -> int:
    """The `seed` a trainer passes to `compress` (docs/compression.md): public, so verifiers can replay it."""
    for label, v in (("run_seed", run_seed), ("epoch", epoch), ("slot", slot)):
        if not 0 <= v < 2**256:
            raise CompressError(f"{label}={v} must be a uint256")
    enc = abi_encode(["string", "uint256", "uint256", "uint256"], [SEED_TAG.decode(), run_seed, epoch, slot])
    return int.from_bytes(keccak(enc)[:8], "little")


def tensor_seed(seed: int, name: str) -> int:
    """The sketch seed of one tensor: a public function of the caller's seed and the name."""
    word = keccak(SEED_TAG + (seed % (1 << 64)).to_bytes(8, "little") + name.encode())
    return int.from_bytes(word[:8], "little") & ((1 << 63) - 1)


def _lowrank_bytes(m: int, n: int, r: int, bits: int, group: int) -> int:
    if bits == 32:
        return 4 * r * (m + n)
    per = (lambda L: r * L * bits // 8 + r * -(-L // group) * 2)
    return per(m) + per(n) + 4 * (r + 1)


def _dense_bytes(numel: int, bits: int, group: int) -> int:
    return 4 * numel if bits == 32 else numel * bits // 8 + -(-numel // group) * 2


def factorize(x: torch.Tensor, rank: int, seed: int, oversample: int, power_iters: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Randomized SVD of a float32 matrix: (P, Q, s2) with x ~ P @ Q.T, P = U*sqrt(S), Q = V*sqrt(S).

    Splitting sqrt(S) between the factors gives them comparable magnitudes, which suits their
    separate quantization. s2 holds the estimated squared singular values (the energy spectrum).
    """
    m, n = x.shape
    k = min(rank + oversample, m, n)
    gen = torch.Generator().manual_seed(seed)
    omega = torch.randn(n, k, generator=gen, dtype=torch.float32)
    basis, _ = torch.linalg.qr(x @ omega)
    for _ in range(power_iters):
        z, _ = torch.linalg.qr(x.t() @ basis)
        basis, _ = torch.linalg.qr(x @ z)
    u_b, s, vh = torch.linalg.svd(basis.t() @ x, full_matrices=False)
    r = min(rank, k)
    root = s[:r].sqrt()
    p = (basis @ u_b[:, :r]) * root
    q = vh[:r].t() * root
    return p.contiguous(), q.contiguous(), s[:r].square()


def _kind(shape: tuple[int, ...], rank: int, cfg: CompressionConfig) -> tuple[int, int, int, int]:
    """How a tensor of ``shape`` is encoded at ``rank``: (kind, bits, group, rank). Low-rank where it
    saves ``min_saving`` over the dense encoding; both ``_encode_tensor`` and ``payload_size`` ask."""
    numel = math.prod(shape)
    if cfg.lowrank and len(shape) >= 2:
        m, n = shape[0], numel // shape[0]
        r = min(rank, m, n)
        if r >= 1 and _lowrank_bytes(m, n, r, cfg.bits, cfg.group_size) * cfg.min_saving <= _dense_bytes(numel, cfg.dense_bits, cfg.group_size):
            return LOWRANK, cfg.bits, cfg.group_size, r
    return (RAW, 32, 0, 0) if cfg.dense_bits == 32 else (QUANT, cfg.dense_bits, cfg.group_size, 0)


def _encode_tensor(name: str, x: torch.Tensor, dtype: torch.dtype, rank: int, seed: int, cfg: CompressionConfig) -> Record:
    shape = tuple(x.shape)
    kind, bits, group, r = _kind(shape, rank, cfg)
    if kind == LOWRANK:
        mat = x.reshape(shape[0], -1)
        p, q, s2 = factorize(mat, r, tensor_seed(seed, name), cfg.oversample, cfg.power_iters)
        energy = float(torch.linalg.vector_norm(mat)) ** 2
        return encode_lowrank(name, shape, dtype, p, q, bits, group, energy, s2.tolist())
    if kind == RAW:
        return encode_raw(name, x.to(dtype))
    return encode_quant(name, x.to(dtype), bits, group)


def payload_size(shapes: Mapping[str, tuple[int, ...]], rank: int, cfg: CompressionConfig) -> int:
    """Bytes of the payload ``compress`` writes for tensors of ``shapes`` at ``rank``, priced by the
    payload layout without encoding anything (benchmarks/projection.py prices a 107B model)."""
    return encoded_size([(name, shape, *_kind(shape, rank, cfg)) for name, shape in shapes.items()])


def compress(
    delta: Mapping[str, torch.Tensor],
    ef: Mapping[str, torch.Tensor],
    rank: int,
    seed: int,
    cfg: CompressionConfig,
) -> Compressed:
    """Encode `delta + ef` and return the payload, the new error buffer and statistics.

    `delta` and `ef` use bare parameter names; missing `ef` entries count as zero. The new buffer is
    `(delta + ef) - decode(payload)`, reconstructed from the payload bytes themselves so it matches exactly
    what the coordinator will decode. Deterministic for fixed inputs, seed and thread settings.
    """
    if rank < 1:
        raise CompressError(f"rank must be at least 1, got {rank}")
    extra = sorted(set(ef) - set(delta))
    if extra:
        raise CompressError(f"error-feedback buffer has entries with no pseudo-gradient: {extra}")
    xs: dict[str, torch.Tensor] = {}
    records: list[Record] = []
    for name in sorted(delta, key=lambda s: s.encode()):
        d = delta[name].detach().cpu()
        if not d.is_floating_point() or d.numel() == 0:
            raise CompressError(f"pseudo-gradient {name!r} must be a non-empty float tensor, got {d.dtype} {tuple(d.shape)}")
        x = d.to(torch.float32)
        if name in ef and cfg.error_feedback:
            buf = ef[name].detach().cpu()
            if buf.shape != d.shape:
                raise CompressError(f"error buffer {name!r} has shape {tuple(buf.shape)}, pseudo-gradient {tuple(d.shape)}")
            x = x + buf.to(torch.float32)
        if not all_finite(x):
            raise CompressError(f"pseudo-gradient {name!r} has NaN/Inf values: the inner loop diverged; lower the learning rate")
        xs[name] = x
        try:
            records.append(_encode_tensor(name, x, d.dtype, rank, seed, cfg))
        except ValueError as exc:
            raise CompressError(f"cannot encode {name!r}: {exc}") from exc
    payload = encode(records)
    new_ef: dict[str, torch.Tensor] = {}
    tensors: dict[str, TensorStats] = {}
    err2 = tot2 = 0.0
    entries = parse(payload, max_bytes=max(DEFAULT_MAX_BYTES, len(payload)),
                    max_elements=max(1, sum(x.numel() for x in xs.values())))
    for e in entries:
        x = xs[e.name]
        residual = x - reconstruct(payload, e).to(torch.float32)
        new_ef[e.name] = residual.to(delta[e.name].dtype) if cfg.error_feedback else torch.zeros_like(delta[e.name])
        r2, x2 = float(torch.linalg.vector_norm(residual)) ** 2, float(torch.linalg.vector_norm(x)) ** 2
        err2, tot2 = err2 + r2, tot2 + x2
        tensors[e.name] = TensorStats(KIND_NAMES[e.kind], e.rank, math.sqrt(r2 / x2) if x2 > 0 else 0.0, x2, e.spectrum, r2)
    return Compressed(
        payload,
        new_ef,
        CompressionStats(
            payload_bytes=len(payload),
            dense_bytes=4 * sum(x.numel() for x in xs.values()),
            rel_error=math.sqrt(err2 / tot2) if tot2 > 0 else 0.0,
            tensors=tensors,
            profile=_profile([(e.energy, e.spectrum) for e in entries if e.kind == LOWRANK]),
        ),
    )


def merge_compressed(parts: Sequence[tuple[bytes, CompressionStats]]) -> tuple[bytes, CompressionStats]:
    """The payload and statistics of a whole model from those of its parts (disjoint tensor names).

    Byte- and bit-identical to `compress` on the whole: each tensor is compressed alone (seeded by
    its name), the payload is re-laid out by name, and the error sums run in the same name order.
    """
    payload = merge([p for p, _ in parts])
    tensors: dict[str, TensorStats] = {}
    for _, st in parts:
        tensors.update(st.tensors)
    err2 = tot2 = 0.0
    entries = parse(payload, max_bytes=max(DEFAULT_MAX_BYTES, len(payload)), max_elements=1 << 62)
    for e in entries:
        t = tensors[e.name]
        err2, tot2 = err2 + t.residual, tot2 + t.energy
    return payload, CompressionStats(
        payload_bytes=len(payload),
        dense_bytes=sum(st.dense_bytes for _, st in parts),
        rel_error=math.sqrt(err2 / tot2) if tot2 > 0 else 0.0,
        tensors={e.name: tensors[e.name] for e in entries},
        profile=_profile([(e.energy, e.spectrum) for e in entries if e.kind == LOWRANK]),
    )


def _profile(items: Sequence[tuple[float, Sequence[float]]]) -> EnergyProfile:
    depth = max((len(s) for _, s in items), default=0)
    captured = [0.0] * depth
    for _, spectrum in items:
        run = 0.0
        for k in range(depth):
            if k < len(spectrum):
                run += spectrum[k]
            captured[k] += run
    return EnergyProfile(total=sum(e for e, _ in items), captured=tuple(captured))


def payload_profile(payload: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> EnergyProfile:
    """The energy profile a payload carries (validated; raises PayloadError on malformed input)."""
    return _profile([(e.energy, e.spectrum) for e in parse(payload, max_bytes=max_bytes) if e.kind == LOWRANK])


@dataclass(frozen=True)
class EpochRecord:
    """What everyone knows about a finished epoch: the rank and H it used and its accepted payloads' profiles."""

    rank: int
    h: int
    profiles: tuple[EnergyProfile, ...]


def h_for_rank(rank: int, cfg: CompressionConfig) -> int:
    """Local steps for a rank: bytes per inner step held at the run's initial ratio, within [h_min, h_max]."""
    h = (cfg.h_initial * rank + cfg.rank_initial // 2) // cfg.rank_initial
    return max(cfg.h_min, min(cfg.h_max, h))


def adapt(history: Sequence[EpochRecord], cfg: CompressionConfig) -> tuple[int, int]:
    """The (rank, H) for the next epoch, from the latest epoch record everyone can see.

    Each accepted payload says how many components it needs to hold `energy_target` of its energy
    (None: more than it carried). The median over trainers (the lower one for an even count) sets
    the rank: grow 2x when the median needs more than the rank used, shrink to what it needs but at
    most 2x per epoch; then clamp to [rank_min, rank_max]. H follows the rank (`h_for_rank`). The
    caller passes records of epochs whose payloads are public when the next epoch starts (with the
    one-step delay: epochs <= e-2 for epoch e).
    """
    if not cfg.adaptive or not history:
        return cfg.rank_initial, h_for_rank(cfg.rank_initial, cfg)
    last = history[-1]
    needs = sorted(
        (n if n is not None else math.inf) for n in (p.needed_rank(cfg.energy_target) for p in last.profiles)
    )
    if not needs:
        return last.rank, last.h
    need = needs[(len(needs) - 1) // 2]
    if need > last.rank:
        rank = 2 * last.rank
    else:
        rank = max(int(need), -(-last.rank // 2))
    rank = max(cfg.rank_min, min(cfg.rank_max, rank))
    return rank, h_for_rank(rank, cfg)


__all__ = [
    "CompressError",
    "Compressed",
    "CompressionConfig",
    "CompressionStats",
    "EnergyProfile",
    "EpochRecord",
    "TensorStats",
    "adapt",
    "compress",
    "compression_seed",
    "factorize",
    "h_for_rank",
    "merge_compressed",
    "payload_profile",
    "tensor_seed",
]
