"""Deterministic aggregation: mean of the accepted pseudo-gradients, then the outer step.

A verifier recomputes the coordinator's new global model and refuses to attest a different one, so
every float operation happens in a fixed order: deltas are summed in fp32 in the order given (the
caller passes them in the protocol's order, e.g. sorted by trainer address), then divided by their
count. ``aggregate_payloads`` is the same over encoded payloads (decoded by ``protocol.payload``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from coordinator.outer import GlobalState, OuterConfig, OuterError, global_params, outer_step


class AggregateError(OuterError):
    """Pseudo-gradients that cannot be averaged together (none, or mismatched names or shapes)."""


def mean_delta(
    deltas: Sequence[Mapping[str, Tensor]], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, Tensor]:
    """fp32 mean of ``deltas`` summed left to right; each must have exactly ``shapes``' names and shapes."""
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
    out: dict[str, Tensor] = {}
    k = float(len(deltas))
    for n in sorted(shapes):
        acc = deltas[0][n].clone()
        for d in deltas[1:]:
            acc = acc + d[n]
        out[n] = acc / k
    return out


def aggregate(
    g: Mapping[str, Tensor], deltas: Sequence[Mapping[str, Tensor]], cfg: OuterConfig
) -> GlobalState:
    """New global state: outer step on the mean of ``deltas`` (in the given order)."""
    shapes = {n: tuple(p.shape) for n, p in global_params(g).items()}
    return outer_step(g, mean_delta(deltas, shapes), cfg)


def aggregate_payloads(
    g: Mapping[str, Tensor], payloads: Sequence[bytes], cfg: OuterConfig
) -> GlobalState:
    """Decode each payload against the model's shapes, then ``aggregate``; bad payloads raise PayloadError."""
    from protocol.payload import decode  # the codec lives with the compressor

    shapes = {n: tuple(p.shape) for n, p in global_params(g).items()}
    return aggregate(g, [decode(p, shapes) for p in payloads], cfg)
