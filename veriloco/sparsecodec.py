"""The field's compressors, as baselines the benchmarks compare against: SparseLoCo-style top-k and
DeMo-style chunked-DCT top-k (issue 33).

These are NOT what the protocol ships: the protocol's codec is ``dilocox/compress.py`` (low-rank int4
with error feedback, its bytes in ``docs/protocol.md``), and nothing here is ever sent on a network or
replayed by a verifier. ``benchmarks/codec.py`` measures their reconstruction error at equal bytes and
``veriloco.simulate`` runs them as training methods (``sparseloco_merge``, ``demo_merge``). Pure
functions of their inputs: the same tensors and codec give the same bytes.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

# Written from the papers' descriptions (SparseLoCo, arXiv 2508.15706: chunk-wise top-k of the
# pseudo-gradient plus error feedback, 2-bit values; DeMo, arXiv 2411.19870: top-k of chunked DCT
# coefficients). Neither is a protocol codec: the payload below is this module's own, deterministic
# (stable sorts, integer coding, fixed reduction orders) and decodable from the shapes alone.
#
# Per tensor (names in byte order), a 10-byte header  u32 k || u8 rice || u8 scale_dtype || u32 unary_bytes,
# then four byte-aligned sections over the tensor's chunks (n chunks of c slots, k kept per chunk):
#   scales   2-bit values: n x (hi, lo) magnitude levels; intB values: n absmax/qmax scales;
#            float16 when every non-zero scale is a normal float16, else bfloat16 (scale_dtype 1 / 2)
#   values   n*k fields in ascending slot order: 2-bit = sign bit then level bit (1 = hi);
#            intB = code + qmax as B unsigned bits (code in [-qmax, qmax], qmax = 2^(B-1) - 1)
#   low bits n*k Rice remainders (`rice` bits each) of the gaps between kept slots
#   unary    n*k Rice quotients in unary (q ones, then a zero); gap = slot - previous slot - 1,
#            the previous slot of a chunk's first is -1
# All bit fields are packed most significant bit first. Top-k takes the k largest magnitudes per
# chunk with ties to the lower slot; the two 2-bit levels are the 2-means split of the kept
# magnitudes (the exact optimum for sign x level), each the mean of its side.

BASELINE_CHUNK = 4096  # SparseLoCo-style: elements per top-k chunk of the flattened tensor
DCT_BLOCK = 64  # DeMo-style: matrices in 64 x 64 blocks (2-D DCT-II), 1-D tensors in chunks of 64 (1-D DCT)
_SCALE_FP16, _SCALE_BF16 = 1, 2
_HEADER = struct.Struct("<IBBI")


@dataclass(frozen=True)
class SparseCodec:
    """A top-k codec: `k` kept per full chunk (4096 elements, or a 64 x 64 DCT block); a smaller
    chunk keeps k x its size / full size, rounded, at least 1."""

    transform: str  # "topk" (SparseLoCo-style, the values themselves) | "dct" (DeMo-style, DCT coefficients)
    k: int
    values: str = "2bit"  # "2bit" | "int4" | "int8"

    def __post_init__(self) -> None:
        if self.transform not in ("topk", "dct") or self.values not in ("2bit", "int4", "int8"):
            raise ValueError(f"unknown codec {self.transform}/{self.values}")
        if not 1 <= self.k <= self.full:
            raise ValueError(f"k must be in [1, {self.full}], got {self.k}")

    @property
    def full(self) -> int:
        return BASELINE_CHUNK if self.transform == "topk" else DCT_BLOCK * DCT_BLOCK

    @property
    def value_bits(self) -> int:
        return {"2bit": 2, "int4": 4, "int8": 8}[self.values]


@dataclass(frozen=True)
class _Geometry:
    rows: int  # the tensor viewed as rows x cols (topk: 1 x numel)
    cols: int
    br: int  # chunk block: br x bc
    bc: int

    @property
    def padded(self) -> tuple[int, int]:
        return -(-self.rows // self.br) * self.br, -(-self.cols // self.bc) * self.bc

    @property
    def chunks(self) -> int:
        r, c = self.padded
        return (r // self.br) * (c // self.bc)

    @property
    def size(self) -> int:
        return self.br * self.bc


def _geometry(shape: tuple[int, ...], codec: SparseCodec) -> _Geometry:
    numel = math.prod(shape)
    if codec.transform == "topk":
        return _Geometry(1, numel, 1, min(BASELINE_CHUNK, numel))
    rows, cols = (shape[0], numel // shape[0]) if len(shape) >= 2 else (1, numel)
    return _Geometry(rows, cols, min(DCT_BLOCK, rows), min(DCT_BLOCK, cols))


def _kept(g: _Geometry, codec: SparseCodec) -> int:
    return min(g.size, max(1, (codec.k * g.size + codec.full // 2) // codec.full))


@functools.lru_cache(maxsize=8)
def _dct_matrix(n: int) -> Tensor:
    """Orthonormal DCT-II: row j is sqrt(2/n) cos(pi (2i + 1) j / 2n), row 0 scaled by 1/sqrt(2)."""
    i = torch.arange(n, dtype=torch.float64)
    d = torch.cos(math.pi * (2 * i[None, :] + 1) * i[:, None] / (2 * n)) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d.to(torch.float32)


def _sandwich(blocks: Tensor, left: Tensor, right: Tensor) -> Tensor:
    """left @ B @ right for every block B of (n, br, bc), as two plain 2-D matrix products."""
    n, br, bc = blocks.shape
    y = (blocks.reshape(n * br, bc) @ right).reshape(n, br, bc)
    y = left @ y.permute(1, 0, 2).reshape(br, n * bc)
    return y.reshape(br, n, bc).permute(1, 0, 2).contiguous()


def _to_chunks(x: Tensor, g: _Geometry, transform: str) -> Tensor:
    r, c = g.padded
    m = torch.nn.functional.pad(x.reshape(g.rows, g.cols).to(torch.float32), (0, c - g.cols, 0, r - g.rows))
    blocks = m.reshape(r // g.br, g.br, c // g.bc, g.bc).permute(0, 2, 1, 3).reshape(g.chunks, g.br, g.bc)
    if transform == "dct":
        blocks = _sandwich(blocks, _dct_matrix(g.br), _dct_matrix(g.bc).t())
    return blocks.reshape(g.chunks, g.size)


def _from_chunks(ch: Tensor, g: _Geometry, transform: str, shape: tuple[int, ...]) -> Tensor:
    r, c = g.padded
    blocks = ch.reshape(g.chunks, g.br, g.bc)
    if transform == "dct":
        blocks = _sandwich(blocks, _dct_matrix(g.br).t(), _dct_matrix(g.bc))
    m = blocks.reshape(r // g.br, c // g.bc, g.br, g.bc).permute(0, 2, 1, 3).reshape(r, c)[: g.rows, : g.cols]
    return m.reshape(shape).contiguous()


def _pack(v: np.ndarray, width: int) -> bytes:
    """Unsigned integers as `width`-bit fields, most significant bit first, zero-padded to a byte."""
    if width == 0 or v.size == 0:
        return b""
    bits = np.empty((v.size, width), dtype=np.uint8)
    for j in range(width):
        bits[:, j] = (v >> (width - 1 - j)) & 1
    return np.packbits(bits.reshape(-1)).tobytes()


def _unpack(buf: bytes, off: int, count: int, width: int) -> tuple[np.ndarray, int]:
    nbytes = -(-count * width // 8)
    if width == 0 or count == 0:
        return np.zeros(count, dtype=np.int64), off
    if off + nbytes > len(buf):
        raise ValueError("payload truncated")
    bits = np.unpackbits(np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=off))[: count * width]
    weights = (1 << np.arange(width - 1, -1, -1, dtype=np.int64))
    return bits.reshape(count, width).astype(np.int64) @ weights, off + nbytes


def _scale_dtype(scales: Tensor) -> int:
    nz = scales[scales > 0]
    fp16 = bool(nz.numel() == 0 or (nz.min() >= torch.finfo(torch.float16).tiny and nz.max() <= torch.finfo(torch.float16).max))
    return _SCALE_FP16 if fp16 else _SCALE_BF16


def _round16(v: Tensor, dtype_code: int) -> tuple[Tensor, bytes]:
    h = v.to(torch.float16 if dtype_code == _SCALE_FP16 else torch.bfloat16)
    return h.to(torch.float32), h.view(torch.int16).numpy().astype("<i2").tobytes()


def _read16(buf: bytes, off: int, count: int, dtype_code: int) -> tuple[Tensor, int]:
    if dtype_code not in (_SCALE_FP16, _SCALE_BF16):
        raise ValueError(f"unknown scale dtype {dtype_code}")
    if off + 2 * count > len(buf):
        raise ValueError("payload truncated")
    raw = torch.from_numpy(np.frombuffer(buf, dtype="<i2", count=count, offset=off).astype(np.int16))
    h = raw.view(torch.float16 if dtype_code == _SCALE_FP16 else torch.bfloat16)
    return h.to(torch.float32), off + 2 * count


def _encode_chunks(ch: Tensor, k: int, values: str) -> tuple[bytes, int]:
    """One tensor's section: (bytes, the byte count its section sizes add up to)."""
    n = ch.shape[0]
    mags, order = torch.sort(ch.abs(), dim=1, descending=True, stable=True)  # ties: the lower slot first
    top, top_mag = order[:, :k], mags[:, :k].double()
    slots, rank = torch.sort(top, dim=1)  # ascending slots; rank[:, j] = magnitude rank of slot j
    vals = ch.gather(1, slots)
    if values == "2bit":
        csum = top_mag.cumsum(dim=1)
        total = csum[:, -1:]
        if k > 1:
            s = torch.arange(1, k, dtype=torch.float64)
            head = csum[:, :-1]
            best = torch.argmax(head.square() / s + (total - head).square() / (k - s), dim=1) + 1  # 2-means split
        else:
            best = torch.ones(n, dtype=torch.int64)
        hi = csum.gather(1, (best - 1)[:, None])[:, 0] / best
        lo = torch.where(best < k, (total[:, 0] - csum.gather(1, (best - 1)[:, None])[:, 0]) / (k - best).clamp(min=1), hi)
        levels = torch.stack([hi, lo], dim=1).to(torch.float32)
        dt = _scale_dtype(levels)
        _, scale_bytes = _round16(levels.reshape(-1), dt)
        sign = (vals < 0).to(torch.int64)
        level = (rank < best[:, None]).to(torch.int64)
        codes = (sign * 2 + level).reshape(-1).numpy()
        width = 2
    else:
        width = 4 if values == "int4" else 8
        qmax = (1 << (width - 1)) - 1
        absmax = vals.abs().amax(dim=1)
        dt = _scale_dtype(absmax / qmax)
        scales, scale_bytes = _round16(absmax / qmax, dt)
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        q = torch.round(vals / safe[:, None]).clamp(-qmax, qmax).to(torch.int64)
        codes = (q + qmax).reshape(-1).numpy()
    prev = torch.cat([torch.full((n, 1), -1, dtype=torch.int64), slots[:, :-1]], dim=1)
    gaps = (slots - prev - 1).reshape(-1).numpy()
    count = gaps.size
    rice = min(range(24), key=lambda b: count * (b + 1) + int((gaps >> b).sum()))
    low = gaps & ((1 << rice) - 1)
    quot = gaps >> rice
    unary_bits = np.ones(int(quot.sum()) + count, dtype=np.uint8)
    unary_bits[np.cumsum(quot + 1) - 1] = 0
    unary = np.packbits(unary_bits).tobytes()
    parts = [_HEADER.pack(k, rice, dt, len(unary)), scale_bytes, _pack(codes, width), _pack(low, rice), unary]
    nbytes = (_HEADER.size + len(scale_bytes) + -(-count * width // 8) + -(-count * rice // 8)
              + -(-(int(quot.sum()) + count) // 8))
    return b"".join(parts), nbytes


def _decode_chunks(buf: bytes, off: int, n: int, c: int, values: str) -> tuple[Tensor, int]:
    if off + _HEADER.size > len(buf):
        raise ValueError("payload truncated")
    k, rice, dt, unary_len = _HEADER.unpack_from(buf, off)
    off += _HEADER.size
    if not 1 <= k <= c or rice >= 24:
        raise ValueError(f"bad chunk header: k={k} of {c}, rice={rice}")
    count = n * k
    if values == "2bit":
        levels, off = _read16(buf, off, 2 * n, dt)
        codes, off = _unpack(buf, off, count, 2)
        codes_t = torch.from_numpy(codes).reshape(n, k)
        lv = levels.reshape(n, 2)
        mag = torch.where((codes_t & 1) == 1, lv[:, :1], lv[:, 1:])
        vals = torch.where((codes_t >> 1) == 1, -mag, mag)
    else:
        width = 4 if values == "int4" else 8
        qmax = (1 << (width - 1)) - 1
        scales, off = _read16(buf, off, n, dt)
        codes, off = _unpack(buf, off, count, width)
        vals = (torch.from_numpy(codes).reshape(n, k) - qmax).to(torch.float32) * scales[:, None]
    low, off = _unpack(buf, off, count, rice)
    if off + unary_len > len(buf):
        raise ValueError("payload truncated")
    ubits = np.unpackbits(np.frombuffer(buf, dtype=np.uint8, count=unary_len, offset=off))
    ends = np.flatnonzero(ubits == 0)[:count]
    if ends.size < count:
        raise ValueError("unary section too short")
    quot = np.diff(ends, prepend=-1) - 1
    gaps = torch.from_numpy((quot << rice) | low).reshape(n, k)
    slots = (gaps + 1).cumsum(dim=1) - 1
    if int(slots[:, -1].max()) >= c:
        raise ValueError("a kept slot lies outside its chunk")
    out = torch.zeros(n, c, dtype=torch.float32)
    out.scatter_(1, slots, vals.to(torch.float32))
    return out, off + unary_len


def baseline_encode(x: Mapping[str, Tensor], codec: SparseCodec) -> tuple[bytes, int]:
    """The payload of `x` under `codec`, and its byte count as the format's sections add it up."""
    parts, total = [], 0
    for name in sorted(x, key=lambda s: s.encode()):
        t = x[name].detach().cpu()
        g = _geometry(tuple(t.shape), codec)
        part, nbytes = _encode_chunks(_to_chunks(t, g, codec.transform), _kept(g, codec), codec.values)
        parts.append(part)
        total += nbytes
    return b"".join(parts), total


def baseline_decode(payload: bytes, shapes: Mapping[str, tuple[int, ...]], codec: SparseCodec) -> dict[str, Tensor]:
    """Decode a `baseline_encode` payload; the shapes and the codec's kind are public. k comes from the bytes."""
    out: dict[str, Tensor] = {}
    off = 0
    for name in sorted(shapes, key=lambda s: s.encode()):
        shape = tuple(shapes[name])
        g = _geometry(shape, codec)
        ch, off = _decode_chunks(payload, off, g.chunks, g.size, codec.values)
        out[name] = _from_chunks(ch, g, codec.transform, shape)
    if off != len(payload):
        raise ValueError(f"{len(payload) - off} trailing bytes")
    return out


def largest_k(x: Mapping[str, Tensor], budget: int, transform: str, values: str, hi: int | None = None) -> int:
    """The largest k (at most ``hi``, default a full chunk) whose ``baseline_encode`` payload of ``x`` is
    at most ``budget`` bytes (0: not even k = 1 fits), by bisection: the payload grows with k."""
    lo, best = 1, 0
    hi = SparseCodec(transform, 1, values).full if hi is None else hi
    while lo <= hi:
        mid = (lo + hi) // 2
        if len(baseline_encode(x, SparseCodec(transform, mid, values))[0]) <= budget:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best
