"""A store that reports upload progress: each put is fed to the backend in pieces, and after each
piece `report(done, total)` is called (done == total once it is stored).

Put in front of a node's store by veriloco/logs.with_upload_progress on a readable console, so an
audit file of many megabytes shows a byte bar (or, off a terminal, a periodic line) while it goes
up. Content and CIDs are unchanged: a backend stores the concatenation of the pieces, whatever
their sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from protocol.store.backends import Cid, Metered, Store

PIECE = 1 << 20  # bytes per reported piece

Report = Callable[[int, int], None]


class ReportedStore(Metered):
    """`inner`, whose uploads call `report(done, total)`; everything else passes through (as Metered's)."""

    def __init__(self, inner: Store, report: Report) -> None:
        super().__init__(inner)
        self.report = report

    def put(self, data: bytes | bytearray | memoryview) -> Cid:
        view = memoryview(data).cast("B")
        return self._put(iter([view]), view.nbytes)

    def put_stream(self, chunks: Iterable[bytes | bytearray | memoryview]) -> Cid:
        return self._put(iter(chunks), None)

    def _put(self, chunks: Iterator[bytes | bytearray | memoryview], size: int | None) -> Cid:
        """`size` when known up front; else the total grows with each chunk seen (exact for one chunk)."""
        seen = [0, 0]  # bytes handed on, bytes known so far

        def pieces() -> Iterator[memoryview]:
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                seen[1] += view.nbytes
                for i in range(0, view.nbytes, PIECE):
                    self.report(seen[0], size if size is not None else seen[1])
                    piece = view[i : i + PIECE]
                    seen[0] += piece.nbytes
                    yield piece

        try:
            return Metered.put_stream(self, pieces())
        finally:
            self.report(seen[0], seen[0])  # over, stored or not: the bar goes away
