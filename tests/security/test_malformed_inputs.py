"""Garbage from anyone: payloads, audit manifests and state files that are truncated, oversize, non-finite,
wrongly shaped or carry lying headers. Every reader must refuse them with its own clear error
(PayloadError / FormatError) before allocating what a header claims — never crash another way.
"""

from __future__ import annotations

import math
import struct
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dilocox.compress import CompressionConfig, compress
from protocol import merkle
from protocol.digest import keccak
from protocol.formats.codec import (
    FormatError,
    build_state_manifest,
    decode_manifest,
    encode_manifest,
    load_state,
    save_state,
)
from protocol.formats.payload import MAX_TENSORS, PayloadError, decode, unwrap, wrap

pytestmark = pytest.mark.unit

SHAPES = {"b": (16,), "w": (8, 16)}
TRAINER = "0x" + "ab" * 20
CID = "QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG"


def raw_payload(
    *, name: bytes = b"w", dtype: int = 1, shape: tuple[int, ...] = (2, 3), kind: int = 0, bits: int = 32,
    scale: int = 0, reserved: int = 0, group: int = 0, rank: int = 0, length: int | None = None,
    values: list[float] | None = None, count: int = 1, magic: bytes = b"VLCP", version: int = 1, flags: int = 0,
    name_len: int | None = None, tail: bytes = b"",
) -> bytes:
    """One raw float32 tensor written field by field, so a test can make any field lie."""
    vals = values if values is not None else [0.5] * math.prod(shape)
    section = struct.pack(f"<{len(vals)}f", *vals)
    entry = (struct.pack("<H", len(name) if name_len is None else name_len) + name + struct.pack("<BB", dtype, len(shape))
             + b"".join(struct.pack("<Q", d) for d in shape)
             + struct.pack("<BBBBIIQ", kind, bits, scale, reserved, group, rank, len(section) if length is None else length))
    return magic + struct.pack("<HHI", version, flags, count) + entry + section + tail


@pytest.fixture(scope="module")
def payload() -> bytes:
    """A real compressed payload (low-rank matrix + quantized vector) for the model SHAPES."""
    g = torch.Generator().manual_seed(3)
    delta = {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}
    return compress(delta, {}, 2, 11, CompressionConfig(min_saving=1.0)).payload


def test_valid_inputs_decode(payload: bytes) -> None:
    out = decode(payload, SHAPES)
    assert {n: tuple(t.shape) for n, t in out.items()} == SHAPES
    assert decode(raw_payload())["w"].shape == (2, 3)


def test_truncated_payload_is_refused_at_every_length(payload: bytes) -> None:
    for n in range(len(payload)):
        with pytest.raises(PayloadError):
            decode(payload[:n], SHAPES)
    with pytest.raises(PayloadError, match="trailing"):
        decode(payload + b"\x00", SHAPES)


def test_oversize_payload_is_refused_before_parsing(payload: bytes) -> None:
    with pytest.raises(PayloadError, match="more than the allowed"):
        decode(payload, SHAPES, max_bytes=len(payload) - 1)
    with pytest.raises(PayloadError, match="more than the allowed"):
        unwrap(wrap(1, 0, TRAINER, payload), max_bytes=len(payload) - 1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_refused(bad: float) -> None:
    with pytest.raises(PayloadError, match="finite"):
        decode(raw_payload(values=[0.0, 1.0, bad, 0.0, 0.0, 0.0]))


def test_non_finite_scales_and_statistics_are_refused(payload: bytes) -> None:
    """NaN hidden in a quantization scale or in a low-rank energy field is found too."""
    from protocol.formats.payload import parse

    entries = parse(payload, SHAPES)
    lowrank = next(e for e in entries if e.kind == 2)
    nan32 = struct.pack("<f", math.nan)
    bad_energy = payload[: lowrank.offset] + nan32 + payload[lowrank.offset + 4:]
    with pytest.raises(PayloadError, match="finite"):
        decode(bad_energy, SHAPES)
    quant = next(e for e in entries if e.kind == 1)
    end = quant.offset + quant.length  # scales (float16) are the section's last bytes
    bad_scale = payload[: end - 2] + struct.pack("<e", math.inf) + payload[end:]
    with pytest.raises(PayloadError, match="finite"):
        decode(bad_scale, SHAPES)


def test_wrong_shapes_and_tensor_sets_are_refused(payload: bytes) -> None:
    with pytest.raises(PayloadError, match="model expects"):
        decode(payload, {"b": (16,), "w": (16, 8)})
    with pytest.raises(PayloadError, match="missing"):
        decode(payload, {**SHAPES, "extra": (4,)})
    with pytest.raises(PayloadError, match="unexpected"):
        decode(payload, {"w": (8, 16)})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"magic": b"VLCX"}, "magic"),
        ({"version": 2}, "version"),
        ({"flags": 1}, "flags"),
        ({"count": 2}, "entry 1"),  # the next "entry" is section bytes
        ({"count": MAX_TENSORS + 1}, "more than the limit"),
        ({"name_len": 0}, "name length"),
        ({"name": b"\xff\xfe"}, "UTF-8"),
        ({"dtype": 4}, "not a float dtype"),
        ({"shape": (2, 0)}, "dimension outside"),
        ({"shape": (1,) * 9, "values": [0.5]}, "dimensions"),
        ({"kind": 7}, "unknown kind"),
        ({"reserved": 1}, "reserved"),
        ({"bits": 16}, "bits 32"),
        ({"length": 23}, "section is 23 bytes"),
        ({"length": 25}, "section is 25 bytes"),
        ({"kind": 2, "bits": 32, "rank": 3}, "rank 3 outside"),
        ({"tail": b"\x00" * 4}, "trailing"),
    ],
)
def test_lying_headers_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        decode(raw_payload(**fields))


def test_a_header_claiming_huge_tensors_allocates_nothing() -> None:
    """2^31 x 2^31 elements claimed in a 60-byte payload: refused by arithmetic, instantly."""
    t0 = time.monotonic()
    with pytest.raises(PayloadError, match="more than"):
        decode(raw_payload(shape=(1 << 31, 1 << 31), values=[0.0]))
    with pytest.raises(PayloadError, match="more than"):
        decode(raw_payload(shape=(4096, 4096), values=[0.0]), max_elements=1 << 20)
    assert time.monotonic() - t0 < 1.0


def test_wrapper_lies_are_refused(payload: bytes) -> None:
    pub = wrap(1, 3, TRAINER, payload)
    head = 4 + 2 + 32 + 8 + 20
    longer = pub[:head] + struct.pack("<Q", len(payload) + 1) + pub[head + 8:]
    with pytest.raises(PayloadError, match="body is"):
        unwrap(longer)
    for kw, msg in (({"run_id": 2}, "run"), ({"epoch": 4}, "epoch"), ({"trainer": "0x" + "cd" * 20}, "trainer")):
        with pytest.raises(PayloadError, match=msg):
            unwrap(pub, **kw)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_corruption_never_escapes_payload_error(payload: bytes, data: st.DataObject) -> None:
    """Any byte edits: either a PayloadError, or finite tensors of exactly the model's shapes."""
    buf = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    try:
        out = decode(bytes(buf), SHAPES)
    except PayloadError:
        return
    assert {n: tuple(t.shape) for n, t in out.items()} == SHAPES
    assert all(bool(torch.isfinite(t).all()) for t in out.values())


# ---------------------------------------------------------------- audit manifests


@pytest.fixture(scope="module")
def manifest_bytes() -> bytes:
    trace = [keccak(bytes([i])) for i in range(9)]
    m = build_state_manifest(run_id=1, epoch=0, trainer=TRAINER, trace=trace, transitions=[5, 2], final=True,
                       cid_of_leaf=lambda i: CID)
    return encode_manifest(m)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: b"", "JSON"),
        (lambda b: b"{}", "format"),
        (lambda b: b[:-1], "JSON"),
        (lambda b: b.replace(b'"epoch":0', b'"epoch": 0'), "canonical"),
        (lambda b: b.replace(b'"epoch":0', b'"epoch":0.0'), "float"),
        (lambda b: b.replace(b'"epoch":0', b'"epoch":NaN'), "NaN|JSON"),
        (lambda b: b.replace(b'"epoch":0', b'"epoch":0,"epoch":0'), "twice|canonical"),
        (lambda b: b.replace(b"veriloco.audit.v2", b"veriloco.audit.v1"), "format"),
        (lambda b: b.replace(b'"leaf_count":9', b'"leaf_count":0'), "leaf_count|out of range|need"),
        (lambda b: b.replace(b'"transitions":[2,5]', b'"transitions":[5,2]'), "sorted"),
        (lambda b: b.replace(b'"transitions":[2,5]', b'"transitions":[2,8]'), "outside"),
        (lambda b: b.replace(CID.encode(), b"Qmnotacid", 1), "state 0"),
        (lambda b: b.replace(b'"previous_leaf_count":0,', b""), "every field present"),
        (lambda b: b.replace(b'"final":true', b'"final":"yes"'), "final"),
    ],
)
def test_malformed_manifests_are_refused(manifest_bytes: bytes, edit, message: str) -> None:
    bad = edit(manifest_bytes)
    assert bad != manifest_bytes
    with pytest.raises(FormatError, match=message):
        decode_manifest(bad)


def test_oversize_manifest_is_refused_before_parsing(manifest_bytes: bytes) -> None:
    with pytest.raises(FormatError, match="over the"):
        decode_manifest(manifest_bytes, max_bytes=len(manifest_bytes) - 1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_manifest_corruption_never_escapes_format_error(manifest_bytes: bytes, data: st.DataObject) -> None:
    buf = bytearray(manifest_bytes)
    i = data.draw(st.integers(0, len(buf) - 1))
    buf[i] = data.draw(st.integers(0, 255))
    try:
        m = decode_manifest(bytes(buf))
    except FormatError:
        return
    # whatever survives is a self-consistent manifest: every state proven against its root
    assert all(merkle.verify(m.trace_root, s.digest, s.leaf_index, m.leaf_count, s.proof) for s in m.states)


# ---------------------------------------------------------------- state files


def test_malformed_state_files_are_refused() -> None:
    good = save_state({"param/w": torch.ones(2, 3), "meta/step": torch.tensor([1])})
    assert load_state(good)["param/w"].shape == (2, 3)
    for n in (0, 7, 8, 20, len(good) - 1):
        with pytest.raises(FormatError):
            load_state(good[:n])
    with pytest.raises(FormatError, match="trailing"):
        load_state(good + b"\x00" * 8)
    with pytest.raises(FormatError, match="over the"):
        load_state(good, max_bytes=len(good) - 1)
    nan = save_state({"param/w": torch.full((2, 3), math.nan)})
    with pytest.raises(FormatError, match="NaN or Inf"):
        load_state(nan)
    lying = bytearray(good)
    n = int.from_bytes(good[:8], "little")
    header = good[8 : 8 + n].replace(b'"shape":[2,3]', b'"shape":[3,3]')
    with pytest.raises(FormatError):
        load_state(bytes(lying[:8]) + header + good[8 + n:])
