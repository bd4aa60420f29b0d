"""The compressor: error bounds against the optimal truncation, determinism, exact error feedback,
the dense fallbacks, and the adaptive (rank, H) rule."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dilocox.compress import (
    CompressError,
    CompressionConfig,
    EnergyProfile,
    EpochRecord,
    adapt,
    compress,
    compression_seed,
    factorize,
    h_for_rank,
    merge_compressed,
    payload_profile,
    tensor_seed,
)
from protocol.formats.payload import PayloadError, decode, parse

pytestmark = pytest.mark.unit

CFG = CompressionConfig()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _lowrank_plus_noise(seed: int, m: int, n: int, k: int, noise: float) -> torch.Tensor:
    g = _gen(seed)
    x = (torch.randn(m, k, generator=g) @ torch.randn(k, n, generator=g)) / math.sqrt(k)
    return x + noise * torch.randn(m, n, generator=g)


def _group_half_steps(f: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Frobenius norm of the largest possible quantization error of a factor stored as rows of f.T."""
    rows = f.t()
    r, length = rows.shape
    pad = torch.zeros(r, -(-length // group) * group)
    pad[:, :length] = rows.abs()
    half = pad.view(r, -1, group).amax(2) / (7 if bits == 4 else 127) * (1 + 2.0**-7) / 2
    counts = torch.full_like(half, float(group))
    counts[:, -1] = length - (half.shape[1] - 1) * group
    return (half.square() * counts).sum().sqrt()


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    m=st.integers(24, 120),
    n=st.integers(24, 120),
    k=st.integers(1, 6),
    rank=st.integers(6, 12),
    noise=st.sampled_from([0.0, 1e-3, 3e-2]),
    bits=st.sampled_from([4, 8, 32]),
)
def test_lowrank_error_bounded_by_truncation_plus_quantization(
    seed: int, m: int, n: int, k: int, rank: int, noise: float, bits: int
) -> None:
    x = _lowrank_plus_noise(seed, m, n, k, noise)
    cfg = CompressionConfig(bits=bits, min_saving=0.01)
    out = compress({"w": x}, {}, rank, seed, cfg)
    assert out.stats.tensors["w"].kind == "lowrank"
    y = decode(out.payload)["w"]
    # (1) the factorisation is near-optimal: within 1.5x the best rank-r error (Eckart-Young)
    r = min(rank, m, n)
    sv = torch.linalg.svdvals(x.double())
    tail = float(sv[r:].square().sum().sqrt())
    p, q, s2 = factorize(x, r, tensor_seed(seed, "w"), cfg.oversample, cfg.power_iters)
    fact_err = float((x - p @ q.t()).norm())
    assert fact_err <= 1.5 * tail + 1e-5 * float(x.norm())
    # the carried spectrum estimates the true one from below
    assert torch.all(s2.double() <= sv[:r].square() * (1 + 1e-4) + 1e-9)
    # (2) quantizing the factors adds at most the worst-case error of each factor times the other's norm
    if bits == 32:
        quant_bound = 1e-5 * float(x.norm())
    else:
        ep, eq = _group_half_steps(p, bits, cfg.group_size), _group_half_steps(q, bits, cfg.group_size)
        quant_bound = float(ep * torch.linalg.matrix_norm(q, 2) + eq * torch.linalg.matrix_norm(p, 2) + ep * eq)
        quant_bound = quant_bound * (1 + 1e-4) + 1e-6 * float(x.norm())
    assert float((y - p @ q.t()).norm()) <= quant_bound
    assert float((x - y).norm()) <= fact_err + quant_bound


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 500), log_scale=st.sampled_from([-25.0, -8.0, 0.0, 10.0]))
def test_vectors_use_int8_within_half_a_step(seed: int, n: int, log_scale: float) -> None:
    v = torch.randn(n, generator=_gen(seed)) * 2.0**log_scale
    out = compress({"b": v}, {}, 8, seed, CFG)
    assert out.stats.tensors["b"].kind == "quant"
    y = decode(out.payload)["b"]
    g = CFG.group_size
    pad = torch.zeros(-(-n // g) * g)
    pad[:n] = v.abs()
    absmax = pad.view(-1, g).amax(1).repeat_interleave(g)[:n]
    assert torch.all((v - y).abs() <= absmax / 127 * (1 + 2.0**-7) / 2 + 1e-6 * absmax)


def test_small_matrices_are_not_factorised() -> None:
    out = compress({"tiny": torch.randn(6, 5, generator=_gen(0)), "big": torch.randn(128, 96, generator=_gen(1))}, {}, 8, 0, CFG)
    assert out.stats.tensors["tiny"].kind == "quant"
    assert out.stats.tensors["big"].kind == "lowrank" and out.stats.tensors["big"].rank == 8
    assert out.stats.payload_bytes < out.stats.dense_bytes / 10


def test_ablation_settings_select_the_encodings() -> None:
    x = {"w": torch.randn(64, 64, generator=_gen(0)), "b": torch.randn(64, generator=_gen(1))}
    raw = compress(x, {}, 4, 0, CompressionConfig(lowrank=False, dense_bits=32))
    assert {t.kind for t in raw.stats.tensors.values()} == {"raw"} and raw.stats.rel_error == 0.0
    quant = compress(x, {}, 4, 0, CompressionConfig(lowrank=False, dense_bits=4))
    assert {t.kind for t in quant.stats.tensors.values()} == {"quant"}
    fp32_factors = compress(x, {}, 4, 0, CompressionConfig(bits=32))
    assert [e.bits for e in parse(fp32_factors.payload) if e.name == "w"] == [32]


def _model_delta(seed: int) -> dict[str, torch.Tensor]:
    g = _gen(seed)
    return {
        "blocks.0.attn.weight": torch.randn(96, 32, generator=g) * 1e-3,
        "blocks.0.ln.bias": torch.randn(32, generator=g) * 1e-4,
        "emb.weight": torch.randn(64, 2, 16, generator=g) * 1e-2,
        "head.weight": torch.randn(3, 2, generator=g),
    }


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31), rank=st.integers(1, 16))
def test_same_inputs_give_the_same_bytes(seed: int, rank: int) -> None:
    d = _model_delta(seed)
    ef = {k: v * 0.1 for k, v in _model_delta(seed + 1).items()}
    a = compress(d, ef, rank, seed, CFG)
    b = compress({k: d[k].clone() for k in reversed(list(d))}, {k: v.clone() for k, v in ef.items()}, rank, seed, CFG)
    assert a.payload == b.payload
    assert all(torch.equal(a.new_ef[k], b.new_ef[k]) for k in d)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31), rank=st.integers(1, 16), cut=st.integers(1, 3))
def test_parts_compressed_apart_merge_into_the_whole_payload(seed: int, rank: int, cut: int) -> None:
    d = _model_delta(seed)
    ef = {k: v * 0.1 for k, v in _model_delta(seed + 1).items()}
    whole = compress(d, ef, rank, seed, CFG)
    names = list(d)
    parts = [names[:cut], names[cut:]]
    got = [compress({n: d[n] for n in p}, {n: ef[n] for n in p}, rank, seed, CFG) for p in parts]
    payload, stats = merge_compressed([(c.payload, c.stats) for c in reversed(got)])
    assert payload == whole.payload
    assert stats == whole.stats


def test_seed_drives_the_sketch() -> None:
    d = _model_delta(0)
    assert compress(d, {}, 4, 1, CFG).payload != compress(d, {}, 4, 2, CFG).payload
    assert tensor_seed(1, "a") != tensor_seed(1, "b") and tensor_seed(1, "a") == tensor_seed(1, "a")
    seeds = {compression_seed(7, e, s) for e in range(3) for s in range(3)}
    assert len(seeds) == 9 and all(0 <= x < 2**64 for x in seeds)
    assert compression_seed(7, 1, 2) == compression_seed(7, 1, 2)
    with pytest.raises(CompressError):
        compression_seed(-1, 0, 0)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), rounds=st.integers(1, 6), rank=st.integers(1, 4))
def test_error_feedback_telescopes(seed: int, rounds: int, rank: int) -> None:
    """sum of decoded payloads + final buffer == sum of pseudo-gradients: nothing is lost, only delayed."""
    ef: dict[str, torch.Tensor] = {}
    sent = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in _model_delta(0).items()}
    total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in sent.items()}
    for t in range(rounds):
        d = _model_delta(seed + t)
        out = compress(d, ef, rank, seed + t, CFG)
        for k, v in decode(out.payload).items():
            sent[k] += v.double()
            total[k] += d[k].double()
        ef = out.new_ef
    for k, want in total.items():
        scale = float(want.abs().max())
        assert torch.allclose(sent[k] + ef[k].double(), want, atol=1e-5 * scale * rounds, rtol=0)


def test_error_feedback_off_keeps_a_zero_buffer() -> None:
    d = _model_delta(3)
    out = compress(d, {k: torch.ones_like(v) for k, v in d.items()}, 2, 0, CompressionConfig(error_feedback=False))
    assert all(torch.count_nonzero(v) == 0 for v in out.new_ef.values())
    assert out.payload == compress(d, {}, 2, 0, CompressionConfig(error_feedback=False)).payload


def test_error_feedback_reduces_accumulated_error() -> None:
    """Sending the same signal repeatedly, the running sum with feedback converges to the true sum."""
    x = {"w": torch.randn(80, 60, generator=_gen(5))}
    ef: dict[str, torch.Tensor] = {}
    acc_fb, acc_nofb = torch.zeros(80, 60), torch.zeros(80, 60)
    for t in range(20):
        out = compress(x, ef, 4, t, CFG)
        ef = out.new_ef
        acc_fb += decode(out.payload)["w"]
        acc_nofb += decode(compress(x, {}, 4, t, CFG).payload)["w"]
    truth = 20 * x["w"]
    assert (acc_fb - truth).norm() < 0.5 * (acc_nofb - truth).norm()


def test_bad_inputs_raise_compress_error() -> None:
    d = _model_delta(0)
    bad = dict(d, **{"emb.weight": d["emb.weight"].clone().index_fill_(0, torch.tensor([3]), math.nan)})
    with pytest.raises(CompressError, match="NaN"):
        compress(bad, {}, 4, 0, CFG)
    with pytest.raises(CompressError, match="no pseudo-gradient"):
        compress(d, {"other": torch.zeros(1)}, 4, 0, CFG)
    with pytest.raises(CompressError, match="shape"):
        compress(d, {"head.weight": torch.zeros(2, 3)}, 4, 0, CFG)
    with pytest.raises(CompressError, match="rank"):
        compress(d, {}, 0, 0, CFG)
    with pytest.raises(CompressError, match="non-empty float"):
        compress({"i": torch.ones(3, dtype=torch.int64)}, {}, 4, 0, CFG)
    with pytest.raises(CompressError):
        CompressionConfig(bits=5)
    with pytest.raises(CompressError):
        CompressionConfig(rank_min=9, rank_initial=8)


def test_scalars_and_other_dtypes_round_trip() -> None:
    d = {"scale": torch.tensor(0.25), "half": torch.randn(70, 80, generator=_gen(2)).half()}
    out = compress(d, {}, 4, 0, CFG)
    dec = decode(out.payload, {"scale": (), "half": (70, 80)})
    assert dec["scale"].shape == () and abs(float(dec["scale"]) - 0.25) <= 0.25 / 254
    assert dec["half"].dtype == torch.float16 and out.new_ef["half"].dtype == torch.float16


def test_zero_pseudo_gradient_compresses_to_zero() -> None:
    z = {"w": torch.zeros(64, 64), "b": torch.zeros(7)}
    out = compress(z, {}, 4, 0, CFG)
    assert all(torch.count_nonzero(v) == 0 for v in decode(out.payload).values())
    assert out.stats.rel_error == 0.0


def test_profile_is_readable_from_the_payload() -> None:
    d = {"a": _lowrank_plus_noise(0, 96, 64, 2, 1e-3), "b": _lowrank_plus_noise(1, 64, 128, 3, 1e-3), "c": torch.randn(5)}
    out = compress(d, {}, 6, 0, CFG)
    prof = payload_profile(out.payload)
    assert prof == out.stats.profile
    assert len(prof.captured) == 6
    assert prof.captured[-1] <= prof.total * (1 + 1e-5)
    assert prof.needed_rank(0.99) == 3  # the ranks 2 and 3 of the two matrices dominate
    with pytest.raises(PayloadError):
        payload_profile(out.payload[:-1])


def _record(rank: int, needs: list[int | None], depth: int | None = None) -> EpochRecord:
    """A record whose trainers need the given ranks to reach 50% of their energy."""
    depth = depth or rank
    profiles = []
    for need in needs:
        if need is None:
            profiles.append(EnergyProfile(100.0, tuple(10.0 * (k + 1) / depth * 0.4 for k in range(depth))))
        else:
            profiles.append(EnergyProfile(100.0, tuple(50.0 if k + 1 >= need else 1.0 for k in range(depth))))
    return EpochRecord(rank, h_for_rank(rank, CFG), tuple(profiles))


def test_adapt_rule() -> None:
    cfg = CompressionConfig(rank_initial=8, rank_min=2, rank_max=32, h_initial=16, h_min=8, h_max=64)
    assert adapt([], cfg) == (8, 16)
    # median trainer needs more than it carried: double rank, H follows
    assert adapt([_record(8, [None, None, 3])], cfg) == (16, 32)
    # median trainer needs 3 of 8: shrink, but at most by half per epoch
    assert adapt([_record(8, [3, 3, None])], cfg) == (4, 8)
    assert adapt([_record(8, [6, 5, 7])], cfg) == (6, 12)
    # clamps
    assert adapt([_record(32, [None])], cfg) == (32, 64)
    assert adapt([_record(2, [1])], cfg) == (2, 8)
    # only the latest record counts; no profiles keeps the previous choice
    assert adapt([_record(8, [None]), _record(16, [12])], cfg) == (12, 24)
    assert adapt([EpochRecord(12, 24, ())], cfg) == (12, 24)
    # the rule is off for fixed-rank runs
    assert adapt([_record(8, [None])], CompressionConfig(adaptive=False)) == (8, 16)
    # a run config holds rank and H the same way with rank_min = rank_max (examples/small.toml at 128 rows)
    held = CompressionConfig(rank_initial=64, rank_min=64, rank_max=64, h_initial=8, h_min=4, h_max=32)
    assert {adapt([_record(64, need)], held) for need in ([None], [1, 2, 3], [64])} == {(64, 8)}
    # median is robust to a minority of outliers
    assert adapt([_record(16, [1, 1, 12, 12, 12])], cfg) == (12, 24)


@pytest.mark.parametrize("preset_name", ["tiny", "llama-tiny"])
def test_real_model_pseudo_gradients_compress_deterministically_and_telescope(preset_name: str) -> None:
    """Both architectures' parameter sets go through the same codec: every matrix is factorised or
    quantised, the bytes are a function of the inputs, the decoded shapes are the model's, and error
    feedback loses nothing over rounds."""
    from protocol.model import init_params, param_shapes, preset

    cfg = preset(preset_name)
    shapes = param_shapes(cfg)
    base = init_params(cfg, 0)
    deltas = [{n: (init_params(cfg, s)[n] - base[n]) * 1e-2 for n in base} for s in (1, 2, 3)]
    ef: dict[str, torch.Tensor] = {}
    sent = {n: torch.zeros(s, dtype=torch.float64) for n, s in shapes.items()}
    for t, d in enumerate(deltas):
        out = compress(d, ef, 4, t, CFG)
        again = compress({n: v.clone() for n, v in d.items()}, {n: v.clone() for n, v in ef.items()}, 4, t, CFG)
        assert out.payload == again.payload
        assert set(out.stats.tensors) == set(shapes)
        kinds = {n: st.kind for n, st in out.stats.tensors.items()}
        assert all(kinds[n] in ("lowrank", "quant") for n, s in shapes.items() if len(s) >= 2)
        assert any(k == "lowrank" for k in kinds.values())
        assert out.stats.payload_bytes < out.stats.dense_bytes / 4
        decoded = decode(out.payload)
        assert {n: tuple(v.shape) for n, v in decoded.items()} == shapes
        for n, v in decoded.items():
            sent[n] += v.double()
        ef = out.new_ef
    for n in shapes:
        want = sum(d[n].double() for d in deltas)
        scale = float(want.abs().max())
        assert torch.allclose(sent[n] + ef[n].double(), want, atol=1e-5 * scale * 3, rtol=0), n
