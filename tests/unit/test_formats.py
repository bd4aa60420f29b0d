"""Canonical state files, canonical JSON and audit manifests: one byte form, strict readers."""

from __future__ import annotations

import dataclasses
import io
import json
from dataclasses import dataclass
from decimal import Decimal

import pytest
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import merkle
from protocol.digest import keccak, state_digest
from protocol.formats import codec as formats
from protocol.formats.codec import (
    AuditManifest,
    FormatError,
    TensorSpec,
    canonical_json,
    decode_canonical_json,
    load_state,
    save_state,
    spec_of,
)
from protocol.store.unixfs import cid_of
from protocol.types import Address, Cid

pytestmark = pytest.mark.unit


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "param/wte.weight": torch.randn(16, 8, generator=g),
        "param/ln.bias": torch.randn(8, generator=g),
        "adam.m/wte.weight": torch.zeros(16, 8),
        "adam.v/ln.bias": torch.rand(8, generator=g),
        "ef/wte.weight": torch.randn(16, 8, generator=g).half(),
        "meta/step": torch.tensor([7], dtype=torch.int64),
        "meta/rng": torch.tensor([123456789], dtype=torch.int64),
        "misc/bf": torch.randn(3, generator=g).bfloat16(),
    }


# ---- state files ---------------------------------------------------------------------------


def test_round_trip_keeps_digest_and_values() -> None:
    s = _state()
    data = save_state(s)
    back = load_state(data, expect=spec_of(s))
    assert state_digest(back) == state_digest(s)
    for k in s:
        assert torch.equal(back[k], s[k]) and back[k].dtype == s[k].dtype


def test_bytes_do_not_depend_on_dict_order_or_memory_layout() -> None:
    s = _state()
    shuffled = {k: s[k] for k in reversed(list(s))}
    shuffled["param/wte.weight"] = s["param/wte.weight"].t().contiguous().t()  # non-contiguous
    assert not shuffled["param/wte.weight"].is_contiguous()
    assert save_state(shuffled) == save_state(s)
    assert cid_of(save_state(shuffled)) == cid_of(save_state(s))


def test_header_is_the_documented_canonical_form() -> None:
    data = save_state({"b": torch.zeros(2), "a": torch.ones(1, dtype=torch.int64)})
    n = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + n]
    assert n % 8 == 0
    assert header.rstrip(b" ") == (
        b'{"__metadata__":{"format":"veriloco.state.v1"},'
        b'"a":{"data_offsets":[0,8],"dtype":"I64","shape":[1]},'
        b'"b":{"data_offsets":[8,16],"dtype":"F32","shape":[2]}}'
    )


def test_any_safetensors_reader_can_read_it() -> None:
    s = _state()
    other = safetensors.torch.load(save_state(s))
    assert set(other) == set(s) and all(torch.equal(other[k], s[k]) for k in s)


def test_files_written_by_other_writers_are_not_canonical() -> None:
    s = _state()
    data = safetensors.torch.save(s, metadata={"format": "veriloco.state.v1"})
    with pytest.raises(FormatError, match="canonical|packed"):
        load_state(data)


def test_iter_state_pieces_join_to_the_file() -> None:
    s = _state()
    assert b"".join(bytes(p) for p in formats.iter_state(s)) == save_state(s)


def test_file_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = _state(3)
    p = tmp_path / "s.safetensors"
    n = formats.write_state(s, p)
    assert n == p.stat().st_size
    assert state_digest(formats.load_state_file(p)) == state_digest(s)


def _with_header(header: dict, body: bytes = b"") -> bytes:  # type: ignore[type-arg]
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + body


META = {"format": "veriloco.state.v1"}


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "too short"),
        (b"\x01" * 7, "too short"),
        ((10**9).to_bytes(8, "little") + b"{}", "header length"),
        ((4).to_bytes(8, "little") + b"\xff\xfe{}", "not valid JSON"),
        ((2).to_bytes(8, "little") + b"[]", "not a JSON object"),
        (_with_header({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "metadata"),
        (_with_header({"__metadata__": {"format": "veriloco.state.v0"}}), "metadata"),
        (_with_header({"__metadata__": META, "x": {"dtype": "BOOL", "shape": [1], "data_offsets": [0, 1]}}, b"\0"), "dtype"),
        (_with_header({"__metadata__": META, "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "offsets"),
        (_with_header({"__metadata__": META, "x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4), "shape"),
        (_with_header({"__metadata__": META, "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8), "trailing"),
        (_with_header({"__metadata__": META, "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 2), "offsets"),
        (_with_header({"__metadata__": META, "x": [1, 2]}), "malformed"),
        (_with_header({"__metadata__": META, "x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}, "y": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8), "packed"),
        (_with_header({"__metadata__": META, "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\x00\x00\xc0\x7f"), "NaN or Inf"),
    ],
)
def test_malformed_state_files_raise_format_errors(data: bytes, match: str) -> None:
    with pytest.raises(FormatError, match=match):
        load_state(data)


def test_duplicate_keys_and_whitespace_are_rejected() -> None:
    good = save_state({"x": torch.zeros(1)})
    n = int.from_bytes(good[:8], "little")
    header = good[8 : 8 + n].rstrip(b" ")
    dup = header[:-1] + b',"x":{"data_offsets":[0,4],"dtype":"F32","shape":[1]}}'
    dup += b" " * (-len(dup) % 8)
    with pytest.raises(FormatError, match="twice"):
        load_state(len(dup).to_bytes(8, "little") + dup + good[8 + n :])
    spaced = header.replace(b",", b", ")
    spaced += b" " * (-len(spaced) % 8)
    with pytest.raises(FormatError, match="canonical"):
        load_state(len(spaced).to_bytes(8, "little") + spaced + good[8 + n :])


def test_nonfinite_allowed_when_asked() -> None:
    s = {"x": torch.tensor([float("inf"), 1.0])}
    with pytest.raises(FormatError, match="NaN or Inf"):
        load_state(save_state(s))
    assert torch.equal(load_state(save_state(s), allow_nonfinite=True)["x"], s["x"])


def test_expected_layout_is_enforced() -> None:
    s = _state()
    data = save_state(s)
    spec = spec_of(s)
    wrong_shape = {**spec, "param/ln.bias": TensorSpec(torch.float32, (9,))}
    with pytest.raises(FormatError, match="expected torch.float32 \\[9\\]"):
        load_state(data, expect=wrong_shape)
    wrong_dtype = {**spec, "meta/step": TensorSpec(torch.int32, (1,))}
    with pytest.raises(FormatError, match="meta/step"):
        load_state(data, expect=wrong_dtype)
    missing = {**spec, "param/extra": TensorSpec(torch.float32, (1,))}
    with pytest.raises(FormatError, match="missing \\['param/extra'\\]"):
        load_state(data, expect=missing)


def test_size_limit() -> None:
    data = save_state(_state())
    with pytest.raises(FormatError, match="limit"):
        load_state(data, max_bytes=len(data) - 1)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_reader(junk: bytes) -> None:
    try:
        load_state(junk)
    except FormatError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_state_files_never_crash_the_reader(data: st.DataObject) -> None:
    good = bytearray(save_state({"a": torch.ones(3), "b": torch.arange(4)}))
    i = data.draw(st.integers(0, len(good) - 1))
    good[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(good)))
    try:
        load_state(bytes(good[:cut]))
    except FormatError:
        pass


# ---- canonical JSON ------------------------------------------------------------------------


def test_canonical_json_form() -> None:
    assert canonical_json({"b": [1, True, None], "a": "é"}) == '{"a":"é","b":[1,true,null]}'.encode()


@pytest.mark.parametrize("value", [{"x": 1.5}, [float("nan")], {1: 2}, {"x": b"raw"}, {"x": {1, 2}}])
def test_canonical_json_refuses_what_it_cannot_hold(value: object) -> None:
    with pytest.raises(FormatError):
        canonical_json(value)


@pytest.mark.parametrize(
    "data",
    [b'{"a":1.5}', b'{"b":1,"a":2}', b'{"a": 1}', b'{"a":1,"a":1}', b"NaN", b'{"a":Infinity}',
     b"\xff", b"{", b'{"a":"\\u00e9"}', b"[1e5]", b" 1"],
)
def test_non_canonical_json_is_rejected(data: bytes) -> None:
    with pytest.raises(FormatError):
        decode_canonical_json(data)


@settings(max_examples=150, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=20,
    )
)
def test_canonical_json_round_trips(value: object) -> None:
    data = canonical_json(value)
    assert decode_canonical_json(data) == value
    assert canonical_json(decode_canonical_json(data)) == data


@dataclass(frozen=True)
class _Inner:
    lr: float
    beta: Decimal = Decimal("0.9")


@dataclass(frozen=True)
class _Config:
    name: str
    steps: int
    inner: _Inner
    seeds: tuple[int, ...] = ()
    digest: bytes = b""
    note: str | None = None


def test_dataclass_round_trip_with_decimal_strings() -> None:
    cfg = _Config("run", 10, _Inner(3e-4), (1, 2), b"\x01\x02", None)
    data = formats.encode_dataclass(cfg, "veriloco.test.v1")
    assert b'"lr":"0.0003"' in data and b'"format":"veriloco.test.v1"' in data
    assert formats.decode_dataclass(_Config, data, "veriloco.test.v1") == cfg


@pytest.mark.parametrize(
    "value, match",
    [
        ({"name": "r", "inner": {"lr": "0.1"}}, "missing the required key 'steps'"),
        ({"name": "r", "steps": "10", "inner": {"lr": "0.1"}}, "steps must be an integer"),
        ({"name": "r", "steps": True, "inner": {"lr": "0.1"}}, "steps must be an integer"),
        ({"name": "r", "steps": 1, "inner": {"lr": "nan"}}, "decimal string"),
        ({"name": "r", "steps": 1, "inner": {"lr": "1e400x"}}, "decimal string"),
        ({"name": "r", "steps": 1, "inner": {"lr": "0.1", "extra": 1}}, "unknown keys"),
        ({"name": "r", "steps": 1, "inner": {"lr": "0.1"}, "digest": "0xZZ"}, "hex"),
        ({"name": "r", "steps": 1, "inner": {"lr": "0.1"}, "seeds": [1, "2"]}, r"seeds\[1\]"),
    ],
)
def test_dataclass_schema_errors_name_the_field(value: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(FormatError, match=match):
        formats.from_json_value(_Config, value)


def test_wrong_format_tag_is_rejected() -> None:
    data = formats.encode_dataclass(_Inner(0.1), "veriloco.a.v1")
    with pytest.raises(FormatError, match="expected 'veriloco.a.v2'"):
        formats.decode_dataclass(_Inner, data, "veriloco.a.v2")


# ---- audit manifests -----------------------------------------------------------------------

TRAINER = Address("0x" + "ab" * 20)


def _trace(n: int) -> list[bytes]:
    return [keccak(i.to_bytes(4, "little")) for i in range(n)]


def _manifest(n: int = 9, transitions: tuple[int, ...] = (2, 5), final: bool = True) -> AuditManifest:
    trace = _trace(n)
    return formats.build_state_manifest(
        run_id=1, epoch=3, trainer=TRAINER, trace=trace, transitions=transitions, final=final,
        cid_of_leaf=lambda i: cid_of(b"state %d" % i),
    )


def test_manifest_round_trip_and_contents() -> None:
    m = _manifest()
    assert [s.leaf_index for s in m.states] == [0, 2, 5, 8]  # final needs the start state too
    assert [s.leaf_index for s in m.ends] == [3, 6] and all(s.cid == "" for s in m.ends)  # digests only
    data = formats.encode_manifest(m)
    assert data == canonical_json(json.loads(data))
    back = formats.decode_manifest(data)
    assert back == m
    assert back.state(5).digest == _trace(9)[5]
    assert merkle.verify(m.trace_root, m.state(8).digest, 8, 9, m.state(8).proof)


@pytest.mark.parametrize("final", [True, False])
def test_manifest_previous_epoch_states_are_proven(final: bool) -> None:
    """The start rule is checked in every audit, so the previous epoch's states ride with or without a final check."""
    prev = _trace(5)
    m = formats.build_state_manifest(
        run_id=1, epoch=3, trainer=TRAINER, trace=_trace(9), transitions=(2,), final=final,
        cid_of_leaf=lambda i: cid_of(b"state %d" % i),
        previous_trace=prev, previous_cid_of_leaf=lambda i: cid_of(b"prev %d" % i),
    )
    assert [s.leaf_index for s in m.previous] == [0, 4] and m.previous_root == merkle.root(prev)
    assert formats.decode_manifest(formats.encode_manifest(m)) == m
    forged = dataclasses.replace(m, previous=(m.previous[0], dataclasses.replace(m.previous[1], digest=prev[3])))
    with pytest.raises(FormatError, match="previous state 4"):
        formats.encode_manifest(forged)
    with pytest.raises(FormatError, match="in epoch 0"):  # epoch 0 has no previous epoch to continue
        formats.encode_manifest(dataclasses.replace(m, epoch=0))


@pytest.mark.parametrize("final", [True, False])
def test_every_manifest_proves_its_start_leaf_by_digest(final: bool) -> None:
    """Leaf 0 is proven in every audit, without a file: the verifier recomputes the start state itself."""
    m = _manifest(final=final)
    assert m.start.leaf_index == 0 and m.start.cid == "" and m.start.digest == _trace(9)[0]
    assert merkle.verify(m.trace_root, m.start.digest, 0, 9, m.start.proof)
    assert (0 in [s.leaf_index for s in m.states]) == final  # a state file only when the final check needs one
    raw = json.loads(formats.encode_manifest(m))
    for edit, match in (
        (lambda r: r["start"].update(digest="0x" + "00" * 32), "start: Merkle proof"),
        (lambda r: r["start"].update(digest=r["states"][-1]["digest"]), "start: Merkle proof"),  # another leaf
        (lambda r: r["start"].update(leaf_index=1), "leaf 0"),
        (lambda r: r["start"].update(cid=r["states"][0]["cid"]), "no cid"),
        (lambda r: r["start"]["proof"].pop(), "start: Merkle proof"),
        (lambda r: r.pop("start"), "start"),
    ):
        bad = json.loads(json.dumps(raw))
        edit(bad)
        with pytest.raises(FormatError, match=match):
            formats.decode_manifest(canonical_json(bad))


def test_manifest_with_a_tampered_proof_is_rejected() -> None:
    m = _manifest()
    s = m.states[1]
    bad = dataclasses.replace(s, proof=(bytes(32), *s.proof[1:]))
    tampered = dataclasses.replace(m, states=(m.states[0], bad, *m.states[2:]))
    with pytest.raises(FormatError, match="Merkle proof"):
        formats.encode_manifest(tampered)
    raw = json.loads(formats.encode_manifest(m))
    raw["states"][1]["digest"] = "0x" + "00" * 32
    with pytest.raises(FormatError, match="Merkle proof"):
        formats.decode_manifest(canonical_json(raw))


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda r: r.update(format="veriloco.audit.v0"), "format"),
        (lambda r: r["states"].pop(0), "need exactly"),
        (lambda r: r.update(transitions=[5, 2]), "sorted"),
        (lambda r: r.update(transitions=[8]), "outside"),
        (lambda r: r.update(trainer="0x12"), "address"),
        (lambda r: r.update(leaf_count=0), "leaf_count"),
        (lambda r: r["states"][0].update(cid="bafy"), "CIDv0"),
        (lambda r: r["states"][0].update(digest="0x00"), "32 bytes"),
        (lambda r: r["states"][0].update(leaf_index="2"), "integer"),
        (lambda r: r.update(states={}), "list"),
    ],
)
def test_malformed_manifests_are_rejected(edit, match: str) -> None:  # type: ignore[no-untyped-def]
    raw = json.loads(formats.encode_manifest(_manifest()))
    edit(raw)
    with pytest.raises(FormatError, match=match):
        formats.decode_manifest(canonical_json(raw))


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_manifest_reader(junk: bytes) -> None:
    try:
        formats.decode_manifest(junk)
    except FormatError:
        pass


def test_cids_of_leaves_can_be_a_mapping() -> None:
    trace = _trace(4)
    cids = {i: Cid(cid_of(bytes([i]))) for i in range(4)}
    m = formats.build_state_manifest(run_id=0, epoch=0, trainer=TRAINER, trace=trace, transitions=[0],
                               final=False, cid_of_leaf=cids)
    assert [s.cid for s in m.states] == [cids[0]]
    assert isinstance(io.BytesIO(formats.encode_manifest(m)).read(), bytes)


def test_segment_audits_prove_the_segment_end_and_publish_it_when_tolerant() -> None:
    trace = _trace(9)
    m = formats.build_state_manifest(run_id=0, epoch=0, trainer=TRAINER, trace=trace, transitions=[1, 6], final=False,
                               cid_of_leaf=lambda i: cid_of(b"s%d" % i), segment=4, publish_ends=True)
    assert [s.leaf_index for s in m.states] == [1, 6]
    assert [s.leaf_index for s in m.ends] == [5, 8]  # 6 + 4 is cut at the last leaf
    assert m.end(6).cid == cid_of(b"s8") and formats.decode_manifest(formats.encode_manifest(m)) == m
    wrong = dataclasses.replace(m, ends=(m.ends[0], dataclasses.replace(m.ends[1], digest=trace[7])))
    with pytest.raises(FormatError, match="end 8"):
        formats.encode_manifest(wrong)


def test_manifest_without_previous_states_has_no_previous_root() -> None:
    m = _manifest()
    raw = json.loads(formats.encode_manifest(m))
    raw["previous_root"] = "0x" + "11" * 32
    with pytest.raises(FormatError, match="no previous states"):
        formats.decode_manifest(canonical_json(raw))


def test_manifest_with_defaulted_keys_left_out_is_not_canonical() -> None:
    raw = json.loads(formats.encode_manifest(_manifest()))
    del raw["previous"]
    with pytest.raises(FormatError, match="canonical"):
        formats.decode_manifest(canonical_json(raw))
