"""Codec benchmark: veriloco's compressor against torch's PowerSGD hook at equal bytes.

Pseudo-gradients are real: the GPT from protocol/model.py trains on the built-in corpus for
`--rounds` rounds of `--h` AdamW steps, and each round's start - end is one pseudo-gradient. Each
compressor sees the same sequence and keeps its own error feedback (PowerSGD also its warm start),
as it would in training. PowerSGD runs as torch ships it: `powerSGD_hook` registered on a
DistributedDataParallel model in a one-process gloo group, with the gradient set to the
pseudo-gradient. For each PowerSGD rank, veriloco gets the largest rank whose payload is no bigger.

    .venv/bin/python -m benchmarks.codec --preset small --out benchmarks/results/codec.json

Prints a Markdown table and writes JSON (machine, versions, settings, per-method numbers, ratios).
Throughput is dense float32 MB per CPU-second of the process (all threads), the fastest of the
rounds; PowerSGD's encode and decode run fused inside its hook, so it has one round-trip figure,
which includes a trivial backward pass.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from protocol.data import batch, default_corpus
from protocol.formats.payload import decode
from protocol.model import preset
from trainer.compress import CompressionConfig, EpochRecord, adapt, compress
from trainer.inner import PARAM, InnerConfig, init_state, section, train_step

Deltas = list[dict[str, Tensor]]

# Codec timings use the process's CPU time (all its threads): on a shared machine, wall time
# measures the neighbours as much as the codec. With one torch thread the two agree when idle.
_clock = time.process_time


def pseudo_gradients(preset_name: str, rounds: int, h: int, batch_size: int, seed: int) -> tuple[Deltas, float]:
    """`rounds` consecutive pseudo-gradients of one trainer (start - end params), and seconds per step."""
    cfg = preset(preset_name)
    inner = InnerConfig(lr=1e-3, warmup_steps=min(20, rounds * h // 4), total_steps=max(1, rounds * h))
    corpus = default_corpus()
    state = init_state(cfg, seed)
    deltas: Deltas = []
    t0 = time.perf_counter()
    for r in range(rounds):
        start = {k: v.clone() for k, v in section(state, PARAM).items()}
        for k in range(h):
            state, _ = train_step(state, batch(corpus, seed, r, 0, k, batch_size, cfg.seq_len), cfg, inner)
        end = section(state, PARAM)
        deltas.append({n: start[n] - end[n] for n in start})
    return deltas, (time.perf_counter() - t0) / (rounds * h)


@dataclass
class Outcome:
    bytes_per_round: int
    rel_errors: list[float]  # per round, ||x - c(x)|| / ||x|| with x = delta + own error buffer
    cumulative_error: float  # ||sum delta - sum decoded|| / ||sum delta||
    encode_s: float  # fastest round: the machine is shared, the minimum is the least disturbed
    decode_s: float


def _norm2(d: dict[str, Tensor]) -> float:
    return sum(float(v.double().square().sum()) for v in d.values())


def _evaluate(deltas: Deltas, step: Callable[[dict[str, Tensor]], tuple[dict[str, Tensor], int, float, float]]) -> Outcome:
    """Run a compressor with error feedback over the sequence: step(x) -> (decoded, bytes, enc_s, dec_s)."""
    ef = {k: torch.zeros_like(v) for k, v in deltas[0].items()}
    sum_delta = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in ef.items()}
    sum_dec = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in ef.items()}
    errors: list[float] = []
    enc, dec = math.inf, math.inf
    size = 0
    for d in deltas:
        x = {k: d[k] + ef[k] for k in d}
        out, size, e_s, d_s = step(x)
        enc, dec = min(enc, e_s), min(dec, d_s)
        ef = {k: x[k] - out[k] for k in x}
        errors.append(math.sqrt(_norm2(ef) / _norm2(x)))
        for k in d:
            sum_delta[k] += d[k].double()
            sum_dec[k] += out[k].double()
    cum = math.sqrt(_norm2({k: sum_delta[k] - sum_dec[k] for k in d}) / _norm2(sum_delta))
    return Outcome(size, errors, cum, enc, dec)


def run_ours(deltas: Deltas, rank: int, cfg: CompressionConfig, seed: int) -> Outcome:
    shapes = {k: tuple(v.shape) for k, v in deltas[0].items()}
    counter = iter(range(10**9))

    def step(x: dict[str, Tensor]) -> tuple[dict[str, Tensor], int, float, float]:
        t0 = _clock()
        # error feedback is applied by _evaluate, identically for both codecs: pass an empty buffer
        c = compress(x, {}, rank, seed + next(counter), cfg)
        t1 = _clock()
        out = decode(c.payload, shapes)
        t2 = _clock()
        return out, len(c.payload), t1 - t0, t2 - t1

    return _evaluate(deltas, step)


def run_adaptive(deltas: Deltas, cfg: CompressionConfig, seed: int) -> list[dict[str, object]]:
    """The adaptive rule over the sequence (one trainer, history lag 1): rank, H and error per round."""
    history: list[EpochRecord] = []
    ef: dict[str, Tensor] = {}
    out: list[dict[str, object]] = []
    for i, d in enumerate(deltas):
        rank, h = adapt(history, cfg)
        c = compress(d, ef, rank, seed + i, cfg)
        ef = c.new_ef
        need = c.stats.profile.needed_rank(cfg.energy_target)
        out.append({"round": i + 1, "rank": rank, "h": h, "bytes": c.stats.payload_bytes,
                    "needed_rank": need, "rel_error": c.stats.rel_error})
        history.append(EpochRecord(rank, h, (c.stats.profile,)))
    return out


def payload_size(deltas: Deltas, rank: int, cfg: CompressionConfig) -> int:
    return len(compress(deltas[0], {}, rank, 0, cfg).payload)


def rank_for_budget(deltas: Deltas, budget: int, cfg: CompressionConfig, hi: int) -> int:
    """The largest rank whose payload fits in `budget` bytes (payload size grows with rank)."""
    lo, best = 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if payload_size(deltas, mid, cfg) <= budget:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


class _Holder(nn.Module):
    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        super().__init__()
        self.names = sorted(shapes)
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(shapes[n])) for n in self.names])

    def forward(self, g: dict[str, Tensor]) -> Tensor:
        """A loss whose gradient with respect to each parameter is exactly g[name]."""
        return torch.stack([(p * g[n]).sum() for n, p in zip(self.names, self.ps, strict=True)]).sum()


def psgd_bytes(shapes: dict[str, tuple[int, ...]], rank: int, min_rate: float) -> int:
    """What the hook sends per round: P and Q (float32) for compressed matrices, other tensors as float32."""
    total = 0
    for s in shapes.values():
        numel = math.prod(s)
        if len(s) > 1:
            n, m = s[0], numel // s[0]
            r = min(n, m, rank)
            ok, _, _ = psgd._should_compress(n, m, r, min_rate)
            if ok:
                total += 4 * r * (n + m)
                continue
        total += 4 * numel
    return total


def run_powersgd(deltas: Deltas, rank: int, seed: int) -> Outcome:
    """torch's powerSGD_hook on DDP, one gloo process; the hook keeps its own error feedback and warm start."""
    shapes = {k: tuple(v.shape) for k, v in deltas[0].items()}
    holder = _Holder(shapes)
    # One bucket: the hook's callbacks block on nested gloo allreduces, and two buckets in flight
    # at once can deadlock gloo's worker threads on a loaded machine.
    ddp = nn.parallel.DistributedDataParallel(holder, bucket_cap_mb=4096)
    state = psgd.PowerSGDState(
        process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2,
        use_error_feedback=True, warm_start=True, random_seed=seed,
    )
    ddp.register_comm_hook(state, psgd.powerSGD_hook)

    def grads_of(g: dict[str, Tensor]) -> tuple[dict[str, Tensor], float]:
        for p in holder.ps:
            p.grad = None
        t0 = _clock()
        ddp(g).backward()  # DDP arms its reducer in forward; backward then runs the hook per bucket
        dt = _clock() - t0
        return {n: p.grad.detach().clone() for n, p in zip(holder.names, holder.ps, strict=True)}, dt  # type: ignore[union-attr]

    zeros = {k: torch.zeros(s) for k, s in shapes.items()}
    for _ in range(2):  # the hook allreduces uncompressed until start_powerSGD_iter
        grads_of(zeros)
    # the hook applies error feedback itself: feed plain deltas, and account for its buffer below
    own_ef = {k: torch.zeros_like(v) for k, v in zeros.items()}
    size = psgd_bytes(shapes, rank, state.min_compression_rate)

    def step(x: dict[str, Tensor]) -> tuple[dict[str, Tensor], int, float, float]:
        # _evaluate hands x = delta + its buffer; the hook adds its own buffer, which equals ours,
        # so pass x - own_ef (= delta) and keep the two in lockstep.
        delta = {k: x[k] - own_ef[k] for k in x}
        out, dt = grads_of(delta)
        for k, v in x.items():
            own_ef[k] = v - out[k]
        return out, size, dt, 0.0

    return _evaluate(deltas, step)


# --- Baselines at equal bytes (issue 33): SparseLoCo-style top-k and DeMo-style chunked-DCT top-k ---
#
# Written from the papers' descriptions (SparseLoCo, arXiv 2508.15706: chunk-wise top-k of the
# pseudo-gradient plus error feedback, 2-bit values; DeMo, arXiv 2411.19870: top-k of chunked DCT
# coefficients). Neither is a protocol codec: the payload below is this benchmark's own, deterministic
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


@dataclass
class BaselineOutcome:
    outcome: Outcome
    sizes: list[int]  # payload bytes of each round (entropy-coded indices: they vary a little)


def run_baseline(deltas: Deltas, codec: SparseCodec) -> BaselineOutcome:
    shapes = {k: tuple(v.shape) for k, v in deltas[0].items()}
    sizes: list[int] = []

    def step(x: dict[str, Tensor]) -> tuple[dict[str, Tensor], int, float, float]:
        t0 = _clock()
        payload, nbytes = baseline_encode(x, codec)
        t1 = _clock()
        out = baseline_decode(payload, shapes, codec)
        t2 = _clock()
        assert nbytes == len(payload)
        sizes.append(nbytes)
        return out, nbytes, t1 - t0, t2 - t1

    return BaselineOutcome(_evaluate(deltas, step), sizes)


def fit_baseline(deltas: Deltas, budget: int, transform: str, values: str) -> tuple[SparseCodec, BaselineOutcome] | None:
    """The largest k whose payload fits `budget` in every round (searched on round 1, then lowered
    while any round with error feedback overflows), and its outcome over the rounds."""
    full = SparseCodec(transform, 1, values).full
    lo, hi, best = 1, full, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if len(baseline_encode(deltas[0], SparseCodec(transform, mid, values))[0]) <= budget:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    while best >= 1:
        codec = SparseCodec(transform, best, values)
        res = run_baseline(deltas, codec)
        if max(res.sizes) <= budget:
            return codec, res
        best -= max(1, best // 200)
    return None


BASELINES = {  # name -> (transform, values)
    "sparseloco top-k 2-bit": ("topk", "2bit"),
    "demo dct top-k int8": ("dct", "int8"),
    "demo dct top-k int4": ("dct", "int4"),
    "demo dct top-k 2-bit": ("dct", "2bit"),
}


def _baseline_summary(o: Outcome, setting: Mapping[str, object], sizes: list[int], dense_mb: float) -> dict[str, object]:
    out = _summary(o, 0, dense_mb)
    del out["rank"]
    out.update(setting)
    out["bytes"] = max(sizes)
    out["bytes_per_round"] = sizes
    out["compression_x"] = dense_mb * 1e6 / max(sizes)
    return out


def run_baselines(args: argparse.Namespace, deltas: Deltas, step_s: float, load0: float) -> dict[str, object]:
    """Every codec at the shipped codec's payload sizes for `--budget-ranks` (rank 128: what small.toml sends)."""
    shapes = {k: tuple(v.shape) for k, v in deltas[0].items()}
    dense_mb = 4 * sum(math.prod(s) for s in shapes.values()) / 1e6
    shipped = CompressionConfig(bits=4)
    names = [n.strip() for n in args.baselines.split(",")] if args.baselines != "all" else list(BASELINES)
    budgets: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        _init_group(tmp)
        try:
            for brank in (int(r) for r in args.budget_ranks.split(",")):
                budget = payload_size(deltas, brank, shipped)
                methods: dict[str, dict[str, Any]] = {
                    "veriloco int4 (shipped)": _summary(run_ours(deltas, brank, shipped, args.seed), brank, dense_mb)
                }
                prank = max((r for r in range(1, 257) if psgd_bytes(shapes, r, 2.0) <= budget), default=0)
                if prank:
                    methods["powersgd"] = _summary(run_powersgd(deltas, prank, args.seed), prank, dense_mb)
                for name in names:
                    transform, values = BASELINES[name]
                    fit = fit_baseline(deltas, budget, transform, values)
                    if fit is None:
                        continue
                    codec, res = fit
                    setting = {"k_per_chunk": codec.k, "chunk": codec.full,
                               "density": codec.k / codec.full, "value_bits": codec.value_bits}
                    methods[name] = _baseline_summary(res.outcome, setting, res.sizes, dense_mb)
                    print(f"budget rank {brank}: {name} k={codec.k} done", file=sys.stderr, flush=True)
                ship = methods["veriloco int4 (shipped)"]
                for v in methods.values():
                    v["error_vs_shipped"] = v["rel_error_mean"] / ship["rel_error_mean"]
                    v["cumulative_error_vs_shipped"] = v["cumulative_error"] / ship["cumulative_error"]
                budgets.append({
                    "budget_rank": brank, "budget_bytes": budget, "methods": methods,
                    "best_rel_error_mean": min(methods, key=lambda m: methods[m]["rel_error_mean"]),
                    "best_cumulative_error": min(methods, key=lambda m: methods[m]["cumulative_error"]),
                })
                print(f"budget rank {brank} ({budget:,} bytes) done", file=sys.stderr, flush=True)
        finally:
            dist.destroy_process_group()
    return {
        "benchmark": "codec-baselines",
        "command": " ".join(["python -m benchmarks.codec", *(sys.argv[1:])]),
        "machine": {"platform": platform.platform(), "cpu": _cpu_model(), "cpus": os.cpu_count(),
                    "threads": args.threads, "load_average_1m": {"start": load0, "end": os.getloadavg()[0]}},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "settings": {"preset": args.preset, "rounds": args.rounds, "h": args.h, "batch_size": args.batch_size,
                     "seed": args.seed, "dense_mb": dense_mb, "inner_step_s": step_s,
                     "topk_chunk": BASELINE_CHUNK, "dct_block": DCT_BLOCK, "error_feedback": "plain (beta = 1), the same for every codec"},
        "budgets": budgets,
    }


def baselines_markdown(result: dict[str, object]) -> str:
    s = result["settings"]
    assert isinstance(s, dict)
    lines = [
        f"Codecs at equal bytes on `{s['preset']}` pseudo-gradients ({s['dense_mb']:.1f} MB fp32, {s['rounds']} rounds x H={s['h']})",
        "",
        ("| budget (shipped rank) | bytes/round (max) | method | setting | compression | rel. error (mean) "
         "| rel. error (round 1) | cumulative error | error vs shipped | cumulative vs shipped |"),
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for b in result["budgets"]:  # type: ignore[attr-defined]
        for name, v in b["methods"].items():
            if "k_per_chunk" in v:
                setting = f"k={v['k_per_chunk']}/{v['chunk']} ({100 * v['density']:.1f}%), {v['value_bits']}-bit"
            else:
                setting = f"rank {v['rank']}"
            best = name == b["best_rel_error_mean"]
            err = f"**{v['rel_error_mean']:.3f}**" if best else f"{v['rel_error_mean']:.3f}"
            cum = f"**{v['cumulative_error']:.3f}**" if name == b["best_cumulative_error"] else f"{v['cumulative_error']:.3f}"
            lines.append(
                f"| {b['budget_rank']} ({b['budget_bytes']:,}) | {v['bytes']:,} | {name} | {setting} | {v['compression_x']:.0f}x "
                f"| {err} | {v['rel_error_first']:.3f} | {cum} | {v['error_vs_shipped']:.2f} | {v['cumulative_error_vs_shipped']:.2f} |"
            )
    return "\n".join(lines)


def _init_group(tmp: str) -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small", choices=["tiny", "small", "gpt2-124m"])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--h", type=int, default=16, help="inner steps per round")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--ranks", default="1,2,4,8", help="PowerSGD ranks to compare at")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cache", type=Path, default=None, help="directory to keep the trained pseudo-gradients in")
    ap.add_argument("--baselines", default=None, metavar="NAMES",
                    help="instead: the SparseLoCo- and DeMo-style baselines at equal bytes ('all' or names, comma-separated)")
    ap.add_argument("--budget-ranks", default="128,64,32,12",
                    help="with --baselines: byte budgets, as the shipped int4 codec's payload at these ranks")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]  # the machine may be shared: timings are only as clean as this

    key = f"{args.preset}-r{args.rounds}-h{args.h}-b{args.batch_size}-s{args.seed}"
    cache = args.cache / f"codec-deltas-{key}.pt" if args.cache else None
    if cache is not None and cache.exists():
        saved = torch.load(cache)
        deltas, step_s = saved["deltas"], saved["inner_step_s"]
    else:
        deltas, step_s = pseudo_gradients(args.preset, args.rounds, args.h, args.batch_size, args.seed)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"deltas": deltas, "inner_step_s": step_s}, cache)
    if args.baselines:
        base = run_baselines(args, deltas, step_s, load0)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(base, indent=2, sort_keys=True) + "\n")
        print(baselines_markdown(base))
        return 0
    shapes = {k: tuple(v.shape) for k, v in deltas[0].items()}
    dense_mb = 4 * sum(math.prod(s) for s in shapes.values()) / 1e6
    variants = {
        "veriloco int4": CompressionConfig(bits=4),
        "veriloco int8": CompressionConfig(bits=8),
        "veriloco fp32": CompressionConfig(bits=32),
    }
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        _init_group(tmp)
        try:
            for prank in (int(r) for r in args.ranks.split(",")):
                ps = run_powersgd(deltas, prank, args.seed)
                row: dict[str, object] = {"powersgd_rank": prank, "budget_bytes": ps.bytes_per_round, "methods": {}}
                methods: dict[str, dict[str, object]] = {"powersgd": _summary(ps, prank, dense_mb)}
                for name, cfg in variants.items():
                    r = rank_for_budget(deltas, ps.bytes_per_round, cfg, hi=64 * prank)
                    if r == 0:
                        continue
                    methods[name] = _summary(run_ours(deltas, r, cfg, args.seed), r, dense_mb)
                row["methods"] = methods
                rows.append(row)
                print(f"PowerSGD rank {prank} done", file=sys.stderr, flush=True)
        finally:
            dist.destroy_process_group()

    # the sketch's accuracy/cost dials, at the largest compared budget's int4 rank
    sketch: list[dict[str, object]] = []
    if rows:
        last = rows[-1]["methods"]
        assert isinstance(last, dict)
        r = int(last["veriloco int4"]["rank"])
        for pi, ov in ((0, 0), (1, 0), (1, 4), (2, 8)):
            o = run_ours(deltas, r, CompressionConfig(power_iters=pi, oversample=ov), args.seed)
            sketch.append({"power_iters": pi, "oversample": ov, **_summary(o, r, dense_mb)})

    adaptive = run_adaptive(deltas, CompressionConfig(), args.seed)

    result: dict[str, object] = {
        "benchmark": "codec",
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"platform": platform.platform(), "cpu": _cpu_model(), "cpus": os.cpu_count(),
                    "threads": args.threads, "load_average_1m": {"start": load0, "end": os.getloadavg()[0]}},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "settings": {"preset": args.preset, "rounds": args.rounds, "h": args.h, "batch_size": args.batch_size,
                     "seed": args.seed, "dense_mb": dense_mb, "inner_step_s": step_s},
        "rows": rows,
        "ratios": _ratios(rows),
        "sketch_settings": sketch,
        "adaptive": adaptive,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(markdown(result))
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _summary(o: Outcome, rank: int, dense_mb: float) -> dict[str, object]:
    return {
        "rank": rank,
        "bytes": o.bytes_per_round,
        "compression_x": dense_mb * 1e6 / o.bytes_per_round,
        "rel_error_first": o.rel_errors[0],
        "rel_error_mean": sum(o.rel_errors) / len(o.rel_errors),
        "rel_errors": o.rel_errors,
        "cumulative_error": o.cumulative_error,
        "encode_mb_s": dense_mb / o.encode_s if o.encode_s > 0 else None,
        "decode_mb_s": dense_mb / o.decode_s if o.decode_s > 0 else None,
        "roundtrip_mb_s": dense_mb / (o.encode_s + o.decode_s),
    }


def _ratios(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    out = []
    for row in rows:
        m = row["methods"]
        assert isinstance(m, dict)
        base = m["powersgd"]
        for name, v in m.items():
            if name == "powersgd":
                continue
            out.append({
                "powersgd_rank": row["powersgd_rank"], "method": name,
                "bytes_vs_powersgd": v["bytes"] / base["bytes"],
                "error_vs_powersgd": v["rel_error_mean"] / base["rel_error_mean"],
                "cumulative_error_vs_powersgd": v["cumulative_error"] / base["cumulative_error"],
                "roundtrip_speed_vs_powersgd": v["roundtrip_mb_s"] / base["roundtrip_mb_s"],
            })
    return out


def markdown(result: dict[str, object]) -> str:
    s = result["settings"]
    assert isinstance(s, dict)
    title = (
        f"Codec on `{s['preset']}` pseudo-gradients ({s['dense_mb']:.1f} MB fp32, {s['rounds']} rounds x "
        f"H={s['h']}), {result['machine']['threads']} thread(s), torch {result['versions']['torch']}, "  # type: ignore[index]
        f"load average {result['machine']['load_average_1m']['start']:.1f} on {result['machine']['cpus']} CPUs"  # type: ignore[index]
    )
    head = (
        "| PowerSGD rank | method | rank | bytes/round | compression | rel. error (mean) | rel. error (round 1) "
        "| cumulative error | encode MB/s | decode MB/s | round trip MB/s | error vs PowerSGD |"
    )
    lines = [title, "", head, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:  # type: ignore[attr-defined]
        base = row["methods"]["powersgd"]
        for name, v in row["methods"].items():
            enc = f"{v['encode_mb_s']:.0f}" if v["encode_mb_s"] and name != "powersgd" else "-"
            dec = f"{v['decode_mb_s']:.0f}" if v["decode_mb_s"] else "-"
            lines.append(
                f"| {row['powersgd_rank']} | {name} | {v['rank']} | {v['bytes']:,} | {v['compression_x']:.0f}x "
                f"| {v['rel_error_mean']:.3f} | {v['rel_error_first']:.3f} | {v['cumulative_error']:.3f} "
                f"| {enc} | {dec} | {v['roundtrip_mb_s']:.0f} | {v['rel_error_mean'] / base['rel_error_mean']:.2f} |"
            )
    sketch = result.get("sketch_settings") or []
    if sketch:
        lines += [
            "",
            "Sketch settings (veriloco int4, same rank): power iterations and oversampling",
            "",
            "| power iters | oversample | rank | rel. error (mean) | cumulative error | encode MB/s |",
            "|---|---|---|---|---|---|",
        ]
        for v in sketch:  # type: ignore[attr-defined]
            lines.append(
                f"| {v['power_iters']} | {v['oversample']} | {v['rank']} | {v['rel_error_mean']:.3f} "
                f"| {v['cumulative_error']:.3f} | {v['encode_mb_s']:.0f} |"
            )
    adaptive = result.get("adaptive") or []
    if adaptive:
        lines += [
            "",
            "Adaptive rule over the same rounds (defaults; one trainer, the previous round's profile)",
            "",
            "| round | rank | H | bytes | needed rank (sketch) | rel. error |",
            "|---|---|---|---|---|---|",
        ]
        for v in adaptive:  # type: ignore[attr-defined]
            need = v["needed_rank"] if v["needed_rank"] is not None else f"> {v['rank']}"
            lines.append(f"| {v['round']} | {v['rank']} | {v['h']} | {v['bytes']:,} | {need} | {v['rel_error']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
