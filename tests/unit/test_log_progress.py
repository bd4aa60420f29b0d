"""Progress for long waits and large uploads in a node's readable output, and none in its JSON output
(veriloco/logs.py, veriloco/uploads.py)."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest

from protocol.store.backends import LocalStore, Metered
from veriloco.logs import HEARTBEAT_S, NodeLog, TextLog, node_logger, with_upload_progress
from veriloco.uploads import PIECE, ReportedStore

pytestmark = pytest.mark.unit

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _text(out: io.StringIO) -> str:
    return ANSI.sub("", out.getvalue())


def test_off_a_terminal_a_long_wait_repeats_with_time_waited_and_left() -> None:
    out, clock = io.StringIO(), Clock()
    log = NodeLog("trainer", TextLog("trainer", out, clock=clock, ticker=False), out, None)
    until = clock.now + 100
    log("waiting", what="epoch 3 to accept commitments", until=until)
    console = log.console
    assert console is not None
    clock.now += HEARTBEAT_S + 1
    console.tick()
    clock.now += 10
    console.tick()  # within the period: no second line yet
    clock.now += HEARTBEAT_S
    console.tick()
    log("committed", epoch=3)
    clock.now += 5 * HEARTBEAT_S
    console.tick()  # the wait ended with the node's next event
    lines = _text(out).splitlines()
    assert len(lines) == 4, lines
    deadline = time.strftime("%H:%M:%S", time.localtime(until))  # a deadline reads as a clock time
    assert re.search(rf"INFO  trainer +waiting +what=epoch 3 to accept commitments until={deadline}$", lines[0])
    assert re.search(r"waiting +what=epoch 3 to accept commitments waited=31s left=69s$", lines[1])
    assert re.search(r"waiting +what=epoch 3 to accept commitments waited=71s left=29s$", lines[2])
    assert "committed" in lines[3]


def test_a_wait_without_a_deadline_says_how_long_it_has_lasted() -> None:
    out, clock = io.StringIO(), Clock()
    log = TextLog("coordinator", out, clock=clock, ticker=False)
    log("waiting", what="epoch 0 to be audited")
    clock.now += 150
    log.tick()
    last = _text(out).splitlines()[-1]
    assert re.search(r"INFO  coordinator waiting +what=epoch 0 to be audited waited=2m30s$", last), last


def test_json_output_has_the_events_only_no_progress(tmp_path: Path) -> None:
    out = io.StringIO()
    log = node_logger("trainer", "json", stream=out)
    assert getattr(log, "console", None) is None
    store = LocalStore(tmp_path / "store")
    assert with_upload_progress(store, log) is store  # no byte bar behind a JSON console
    log("waiting", what="epoch 1 reveals", until=1_800_000_100.0)
    log("committed", epoch=1)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["waiting", "committed"]
    assert "waited" not in out.getvalue() and "left" not in out.getvalue()


def test_text_output_puts_uploads_through_a_reporting_store(tmp_path: Path) -> None:
    log = node_logger("trainer", "text", stream=io.StringIO())
    store = with_upload_progress(LocalStore(tmp_path / "store"), log)
    assert isinstance(store, ReportedStore)


def test_a_reported_upload_stores_the_same_content_piece_by_piece(tmp_path: Path) -> None:
    plain = LocalStore(tmp_path / "a")
    calls: list[tuple[int, int]] = []
    reported = ReportedStore(LocalStore(tmp_path / "b"), lambda done, total: calls.append((done, total)))
    data = bytes(range(256)) * (PIECE * 7 // 512)  # 3.5 pieces
    cid = reported.put(data)
    assert cid == plain.put(data) and reported.get(cid) == data
    n = len(data)
    assert calls == [(0, n), (PIECE, n), (2 * PIECE, n), (3 * PIECE, n), (n, n)]
    assert reported.sent == n
    calls.clear()
    assert reported.put_stream([data[:PIECE], data[PIECE:]]) == cid  # a stream: the total grows as it goes
    assert calls[-1] == (n, n) and all(d <= t for d, t in calls)
    calls.clear()
    assert Metered(reported).put(data) == cid  # as a trainer holds it: its own traffic meter in front
    assert calls[0] == (0, n) and calls[-1] == (n, n) and len(calls) == 5


def test_off_a_terminal_a_slow_upload_prints_its_progress_and_a_small_one_nothing() -> None:
    out, clock = io.StringIO(), Clock()
    log = TextLog("trainer", out, clock=clock, ticker=False)
    log.uploaded(0, 1000)
    log.uploaded(1000, 1000)
    total = 5_200_000
    log.uploaded(0, total)
    clock.now += HEARTBEAT_S + 1
    log.uploaded(1_040_000, total)
    log.tick()
    log.uploaded(total, total)
    clock.now += 3 * HEARTBEAT_S
    log.tick()
    lines = _text(out).splitlines()
    assert len(lines) == 1, lines
    assert re.search(r"INFO  trainer +uploading +done=1.0 MB of 5.2 MB percent=20% elapsed=31s$", lines[0])


def test_on_a_terminal_a_wait_shows_its_time_left_and_an_upload_its_bytes() -> None:
    out, clock = io.StringIO(), Clock()
    log = TextLog("verifier", out, force_terminal=True, clock=clock, ticker=False)
    log("waiting", what="epoch 2 to close its reveals", until=clock.now + 42)
    log.close()
    text = _text(out)
    assert "waiting for epoch 2 to close its reveals" in text and "42s left" in text
    out2 = io.StringIO()
    log2 = TextLog("trainer", out2, force_terminal=True, clock=clock, ticker=False)
    log2.uploaded(2_000_000, 8_000_000)
    log2.close()
    assert "trainer uploading to the store" in _text(out2) and "2.0 MB of 8.0 MB" in _text(out2)


def test_the_heartbeat_runs_by_itself_off_a_terminal() -> None:
    out = io.StringIO()
    log = TextLog("trainer", out, heartbeat_s=0.1)
    log("waiting", what="the run's first epoch")
    time.sleep(0.6)
    log("started", epoch=0)
    time.sleep(0.3)
    lines = _text(out).splitlines()
    assert lines[-1].split()[3] == "started"
    assert sum("waited=" in line for line in lines) >= 2, lines
