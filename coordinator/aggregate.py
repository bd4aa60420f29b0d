"""Deterministic aggregation: mean of the accepted pseudo-gradients, then the outer step.

A verifier recomputes the coordinator's new global model and refuses to attest a different one, so
every float operation happens in a fixed order: deltas are summed in fp32 in the order given (the
caller passes them in the protocol's order, e.g. sorted by trainer address), then divided by their
count. ``aggregate_payloads`` is the same over encoded payloads (decoded by ``protocol.formats.payload``).

Audits are samples, so a forged payload can pass (docs/security.md T5, T15). With ``clip`` > 0
each pseudo-gradient's L2 norm is capped at ``clip`` times the lower median of the norms: with an
honest majority that reference is an honest trainer's norm, so one escaped forgery moves the mean
by at most ``clip`` honest norms / K instead of arbitrarily far.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from coordinator.outer import GlobalState, OuterConfig, OuterError, global_params, outer_step


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


def mean_delta(
    deltas: Sequence[Mapping[str, Tensor]], shapes: Mapping[str, tuple[int, ...]], clip: float = 0.0
) -> dict[str, Tensor]:
    """fp32 mean of ``deltas`` (each norm-capped by ``clip_scales``) summed left to right; each must
    have exactly ``shapes``' names and shapes."""
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


def aggregate(
    g: Mapping[str, Tensor], deltas: Sequence[Mapping[str, Tensor]], cfg: OuterConfig
) -> GlobalState:
    """New global state: outer step on the (clipped, ``cfg.clip``) mean of ``deltas`` in the given order."""
    shapes = {n: tuple(p.shape) for n, p in global_params(g).items()}
    return outer_step(g, mean_delta(deltas, shapes, cfg.clip), cfg)


def aggregate_payloads(
    g: Mapping[str, Tensor], payloads: Sequence[bytes], cfg: OuterConfig
) -> GlobalState:
    """Decode each payload against the model's shapes, then ``aggregate``; bad payloads raise PayloadError."""
    from protocol.formats.payload import decode  # the codec lives with the compressor

    shapes = {n: tuple(p.shape) for n, p in global_params(g).items()}
    return aggregate(g, [decode(p, shapes) for p in payloads], cfg)
