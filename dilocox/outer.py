"""The outer optimizer: Nesterov momentum SGD on the averaged pseudo-gradient (DiLoCo's defaults).

The global state is a flat dict like a training state: ``param/<p>`` (the global model) and
``outer.mom/<p>`` (the momentum buffer), so it digests and serialises the same way. Pure functions;
the operation order is fixed here so anyone recomputes the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from protocol.config import OuterSection
from protocol.errors import VerilocoError

PARAM, MOM = "param/", "outer.mom/"
GlobalState = dict[str, Tensor]
AGGREGATES = ("mean", "trimmed", "median")  # outer.aggregate's values


class OuterError(VerilocoError):
    """A global state or pseudo-gradient the outer step cannot use."""


@dataclass(frozen=True)
class OuterConfig:
    lr: float = 0.7
    momentum: float = 0.9
    nesterov: bool = True
    clip: float = 0.0  # cap each pseudo-gradient's norm at clip × the lower median norm (0: off)
    # how the (clipped) pseudo-gradients are combined (dilocox/aggregate.py, docs/protocol.md §9):
    # "mean"; "trimmed", per coordinate the mean without the `trim` largest and `trim` smallest values;
    # "median", per coordinate the median (the mean of the middle two for an even count)
    aggregate: str = "mean"
    trim: int = 1

    def __post_init__(self) -> None:
        if self.lr <= 0 or not 0 <= self.momentum < 1 or not (self.clip == 0 or self.clip >= 1):
            raise OuterError(f"invalid outer settings {self}: need lr>0, 0<=momentum<1 and clip 0 (off) or >=1")
        if self.aggregate not in AGGREGATES or self.trim < 1:
            raise OuterError(f"invalid outer settings {self}: need aggregate one of {AGGREGATES} and trim >= 1")


def from_section(o: OuterSection) -> OuterConfig:
    """The outer optimizer a run config's ``[outer]`` section sets: one construction for the nodes'
    aggregation and the simulation of a run config, so the two cannot drift apart."""
    return OuterConfig(lr=o.lr, momentum=o.momentum, clip=o.clip, aggregate=o.aggregate, trim=o.trim)


def init_global(params: Mapping[str, Tensor]) -> GlobalState:
    """The global state for an initial model: its params and a zero momentum buffer."""
    g: GlobalState = {}
    for n, p in params.items():
        g[PARAM + n] = p.detach().to(torch.float32).clone()
        g[MOM + n] = torch.zeros_like(g[PARAM + n])
    return g


def global_params(g: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The bare-named model parameters of a global state."""
    return {k[len(PARAM) :]: v for k, v in g.items() if k.startswith(PARAM)}


def outer_step(
    g: Mapping[str, Tensor], delta: Mapping[str, Tensor], cfg: OuterConfig
) -> GlobalState:
    """Apply one outer step with pseudo-gradient ``delta`` (bare names, start − end convention).

    Per parameter: b = mu b + d; u = d + mu b (Nesterov) or b; p = p − lr u. This is
    torch.optim.SGD(momentum, nesterov) with dampening 0, written out so its order is pinned.
    """
    names = sorted(global_params(g))
    if sorted(delta) != names:
        missing = set(names) ^ set(delta)
        raise OuterError(
            f"pseudo-gradient names differ from the global model: {sorted(missing)[:3]}"
        )
    out: GlobalState = {}
    for n in names:
        p, b, d = g[PARAM + n], g[MOM + n], delta[n]
        if d.shape != p.shape or d.dtype != torch.float32:
            raise OuterError(
                f"pseudo-gradient {n!r} is {d.dtype} {tuple(d.shape)}, expected float32 {tuple(p.shape)}"
            )
        b = b * cfg.momentum + d
        u = d + b * cfg.momentum if cfg.nesterov else b
        out[PARAM + n] = p - u * cfg.lr
        out[MOM + n] = b
    return out
