"""The compressed pseudo-gradient payload: byte format, quantization primitives and a strict decoder.

A payload is what a trainer publishes each epoch and what the coordinator and verifiers decode, so
its layout is fixed here (docs/protocol.md §6) and nothing else builds or parses it. Payloads come
from untrusted peers: `decode` checks every header field against the bytes actually present before
allocating anything, and every failure is a `PayloadError` naming the problem.

Layout (integers little-endian):

    payload := "VLCP" || u16 version(=1) || u16 flags(=0) || u32 count || entry*count || section*count
    entry   := u16 len(name) || name(utf8) || u8 dtype || u8 ndim || u64 dim*ndim
               || u8 kind || u8 bits || u8 scale_dtype || u8 reserved(=0) || u32 group || u32 rank
               || u64 len(section)

Entries are sorted by name (bytewise, unique). Sections follow in entry order. A tensor of shape
(d0, d1, ...) is a matrix of m = d0 rows and n = d1*d2*... columns for low-rank purposes.

    raw      (kind 0, bits 32):    numel float32 values
    quant    (kind 1, bits 4|8):   block(1 row, numel columns)
    lowrank  (kind 2, bits 4|8|32): f32 energy || f32 spectrum*rank || factor(rank rows, m) || factor(rank rows, n)
             the tensor is P @ Q.T with P (m x rank), Q (n x rank); factors are stored transposed
             (one row per component), as a block when bits is 4 or 8, as float32 when bits is 32.
    block(rows, L) := codes || scales; codes are rows*L signed integers (int8, or int4 packed two per
             byte, low nibble first, a zero nibble pads an odd count), scales are rows*ceil(L/group)
             float16 (scale_dtype 1) or bfloat16 (scale_dtype 2); value = code * scale of its group,
             groups never cross rows.

`energy` is ||X||_F^2 of the matrix that was compressed and `spectrum` its leading squared singular
values (as estimated by the compressor): the public input of the adaptive rank rule.

The publication wrapper binds a payload to the run, epoch and trainer it belongs to:

    wrapped := "VLCW" || u16 version(=1) || u256 run_id || u64 epoch || address(20) || u64 len(body) || body
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from eth_utils import is_address, to_canonical_address, to_checksum_address

from protocol.digest import dtype_codes, keccak
from protocol.errors import VerilocoError
from protocol.types import Address, Digest, RunId

MAGIC = b"VLCP"
VERSION = 1
WRAP_MAGIC = b"VLCW"
WRAP_VERSION = 1

RAW, QUANT, LOWRANK = 0, 1, 2
KIND_NAMES = {RAW: "raw", QUANT: "quant", LOWRANK: "lowrank"}
SCALE_NONE, SCALE_FP16, SCALE_BF16 = 0, 1, 2

MAX_TENSORS = 1 << 16
MAX_NDIM = 8
MAX_NAME_BYTES = 1024
MAX_DIM = 1 << 32
MAX_GROUP = 1 << 20
DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_MAX_ELEMENTS = 1 << 28  # 1 GiB of float32 output; pass `expected` to bound it by the model

_FLOAT_DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.float64}
_DTYPE_BY_CODE = {code: dt for dt, code in dtype_codes().items() if dt in _FLOAT_DTYPES}
_FP16_MIN_NORMAL = 2.0**-14
_FP16_SAFE_MAX = 60000.0
_BF16_SAFE_MAX = 3.0e38
_QMAX = {4: 7, 8: 127}


class PayloadError(VerilocoError):
    """A payload or wrapper is malformed, oversize, inconsistent or does not match what was expected."""


# ----------------------------------------------------------------------------------------------
# Quantization primitives (shared by the compressor and the decoder, so both agree bit for bit)


@dataclass(frozen=True)
class Block:
    """Group-quantized rows: `codes` int8 (rows x L), `scales` float32 (rows x ceil(L/group))."""

    codes: torch.Tensor
    scales: torch.Tensor
    bits: int
    group: int
    scale_dtype: int


def quantize_rows(x: torch.Tensor, bits: int, group: int, scale_dtype: int | None = None) -> Block:
    """Symmetric round-to-nearest quantization of each row in groups of `group` values.

    Scales are float16 when every non-zero scale is a normal float16 (finer), else bfloat16 (float32's
    range): two bytes either way, so a payload's size depends only on shapes and rank. The stored
    scale is rounded up so no value clips, which keeps every value within half a step of its group.
    """
    if bits not in _QMAX:
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    if group < 1:
        raise ValueError(f"group must be positive, got {group}")
    x = x.detach().to(torch.float32)
    rows, length = x.shape
    n_groups = -(-length // group)
    padded = torch.zeros(rows, n_groups * group, dtype=torch.float32)
    padded[:, :length] = x
    grouped = padded.view(rows, n_groups, group)
    qmax = _QMAX[bits]
    scales = grouped.abs().amax(dim=2) / qmax
    nonzero = scales[scales > 0]
    if scale_dtype is None:
        fits = nonzero.numel() == 0 or (
            nonzero.min().item() >= _FP16_MIN_NORMAL and nonzero.max().item() <= _FP16_SAFE_MAX
        )
        scale_dtype = SCALE_FP16 if fits else SCALE_BF16
    if not torch.isfinite(scales).all() or (scales > _BF16_SAFE_MAX).any():
        raise ValueError("values too large to quantize (a scale overflows bfloat16)")
    s16 = scales.to(torch.float16 if scale_dtype == SCALE_FP16 else torch.bfloat16)
    low = s16.to(torch.float32) < scales
    s16 = torch.where(low, torch.nextafter(s16, torch.full_like(s16, math.inf)), s16)
    scales = s16.to(torch.float32)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(grouped / safe.unsqueeze(2)).clamp_(-qmax, qmax)
    codes = codes.view(rows, n_groups * group)[:, :length].to(torch.int8).contiguous()
    return Block(codes, scales.contiguous(), bits, group, scale_dtype)


def dequantize_rows(block: Block) -> torch.Tensor:
    """The float32 rows a block stands for."""
    rows, length = block.codes.shape
    n_groups = block.scales.shape[1]
    padded = torch.zeros(rows, n_groups * block.group, dtype=torch.float32)
    padded[:, :length] = block.codes.to(torch.float32)
    out = padded.view(rows, n_groups, block.group) * block.scales.unsqueeze(2)
    return out.view(rows, n_groups * block.group)[:, :length].contiguous()


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or infinity in a float tensor (two reductions: faster than isfinite, no allocation)."""
    if t.numel() == 0:
        return True
    return bool(torch.isfinite(t.amax()) and torch.isfinite(t.amin()))


def _block_sizes(rows: int, length: int, bits: int, group: int, scale_dtype: int) -> tuple[int, int]:
    count = rows * length
    code_bytes = count if bits == 8 else (count + 1) // 2
    scale_bytes = rows * (-(-length // group)) * 2
    return code_bytes, scale_bytes


def _block_bytes(block: Block) -> bytes:
    flat = block.codes.reshape(-1).numpy()
    if block.bits == 8:
        code_bytes = flat.tobytes()
    else:
        nib = (flat.astype(np.int16) & 0xF).astype(np.uint8)
        if nib.size % 2:
            nib = np.concatenate([nib, np.zeros(1, dtype=np.uint8)])
        code_bytes = (nib[0::2] | (nib[1::2] << 4)).tobytes()
    if block.scale_dtype == SCALE_FP16:
        scale_bytes = block.scales.numpy().astype("<f2").tobytes()
    else:
        scale_bytes = block.scales.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    return code_bytes + scale_bytes


def _f32_bytes(t: torch.Tensor) -> bytes:
    return t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()


# ----------------------------------------------------------------------------------------------
# Encoding


@dataclass(frozen=True)
class Record:
    """One tensor's header fields and its encoded section, ready to be laid out by `encode`."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    kind: int
    bits: int
    scale_dtype: int
    group: int
    rank: int
    section: bytes


def _check_name_shape(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    raw = name.encode()
    if not 1 <= len(raw) <= MAX_NAME_BYTES:
        raise ValueError(f"tensor name must be 1..{MAX_NAME_BYTES} bytes, got {name!r}")
    if len(shape) > MAX_NDIM or any(not 1 <= d < MAX_DIM for d in shape):
        raise ValueError(f"tensor {name!r}: unsupported shape {shape}")
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"tensor {name!r}: unsupported dtype {dtype}")


def encode_raw(name: str, t: torch.Tensor) -> Record:
    """A tensor as plain float32 values (the uncompressed baseline)."""
    shape = tuple(t.shape)
    _check_name_shape(name, shape, t.dtype)
    return Record(name, t.dtype, shape, RAW, 32, SCALE_NONE, 0, 0, _f32_bytes(t.reshape(-1)))


def encode_quant(name: str, t: torch.Tensor, bits: int, group: int) -> Record:
    """A tensor group-quantized as one row of all its values."""
    shape = tuple(t.shape)
    _check_name_shape(name, shape, t.dtype)
    block = quantize_rows(t.reshape(1, -1), bits, group)
    return Record(name, t.dtype, shape, QUANT, bits, block.scale_dtype, group, 0, _block_bytes(block))


def encode_lowrank(
    name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    p: torch.Tensor,
    q: torch.Tensor,
    bits: int,
    group: int,
    energy: float,
    spectrum: Sequence[float],
) -> Record:
    """A tensor as P @ Q.T (P: m x r, Q: n x r), factors quantized per component (or float32 at 32 bits)."""
    _check_name_shape(name, shape, dtype)
    if len(shape) < 2:
        raise ValueError(f"tensor {name!r}: low-rank needs at least 2 dimensions, got {shape}")
    m, n = shape[0], math.prod(shape[1:])
    rank = p.shape[1]
    if p.shape != (m, rank) or q.shape != (n, rank) or not 1 <= rank <= min(m, n):
        raise ValueError(f"tensor {name!r}: factors {tuple(p.shape)}, {tuple(q.shape)} do not fit {shape}")
    if len(spectrum) != rank:
        raise ValueError(f"tensor {name!r}: spectrum has {len(spectrum)} values, rank is {rank}")
    stats = struct.pack(f"<{rank + 1}f", energy, *spectrum)
    pt, qt = p.t().contiguous(), q.t().contiguous()
    if bits == 32:
        return Record(name, dtype, shape, LOWRANK, 32, SCALE_NONE, 0, rank, stats + _f32_bytes(pt) + _f32_bytes(qt))
    bp, bq = quantize_rows(pt, bits, group), quantize_rows(qt, bits, group)
    if bp.scale_dtype != bq.scale_dtype:  # one scale dtype per tensor: both in bfloat16's range
        bp, bq = quantize_rows(pt, bits, group, SCALE_BF16), quantize_rows(qt, bits, group, SCALE_BF16)
    section = stats + _block_bytes(bp) + _block_bytes(bq)
    return Record(name, dtype, shape, LOWRANK, bits, bp.scale_dtype, group, rank, section)


def encode(records: Sequence[Record]) -> bytes:
    """Lay records out canonically (sorted by name); the same records always give the same bytes."""
    ordered = sorted(records, key=lambda r: r.name.encode())
    for a, b in itertools.pairwise(ordered):
        if a.name == b.name:
            raise ValueError(f"duplicate tensor name {a.name!r}")
    if len(ordered) > MAX_TENSORS:
        raise ValueError(f"at most {MAX_TENSORS} tensors per payload, got {len(ordered)}")
    head = [MAGIC, struct.pack("<HHI", VERSION, 0, len(ordered))]
    for r in ordered:
        raw = r.name.encode()
        head.append(struct.pack("<H", len(raw)) + raw)
        head.append(struct.pack("<BB", dtype_codes()[r.dtype], len(r.shape)))
        head.append(b"".join(struct.pack("<Q", d) for d in r.shape))
        head.append(struct.pack("<BBBBIIQ", r.kind, r.bits, r.scale_dtype, 0, r.group, r.rank, len(r.section)))
    return b"".join(head) + b"".join(r.section for r in ordered)


def merge(payloads: Sequence[bytes], max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """One payload holding every tensor of ``payloads`` (disjoint names), laid out by `encode`.

    Compression is per tensor, so the payloads of a model's parts (pipeline stages) merge into the
    very bytes the whole model's compression gives: each section is copied, the header re-encoded.
    """
    records: list[Record] = []
    for data in payloads:
        for e in parse(data, max_bytes=max_bytes, max_elements=1 << 62):
            section = bytes(data[e.offset : e.offset + e.length])
            records.append(Record(e.name, e.dtype, e.shape, e.kind, e.bits, e.scale_dtype, e.group, e.rank, section))
    try:
        return encode(records)
    except ValueError as exc:
        raise PayloadError(f"cannot merge payloads: {exc}") from exc


# ----------------------------------------------------------------------------------------------
# Decoding


@dataclass(frozen=True)
class Entry:
    """A validated header entry plus where its section lies in the payload."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    kind: int
    bits: int
    scale_dtype: int
    group: int
    rank: int
    offset: int
    length: int
    energy: float = 0.0
    spectrum: tuple[float, ...] = ()

    @property
    def matrix(self) -> tuple[int, int]:
        """(m, n): the tensor seen as a matrix of its first dimension by the rest."""
        if not self.shape:
            return 1, 1
        return self.shape[0], math.prod(self.shape[1:])


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> memoryview:
        if n > len(self.data) - self.pos:
            raise PayloadError(
                f"payload truncated: {what} needs {n} bytes at offset {self.pos}, "
                f"only {len(self.data) - self.pos} left; fetch the payload again or reject it"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> tuple[int, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))


def encoded_size(entries: Sequence[tuple[str, tuple[int, ...], int, int, int, int]]) -> int:
    """Bytes of the payload ``encode`` lays out for entries ``(name, shape, kind, bits, group, rank)``,
    from the layout alone (no tensor): what a cost model prices for a model too large to encode."""
    size = len(MAGIC) + 8
    for name, shape, kind, bits, group, rank in entries:
        m, n = (shape[0], math.prod(shape[1:])) if len(shape) >= 2 else (1, math.prod(shape))
        scales = SCALE_NONE if bits == 32 else SCALE_FP16
        size += 2 + len(name.encode()) + 2 + 8 * len(shape) + 20
        size += _expected_length(name, kind, bits, scales, group if bits != 32 else 0, rank, m, n)
    return size


def _expected_length(name: str, kind: int, bits: int, scale_dtype: int, group: int, rank: int, m: int, n: int) -> int:
    numel = m * n
    if kind == RAW:
        if bits != 32 or scale_dtype != SCALE_NONE or group != 0 or rank != 0:
            raise PayloadError(f"tensor {name!r}: raw entry must have bits 32, no scales, group 0, rank 0")
        return 4 * numel
    if kind == QUANT:
        if bits not in _QMAX or scale_dtype not in (SCALE_FP16, SCALE_BF16) or rank != 0:
            raise PayloadError(f"tensor {name!r}: quant entry needs bits 4|8, scale dtype 1|2 and rank 0")
        if not 1 <= group <= MAX_GROUP:
            raise PayloadError(f"tensor {name!r}: group size {group} outside 1..{MAX_GROUP}")
        return sum(_block_sizes(1, numel, bits, group, scale_dtype))
    if kind == LOWRANK:
        if not 1 <= rank <= min(m, n):
            raise PayloadError(f"tensor {name!r}: rank {rank} outside 1..{min(m, n)} for a {m}x{n} matrix")
        stats = 4 * (rank + 1)
        if bits == 32:
            if scale_dtype != SCALE_NONE or group != 0:
                raise PayloadError(f"tensor {name!r}: float32 factors take no scales and group 0")
            return stats + 4 * rank * (m + n)
        if bits not in _QMAX or scale_dtype not in (SCALE_FP16, SCALE_BF16):
            raise PayloadError(f"tensor {name!r}: low-rank factors need bits 4|8|32 and scale dtype 1|2")
        if not 1 <= group <= MAX_GROUP:
            raise PayloadError(f"tensor {name!r}: group size {group} outside 1..{MAX_GROUP}")
        return stats + sum(_block_sizes(rank, m, bits, group, scale_dtype)) + sum(
            _block_sizes(rank, n, bits, group, scale_dtype)
        )
    raise PayloadError(f"tensor {name!r}: unknown kind {kind} (this decoder knows 0 raw, 1 quant, 2 lowrank)")


def parse(
    payload: bytes,
    expected: Mapping[str, tuple[int, ...]] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> list[Entry]:
    """Validate a payload's header and statistics against its bytes, without reconstructing tensors.

    `expected` (name -> shape) pins the exact tensor set; `max_elements` bounds the total size of
    the dense output, so a lying header cannot make the decoder allocate more than the caller allows.
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise PayloadError(f"payload must be bytes, got {type(payload).__name__}")
    if len(payload) > max_bytes:
        raise PayloadError(f"payload is {len(payload)} bytes, more than the allowed {max_bytes}")
    rd = _Reader(memoryview(bytes(payload)))
    if bytes(rd.take(4, "magic")) != MAGIC:
        raise PayloadError("not a veriloco payload: magic is not 'VLCP'")
    version, flags, count = rd.unpack("<HHI", "header")
    if version != VERSION:
        raise PayloadError(f"payload version {version} is not supported (this decoder reads version {VERSION})")
    if flags != 0:
        raise PayloadError(f"payload flags {flags:#x} are not defined in version {VERSION}")
    if count > MAX_TENSORS:
        raise PayloadError(f"payload claims {count} tensors, more than the limit {MAX_TENSORS}")
    heads: list[tuple[str, torch.dtype, tuple[int, ...], int, int, int, int, int, int]] = []
    total_elements = 0
    prev: bytes | None = None
    for i in range(count):
        (name_len,) = rd.unpack("<H", f"entry {i} name length")
        if not 1 <= name_len <= MAX_NAME_BYTES:
            raise PayloadError(f"entry {i}: name length {name_len} outside 1..{MAX_NAME_BYTES}")
        raw_name = bytes(rd.take(name_len, f"entry {i} name"))
        try:
            name = raw_name.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PayloadError(f"entry {i}: name is not valid UTF-8") from exc
        if prev is not None and raw_name <= prev:
            raise PayloadError(f"entry {i} ({name!r}): names must be unique and sorted bytewise")
        prev = raw_name
        dtype_code, ndim = rd.unpack("<BB", f"tensor {name!r} dtype")
        if dtype_code not in _DTYPE_BY_CODE:
            raise PayloadError(f"tensor {name!r}: dtype code {dtype_code} is not a float dtype")
        if ndim > MAX_NDIM:
            raise PayloadError(f"tensor {name!r}: {ndim} dimensions, more than {MAX_NDIM}")
        shape = rd.unpack(f"<{ndim}Q", f"tensor {name!r} shape") if ndim else ()
        if any(not 1 <= d < MAX_DIM for d in shape):
            raise PayloadError(f"tensor {name!r}: shape {shape} has a dimension outside 1..2^32-1")
        numel = math.prod(shape)
        total_elements += numel
        if total_elements > max_elements:
            raise PayloadError(f"payload decodes to more than {max_elements} elements (at {name!r}); refusing")
        kind, bits, scale_dtype, reserved, group, rank, length = rd.unpack("<BBBBIIQ", f"tensor {name!r} encoding")
        if reserved != 0:
            raise PayloadError(f"tensor {name!r}: reserved byte is {reserved}, must be 0")
        m, n = (shape[0], numel // shape[0]) if shape else (1, 1)
        if kind == LOWRANK and ndim < 2:
            raise PayloadError(f"tensor {name!r}: low-rank entry needs at least 2 dimensions, shape is {shape}")
        want = _expected_length(name, kind, bits, scale_dtype, group, rank, m, n)
        if length != want:
            raise PayloadError(f"tensor {name!r}: header says its section is {length} bytes, its encoding needs {want}")
        heads.append((name, _DTYPE_BY_CODE[dtype_code], tuple(shape), kind, bits, scale_dtype, group, rank, length))
    data_bytes = sum(h[-1] for h in heads)
    left = len(rd.data) - rd.pos
    if data_bytes > left:
        raise PayloadError(f"payload truncated: sections need {data_bytes} bytes, only {left} present")
    if data_bytes < left:
        raise PayloadError(f"payload has {left - data_bytes} trailing bytes after its sections")
    if expected is not None:
        names = {h[0] for h in heads}
        missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
        if missing or extra:
            raise PayloadError(f"payload tensors do not match the model: missing {missing}, unexpected {extra}")
        for h in heads:
            if tuple(expected[h[0]]) != h[2]:
                raise PayloadError(f"tensor {h[0]!r}: shape {h[2]} but the model expects {tuple(expected[h[0]])}")
    entries: list[Entry] = []
    offset = rd.pos
    for name, dtype, shape, kind, bits, scale_dtype, group, rank, length in heads:
        energy = 0.0
        spectrum: tuple[float, ...] = ()
        if kind == LOWRANK:
            vals = np.frombuffer(rd.data[offset : offset + 4 * (rank + 1)], dtype="<f4").astype(np.float64)
            if not np.isfinite(vals).all() or (vals < 0).any():
                raise PayloadError(f"tensor {name!r}: energy/spectrum must be finite and non-negative")
            energy, spectrum = float(vals[0]), tuple(float(v) for v in vals[1:])
        entries.append(Entry(name, dtype, shape, kind, bits, scale_dtype, group, rank, offset, length, energy, spectrum))
        offset += length
    return entries


def _nibble_table() -> np.ndarray:
    """Byte -> its (low, high) signed nibbles: int4 unpacking as one table lookup."""
    b = np.arange(256)
    lo, hi = b & 0xF, b >> 4
    return np.stack([lo - 16 * (lo >= 8), hi - 16 * (hi >= 8)], axis=1).astype(np.int8)


_NIBBLES = _nibble_table()


def _read_block(buf: memoryview, rows: int, length: int, bits: int, group: int, scale_dtype: int, name: str) -> Block:
    code_bytes, scale_bytes = _block_sizes(rows, length, bits, group, scale_dtype)
    raw = buf[:code_bytes]
    count = rows * length
    if bits == 8:
        codes = np.frombuffer(raw, dtype=np.int8)
    else:
        packed = np.frombuffer(raw, dtype=np.uint8)
        if count % 2 and packed[-1] >> 4:
            raise PayloadError(f"tensor {name!r}: the padding nibble of its int4 codes is not zero")
        codes = _NIBBLES[packed].reshape(-1)[:count]
    raw_scales = buf[code_bytes : code_bytes + scale_bytes]
    if scale_dtype == SCALE_FP16:
        scales = np.frombuffer(raw_scales, dtype="<f2").astype(np.float32)
    else:  # bfloat16 is the top half of a float32
        scales = (np.frombuffer(raw_scales, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    if not np.isfinite(scales).all() or (scales < 0).any():
        raise PayloadError(f"tensor {name!r}: quantization scales must be finite and non-negative")
    return Block(
        torch.from_numpy(codes.astype(np.int8).reshape(rows, length)),
        torch.from_numpy(scales.reshape(rows, -1)),
        bits,
        group,
        scale_dtype,
    )


def _read_f32(buf: memoryview, rows: int, length: int, name: str) -> torch.Tensor:
    vals = np.frombuffer(buf[: 4 * rows * length], dtype="<f4").astype(np.float32)
    if not np.isfinite(vals).all():
        raise PayloadError(f"tensor {name!r}: float32 values must be finite")
    return torch.from_numpy(vals.reshape(rows, length))


def _factor(buf: memoryview, e: Entry, rows: int, length: int) -> tuple[torch.Tensor, int]:
    if e.bits == 32:
        return _read_f32(buf, rows, length, e.name), 4 * rows * length
    block = _read_block(buf, rows, length, e.bits, e.group, e.scale_dtype, e.name)
    return dequantize_rows(block), sum(_block_sizes(rows, length, e.bits, e.group, e.scale_dtype))


def reconstruct(payload: bytes | memoryview, e: Entry) -> torch.Tensor:
    """The dense tensor one validated entry stands for (float32 math, cast to the entry's dtype)."""
    buf = memoryview(payload)[e.offset : e.offset + e.length]
    m, n = e.matrix
    if e.kind == RAW:
        dense = _read_f32(buf, 1, m * n, e.name)
    elif e.kind == QUANT:
        dense = dequantize_rows(_read_block(buf, 1, m * n, e.bits, e.group, e.scale_dtype, e.name))
    else:
        pos = 4 * (e.rank + 1)
        pt, used = _factor(buf[pos:], e, e.rank, m)
        qt, _ = _factor(buf[pos + used :], e, e.rank, n)
        dense = pt.t() @ qt
    if not all_finite(dense):
        raise PayloadError(f"tensor {e.name!r}: decodes to non-finite values")
    out = dense.reshape(e.shape)
    if e.dtype != torch.float32:
        out = out.to(e.dtype)
        if not all_finite(out):
            raise PayloadError(f"tensor {e.name!r}: values overflow its dtype {e.dtype}")
    return out


def decode(
    payload: bytes,
    expected: Mapping[str, tuple[int, ...]] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> dict[str, torch.Tensor]:
    """Reconstruct the dense pseudo-gradient from an untrusted payload, or raise PayloadError."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise PayloadError(f"payload must be bytes, got {type(payload).__name__}")
    data = bytes(payload)
    entries = parse(data, expected, max_bytes, max_elements)
    return {e.name: reconstruct(data, e) for e in entries}


# ----------------------------------------------------------------------------------------------
# Publication wrapper


@dataclass(frozen=True)
class Wrapped:
    """A payload together with the run, epoch and trainer it was published for."""

    run_id: RunId
    epoch: int
    trainer: Address
    body: bytes


_WRAP_HEAD = struct.Struct("<4sH32sQ20sQ")


def wrap(run_id: int, epoch: int, trainer_address: str, body: bytes) -> bytes:
    """Bind a payload to its run, epoch and trainer, so it cannot be replayed under another identity."""
    if not 0 <= run_id < 1 << 256:
        raise PayloadError(f"run id {run_id} is not a uint256")
    if not 0 <= epoch < 1 << 64:
        raise PayloadError(f"epoch {epoch} is not a uint64")
    if not is_address(trainer_address):
        raise PayloadError(f"trainer address {trainer_address!r} is not a 20-byte hex address")
    head = _WRAP_HEAD.pack(
        WRAP_MAGIC, WRAP_VERSION, run_id.to_bytes(32, "little"), epoch,
        to_canonical_address(trainer_address), len(body),
    )
    return head + bytes(body)


def unwrap(
    data: bytes,
    *,
    run_id: int | None = None,
    epoch: int | None = None,
    trainer: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Wrapped:
    """Parse a published payload; when run_id/epoch/trainer are given, they must match."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PayloadError(f"wrapped payload must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_bytes + _WRAP_HEAD.size:
        raise PayloadError(f"wrapped payload is {len(data)} bytes, more than the allowed {max_bytes}")
    if len(data) < _WRAP_HEAD.size:
        raise PayloadError(f"wrapped payload truncated: {len(data)} bytes, the header alone is {_WRAP_HEAD.size}")
    magic, version, rid, ep, addr, length = _WRAP_HEAD.unpack_from(data)
    if magic != WRAP_MAGIC:
        raise PayloadError("not a published veriloco payload: magic is not 'VLCW'")
    if version != WRAP_VERSION:
        raise PayloadError(f"wrapper version {version} is not supported (this reader knows {WRAP_VERSION})")
    body = data[_WRAP_HEAD.size :]
    if length != len(body):
        raise PayloadError(f"wrapper says the body is {length} bytes, {len(body)} are present")
    if body[:4] != MAGIC:
        raise PayloadError("wrapped body is not a veriloco payload (magic is not 'VLCP')")
    w = Wrapped(RunId(int.from_bytes(rid, "little")), ep, Address(to_checksum_address(addr)), body)
    if run_id is not None and w.run_id != run_id:
        raise PayloadError(f"payload belongs to run {w.run_id}, expected run {run_id}")
    if epoch is not None and w.epoch != epoch:
        raise PayloadError(f"payload belongs to epoch {w.epoch}, expected epoch {epoch}")
    if trainer is not None and (not is_address(trainer) or to_canonical_address(trainer) != addr):
        raise PayloadError(f"payload belongs to trainer {w.trainer}, expected {trainer}")
    return w


def open_publication(
    data: bytes, shapes: Mapping[str, tuple[int, ...]], *, run_id: int, epoch: int, trainer: str
) -> dict[str, torch.Tensor]:
    """The dense pseudo-gradient a publication carries, once it is bound to this (run, epoch, trainer)
    and decodes to the model's shapes; or PayloadError."""
    return decode(unwrap(data, run_id=run_id, epoch=epoch, trainer=trainer).body, dict(shapes))


def payload_digest(data: bytes) -> Digest:
    """keccak of the published (wrapped) bytes: the `payloadDigest` a trainer commits to."""
    return keccak(bytes(data))
