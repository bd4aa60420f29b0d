"""The SparseLoCo- and DeMo-style baseline codecs of benchmarks/codec.py (issue 33): deterministic
bytes, a decoder, byte counts that are the payload's length, and the top-k rules they claim."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.codec import BASELINES, run_baseline
from veriloco.sparsecodec import SparseCodec, baseline_decode, baseline_encode

pytestmark = pytest.mark.unit


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    """Matrices on and off the 64 x 64 block grid, a 1-D tensor, a 3-D one, and a chunk-sized vector."""
    g = torch.Generator().manual_seed(seed)
    return {
        "w.weight": torch.randn(128, 192, generator=g) * 1e-3,
        "odd.weight": torch.randn(100, 70, generator=g),
        "ln.weight": torch.randn(384, generator=g) * 1e-2,
        "conv": torch.randn(3, 5, 7, generator=g),
        "long": torch.randn(9000, generator=g),  # two full 4096 chunks and a padded one
    }


def _rel(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> float:
    num = sum(float((x[k] - y[k]).double().square().sum()) for k in x)
    return math.sqrt(num / sum(float(v.double().square().sum()) for v in x.values()))


CODECS = [SparseCodec(t, k, v) for t, v in BASELINES.values() for k in (1, 37, 512, 4096)]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: f"{c.transform}-{c.values}-k{c.k}")
def test_round_trips_deterministically_and_counts_its_bytes(codec: SparseCodec) -> None:
    x = _tensors(0)
    shapes = {k: tuple(v.shape) for k, v in x.items()}
    payload, nbytes = baseline_encode(x, codec)
    again, nbytes2 = baseline_encode({k: v.clone() for k, v in x.items()}, codec)
    assert payload == again and nbytes == nbytes2
    assert nbytes == len(payload)
    out = baseline_decode(payload, shapes, codec)
    assert set(out) == set(x)
    for k, v in out.items():
        assert v.shape == x[k].shape and v.dtype == torch.float32 and bool(torch.isfinite(v).all())
    out2 = baseline_decode(payload, shapes, codec)
    assert all(torch.equal(out[k], out2[k]) for k in out)
    assert _rel(x, out) < 1.0  # never worse than sending nothing
    with pytest.raises(ValueError):
        baseline_decode(payload[:-1], shapes, codec)
    with pytest.raises(ValueError):
        baseline_decode(payload + b"\0", shapes, codec)


def test_more_kept_entries_cost_more_bytes_and_lose_less() -> None:
    x = _tensors(1)
    shapes = {k: tuple(v.shape) for k, v in x.items()}
    for transform, values in BASELINES.values():
        sizes, errors = [], []
        for k in (16, 128, 1024):
            codec = SparseCodec(transform, k, values)
            payload, _ = baseline_encode(x, codec)
            sizes.append(len(payload))
            errors.append(_rel(x, baseline_decode(payload, shapes, codec)))
        assert sizes == sorted(sizes) and errors == sorted(errors, reverse=True), (transform, values)


def test_topk_keeps_the_largest_with_ties_to_the_lower_slot_and_two_levels_are_exact() -> None:
    v = torch.zeros(4096)
    v[[5, 900, 3000]] = torch.tensor([3.0, -3.0, 1.0])
    v[[7, 8]] = -1.0  # ties with slot 3000: with k = 4 the lower slots 7 and 8 are kept, 3000 is not
    codec = SparseCodec("topk", 4, "2bit")
    out = baseline_decode(baseline_encode({"v": v}, codec)[0], {"v": (4096,)}, codec)["v"]
    expect = torch.zeros(4096)
    expect[[5, 900, 7, 8]] = torch.tensor([3.0, -3.0, -1.0, -1.0])
    assert torch.equal(out, expect)  # magnitudes {3, 1}: two levels hold them exactly


def test_dct_int8_with_every_coefficient_is_nearly_lossless() -> None:
    x = _tensors(2)
    codec = SparseCodec("dct", 4096, "int8")
    out = baseline_decode(baseline_encode(x, codec)[0], {k: tuple(v.shape) for k, v in x.items()}, codec)
    assert _rel(x, out) < 0.02


def test_dct_concentrates_a_smooth_matrix_where_plain_topk_cannot() -> None:
    i = torch.arange(128, dtype=torch.float32)
    smooth = {"m": torch.outer(torch.cos(i / 40), torch.sin(i / 30 + 1))}
    shapes = {"m": (128, 128)}
    errs = {}
    for t in ("topk", "dct"):
        codec = SparseCodec(t, 64, "int8" if t == "dct" else "2bit")
        errs[t] = _rel(smooth, baseline_decode(baseline_encode(smooth, codec)[0], shapes, codec))
    assert errs["dct"] < 0.1 < errs["topk"]


def test_error_feedback_run_reports_each_rounds_payload_size() -> None:
    g = torch.Generator().manual_seed(3)
    deltas = [{"w": torch.randn(64, 96, generator=g), "b": torch.randn(96, generator=g)} for _ in range(3)]
    res = run_baseline(deltas, SparseCodec("topk", 256, "2bit"))
    assert len(res.sizes) == 3 and res.outcome.bytes_per_round == res.sizes[-1]
    # error feedback: what was not sent comes later, so the sum is tracked better than any one round
    assert res.outcome.cumulative_error < min(res.outcome.rel_errors)


def test_rejects_a_k_outside_the_chunk() -> None:
    with pytest.raises(ValueError):
        SparseCodec("topk", 0)
    with pytest.raises(ValueError):
        SparseCodec("dct", 4097, "int4")


def test_the_baselines_command_writes_every_codec_at_each_budget(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """`--baselines all` end to end on cached toy pseudo-gradients (the cache key is the run's settings)."""
    import json

    from benchmarks.codec import main

    g = torch.Generator().manual_seed(4)
    deltas = [{"w": torch.randn(96, 128, generator=g) * 1e-3, "b": torch.randn(128, generator=g) * 1e-3} for _ in range(2)]
    torch.save({"deltas": deltas, "inner_step_s": 0.0}, tmp_path / "codec-deltas-tiny-r2-h1-b1-s0.pt")
    out = tmp_path / "base.json"
    assert main(["--preset", "tiny", "--rounds", "2", "--h", "1", "--batch-size", "1", "--baselines", "all",
                 "--budget-ranks", "8,2", "--cache", str(tmp_path), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [b["budget_rank"] for b in res["budgets"]] == [8, 2]
    for b in res["budgets"]:
        methods = b["methods"]
        assert set(BASELINES) | {"veriloco int4 (shipped)"} <= set(methods)
        assert methods["veriloco int4 (shipped)"]["rank"] == b["budget_rank"]
        for name in BASELINES:
            assert max(methods[name]["bytes_per_round"]) <= b["budget_bytes"]
        assert b["best_rel_error_mean"] in methods
    assert "| 8 (" in capsys.readouterr().out
