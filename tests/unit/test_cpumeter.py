"""The CPU meter at a node's edges (protocol/cpumeter.py): thread CPU inside measured calls, a call
made inside another counted once, and exceptions still measured."""

from __future__ import annotations

import time

import pytest

from protocol.cpumeter import CpuMeter

pytestmark = pytest.mark.unit


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_counts_outer_calls_and_their_thread_cpu_once() -> None:
    m = CpuMeter()
    with m.measure():
        _spin(0.02)
        with m.measure():  # a measured call inside a measured call (an RPC retried inside another)
            _spin(0.02)
    assert m.calls == 1 and 0.04 <= m.cpu_s < 1.0
    with pytest.raises(ValueError), m.measure():
        _spin(0.01)
        raise ValueError("a failed call costs CPU too")
    assert m.calls == 2 and m.cpu_s >= 0.05


def test_sleeping_is_not_cpu() -> None:
    """A node waiting on its RPC server or store pays no CPU for the wait (what wall time would count)."""
    m = CpuMeter()
    with m.measure():
        time.sleep(0.05)
    assert m.calls == 1 and m.cpu_s < 0.04
