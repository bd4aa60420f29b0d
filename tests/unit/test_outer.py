"""Outer Nesterov step and deterministic aggregation: equal to torch's SGD, order-pinned, strict on input."""

import math

import pytest
import torch

from coordinator.aggregate import (
    AggregateError,
    aggregate,
    aggregate_payloads,
    clip_scales,
    delta_norm,
    mean_delta,
)
from coordinator.outer import (
    MOM,
    PARAM,
    OuterConfig,
    OuterError,
    global_params,
    init_global,
    outer_step,
)
from protocol.digest import state_digest
from protocol.formats.payload import PayloadError, decode
from trainer.compress import CompressionConfig, compress

pytestmark = pytest.mark.unit


def _params(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(5, 3, generator=g), "b": torch.randn(3, generator=g)}


def test_outer_step_matches_torch_sgd_nesterov() -> None:
    cfg = OuterConfig()
    p0 = _params(0)
    g = init_global(p0)
    ref = {n: t.clone().requires_grad_() for n, t in p0.items()}
    opt = torch.optim.SGD(list(ref.values()), lr=cfg.lr, momentum=cfg.momentum, nesterov=True)
    for k in range(4):
        d = _params(10 + k)
        g = outer_step(g, d, cfg)
        for n, t in ref.items():
            t.grad = d[n].clone()
        opt.step()
    for n, t in ref.items():
        torch.testing.assert_close(g[PARAM + n], t.detach(), rtol=1e-6, atol=1e-6)
    assert set(g) == {PARAM + "w", PARAM + "b", MOM + "w", MOM + "b"}


def test_plain_momentum_and_bad_config() -> None:
    g = init_global(_params(0))
    d = _params(1)
    out = outer_step(g, d, OuterConfig(lr=1.0, momentum=0.0, nesterov=False))
    torch.testing.assert_close(out[PARAM + "w"], g[PARAM + "w"] - d["w"])
    with pytest.raises(OuterError):
        OuterConfig(momentum=1.0)
    with pytest.raises(OuterError, match="names differ"):
        outer_step(g, {"w": d["w"]}, OuterConfig())


def test_aggregate_is_mean_in_fixed_order_and_deterministic() -> None:
    g = init_global(_params(0))
    deltas = [_params(s) for s in (1, 2, 3)]
    a = aggregate(g, deltas, OuterConfig())
    b = aggregate(g, [dict(d) for d in deltas], OuterConfig())
    assert state_digest(a) == state_digest(b)
    m = mean_delta(deltas, {n: tuple(t.shape) for n, t in global_params(g).items()})
    torch.testing.assert_close(m["w"], (deltas[0]["w"] + deltas[1]["w"] + deltas[2]["w"]) / 3)
    assert state_digest(a) == state_digest(outer_step(g, m, OuterConfig()))
    assert global_params(a).keys() == {"w", "b"}
    assert state_digest(g) == state_digest(init_global(_params(0)))  # input untouched


@pytest.mark.parametrize(
    ("deltas", "match"),
    [
        ([], "no pseudo-gradients"),
        ([{"w": torch.zeros(5, 3)}], "different tensor names"),
        ([{"w": torch.zeros(3, 5), "b": torch.zeros(3)}], "expected float32"),
        ([{"w": torch.zeros(5, 3), "b": torch.zeros(3, dtype=torch.float64)}], "expected float32"),
        ([{"w": torch.full((5, 3), float("nan")), "b": torch.zeros(3)}], "NaN"),
    ],
)
def test_aggregate_rejects_bad_deltas(deltas: list[dict[str, torch.Tensor]], match: str) -> None:
    with pytest.raises(AggregateError, match=match):
        aggregate(init_global(_params(0)), deltas, OuterConfig())


def test_aggregate_payloads_decodes_then_aggregates() -> None:
    g = init_global(_params(0))
    deltas = [_params(s) for s in (1, 2)]
    payloads = [compress(d, {}, 2, 0, CompressionConfig()).payload for d in deltas]
    want = aggregate(g, [decode(p) for p in payloads], OuterConfig())
    got = aggregate_payloads(g, payloads, OuterConfig())
    assert state_digest(got) == state_digest(want)
    with pytest.raises(PayloadError):
        aggregate_payloads(g, [payloads[0][:-3]], OuterConfig())


def _shapes() -> dict[str, tuple[int, ...]]:
    return {n: tuple(t.shape) for n, t in _params(0).items()}


def test_clip_caps_an_outlier_at_the_lower_median_norm() -> None:
    honest = [_params(s) for s in (1, 2, 3)]
    huge = {n: t * 1000 for n, t in _params(4).items()}
    deltas = [honest[0], huge, honest[1], honest[2]]
    scales = clip_scales(deltas, 2.0)
    norms = [delta_norm(d) for d in deltas]
    limit = 2.0 * sorted(norms)[1]  # lower median of four
    assert [s for i, s in enumerate(scales) if i != 1] == [1.0, 1.0, 1.0]
    assert 0 < scales[1] < 1 and limit - 1e-4 * limit <= norms[1] * scales[1] <= limit
    mantissa, _ = math.frexp(scales[1])
    assert math.ldexp(mantissa, 16).is_integer()  # 16 significant bits, as published
    m = mean_delta(deltas, _shapes(), clip=2.0)
    want = (honest[0]["w"] + huge["w"] * scales[1] + honest[1]["w"] + honest[2]["w"]) / 4
    assert torch.equal(m["w"], want)
    # the outlier's pull on the mean is bounded by clip × an honest norm / K
    unclipped = mean_delta(deltas, _shapes())
    assert delta_norm(unclipped) > 100 * delta_norm(m)
    assert delta_norm(m) <= (limit + sum(norms[i] for i in (0, 2, 3))) / 4


def test_clip_leaves_honest_sets_bit_identical_and_can_be_off() -> None:
    deltas = [_params(s) for s in (1, 2, 3)]
    shapes = _shapes()
    plain = mean_delta(deltas, shapes)
    assert clip_scales(deltas, 2.0) == [1.0, 1.0, 1.0]
    assert all(torch.equal(plain[n], mean_delta(deltas, shapes, clip=2.0)[n]) for n in shapes)
    huge = [deltas[0], {n: t * 1000 for n, t in deltas[1].items()}]
    assert clip_scales(huge, 0.0) == [1.0, 1.0]  # off
    assert clip_scales(huge[1:], 2.0) == [1.0]  # one trainer: nothing to compare with
    assert clip_scales([deltas[0], {n: torch.zeros_like(t) for n, t in deltas[0].items()}], 2.0) == [1.0, 1.0]
    with pytest.raises(OuterError, match="clip"):
        OuterConfig(clip=0.5)
