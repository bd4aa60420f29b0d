"""BLAKE3-256 of a tensor's bytes, computed with torch where the tensor lives (issue 31).

A sharded trace commits every block's boundary tensors every step (docs/protocol.md §3.1), hashed
with BLAKE3. Hashing them with the C library means copying them to the host first: on a 124M model at
0.5M tokens that is about 80 GB per step, more than a PCIe link moves in the step itself. Computed
on the device, only 32 bytes per tensor leave it.

This is BLAKE3 exactly (the reference's chunks of 1,024 bytes, its compression function, its tree),
so a digest is the same whichever side computes it: the tests compare it with the library on the
CPU, byte for byte, at every size that changes the tree's shape. Every chunk of every tensor of one
size is compressed at once, as columns of 64-bit integers holding 32-bit words, then the trees are
folded level by level (adjacent pairs, an odd node carried up: that is BLAKE3's left-complete tree).
A step's boundaries are a few sizes cut into many groups, so one pass per size keeps the number of
kernel launches (about 15,000 per pass) independent of the tensor count. On a CPU this is much
slower than the library, which keeps hashing CPU tensors; its speed on a GPU is unmeasured until one
is lent (benchmarks/gpu.py measures it).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

_MASK = 0xFFFFFFFF
_IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
_PERMUTATION = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
CHUNK_START, CHUNK_END, PARENT, ROOT = 1, 2, 4, 8
CHUNK_BYTES, BLOCK_BYTES = 1024, 64
BATCH_CHUNKS = 1 << 18  # chunks compressed at once: 256 MiB of input, 2 GiB of 64-bit words at most


def _rotr(x: torch.Tensor, n: int) -> torch.Tensor:
    return ((x >> n) | (x << (32 - n))) & _MASK


def _g(s: list[torch.Tensor], a: int, b: int, c: int, d: int, mx: torch.Tensor, my: torch.Tensor) -> None:
    s[a] = (s[a] + s[b] + mx) & _MASK
    s[d] = _rotr(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & _MASK
    s[b] = _rotr(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b] + my) & _MASK
    s[d] = _rotr(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & _MASK
    s[b] = _rotr(s[b] ^ s[c], 7)


def _compress(cv: list[torch.Tensor], m: list[torch.Tensor], counter: torch.Tensor, block_len: int, flags: int) -> list[torch.Tensor]:
    """The compression function on columns of inputs: the new chaining values (eight words)."""
    like = cv[0]
    s = [*cv, *(torch.full_like(like, v) for v in _IV[:4]), counter & _MASK, (counter >> 32) & _MASK,
         torch.full_like(like, block_len), torch.full_like(like, flags)]
    m = list(m)
    for r in range(7):
        _g(s, 0, 4, 8, 12, m[0], m[1])
        _g(s, 1, 5, 9, 13, m[2], m[3])
        _g(s, 2, 6, 10, 14, m[4], m[5])
        _g(s, 3, 7, 11, 15, m[6], m[7])
        _g(s, 0, 5, 10, 15, m[8], m[9])
        _g(s, 1, 6, 11, 12, m[10], m[11])
        _g(s, 2, 7, 8, 13, m[12], m[13])
        _g(s, 3, 4, 9, 14, m[14], m[15])
        if r < 6:
            m = [m[i] for i in _PERMUTATION]
    return [s[i] ^ s[i + 8] for i in range(8)]


def _words(data: torch.Tensor) -> torch.Tensor:
    """Little-endian 32-bit words of a byte tensor whose last dimension is a multiple of 4, as int64
    (the storage is little-endian on every machine torch trains on: checked in ``blake3_many``)."""
    return data.view(torch.int32).to(torch.int64) & _MASK


def _column(v: int, like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, v)


def _full_chunk_cvs(words: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Chaining values of full chunks, ``words`` [N, 16 blocks, 16 words], numbered ``counter`` [N]:
    [N, 8]. Never the root (a one-chunk input is its own last chunk)."""
    cv = [_column(v, counter) for v in _IV]
    for blk in range(16):
        flags = (CHUNK_START if blk == 0 else 0) | (CHUNK_END if blk == 15 else 0)
        cv = _compress(cv, [words[:, blk, i] for i in range(16)], counter, BLOCK_BYTES, flags)
    return torch.stack(cv, dim=1)


def _last_chunk_cvs(tails: torch.Tensor, counter: torch.Tensor, root: bool) -> torch.Tensor:
    """Chaining values of last chunks of one length, ``tails`` [k, 0..1,024 bytes], numbered
    ``counter`` [k]: [k, 8] (the output words when ``root``)."""
    k, length = tails.shape
    n_blocks = max(1, -(-length // BLOCK_BYTES))
    padded = torch.zeros(k, n_blocks * BLOCK_BYTES, dtype=torch.uint8, device=tails.device)
    padded[:, :length] = tails
    words = _words(padded).reshape(k, n_blocks, 16)
    cv = [_column(v, counter) for v in _IV]
    for blk in range(n_blocks):
        last = blk == n_blocks - 1
        flags = (CHUNK_START if blk == 0 else 0) | (CHUNK_END if last else 0) | (ROOT if root and last else 0)
        cv = _compress(cv, [words[:, blk, i] for i in range(16)], counter, length - blk * BLOCK_BYTES if last else BLOCK_BYTES, flags)
    return torch.stack(cv, dim=1)


def _fold(cvs: torch.Tensor) -> torch.Tensor:
    """Root outputs of k trees from their chunks' chaining values [k, n >= 2, 8]: [k, 8]."""
    while cvs.shape[1] > 1:
        pairs = cvs.shape[1] // 2
        left, right = cvs[:, 0:2 * pairs:2].reshape(-1, 8), cvs[:, 1:2 * pairs:2].reshape(-1, 8)
        cv = [_column(v, left[:, 0]) for v in _IV]
        m = [left[:, i] for i in range(8)] + [right[:, i] for i in range(8)]
        flags = PARENT | (ROOT if cvs.shape[1] == 2 else 0)
        merged = torch.stack(_compress(cv, m, torch.zeros_like(left[:, 0]), BLOCK_BYTES, flags), dim=1)
        merged = merged.reshape(cvs.shape[0], pairs, 8)
        cvs = torch.cat([merged, cvs[:, 2 * pairs:]], dim=1) if cvs.shape[1] % 2 else merged
    return cvs[:, 0]


def _same_length(data: torch.Tensor) -> torch.Tensor:
    """BLAKE3 outputs of k inputs of one length, ``data`` [k, nbytes] uint8: [k, 8] words."""
    k, nbytes = data.shape
    dev = data.device
    n = max(1, -(-nbytes // CHUNK_BYTES))  # chunks; an empty input is one empty chunk
    full = n - 1
    last = _last_chunk_cvs(data[:, full * CHUNK_BYTES:], torch.full((k,), full, dtype=torch.int64, device=dev), n == 1)
    if n == 1:
        return last
    rows = data[:, : full * CHUNK_BYTES].reshape(k * full, CHUNK_BYTES)  # chunk j of input i at row i * full + j
    counters = torch.arange(full, dtype=torch.int64, device=dev).repeat(k)
    cvs = torch.cat([_full_chunk_cvs(_words(rows[i:i + BATCH_CHUNKS]).reshape(-1, 16, 16), counters[i:i + BATCH_CHUNKS])
                     for i in range(0, k * full, BATCH_CHUNKS)])
    return _fold(torch.cat([cvs.reshape(k, full, 8), last[:, None]], dim=1))


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.zeros(0, dtype=torch.uint8, device=t.device)


def blake3_many(tensors: Sequence[torch.Tensor]) -> list[bytes]:
    """BLAKE3-256 of each tensor's contiguous little-endian storage (what ``protocol.digest``
    hashes), computed on the tensors' devices, one pass per device and byte length: only the digests
    leave them."""
    if sys.byteorder != "little":
        raise RuntimeError("device hashing reads 32-bit words in native order, which is big-endian here: hash on the host")
    flat = [_flat_bytes(t) for t in tensors]
    same: dict[tuple[torch.device, int], list[int]] = {}
    for i, f in enumerate(flat):
        same.setdefault((f.device, f.numel()), []).append(i)
    out: list[bytes] = [b""] * len(flat)
    for idx in same.values():
        words = _same_length(torch.stack([flat[i] for i in idx])).cpu().tolist()
        for i, w in zip(idx, words, strict=True):
            out[i] = b"".join(int(x).to_bytes(4, "little") for x in w)
    return out


def blake3_tensor(t: torch.Tensor) -> bytes:
    """``blake3_many`` of one tensor."""
    return blake3_many([t])[0]


def blake3_bytes(data: torch.Tensor) -> bytes:
    """BLAKE3-256 of a one-dimensional uint8 tensor, on its device."""
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise ValueError(f"expected a 1-D uint8 tensor, got {data.dtype} of shape {tuple(data.shape)}")
    return blake3_tensor(data)
