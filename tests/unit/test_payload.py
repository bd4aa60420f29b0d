"""The payload format: exact layouts round-trip, quantization stays within half a step, and no
malformed, truncated, lying or non-finite input gets past the decoder as anything but PayloadError."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.digest import keccak
from protocol.formats.payload import (
    MAGIC,
    PayloadError,
    decode,
    dequantize_rows,
    encode,
    encode_lowrank,
    encode_quant,
    encode_raw,
    parse,
    payload_digest,
    quantize_rows,
    unwrap,
    wrap,
)

pytestmark = pytest.mark.unit

TRAINER = "0x00000000000000000000000000000000000000AA"


def _t(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _sample_payload() -> bytes:
    p, q = _t(1, 12, 3), _t(2, 20, 3)
    return encode(
        [
            encode_raw("a.raw", _t(3, 5)),
            encode_quant("b.int8", _t(4, 7, 9), 8, 16),
            encode_quant("c.int4", _t(5, 33), 4, 8),
            encode_lowrank("d.lr", (12, 4, 5), torch.float32, p, q, 4, 8, 10.0, [3.0, 2.0, 1.0]),
            encode_lowrank("e.lr32", (12, 20), torch.float32, p, q, 32, 0, 10.0, [3.0, 2.0, 1.0]),
        ]
    )


def test_raw_roundtrip_is_exact_and_dtype_is_kept() -> None:
    t = _t(0, 3, 4)
    out = decode(encode([encode_raw("w", t), encode_raw("h", t.half())]))
    assert torch.equal(out["w"], t)
    assert out["h"].dtype == torch.float16 and torch.equal(out["h"], t.half())


def test_lowrank_float32_factors_roundtrip() -> None:
    p, q = _t(1, 6, 2), _t(2, 15, 2)
    out = decode(encode([encode_lowrank("w", (6, 3, 5), torch.float32, p, q, 32, 0, 1.0, [1.0, 0.5])]))
    assert torch.allclose(out["w"], (p @ q.t()).reshape(6, 3, 5), atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    rows=st.integers(1, 5),
    length=st.integers(1, 300),
    bits=st.sampled_from([4, 8]),
    group=st.sampled_from([1, 7, 32, 64]),
    log_scale=st.sampled_from([-30.0, -12.0, -3.0, 0.0, 5.0, 12.0]),
)
def test_quantization_error_within_half_a_step(seed: int, rows: int, length: int, bits: int, group: int, log_scale: float) -> None:
    x = _t(seed, rows, length, scale=2.0**log_scale)
    if seed % 3 == 0:
        x[:, : length // 2] = 0.0  # whole zero groups take scale 0
    block = quantize_rows(x, bits, group)
    y = dequantize_rows(block)
    qmax = 7 if bits == 4 else 127
    pad = torch.zeros(rows, -(-length // group) * group)
    pad[:, :length] = x.abs()
    absmax = pad.view(rows, -1, group).amax(2).repeat_interleave(group, 1)[:, :length]
    # half a step of the stored scale: the exact scale rounded up to float16 or bfloat16
    bound = absmax / qmax * (1 + 2.0**-7) / 2 + 1e-6 * absmax + 1e-45
    assert torch.all((x - y).abs() <= bound)
    if rows == 1:  # and the bytes carry exactly that block
        assert torch.equal(decode(encode([encode_quant("x", x[0], bits, group)]))["x"], y[0])


def test_scales_fall_back_to_bfloat16_outside_fp16_range() -> None:
    assert quantize_rows(torch.full((1, 8), 1.0), 8, 8).scale_dtype == 1
    assert quantize_rows(torch.full((1, 8), 1e-6), 8, 8).scale_dtype == 2
    assert quantize_rows(torch.full((1, 8), 1e9), 8, 8).scale_dtype == 2
    # two bytes per scale either way, so the payload size does not depend on magnitudes
    sizes = {len(encode([encode_quant("v", torch.full((100,), m), 8, 16)])) for m in (1e-30, 1e-6, 1.0, 1e30)}
    assert len(sizes) == 1
    # and a mixed low-rank pair is stored in one dtype, still within its bound
    p, q = torch.full((8, 1), 1e-7), torch.full((8, 1), 1.0)
    out = decode(encode([encode_lowrank("w", (8, 8), torch.float32, p, q, 8, 8, 1.0, [1.0])]))["w"]
    assert torch.allclose(out, p @ q.t(), rtol=1e-2)


def test_encoding_is_deterministic_and_order_free() -> None:
    a = _sample_payload()
    assert a == _sample_payload()
    recs = [encode_raw("z", _t(0, 3)), encode_raw("a", _t(1, 3))]
    assert encode(recs) == encode(list(reversed(recs)))
    with pytest.raises(ValueError):
        encode([encode_raw("a", _t(0, 3)), encode_raw("a", _t(1, 3))])


def test_expected_shapes_are_enforced() -> None:
    data = _sample_payload()
    shapes = {e.name: e.shape for e in parse(data)}
    assert set(decode(data, shapes)) == set(shapes)
    with pytest.raises(PayloadError, match="missing"):
        decode(data, {**shapes, "f.extra": (2,)})
    with pytest.raises(PayloadError, match="unexpected"):
        decode(data, {k: v for k, v in shapes.items() if k != "a.raw"})
    with pytest.raises(PayloadError, match="expects"):
        decode(data, {**shapes, "a.raw": (6,)})


def test_limits_on_size_and_elements() -> None:
    data = _sample_payload()
    with pytest.raises(PayloadError, match="more than the allowed"):
        decode(data, max_bytes=len(data) - 1)
    with pytest.raises(PayloadError, match="elements"):
        decode(data, max_elements=100)


def _header(entries: list[bytes], count: int | None = None, version: int = 1) -> bytes:
    return MAGIC + struct.pack("<HHI", version, 0, len(entries) if count is None else count) + b"".join(entries)


def _entry(name: bytes, dims: tuple[int, ...], kind: int, bits: int, sdt: int, group: int, rank: int, length: int, dtype: int = 1) -> bytes:
    return (
        struct.pack("<H", len(name)) + name + struct.pack("<BB", dtype, len(dims))
        + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<BBBBIIQ", kind, bits, sdt, 0, group, rank, length)
    )


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "truncated"),
        (b"VLCQ" + bytes(8), "magic"),
        (_header([], version=2), "version"),
        (MAGIC + struct.pack("<HHI", 1, 1, 0), "flags"),
        (_header([], count=2**32 - 1), "more than the limit"),
        (_header([], count=3), "truncated"),
        (_header([_entry(b"w", (2**40, 2**40), 2, 4, 1, 64, 1, 8)]), "dimension"),
        (_header([_entry(b"w", (2**31, 2**31), 2, 4, 1, 64, 1, 8)]), "elements"),
        (_header([_entry(b"w", (4, 4), 2, 4, 1, 64, 5, 8)]), "rank 5"),
        (_header([_entry(b"w", (4, 4), 2, 4, 1, 64, 0, 8)]), "rank 0"),
        (_header([_entry(b"w", (4, 4), 0, 32, 0, 0, 0, 2**60)]), "header says"),
        (_header([_entry(b"w", (4, 4), 0, 32, 0, 0, 0, 64)]), "truncated"),
        (_header([_entry(b"w", (4,), 0, 32, 0, 0, 0, 16)]) + bytes(17), "trailing"),
        (_header([_entry(b"w", (4,), 7, 32, 0, 0, 0, 16)]) + bytes(16), "unknown kind"),
        (_header([_entry(b"w", (4,), 1, 3, 1, 4, 0, 6)]) + bytes(6), "bits"),
        (_header([_entry(b"w", (4,), 1, 8, 1, 0, 0, 6)]) + bytes(6), "group size"),
        (_header([_entry(b"w", (4,), 2, 8, 1, 2, 1, 6)]) + bytes(6), "2 dimensions"),
        (_header([_entry(b"w", (4,), 0, 32, 0, 0, 0, 16, dtype=4)]) + bytes(16), "float dtype"),
        (_header([_entry(b"\xff", (4,), 0, 32, 0, 0, 0, 16)]) + bytes(16), "UTF-8"),
        (_header([_entry(b"", (4,), 0, 32, 0, 0, 0, 16)]) + bytes(16), "name length"),
        (_header([_entry(b"b", (1,), 0, 32, 0, 0, 0, 4), _entry(b"a", (1,), 0, 32, 0, 0, 0, 4)]) + bytes(8), "sorted"),
        (_header([_entry(b"a", (1,), 0, 32, 0, 0, 0, 4), _entry(b"a", (1,), 0, 32, 0, 0, 0, 4)]) + bytes(8), "unique"),
        (_header([_entry(b"w", (0,), 0, 32, 0, 0, 0, 0)]), "dimension"),
        (_header([_entry(b"w", (1,) * 9, 0, 32, 0, 0, 0, 4)]), "dimensions"),
    ],
)
def test_lying_or_malformed_headers_are_rejected(data: bytes, match: str) -> None:
    with pytest.raises(PayloadError, match=match):
        decode(data)


def test_small_payload_cannot_demand_a_huge_output() -> None:
    """A rank-1 entry of 2^15 x 2^15 is only ~32 KiB of bytes but 4 GiB dense: refused by default."""
    m = 1 << 15
    sizes = 8 + (m + 1) // 2 + (m // 64) * 2
    data = _header([_entry(b"w", (m, m), 2, 4, 1, 64, 1, 2 * sizes - 8)])
    with pytest.raises(PayloadError, match="elements"):
        decode(data + bytes(2 * sizes - 8))
    with pytest.raises(PayloadError, match="expects"):
        decode(data + bytes(2 * sizes - 8), expected={"w": (m, 2)}, max_elements=1 << 31)


def test_non_finite_values_are_rejected() -> None:
    nan32 = struct.pack("<f", math.nan)
    raw = _header([_entry(b"w", (2,), 0, 32, 0, 0, 0, 8)])
    with pytest.raises(PayloadError, match="finite"):
        decode(raw + struct.pack("<f", 1.0) + nan32)
    # int8 codes then one fp16 scale: a NaN, an infinity and a negative scale are all refused
    q = _header([_entry(b"w", (4,), 1, 8, 1, 4, 0, 6)]) + bytes(4)
    for scale in (b"\x00\x7e", b"\x00\x7c", b"\x00\xbc"):
        with pytest.raises(PayloadError, match="scales"):
            decode(q + scale)
    # energy / spectrum statistics of a low-rank entry
    good = encode([encode_lowrank("w", (8, 8), torch.float32, _t(0, 8, 1), _t(1, 8, 1), 8, 8, 1.0, [1.0])])
    off = parse(good)[0].offset
    bad = good[:off] + nan32 + good[off + 4 :]
    with pytest.raises(PayloadError, match="energy"):
        decode(bad)
    # finite factors whose product overflows float32
    huge = _t(0, 4, 1).abs() + 1e20
    over = encode([encode_lowrank("w", (4, 4), torch.float32, huge, huge, 32, 0, 1.0, [1.0])])
    with pytest.raises(PayloadError, match="non-finite"):
        decode(over)
    # representable in float32, not in the declared float16
    big = encode([encode_raw("w", torch.full((2,), 1e5))])
    patched = big.replace(struct.pack("<BB", 1, 1), struct.pack("<BB", 2, 1), 1)
    with pytest.raises(PayloadError, match="overflow"):
        decode(patched)


def test_int4_padding_nibble_must_be_zero() -> None:
    good = encode([encode_quant("w", torch.ones(3), 4, 4)])
    off = parse(good)[0].offset
    bad = bytearray(good)
    bad[off + 1] |= 0x30
    decode(good)
    with pytest.raises(PayloadError, match="padding nibble"):
        decode(bytes(bad))


def _mutations() -> st.SearchStrategy[tuple[str, int, int]]:
    return st.tuples(st.sampled_from(["truncate", "flip", "insert", "delete", "extend"]), st.integers(0, 10**6), st.integers(0, 255))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_mutations(), min_size=1, max_size=4))
def test_mutated_payloads_raise_only_payload_error(ops: list[tuple[str, int, int]]) -> None:
    data = bytearray(_sample_payload())
    for op, pos, byte in ops:
        i = pos % (len(data) + 1)
        if op == "truncate":
            del data[i:]
        elif op == "flip" and data:
            data[i % len(data)] ^= 1 << (byte % 8)
        elif op == "insert":
            data[i:i] = bytes([byte])
        elif op == "delete" and data:
            del data[i % len(data)]
        elif op == "extend":
            data += bytes([byte]) * (byte + 1)
    try:
        out = decode(bytes(data), max_elements=10**6)
    except PayloadError:
        return
    assert all(torch.isfinite(t).all() for t in out.values())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_payload_error(blob: bytes) -> None:
    for data in (blob, MAGIC + b"\x01\x00\x00\x00" + blob):
        try:
            decode(data, max_elements=10**6)
        except PayloadError:
            pass


def test_non_bytes_input_is_a_payload_error() -> None:
    with pytest.raises(PayloadError):
        decode("VLCP")  # type: ignore[arg-type]


def test_wrap_binds_run_epoch_and_trainer() -> None:
    body = _sample_payload()
    data = wrap(2**200 + 5, 7, TRAINER.lower(), body)
    w = unwrap(data, run_id=2**200 + 5, epoch=7, trainer=TRAINER)
    assert (w.run_id, w.epoch, w.trainer, w.body) == (2**200 + 5, 7, TRAINER, body)
    assert payload_digest(data) == keccak(data)
    with pytest.raises(PayloadError, match="run"):
        unwrap(data, run_id=1)
    with pytest.raises(PayloadError, match="epoch"):
        unwrap(data, epoch=8)
    with pytest.raises(PayloadError, match="trainer"):
        unwrap(data, trainer="0x" + "11" * 20)
    with pytest.raises(PayloadError, match="truncated"):
        unwrap(data[:20])
    with pytest.raises(PayloadError, match="body"):
        unwrap(data + b"\x00")
    with pytest.raises(PayloadError, match="magic"):
        unwrap(b"XXXX" + data[4:])
    with pytest.raises(PayloadError, match="not a veriloco payload"):
        unwrap(wrap(1, 1, TRAINER, b"nope"))
    with pytest.raises(PayloadError, match="address"):
        wrap(1, 1, "0x123", body)
    with pytest.raises(PayloadError, match="uint256"):
        wrap(-1, 1, TRAINER, body)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_unwrap_of_random_bytes_raises_only_payload_error(blob: bytes) -> None:
    for data in (blob, wrap(3, 4, TRAINER, MAGIC)[:80] + blob):
        try:
            unwrap(data)
        except PayloadError:
            pass


def test_numpy_views_do_not_leak_readonly_buffers() -> None:
    out = decode(encode([encode_raw("w", _t(0, 4))]))
    out["w"].add_(1.0)  # decoded tensors are ordinary writable tensors
    assert isinstance(np.asarray(out["w"]), np.ndarray)
