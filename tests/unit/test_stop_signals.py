"""A stop signal that lands inside a finalizer still stops the node (veriloco/nodes.py `stop_signals`).

Python prints and drops an exception raised in `__del__`; a SIGINT that arrived while garbage was
collected used to be lost that way (seen in CI: a Ctrl-C'd verifier ran on until it was killed).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from veriloco.nodes import Stopped, stop_signals

pytestmark = pytest.mark.unit


class SlowToFinalize:
    def __init__(self, inside: threading.Event) -> None:
        self.inside = inside

    def __del__(self) -> None:
        self.inside.set()
        time.sleep(0.3)  # the signal arrives now, in the finalizer


def test_a_signal_inside_a_finalizer_is_delivered_after_it() -> None:
    inside = threading.Event()

    def signal_when_inside() -> None:
        inside.wait(5)
        os.kill(os.getpid(), signal.SIGINT)

    with stop_signals():
        threading.Thread(target=signal_when_inside, daemon=True).start()
        with pytest.raises(Stopped) as stopped:
            obj = SlowToFinalize(inside)
            del obj  # the finalizer runs here, the signal lands inside it
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the node's loop: the stop must reach it
                time.sleep(0.01)
    assert stopped.value.signal == "SIGINT"
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_DFL  # the handlers came back after


def test_a_signal_outside_a_finalizer_stops_at_once() -> None:
    with stop_signals(), pytest.raises(Stopped):
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
        time.sleep(10)
