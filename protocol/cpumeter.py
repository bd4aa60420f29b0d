"""CPU seconds spent at a node's edges (chain RPCs, the content store), so that what a verification
costs splits into the work it audits and the fixed cost of talking to the world (issue 31).

Thread CPU, not wall time: a verifier's wall clock waits on the RPC server and the store, which are
other processes; what it pays itself is the encoding, the HTTP client and the parsing. Nested
measurements count once (the outermost), so a call made inside a measured call is not doubled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class CpuMeter:
    """Calls and the thread CPU seconds spent inside them, cumulative for the process."""

    calls: int = 0
    cpu_s: float = 0.0

    def __post_init__(self) -> None:
        self._depth = threading.local()

    @contextmanager
    def measure(self) -> Iterator[None]:
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        t0 = time.thread_time()
        try:
            yield
        finally:
            self._depth.n = depth
            if depth == 0:
                self.calls += 1
                self.cpu_s += time.thread_time() - t0

    def snapshot(self) -> tuple[int, float]:
        return self.calls, self.cpu_s


# every RPC this process makes (protocol/chain/binding.py `_rpc`): one process is one node
RPC = CpuMeter()
