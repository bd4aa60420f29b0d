"""Outer Nesterov step and deterministic aggregation: equal to torch's SGD, order-pinned, strict on input."""

import itertools
import math

import pytest
import torch

from dilocox.aggregate import (
    AggregateError,
    aggregate,
    aggregate_payloads,
    clip_scales,
    delta_norm,
    mean_delta,
    trim_count,
    trimmed_delta,
)
from dilocox.compress import CompressionConfig, compress
from dilocox.outer import (
    AGGREGATES,
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


# --- robust rules: outer.aggregate = "trimmed" / "median" (docs/protocol.md §9) ----------------------


def _bits(d: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {n: t.numpy().tobytes() for n, t in d.items()}


def test_trimmed_is_order_independent_and_repeats_bit_for_bit() -> None:
    deltas = [_params(s) for s in (1, 2, 3, 4, 5)]
    for i, d in enumerate(deltas):  # signed zeros tie in the sort: the output must not depend on their order
        d["b"][0] = -0.0 if i % 2 else 0.0
        d["b"][1] = 0.0 if i % 2 else -0.0
    shapes = _shapes()
    want = _bits(trimmed_delta(deltas, shapes, clip=2.0))
    assert _bits(trimmed_delta([dict(d) for d in deltas], shapes, clip=2.0)) == want
    for perm in itertools.islice(itertools.permutations(range(5)), 0, None, 7):
        assert _bits(trimmed_delta([deltas[i] for i in perm], shapes, clip=2.0)) == want
    got = trimmed_delta(deltas, shapes, clip=2.0)["b"]
    assert math.copysign(1.0, float(got[0])) == math.copysign(1.0, float(got[1])) == 1.0  # +0.0
    cfg = OuterConfig(aggregate="trimmed", clip=2.0)
    g = init_global(_params(0))
    assert state_digest(aggregate(g, deltas, cfg)) == state_digest(aggregate(g, deltas[::-1], cfg))
    assert state_digest(aggregate(g, deltas, cfg)) != state_digest(aggregate(g, deltas, OuterConfig(clip=2.0)))


def test_trimmed_drops_the_extremes_per_coordinate() -> None:
    deltas = [_params(s) for s in (1, 2, 3, 4, 5)]
    shapes = _shapes()
    for rule, trim, keep in (("trimmed", 1, slice(1, 4)), ("trimmed", 2, slice(2, 3)), ("median", 1, slice(2, 3))):
        got = trimmed_delta(deltas, shapes, rule=rule, trim=trim)
        for n in shapes:
            v = torch.sort(torch.stack([d[n] for d in deltas]), dim=0).values[keep]
            acc = v[0].clone()
            for row in v[1:]:
                acc = acc + row
            assert torch.equal(got[n], acc / v.shape[0])  # in value order, fp32, then one division


def test_trimmed_is_the_mean_where_nothing_is_dropped_and_the_median_at_three_and_four() -> None:
    shapes = _shapes()
    two = [_params(1), _params(2)]
    for rule in ("trimmed", "median"):  # K <= 2: nothing to drop, the mean itself (address order)
        assert _bits(trimmed_delta(two, shapes, clip=2.0, rule=rule)) == _bits(mean_delta(two, shapes, clip=2.0))
        assert _bits(trimmed_delta(two[:1], shapes, rule=rule)) == _bits(mean_delta(two[:1], shapes))
    assert _bits(trimmed_delta(two, shapes, rule="mean")) == _bits(mean_delta(two, shapes))
    three, four = [_params(s) for s in (1, 2, 3)], [_params(s) for s in (1, 2, 3, 4)]
    for ds in (three, four):  # trim 1 of 3 or 4 keeps the middle one or two: the median
        assert _bits(trimmed_delta(ds, shapes, trim=5)) == _bits(trimmed_delta(ds, shapes, rule="median"))
        assert _bits(trimmed_delta(ds, shapes, trim=1)) == _bits(trimmed_delta(ds, shapes, rule="median"))
    same = [_params(7)] * 5  # identical inputs: kept one or two (x + x = 2x, / 2 exact) gives them back
    assert _bits(trimmed_delta(same, shapes, rule="median")) == _bits(trimmed_delta(same[:4], shapes)) == _bits(same[0])
    assert [trim_count(k, "trimmed", 1) for k in (1, 2, 3, 4, 5)] == [0, 0, 1, 1, 1]
    assert [trim_count(k, "median") for k in (1, 2, 3, 4, 5, 6)] == [0, 0, 1, 1, 2, 2]
    assert trim_count(9, "trimmed", 2) == 2 and trim_count(9, "mean") == 0


def test_one_outlier_moves_a_coordinate_only_within_the_others_range() -> None:
    """The bound docs/protocol.md §9 states: with one input replaced, the trimmed mean's coordinate i
    stays within [lo_i, hi_i], the aggregate with that input at -inf / +inf (the rule is monotone), which
    lies within the other inputs' range at i; so along any unit u the aggregate moves at most
    sum_i |u_i| (hi_i - lo_i), whatever the forgery's norm. The clipped mean moves by the forgery / K."""
    shapes = _shapes()
    honest = [_params(s) for s in (1, 2, 3, 4)]
    others = honest[1:]
    g = torch.Generator().manual_seed(9)
    u = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    un = math.sqrt(sum(float((t.double() ** 2).sum()) for t in u.values()))
    u = {n: t / un for n, t in u.items()}
    big = {n: torch.full(s, 1e30) for n, s in shapes.items()}
    hi = trimmed_delta([*others, big], shapes)
    lo = trimmed_delta([*others, {n: -t for n, t in big.items()}], shapes)
    base = trimmed_delta(honest, shapes)
    bound = sum(float((u[n].abs() * (hi[n] - lo[n])).sum()) for n in shapes)
    for n in shapes:
        stack = torch.stack([d[n] for d in others])
        assert bool((lo[n] >= stack.min(0).values).all()) and bool((hi[n] <= stack.max(0).values).all())
        torch.testing.assert_close(hi[n] - lo[n], (stack.max(0).values - stack.min(0).values) / 2, rtol=0, atol=1e-6)
        assert bool((lo[n] <= base[n]).all()) and bool((base[n] <= hi[n]).all())
    for scale in (1.0, 1e3, 1e6, -1e6):
        forged = {n: -scale * u[n] for n in shapes}
        got = trimmed_delta([forged, *others], shapes, clip=2.0)
        for n in shapes:
            assert bool((lo[n] <= got[n]).all()) and bool((got[n] <= hi[n]).all())
        steer = sum(float((u[n] * (base[n] - got[n])).sum()) for n in shapes)
        assert abs(steer) <= bound + 1e-6
    # the clipped mean: a forgery at 1e6 is capped at clip x the lower median norm, and moves the mean by cap / K
    forged = {n: -1e6 * u[n] for n in shapes}
    cap = 2.0 * sorted(delta_norm(d) for d in [forged, *others])[1]
    mean_steer = sum(float((u[n] * (mean_delta(honest, shapes, 2.0)[n] - mean_delta([forged, *others], shapes, 2.0)[n]))
                           .sum()) for n in shapes)
    own = abs(sum(float((u[n] * honest[0][n]).sum()) for n in shapes))
    assert cap / 4 - own - 1e-4 <= mean_steer <= cap / 4 + own + 1e-4


def test_trimmed_chunks_and_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import dilocox.aggregate as agg

    deltas = [_params(s) for s in (1, 2, 3, 4, 5)]
    want = _bits(trimmed_delta(deltas, _shapes(), clip=2.0))
    monkeypatch.setattr(agg, "_CHUNK_VALUES", 7)  # a slice of 1 coordinate at K = 5: same bytes
    assert _bits(trimmed_delta(deltas, _shapes(), clip=2.0)) == want
    with pytest.raises(AggregateError, match="NaN"):
        trimmed_delta([*deltas[:4], {"w": torch.full((5, 3), float("inf")), "b": torch.zeros(3)}], _shapes())
    with pytest.raises(OuterError, match="aggregate"):
        OuterConfig(aggregate="krum")
    with pytest.raises(OuterError, match="trim"):
        OuterConfig(aggregate="trimmed", trim=0)
    from protocol.config import AGGREGATES as CONFIG_AGGREGATES

    assert CONFIG_AGGREGATES == AGGREGATES
