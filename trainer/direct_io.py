"""Write-once files past the page cache: a trainer's checkpoints and its audit-answer log.

A trainer writes a checkpoint every few steps and, at large batches, tens of MB of answer log every
step, and reads back only the little an audit draws. A buffered write copies every byte into the
kernel's page cache: on this project's 2-core VM that is about a tenth of a `small` step's CPU for one
41 MB log step, and an epoch of log (10 GB at 8 x 128 tokens) then evicts the pages the trainer does
reuse. With ``O_DIRECT`` the device reads the bytes from an aligned buffer, and the only CPU spent is
one copy into that buffer (``benchmarks/diskwrite.py`` measures both). Where the flag is missing
(macOS, Windows) or refused (tmpfs, some network file systems) the same bytes are written buffered.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections.abc import Iterable
from pathlib import Path

ALIGN = 4096  # O_DIRECT wants buffers, offsets and lengths aligned to the logical block (512 or 4096)
CHUNK = 16 << 20  # the aligned buffer a file streams through: bounded, whatever the file's size
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_REFUSED = (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)
_local = threading.local()  # one buffer per thread: answers are built on a worker beside training


def write_file(pieces: Iterable[bytes | memoryview], path: Path | str, *, direct: bool = True) -> tuple[int, bool]:
    """Write the concatenation of ``pieces`` to ``path``: past the page cache where the system and
    its file system allow (and ``direct``), else buffered. Returns (bytes written, whether direct)."""
    parts = [memoryview(p).cast("B") for p in pieces]
    if direct and _O_DIRECT:
        try:
            return _direct(parts, path), True
        except OSError as exc:
            if exc.errno not in _REFUSED:
                raise
    with open(path, "wb") as f:
        f.writelines(parts)
    return sum(len(p) for p in parts), False


def _buffer() -> mmap.mmap:
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = mmap.mmap(-1, CHUNK)  # anonymous memory is page-aligned
    return buf


def _direct(parts: list[memoryview], path: Path | str) -> int:
    view = memoryview(_buffer())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_DIRECT, 0o644)
    try:
        total = fill = 0
        for p in parts:
            off = 0
            while off < len(p):
                n = min(CHUNK - fill, len(p) - off)
                view[fill:fill + n] = p[off:off + n]
                fill, off = fill + n, off + n
                if fill == CHUNK:
                    _write_all(fd, view[:CHUNK])
                    fill = 0
            total += len(p)
        if fill:
            padded = -(-fill // ALIGN) * ALIGN
            view[fill:padded] = bytes(padded - fill)
            _write_all(fd, view[:padded])
        os.ftruncate(fd, total)  # the padding of the last block goes
        return total
    finally:
        view.release()
        os.close(fd)


def _write_all(fd: int, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += os.write(fd, data[done:])


__all__ = ["ALIGN", "CHUNK", "write_file"]
