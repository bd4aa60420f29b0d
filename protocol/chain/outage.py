"""Ride out a chain or store outage: a devnet restart, a node rebooting, a dropped connection.

Node loops are idempotent (every action first looks at the chain and the node's own records), so
the right response to an unreachable endpoint is to wait and run the same step again, not to crash
and lose the in-memory run context. Everything else still propagates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from protocol.chain.errors import ChainUnavailable
from protocol.errors import VerilocoError
from protocol.store.backends import StoreUnavailable

T = TypeVar("T")
TRANSIENT: tuple[type[BaseException], ...] = (ChainUnavailable, StoreUnavailable, ConnectionError, TimeoutError)


class OutageTooLong(VerilocoError):
    """An endpoint stayed unreachable longer than the node is willing to wait."""


def through_outages(step: Callable[[], T], log: Callable[..., None], what: str,
                    max_outage_s: float = 600.0, pause_s: float = 1.0) -> T:
    """Run `step`; while it fails with a transient error, log once, wait and run it again."""
    started: float | None = None
    while True:
        try:
            result = step()
        except TRANSIENT as exc:
            now = time.monotonic()
            if started is None:
                started = now
                log("outage", what=what, error=f"{type(exc).__name__}: {exc}")
            elif now - started > max_outage_s:
                raise OutageTooLong(f"{what}: unreachable for {max_outage_s:.0f} s ({exc}); check the RPC/IPFS endpoint") from exc
            time.sleep(pause_s)
            continue
        if started is not None:
            log("recovered", what=what, seconds=round(time.monotonic() - started, 1))
        return result
