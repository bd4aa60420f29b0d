"""Deterministic aggregation: mean of the accepted pseudo-gradients, then the outer step.

A verifier recomputes the coordinator's new global model and refuses to attest a different one, so
every float operation happens in a fixed order: deltas are summed in fp32 in the order given (the
caller passes them in the protocol's order, e.g. sorted by trainer address), then divided by their
count. ``aggregate_payloads`` is the same over encoded payloads (decoded by ``protocol.formats.payload``).

Audits are samples, so a forged payload can pass (docs/security.md T5, T15). With ``clip`` > 0
each pseudo-gradient's L2 norm is capped at ``clip`` times the lower median of the norms: with an
honest majority that reference is an honest trainer's norm, so one escaped forgery moves the mean
by at most ``clip`` honest norms / K instead of arbitrarily far.

That bound is reached every epoch by a forgery at the cap (docs/results-steering.md). With
``aggregate`` = "trimmed" (or "median") the clipped pseudo-gradients are combined per coordinate
instead: the values are sorted and the ``trim`` largest and smallest dropped before the mean, so one
trainer can move a coordinate of the aggregate only within the other trainers' range there. Sorting
makes that rule independent of the input order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from dilocox.outer import GlobalState, OuterConfig, OuterError, global_params, outer_step


class AggregateError(OuterError):
    """Pseudo-gradients that cannot be averaged together (none, or mismatched names or shapes)."""


# Clip scales are rounded down to this many significant bits: a norm computed on another CPU may
# differ in its last bits (vectorised reductions), and rounding makes that change the aggregate with
# odds ~1e-8.
_SCALE_BITS = 16


def _round_down(x: float) -> float:
    mantissa, exponent = math.frexp(x)
    return math.ldexp(math.floor(math.ldexp(mantissa, _SCALE_BITS)), exponent - _SCALE_BITS)


def delta_norm(delta: Mapping[str, Tensor]) -> float:
    """L2 norm over all tensors, squares summed in fp64 (exact per element), tensors in name order."""
    return math.sqrt(math.fsum(float(torch.sum(delta[n].double() ** 2)) for n in sorted(delta)))


def clip_scales(deltas: Sequence[Mapping[str, Tensor]], clip: float) -> list[float]:
    """Per-delta multipliers capping each norm at ``clip`` × the lower median norm (1.0 = untouched).

    Off with ``clip`` = 0, a single delta, or a zero reference norm (nothing honest to compare with).
    """
    if clip <= 0 or len(deltas) < 2:
        return [1.0] * len(deltas)
    norms = [delta_norm(d) for d in deltas]
    limit = clip * sorted(norms)[(len(norms) - 1) // 2]
    if limit <= 0:
        return [1.0] * len(deltas)
    return [1.0 if n <= limit else _round_down(limit / n) for n in norms]


def _check(deltas: Sequence[Mapping[str, Tensor]], shapes: Mapping[str, tuple[int, ...]]) -> None:
    if not deltas:
        raise AggregateError("no pseudo-gradients to aggregate; at least one trainer must pass")
    for i, d in enumerate(deltas):
        if set(d) != set(shapes):
            diff = sorted(set(d) ^ set(shapes))[:3]
            raise AggregateError(
                f"pseudo-gradient #{i} has different tensor names than the model: {diff}"
            )
        for n, s in shapes.items():
            t = d[n]
            if tuple(t.shape) != tuple(s) or t.dtype != torch.float32:
                raise AggregateError(
                    f"pseudo-gradient #{i} tensor {n!r} is {t.dtype} {tuple(t.shape)}, expected float32 {s}"
                )
            if not bool(torch.isfinite(t).all()):
                raise AggregateError(f"pseudo-gradient #{i} tensor {n!r} has NaN or Inf values")


def mean_delta(
    deltas: Sequence[Mapping[str, Tensor]], shapes: Mapping[str, tuple[int, ...]], clip: float = 0.0
) -> dict[str, Tensor]:
    """fp32 mean of ``deltas`` (each norm-capped by ``clip_scales``) summed left to right; each must
    have exactly ``shapes``' names and shapes."""
    _check(deltas, shapes)
    scales = clip_scales(deltas, clip)

    def term(i: int, n: str) -> Tensor:
        return deltas[i][n] if scales[i] == 1.0 else deltas[i][n] * scales[i]

    out: dict[str, Tensor] = {}
    k = float(len(deltas))
    for n in sorted(shapes):
        acc = term(0, n).clone()
        for i in range(1, len(deltas)):
            acc = acc + term(i, n)
        out[n] = acc / k
    return out


def trim_count(k: int, rule: str, trim: int = 1) -> int:
    """Values dropped at each end of a coordinate's K sorted values: ``trim`` ("trimmed", at most
    ⌊(K−1)/2⌋ so one or two are left), ⌊(K−1)/2⌋ ("median"), 0 ("mean")."""
    most = (k - 1) // 2
    return {"mean": 0, "trimmed": min(trim, most), "median": most}[rule]


# values sorted at once per tensor slice: K × this many floats (64 MiB at K = 256)
_CHUNK_VALUES = 1 << 24


def trimmed_delta(
    deltas: Sequence[Mapping[str, Tensor]], shapes: Mapping[str, tuple[int, ...]], clip: float = 0.0,
    rule: str = "trimmed", trim: int = 1,
) -> dict[str, Tensor]:
    """Per coordinate, the fp32 mean of the clipped values (``clip_scales``, as ``mean_delta``) left
    after dropping the ``trim_count`` smallest and largest: sorted ascending (−0.0 made +0.0 first,
    so equal values are equal bits), the middle K − 2t summed in that order, divided by K − 2t.

    Depends only on the multiset of the inputs, not their order. With nothing to drop (t = 0: K ≤ 2,
    or rule "mean") it is ``mean_delta`` itself, bit for bit."""
    _check(deltas, shapes)
    t = trim_count(len(deltas), rule, trim)
    if t == 0:
        return mean_delta(deltas, shapes, clip)
    scales = clip_scales(deltas, clip)
    k = len(deltas)
    kept = float(k - 2 * t)
    chunk = max(1, _CHUNK_VALUES // k)
    out: dict[str, Tensor] = {}
    for n in sorted(shapes):
        flat = [(d[n] if s == 1.0 else d[n] * s).reshape(-1) for d, s in zip(deltas, scales)]
        res = torch.empty(flat[0].numel(), dtype=torch.float32)
        for lo in range(0, res.numel(), chunk):
            v = torch.stack([f[lo : lo + chunk] for f in flat]) + 0.0  # -0.0 + 0.0 = +0.0
            v = torch.sort(v, dim=0).values
            acc = v[t].clone()
            for i in range(t + 1, k - t):
                acc = acc + v[i]
            res[lo : lo + chunk] = acc / kept
        out[n] = res.reshape(shapes[n])
    return out


def combine(
    deltas: Sequence[Mapping[str, Tensor]], shapes: Mapping[str, tuple[int, ...]], cfg: OuterConfig
) -> dict[str, Tensor]:
    """The aggregated pseudo-gradient by ``cfg``'s rule (``cfg.aggregate``, ``cfg.clip``, ``cfg.trim``)."""
    if cfg.aggregate == "mean":
        return mean_delta(deltas, shapes, cfg.clip)
    return trimmed_delta(deltas, shapes, cfg.clip, cfg.aggregate, cfg.trim)


def aggregate(
    g: Mapping[str, Tensor], deltas: Sequence[Mapping[str, Tensor]], cfg: OuterConfig
) -> GlobalState:
    """New global state: outer step on ``combine(deltas)``: the (clipped, ``cfg.clip``) mean of
    ``deltas`` in the given order, or their trimmed mean or median per coordinate (``cfg.aggregate``)."""
    shapes = {n: tuple(p.shape) for n, p in global_params(g).items()}
    return outer_step(g, combine(deltas, shapes, cfg), cfg)


def aggregate_payloads(
    g: Mapping[str, Tensor], payloads: Sequence[bytes], cfg: OuterConfig
) -> GlobalState:
    """Decode each payload against the model's shapes, then ``aggregate``; bad payloads raise PayloadError."""
    from protocol.formats.payload import decode  # the codec lives with the compressor

    shapes = {n: tuple(p.shape) for n, p in global_params(g).items()}
    return aggregate(g, [decode(p, shapes) for p in payloads], cfg)
