"""Canonical byte forms of what nodes publish: state/model files, canonical JSON, audit manifests.

Content addressing only works if the same value always has the same bytes, so every writer here
has exactly one output for a given input and every reader checks that what it got is that one
form (docs/protocol.md §6). Readers take untrusted bytes: anything malformed raises FormatError
naming what is wrong; nothing here crashes, allocates beyond `max_bytes`, or evaluates input.

- State / model file: safetensors with keys sorted, tensors packed in key order, header JSON
  compact with sorted keys padded with spaces to 8 bytes, metadata exactly
  {"format": "veriloco.state.v1"}. Readable by any safetensors reader.
- Canonical JSON: UTF-8, sorted keys, no whitespace, no floats (reals as decimal strings).
- Audit manifest: canonical JSON, "format": "veriloco.audit.v2".

torch is imported by the state-file functions, not with the module: a run config is canonical JSON,
and `veriloco status` and `runs` read one without loading torch (issue 32).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from protocol import merkle
from protocol.digest import dtype_codes, tensor_bytes
from protocol.errors import VerilocoError
from protocol.formats.jsondepth import MAX_JSON_DEPTH, json_depth
from protocol.store.unixfs import CidError, validate_cid
from protocol.types import Address, Cid, Digest

if TYPE_CHECKING:
    import torch

    from protocol.store.backends import Store

STATE_FORMAT = "veriloco.state.v1"
AUDIT_FORMAT = "veriloco.audit.v2"
STATE_METADATA = {"format": STATE_FORMAT}

DEFAULT_MAX_STATE_BYTES = 8 << 30
DEFAULT_MAX_JSON_BYTES = 16 << 20
_MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit
_MAX_NDIM = 8


@functools.cache
def _st_dtypes() -> dict[torch.dtype, str]:
    """safetensors' name of each dtype a state may hold (those the §2 digest has a code for)."""
    import torch

    names = {
        torch.float32: "F32",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.float64: "F64",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.uint8: "U8",
        torch.int8: "I8",
    }
    assert set(names) == set(dtype_codes())
    return names


@functools.cache
def _st_names() -> dict[str, torch.dtype]:
    return {v: k for k, v in _st_dtypes().items()}


if sys.byteorder != "little":  # tensors are stored in native order below
    raise ImportError("veriloco formats need a little-endian machine")


class FormatError(VerilocoError):
    """Bytes that are not the canonical form of what they claim to be."""


# ---------------------------------------------------------------------------------------------
# State / model files (safetensors)


@dataclass(frozen=True)
class TensorSpec:
    """What a reader expects one entry to be: its dtype and shape."""

    dtype: torch.dtype
    shape: tuple[int, ...]


def spec_of(state: Mapping[str, torch.Tensor]) -> dict[str, TensorSpec]:
    """The expected keys, dtypes and shapes of states like `state` (to pass to load_state)."""
    return {k: TensorSpec(t.dtype, tuple(t.shape)) for k, t in state.items()}


def state_file_size(spec: Mapping[str, TensorSpec]) -> int:
    """Bytes of the canonical state file of any state with ``spec``'s entries, without any data: the
    header is laid out from shapes alone (meta tensors), so a cost model can price a file for a
    model no machine here could hold."""
    import torch

    head, entries = _layout({n: torch.empty(s.shape, dtype=s.dtype, device="meta") for n, s in spec.items()})
    return len(head) + sum(t.numel() * t.element_size() for _, t in entries)


def _layout(state: Mapping[str, torch.Tensor]) -> tuple[bytes, list[tuple[str, torch.Tensor]]]:
    import torch

    st_dtypes = _st_dtypes()
    names = sorted(state, key=lambda n: n.encode())
    header: dict[str, Any] = {"__metadata__": STATE_METADATA}
    offset = 0
    entries = []
    for name in names:
        t = state[name]
        if not isinstance(t, torch.Tensor):
            raise FormatError(f"state entry {name!r} is {type(t).__name__}, not a tensor")
        if t.dtype not in st_dtypes:
            raise FormatError(f"state entry {name!r} has unsupported dtype {t.dtype}")
        if name == "__metadata__" or not name:
            raise FormatError(f"state entry name {name!r} is reserved")
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": st_dtypes[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
        entries.append((name, t))
    raw = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw, entries


def iter_state(state: Mapping[str, torch.Tensor]) -> Iterator[bytes | memoryview]:
    """The canonical state file as pieces (header, then each tensor's bytes) without joining them.

    Feed this to `Store.put_stream` so a model is published without a second copy in memory.
    """
    head, entries = _layout(state)
    yield head
    for _, t in entries:
        if t.numel():
            yield tensor_bytes(t)


def save_state(state: Mapping[str, torch.Tensor]) -> bytes:
    """The canonical state file of `state` as one bytes object."""
    buf = io.BytesIO()
    write_state(state, buf)
    return buf.getvalue()


def write_state(state: Mapping[str, torch.Tensor], f: BinaryIO | Path | str) -> int:
    """Write the canonical state file to a binary stream or path; returns the bytes written."""
    if isinstance(f, (str, Path)):
        with open(f, "wb") as fh:
            return write_state(state, fh)
    n = 0
    for piece in iter_state(state):
        f.write(piece)
        n += len(piece)
    return n


def _read_exact(f: BinaryIO, n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise FormatError(f"state file is truncated: {what} needs {n} bytes, got {len(data)}")
    return data


def _parse_header(raw: bytes, body_size: int) -> list[tuple[str, torch.dtype, tuple[int, ...], int, int]]:
    import torch

    if json_depth(raw) > MAX_JSON_DEPTH:
        raise FormatError(f"state file header is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"state file header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise FormatError("state file header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta != STATE_METADATA:
        raise FormatError(
            f"state file metadata is {meta!r}, expected {STATE_METADATA!r}: not a veriloco state "
            "file (or another version); write it with protocol.formats.codec.save_state"
        )
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"state file entry {name!r} is malformed: {info!r}")
        dtype = _st_names().get(info["dtype"]) if isinstance(info["dtype"], str) else None
        if dtype is None:
            raise FormatError(f"state file entry {name!r} has unsupported dtype {info['dtype']!r}")
        shape, offs = info["shape"], info["data_offsets"]
        if (
            not isinstance(shape, list)
            or len(shape) > _MAX_NDIM
            or not all(type(d) is int and 0 <= d < 1 << 48 for d in shape)
        ):
            raise FormatError(f"state file entry {name!r} has a bad shape {shape!r}")
        if not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs):
            raise FormatError(f"state file entry {name!r} has bad data_offsets {offs!r}")
        begin, end = offs
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end <= body_size or end - begin != size:
            raise FormatError(
                f"state file entry {name!r}: offsets {offs} do not fit shape {shape} of "
                f"{info['dtype']} in a {body_size}-byte body"
            )
        entries.append((name, dtype, tuple(shape), begin, end))
    return entries


def read_state(
    f: BinaryIO,
    size: int,
    *,
    max_bytes: int = DEFAULT_MAX_STATE_BYTES,
    expect: Mapping[str, TensorSpec] | None = None,
    allow_nonfinite: bool = False,
) -> dict[str, torch.Tensor]:
    """Parse and validate a canonical state file of `size` bytes from a stream.

    Each tensor is read straight into its own storage, so memory holds one copy of the state.
    """
    import torch

    if size > max_bytes:
        raise FormatError(f"state file is {size} bytes, over the {max_bytes}-byte limit")
    if size < 8:
        raise FormatError(f"state file is {size} bytes: too short for a safetensors header")
    n = int.from_bytes(_read_exact(f, 8, "the header length"), "little")
    if n > min(_MAX_HEADER_BYTES, size - 8):
        raise FormatError(f"state file header length {n} does not fit a {size}-byte file")
    raw = _read_exact(f, n, "the header")
    body_size = size - 8 - n
    entries = _parse_header(raw, body_size)
    # canonical: the exact header the writer would produce for these entries, packed in key order
    entries.sort(key=lambda e: e[0].encode())
    meta_entries: dict[str, Any] = {"__metadata__": STATE_METADATA}
    pos = 0
    for name, dtype, shape, begin, end in entries:
        if begin != pos:
            raise FormatError(f"state file entry {name!r} is not packed in key order (not canonical)")
        meta_entries[name] = {"dtype": _st_dtypes()[dtype], "shape": list(shape), "data_offsets": [begin, end]}
        pos = end
    if pos != body_size:
        raise FormatError(f"state file has {body_size - pos} trailing bytes after its tensors")
    canon = json.dumps(meta_entries, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    canon += b" " * (-len(canon) % 8)
    if canon != raw:
        raise FormatError("state file header is not in canonical form; write it with save_state")
    if expect is not None:
        _check_expected({e[0]: TensorSpec(e[1], e[2]) for e in entries}, expect)
    state: dict[str, torch.Tensor] = {}
    for name, dtype, shape, begin, end in entries:
        t = torch.empty(shape, dtype=dtype)
        if end > begin:
            arr = t.view(torch.int16).numpy() if dtype == torch.bfloat16 else t.numpy()
            view = memoryview(arr)  # type: ignore[arg-type]
            got = f.readinto(view.cast("B"))  # type: ignore[attr-defined]
            if got != end - begin:
                raise FormatError(f"state file is truncated inside entry {name!r}")
        if not allow_nonfinite and dtype.is_floating_point and not bool(torch.isfinite(t).all()):
            raise FormatError(f"state file entry {name!r} contains NaN or Inf")
        state[name] = t
    return state


def _check_expected(got: Mapping[str, TensorSpec], expect: Mapping[str, TensorSpec]) -> None:
    missing = sorted(set(expect) - set(got))
    extra = sorted(set(got) - set(expect))
    if missing or extra:
        raise FormatError(
            f"state file keys differ from the expected layout: missing {missing[:5]}, "
            f"unexpected {extra[:5]}"
        )
    for name, spec in expect.items():
        if got[name] != spec:
            raise FormatError(
                f"state file entry {name!r} is {got[name].dtype} {list(got[name].shape)}, "
                f"expected {spec.dtype} {list(spec.shape)}"
            )


def load_state(
    data: bytes | bytearray | memoryview,
    *,
    max_bytes: int = DEFAULT_MAX_STATE_BYTES,
    expect: Mapping[str, TensorSpec] | None = None,
    allow_nonfinite: bool = False,
) -> dict[str, torch.Tensor]:
    """Parse and validate canonical state bytes (see read_state)."""
    view = memoryview(data).cast("B")
    return read_state(
        io.BytesIO(view),  # type: ignore[arg-type]
        len(view),
        max_bytes=max_bytes,
        expect=expect,
        allow_nonfinite=allow_nonfinite,
    )


def load_state_file(
    path: Path | str,
    *,
    max_bytes: int = DEFAULT_MAX_STATE_BYTES,
    expect: Mapping[str, TensorSpec] | None = None,
    allow_nonfinite: bool = False,
) -> dict[str, torch.Tensor]:
    """Parse and validate a canonical state file on disk, one copy in memory."""
    with open(path, "rb") as f:
        size = f.seek(0, io.SEEK_END)
        f.seek(0)
        return read_state(f, size, max_bytes=max_bytes, expect=expect, allow_nonfinite=allow_nonfinite)


def publish_state(store: Store, state: Mapping[str, torch.Tensor]) -> Cid:
    """Store the canonical state file of `state` without building it in memory first."""
    return store.put_stream(iter_state(state))


def fetch_state(
    store: Store,
    cid: str,
    *,
    max_bytes: int = DEFAULT_MAX_STATE_BYTES,
    expect: Mapping[str, TensorSpec] | None = None,
    allow_nonfinite: bool = False,
    digest: bytes | None = None,
) -> dict[str, torch.Tensor]:
    """Fetch, verify (CID, optional keccak `digest`) and parse a state file, one copy in memory.

    The bytes are streamed into a temporary file and read tensor by tensor from there.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="veriloco-state-") as tmp:
        path = Path(tmp) / "state.safetensors"
        store.get_to_file(cid, path, max_size=max_bytes, digest=digest)
        return load_state_file(path, max_bytes=max_bytes, expect=expect, allow_nonfinite=allow_nonfinite)


# ---------------------------------------------------------------------------------------------
# Canonical JSON


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"JSON object has the key {k!r} twice")
        out[k] = v
    return out


def _reject_float(text: str) -> Any:
    raise FormatError(f"canonical JSON has no floats (got {text}); write real numbers as decimal strings")


def _reject_constant(text: str) -> Any:
    raise FormatError(f"canonical JSON has no {text}")


def _check_plain(value: Any, path: str) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        raise FormatError(f"{path} is a float ({value!r}); canonical JSON writes reals as decimal strings")
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise FormatError(f"{path} has a non-string key {k!r}")
            _check_plain(v, f"{path}.{k}")
        return
    raise FormatError(f"{path} is a {type(value).__name__}, which canonical JSON cannot hold")


def canonical_json(value: Any) -> bytes:
    """The one canonical encoding: UTF-8, keys sorted, no whitespace, no floats."""
    _check_plain(value, "$")
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def decode_canonical_json(data: bytes, *, max_bytes: int = DEFAULT_MAX_JSON_BYTES) -> Any:
    """Parse canonical JSON, rejecting anything that is not exactly what canonical_json writes."""
    if len(data) > max_bytes:
        raise FormatError(f"JSON document is {len(data)} bytes, over the {max_bytes}-byte limit")
    if json_depth(bytes(data)) > MAX_JSON_DEPTH:
        raise FormatError(f"JSON document is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(
            bytes(data).decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_float=_reject_float,
            parse_constant=_reject_constant,
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"not valid UTF-8 JSON: {exc}") from None
    if canonical_json(value) != bytes(data):
        raise FormatError("JSON is valid but not canonical (sorted keys, no whitespace, minimal escapes)")
    return value


_DECIMAL_RE = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_HEX32_RE = re.compile(r"0x[0-9a-f]{64}")
_ADDRESS_RE = re.compile(r"0x[0-9a-fA-F]{40}")


def decimal_str(x: float | Decimal) -> str:
    """A real number as a decimal string that reads back to exactly the same value."""
    if isinstance(x, float):
        if not math.isfinite(x):
            raise FormatError(f"{x!r} cannot be written as a decimal")
        return repr(x)
    if not x.is_finite():
        raise FormatError(f"{x!r} cannot be written as a decimal")
    return str(x)


def parse_decimal(text: Any, where: str = "value") -> Decimal:
    if not isinstance(text, str) or not _DECIMAL_RE.fullmatch(text):
        raise FormatError(f"{where} must be a decimal string like \"0.001\", got {text!r}")
    try:
        return Decimal(text)
    except InvalidOperation:
        raise FormatError(f"{where} is not a decimal: {text!r}") from None


def hex32(d: bytes) -> str:
    if len(d) != 32:
        raise FormatError(f"a digest is 32 bytes, got {len(d)}")
    return "0x" + d.hex()


def parse_hex32(text: Any, where: str = "digest") -> Digest:
    if not isinstance(text, str) or not _HEX32_RE.fullmatch(text):
        raise FormatError(f"{where} must be 0x followed by 64 lowercase hex digits, got {text!r}")
    return Digest(bytes.fromhex(text[2:]))


T = TypeVar("T")


def to_json_value(obj: Any) -> Any:
    """A dataclass (nested, with tuples, floats, Decimals, bytes) as plain canonical-JSON values.

    floats and Decimals become decimal strings, bytes become 0x-hex, tuples become lists.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json_value(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, (float, Decimal)):
        return decimal_str(obj)
    if isinstance(obj, (bytes, bytearray)):
        return "0x" + bytes(obj).hex()
    if isinstance(obj, (list, tuple)):
        return [to_json_value(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_json_value(v) for k, v in obj.items()}
    raise FormatError(f"cannot write a {type(obj).__name__} as canonical JSON")


def from_json_value(cls: type[T], value: Any, where: str = "$") -> T:
    """Build dataclass `cls` from plain JSON values, checking every field against its annotation.

    Unknown keys and wrong types are errors; missing keys take the field's default if it has one.
    Supported annotations: bool, int, str, float/Decimal (decimal strings), bytes (0x-hex), NewTypes
    of those, Optional[X], tuple[X, ...], list[X], dict[str, X] and nested dataclasses.
    """
    return typing.cast(T, _from_json(cls, value, where))


def _from_json(tp: Any, value: Any, where: str) -> Any:
    supertype = getattr(tp, "__supertype__", None)
    if supertype is not None:  # NewType
        return _from_json(supertype, value, where)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise FormatError(f"{where} must be an object, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        flds = {f.name: f for f in dataclasses.fields(tp) if f.init}
        unknown = sorted(set(value) - set(flds))
        if unknown:
            raise FormatError(f"{where} has unknown keys {unknown}; expected only {sorted(flds)}")
        kwargs = {}
        for name, f in flds.items():
            if name in value:
                kwargs[name] = _from_json(hints[name], value[name], f"{where}.{name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise FormatError(f"{where} is missing the required key {name!r}")
        try:
            return tp(**kwargs)
        except (TypeError, ValueError) as exc:
            raise FormatError(f"{where} is not a valid {tp.__name__}: {exc}") from None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _from_json(rest[0], value, where)
        raise FormatError(f"{where}: unions other than Optional[X] are not supported")
    if origin is tuple:
        if not isinstance(value, list):
            raise FormatError(f"{where} must be a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_json(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise FormatError(f"{where} must have {len(args)} items, got {len(value)}")
        return tuple(_from_json(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is list:
        if not isinstance(value, list):
            raise FormatError(f"{where} must be a list, got {type(value).__name__}")
        return [_from_json(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise FormatError(f"{where} must be an object, got {type(value).__name__}")
        return {k: _from_json(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise FormatError(f"{where} must be true or false, got {value!r}")
        return value
    if tp is int:
        if type(value) is not int:
            raise FormatError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise FormatError(f"{where} must be a string, got {value!r}")
        return value
    if tp is float:
        return float(parse_decimal(value, where))
    if tp is Decimal:
        return parse_decimal(value, where)
    if tp is bytes:
        if not isinstance(value, str) or not re.fullmatch(r"0x([0-9a-f]{2})*", value):
            raise FormatError(f"{where} must be 0x-prefixed lowercase hex, got {value!r}")
        return bytes.fromhex(value[2:])
    if tp is Any:
        _check_plain(value, where)
        return value
    raise FormatError(f"{where}: cannot read a value of type {tp!r}")


def encode_dataclass(obj: Any, format_tag: str | None = None) -> bytes:
    """Canonical JSON of a dataclass, with a "format" key first-class when given."""
    value = to_json_value(obj)
    if format_tag is not None:
        if "format" in value:
            raise FormatError("the dataclass already has a 'format' field")
        value["format"] = format_tag
    return canonical_json(value)


def decode_dataclass(
    cls: type[T],
    data: bytes,
    format_tag: str | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_JSON_BYTES,
) -> T:
    """Inverse of encode_dataclass: canonical JSON check, format tag check, field checks."""
    value = decode_canonical_json(data, max_bytes=max_bytes)
    if format_tag is not None:
        if not isinstance(value, dict):
            raise FormatError(f"expected a JSON object with format {format_tag!r}")
        tag = value.pop("format", None)
        if tag != format_tag:
            raise FormatError(f"document format is {tag!r}, expected {format_tag!r}")
    return from_json_value(cls, value)


# ---------------------------------------------------------------------------------------------
# Audit manifest


_ZERO32 = Digest(bytes(32))


@dataclass(frozen=True)
class ChallengedState:
    """One state the trainer must reveal: its leaf index, file CID, digest and Merkle proof."""

    leaf_index: int
    cid: Cid
    digest: Digest
    proof: tuple[Digest, ...]


@dataclass(frozen=True)
class AuditManifest:
    """A trainer's answer to an audit: the challenged transitions and the states they need.

    `transitions` are the k of challenged steps (sorted, distinct); each is checked by replaying
    `segment` steps, k -> end(k) = min(k + segment, leaf_count - 1). `final` says the end state ->
    payload check was drawn. `states` (files, sorted by leaf index, distinct) hold leaf k of every
    transition, and leaves 0 and leaf_count-1 when `final` is set (the payload is a function of
    both). `ends` prove the leaves end(k); their files are published (cid set) only when the run
    audits in tolerant mode, since an exact replay only compares digests. Publishing one state per
    challenge instead of two, and covering `segment` steps with it, is what keeps audit traffic far
    below the payload traffic it protects for large models (docs/protocol.md §5).

    Every audit also checks the start state (docs/protocol.md §8), so every manifest carries `start`:
    leaf 0's digest and proof, no file (the verifier recomputes the start state from public data and
    compares digests). In epoch > 0 `previous` holds the start and end states (leaves 0 and
    previous_leaf_count-1) of the trainer's previous epoch, proven against that epoch's trace root,
    when it continued that epoch; it is empty when it claims a fresh start, which is then checked
    against the fresh-start rule instead.
    """

    run_id: int
    epoch: int
    trainer: Address
    trace_root: Digest
    leaf_count: int
    transitions: tuple[int, ...]
    final: bool
    states: tuple[ChallengedState, ...]
    start: ChallengedState
    previous_root: Digest = _ZERO32
    previous_leaf_count: int = 0
    previous: tuple[ChallengedState, ...] = ()
    segment: int = 1
    ends: tuple[ChallengedState, ...] = ()

    def state(self, leaf_index: int) -> ChallengedState:
        for s in self.states:
            if s.leaf_index == leaf_index:
                return s
        raise FormatError(f"audit manifest has no state for leaf {leaf_index}")

    def end(self, k: int) -> ChallengedState:
        """The proven leaf a replay from leaf k must reach."""
        target = segment_end(k, self.segment, self.leaf_count)
        for s in self.ends:
            if s.leaf_index == target:
                return s
        raise FormatError(f"audit manifest has no proof for leaf {target}")


def segment_end(k: int, segment: int, leaf_count: int) -> int:
    return min(k + segment, leaf_count - 1)


def state_manifest_leaves(transitions: Sequence[int], final: bool, leaf_count: int) -> list[int]:
    """The leaf indices whose state files a manifest must publish for these challenges."""
    need = set(transitions)
    if final:
        need |= {0, leaf_count - 1}
    return sorted(need)


def required_ends(transitions: Sequence[int], segment: int, leaf_count: int) -> list[int]:
    """The leaf indices a manifest must prove as segment ends."""
    return sorted({segment_end(k, segment, leaf_count) for k in transitions})


def validate_manifest(m: AuditManifest) -> None:
    """Check a manifest's internal consistency and every Merkle proof against its trace root."""
    if m.run_id < 0 or m.epoch < 0:
        raise FormatError("audit manifest run_id and epoch must be non-negative")
    if not _ADDRESS_RE.fullmatch(m.trainer):
        raise FormatError(f"audit manifest trainer {m.trainer!r} is not a 0x address")
    if len(m.trace_root) != 32:
        raise FormatError("audit manifest trace_root must be 32 bytes")
    if not 1 <= m.leaf_count <= 1 << 32:
        raise FormatError(f"audit manifest leaf_count {m.leaf_count} out of range")
    if list(m.transitions) != sorted(set(m.transitions)):
        raise FormatError("audit manifest transitions must be sorted and distinct")
    for k in m.transitions:
        if not 0 <= k < m.leaf_count - 1:
            raise FormatError(f"audit manifest transition {k} -> {k + 1} is outside the trace")
    indices = [s.leaf_index for s in m.states]
    if indices != sorted(set(indices)):
        raise FormatError("audit manifest states must be sorted by leaf index and distinct")
    need = state_manifest_leaves(m.transitions, m.final, m.leaf_count)
    if indices != need:
        raise FormatError(f"audit manifest reveals leaves {indices}, the challenges need exactly {need}")
    depth = merkle.proof_length(m.leaf_count)
    for s in m.states:
        try:
            validate_cid(s.cid)
        except CidError as exc:
            raise FormatError(f"audit manifest state {s.leaf_index}: {exc}") from None
        if len(s.digest) != 32 or len(s.proof) != depth or any(len(p) != 32 for p in s.proof):
            raise FormatError(f"audit manifest state {s.leaf_index}: digest/proof sizes are wrong")
        if not merkle.verify(m.trace_root, s.digest, s.leaf_index, m.leaf_count, s.proof):
            raise FormatError(
                f"audit manifest state {s.leaf_index}: Merkle proof does not lead to the trace root"
            )
    if not 1 <= m.segment <= 1 << 32:
        raise FormatError(f"audit manifest segment {m.segment} must be at least 1")
    ends = [s.leaf_index for s in m.ends]
    if ends != required_ends(m.transitions, m.segment, m.leaf_count):
        raise FormatError(f"audit manifest proves ends {ends}, the challenges need exactly "
                          f"{required_ends(m.transitions, m.segment, m.leaf_count)}")
    for s in m.ends:
        if s.cid:
            try:
                validate_cid(s.cid)
            except CidError as exc:
                raise FormatError(f"audit manifest end {s.leaf_index}: {exc}") from None
        if len(s.digest) != 32 or len(s.proof) != depth or any(len(p) != 32 for p in s.proof) or not merkle.verify(
            m.trace_root, s.digest, s.leaf_index, m.leaf_count, s.proof
        ):
            raise FormatError(f"audit manifest end {s.leaf_index}: Merkle proof does not lead to the trace root")
    s = m.start
    if s.leaf_index != 0 or s.cid != "":
        raise FormatError("audit manifest start must be leaf 0, proven by digest only (no cid)")
    if len(s.digest) != 32 or len(s.proof) != depth or any(len(p) != 32 for p in s.proof) or not merkle.verify(
        m.trace_root, s.digest, 0, m.leaf_count, s.proof
    ):
        raise FormatError("audit manifest start: Merkle proof does not lead to the trace root")
    if not m.previous:
        if m.previous_leaf_count != 0 or m.previous_root != _ZERO32:
            raise FormatError("audit manifest has previous_root/previous_leaf_count but no previous states")
    else:
        if m.epoch == 0:
            raise FormatError("audit manifest carries previous-epoch states in epoch 0")
        if not 2 <= m.previous_leaf_count <= 1 << 32:
            raise FormatError(f"audit manifest previous_leaf_count {m.previous_leaf_count} out of range")
        if [s.leaf_index for s in m.previous] != [0, m.previous_leaf_count - 1]:
            raise FormatError("audit manifest previous states must be leaves 0 and previous_leaf_count-1")
        for s in m.previous:
            try:
                validate_cid(s.cid)
            except CidError as exc:
                raise FormatError(f"audit manifest previous state {s.leaf_index}: {exc}") from None
            if len(s.digest) != 32 or any(len(p) != 32 for p in s.proof) or not merkle.verify(
                m.previous_root, s.digest, s.leaf_index, m.previous_leaf_count, s.proof
            ):
                raise FormatError(f"audit manifest previous state {s.leaf_index}: proof does not lead to previous_root")


def encode_manifest(m: AuditManifest) -> bytes:
    validate_manifest(m)
    return encode_dataclass(m, AUDIT_FORMAT)


def decode_manifest(data: bytes, *, max_bytes: int = DEFAULT_MAX_JSON_BYTES) -> AuditManifest:
    m = decode_dataclass(AuditManifest, data, AUDIT_FORMAT, max_bytes=max_bytes)
    if len(m.previous_root) != 32:
        raise FormatError("audit manifest previous_root must be 32 bytes")
    for s in (*m.states, m.start, *m.previous, *m.ends):
        for d in (s.digest, *s.proof):
            if len(d) != 32:
                raise FormatError(f"audit manifest state {s.leaf_index}: digests must be 32 bytes")
    validate_manifest(m)
    if encode_dataclass(m, AUDIT_FORMAT) != bytes(data):  # e.g. defaulted keys left out
        raise FormatError("audit manifest is not in canonical form (every field present)")
    return m


def build_state_manifest(
    *,
    run_id: int,
    epoch: int,
    trainer: Address,
    trace: Sequence[bytes],
    transitions: Sequence[int],
    final: bool,
    cid_of_leaf: Callable[[int], Cid] | Mapping[int, Cid],
    previous_trace: Sequence[bytes] = (),
    previous_cid_of_leaf: Callable[[int], Cid] | Mapping[int, Cid] | None = None,
    segment: int = 1,
    publish_ends: bool = False,
) -> AuditManifest:
    """Assemble (and validate) the manifest for a trace and its challenges; proofs are computed here.

    `publish_ends` (tolerant mode) also publishes the segment-end states through `cid_of_leaf`.
    `previous_trace` / `previous_cid_of_leaf` (epoch > 0, a start that continued the previous epoch)
    add that epoch's first and last states for the start-rule check.
    """
    leaf_count = len(trace)
    ts = sorted(set(transitions))
    lookup = cid_of_leaf.__getitem__ if isinstance(cid_of_leaf, Mapping) else cid_of_leaf
    states = tuple(
        ChallengedState(i, lookup(i), Digest(bytes(trace[i])), tuple(merkle.prove(trace, i)))
        for i in state_manifest_leaves(ts, final, leaf_count)
    )
    previous: tuple[ChallengedState, ...] = ()
    prev_root = _ZERO32
    if previous_trace and previous_cid_of_leaf is not None:
        plook = previous_cid_of_leaf.__getitem__ if isinstance(previous_cid_of_leaf, Mapping) else previous_cid_of_leaf
        prev_root = merkle.root(previous_trace)
        previous = tuple(
            ChallengedState(i, plook(i), Digest(bytes(previous_trace[i])), tuple(merkle.prove(previous_trace, i)))
            for i in (0, len(previous_trace) - 1)
        )
    ends = tuple(
        ChallengedState(i, lookup(i) if publish_ends else Cid(""), Digest(bytes(trace[i])), tuple(merkle.prove(trace, i)))
        for i in required_ends(ts, segment, leaf_count)
    )
    m = AuditManifest(
        run_id=run_id, epoch=epoch, trainer=trainer, trace_root=merkle.root(trace), leaf_count=leaf_count,
        transitions=tuple(ts), final=final, states=states,
        start=ChallengedState(0, Cid(""), Digest(bytes(trace[0])), tuple(merkle.prove(trace, 0))),
        previous_root=prev_root, previous_leaf_count=len(previous_trace) if previous else 0, previous=previous,
        segment=segment, ends=ends,
    )
    validate_manifest(m)
    return m
