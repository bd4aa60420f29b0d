"""What a node prints: readable lines for a person (rich), or one JSON object per line for a program.

A node loop only calls `log(event, **fields)`. `node_logger` decides how that looks:

- `text` (the default): `HH:MM:SS LEVEL node event key=value ...`, one line per event, the level
  derived from the event name; on a terminal, the inner steps of an epoch show as a live progress
  bar instead of a line each, a wait (a `waiting` event, optionally with `until`, a Unix time) as a
  spinner with the time waited and left until the node's next event, and a large upload to the
  store as a byte bar. Off a terminal (a pipe, a file), a wait still going on repeats itself every
  HEARTBEAT_S seconds (`waited=`, `left=`) and a slow upload prints its progress as often.
- `json`: `{"t": unix_time, "level": ..., "node": ..., "run": ..., "address": ..., "event": ...,
  **fields}` per line on stdout, what the demo, the tests and the benchmarks parse (they pass
  `--log-format json`): the node's events only, no progress, heartbeats or upload bars. `level` is
  the text line's (DEBUG, INFO, WARN, ERROR); `run` and `address` (the node's run id and its key's
  account) are there once the node knows them (`NodeLog.bind`): from its first line on for the run,
  from the line after `loading` for the address. So lines from many nodes in one collector can be
  filtered by severity, run and node without parsing the event.

`--log-file PATH` appends every event as a JSON line as well, whatever the console shows.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from protocol.errors import VerilocoError

Log = Callable[..., None]
FORMATS = ("text", "json")

# events named here (or ending in -failed / -error) are errors, these warnings; the rest are info
_ERRORS = {"error", "alarm", "aborted", "refused", "model-mismatch", "slashed"}
_WARNINGS = {"warning", "skipped", "removed", "abandon-reported", "outage", "content-missing", "withholding", "too-few-verifiers"}
_STYLES = {"DEBUG": "dim", "INFO": "green", "WARN": "yellow", "ERROR": "bold red"}
HEARTBEAT_S = 30.0  # off a terminal: how often a wait still going on, or a slow upload, prints a line
UPLOAD_MIN_BYTES = 1 << 20  # smaller uploads are over too soon to show


class LogSetupError(VerilocoError):
    """The log file cannot be opened."""


def level(event: str, fields: dict[str, Any]) -> str:
    """DEBUG, INFO, WARN or ERROR for an event, from its name (and a failed verdict is a warning)."""
    if event in _ERRORS or event.endswith(("-failed", "-error")):
        return "ERROR"
    if event in _WARNINGS or event.endswith("-retry") or fields.get("passed") is False:
        return "WARN"
    return "DEBUG" if event == "step" else "INFO"


def json_line(node: str, event: str, fields: dict[str, Any], context: dict[str, Any] | None = None) -> str:
    """One event as a JSON object: time, level, node, the node's context (run, address), event, fields."""
    head = {"t": round(time.time(), 3), "level": level(event, fields), "node": node, **(context or {}), "event": event}
    return json.dumps({**head, **fields}, default=str)


def _value(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v).lower()
    if isinstance(v, int) and abs(v) >= 10_000:
        return f"{v:,}"
    if isinstance(v, (str, int, float)):
        return str(v)
    return json.dumps(v, default=str)


def fields_text(fields: dict[str, Any]) -> str:
    """`key=value ...`, as a text log line shows an event's fields."""
    return " ".join(f"{k}={_value(v)}" for k, v in fields.items())


class TextLog:
    """Readable lines through a rich Console; a live progress line for steps, waits and uploads on a
    terminal, a heartbeat line for waits and slow uploads off one.

    A wait lasts from its `waiting` event to the node's next event, whatever it is.
    """

    def __init__(self, node: str, stream: IO[str] | None = None, *, force_terminal: bool | None = None,
                 heartbeat_s: float = HEARTBEAT_S, clock: Callable[[], float] = time.time, ticker: bool = True):
        from rich.console import Console

        self.node = node
        self.console = Console(file=stream or sys.stdout, highlight=False, soft_wrap=True, force_terminal=force_terminal)
        self.heartbeat_s, self.clock = heartbeat_s, clock
        self._lock = threading.Lock()
        self._progress: Any = None
        self._task: Any = None
        self._kind: tuple[str, Any] = ("", None)
        self._wait: dict[str, Any] | None = None  # the wait going on: what, until, since, last line
        self._upload: dict[str, Any] | None = None  # the upload going on: done, total, since, last line
        self._ticker: threading.Thread | None = None
        self._tick_in_background = ticker  # off: a caller (a test) calls tick() itself

    def __call__(self, event: str, **fields: Any) -> None:
        with self._lock:
            now = self.clock()
            self._wait = None  # any event ends the wait before it; a `waiting` event starts the next
            if event == "waiting":
                self._wait = {"what": fields.get("what", "the chain"), "until": fields.get("until"),
                              "since": now, "last": now}
                self._start_ticker()
            if self.console.is_terminal and event in ("step", "waiting"):
                if event == "waiting":  # kept on screen as a line; the spinner shows it is still going on
                    self._stop_live()
                    self.console.print(self.render(event, fields))
                self._live(event, fields)
                return
            if event == "step" and not _milestone(fields):
                return
            self._stop_live()
            self.console.print(self.render(event, fields))

    def render(self, event: str, fields: dict[str, Any]) -> Any:
        from rich.text import Text

        lv = level(event, fields)
        line = Text(time.strftime("%H:%M:%S "), style="dim")
        line.append(f"{lv:<5} ", style=_STYLES[lv])
        line.append(f"{self.node:<11} ", style="cyan")
        line.append(f"{event:<12}", style="bold" if lv != "DEBUG" else "")
        for k, v in fields.items():
            line.append(f" {k}=", style="dim")
            # a wait's deadline (Unix time) as a wall-clock time, like the line's own
            line.append(time.strftime("%H:%M:%S", time.localtime(v)) if k == "until" and isinstance(v, (int, float))
                        else _value(v))
        return line

    def _live(self, event: str, fields: dict[str, Any]) -> None:
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        if self._progress is None:
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                      _detail(self.clock), TimeElapsedColumn(), console=self.console, transient=True)
            self._progress.start()
            self._task = None
        until = None
        if event == "step":
            desc = f"{self.node} epoch {fields.get('epoch')} training  loss {fields.get('loss')}"
            total, done = fields.get("of"), fields.get("step")
        elif event == "uploading":
            desc, total, done = f"{self.node} uploading to the store", fields["total"], fields["done"]
        else:
            desc, total, done = f"{self.node} waiting for {fields.get('what', 'the chain')}", None, None
            until = fields.get("until")
        kind = (event, fields.get("epoch", fields.get("what")))
        if self._task is not None and kind != self._kind:  # a new bar (and clock) for each epoch or wait
            self._progress.remove_task(self._task)
            self._task = None
        self._kind = kind
        if self._task is None:
            self._task = self._progress.add_task(desc, total=total, completed=done or 0, kind=event, until=until)
        else:
            self._progress.update(self._task, description=desc, total=total, completed=done or 0)

    def _stop_live(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = self._task = None

    def uploaded(self, done: int, total: int) -> None:
        """Progress of an upload to the store: `done` of `total` bytes (done == total: finished)."""
        with self._lock:
            now = self.clock()
            if done >= total:
                finished, self._upload = self._upload, None
                if finished is not None and self._kind[0] == "uploading":
                    self._stop_live()
                return
            if total < UPLOAD_MIN_BYTES:
                return
            if self._upload is None:
                self._upload = {"since": now, "last": now}
                self._start_ticker()
            self._upload.update(done=done, total=total)
            if self.console.is_terminal and self._kind[0] != "step":  # training keeps its bar
                self._live("uploading", {"done": done, "total": total, "what": id(self._upload)})

    def tick(self) -> None:
        """Off a terminal: repeat a wait still going on, and a slow upload's progress, every `heartbeat_s`."""
        with self._lock:
            if self.console.is_terminal:
                return
            now = self.clock()
            w = self._wait
            if w is not None and now - w["last"] >= self.heartbeat_s:
                w["last"] = now
                line = {"what": w["what"], "waited": _duration(now - w["since"])}
                if isinstance(w["until"], (int, float)):
                    line["left"] = _duration(max(0.0, w["until"] - now))
                self.console.print(self.render("waiting", line))
            u = self._upload
            if u is not None and now - u["last"] >= self.heartbeat_s:
                u["last"] = now
                self.console.print(self.render("uploading", {
                    "done": f"{_mb(u['done'])} of {_mb(u['total'])}",
                    "percent": f"{100 * u['done'] // max(1, u['total'])}%", "elapsed": _duration(now - u["since"])}))

    def _start_ticker(self) -> None:
        if self._ticker is None and self._tick_in_background and not self.console.is_terminal:
            self._ticker = threading.Thread(target=self._tick_forever, name="log-heartbeat", daemon=True)
            self._ticker.start()

    def _tick_forever(self) -> None:
        while True:
            time.sleep(min(1.0, self.heartbeat_s))
            self.tick()

    def close(self) -> None:
        with self._lock:
            self._stop_live()


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s}s" if s < 120 else f"{s // 60}m{s % 60:02d}s"


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _detail_column() -> Any:
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Detail(ProgressColumn):
        """Steps as `k/n`, uploads as `x of y MB`, a wait as the time left when its deadline is known."""

        def __init__(self, clock: Callable[[], float]) -> None:
            super().__init__()
            self.clock = clock

        def render(self, task: Any) -> Text:
            kind = task.fields.get("kind")
            if kind == "uploading":
                return Text(f"{_mb(int(task.completed))} of {_mb(int(task.total or 0))}")
            if kind == "waiting":
                until = task.fields.get("until")
                left = f"{_duration(max(0.0, until - self.clock()))} left" if isinstance(until, (int, float)) else ""
                return Text(left)
            return Text(f"{int(task.completed)}/{int(task.total)}" if task.total is not None else "")

    return Detail


def _detail(clock: Callable[[], float]) -> Any:
    """The progress line's detail column (its class is made once rich is imported)."""
    return _detail_column()(clock)


def _milestone(fields: dict[str, Any]) -> bool:
    """Off a terminal, a step is printed at each quarter of the epoch (and the last), not every step."""
    step, of = fields.get("step"), fields.get("of")
    if not isinstance(step, int) or not isinstance(of, int) or of <= 0:
        return True
    return step == of or step % max(1, of // 4) == 0


def node_logger(node: str, fmt: str = "text", log_file: Path | None = None, stream: IO[str] | None = None,
                run: int | None = None) -> NodeLog:
    """The `log(event, **fields)` a node loop calls: `fmt` on the console, JSON lines into `log_file`;
    every JSON line carries `run` when given (and what `bind` adds later)."""
    if fmt not in FORMATS:
        raise LogSetupError(f"log format {fmt!r}: choose one of {', '.join(FORMATS)}")
    out = stream or sys.stdout
    file: IO[str] | None = None
    if log_file is not None:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            file = open(log_file, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's life)
        except OSError as exc:
            raise LogSetupError(f"cannot open the log file {log_file}: {exc}; pick another --log-file") from None
    log = NodeLog(node, TextLog(node, out) if fmt == "text" else None, out, file)
    if run is not None:
        log.bind(run=run)
    return log


class NodeLog:
    """`log(event, **fields)`: the console (readable or JSON) and the JSON log file; `console` is the
    TextLog in text mode (what progress is reported to), None in JSON mode (no progress at all)."""

    def __init__(self, node: str, console: TextLog | None, out: IO[str], file: IO[str] | None) -> None:
        self.node, self.console, self.out, self.file = node, console, out, file
        self.context: dict[str, Any] = {}  # run, address: on every JSON line from `bind` on
        self._lock = threading.Lock()
        if console is not None:
            atexit.register(console.close)  # a live progress line must not outlive the process's last event

    def bind(self, **context: Any) -> None:
        """Add `context` (the node's `run`, its `address`) to every JSON line from now on."""
        with self._lock:
            self.context = {**self.context, **context}

    def __call__(self, event: str, **fields: Any) -> None:
        line = json_line(self.node, event, fields, self.context) if (self.file or self.console is None) else ""
        if self.console is not None:
            self.console(event, **fields)
        else:
            with self._lock:
                self.out.write(line + "\n")
                self.out.flush()
        if self.file is not None:
            with self._lock:
                self.file.write(line + "\n")
                self.file.flush()


def with_upload_progress(store: Any, log: Log) -> Any:
    """`store`, reporting its large uploads as progress on a text console; unchanged for JSON output."""
    console = getattr(log, "console", None)
    if console is None:
        return store
    from veriloco.uploads import ReportedStore

    return ReportedStore(store, console.uploaded)


def _log_format(value: str) -> str:
    if value not in FORMATS:
        raise argparse.ArgumentTypeError(f"{value!r} (from the flag or $VERILOCO_LOG_FORMAT): choose text or json")
    return value


def add_log_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    # a string default goes through `type` too, so a bad $VERILOCO_LOG_FORMAT is refused before anything starts
    g.add_argument("--log-format", type=_log_format, metavar="{text,json}", default=os.environ.get("VERILOCO_LOG_FORMAT") or "text",
                   help="text: readable lines and progress (default); json: one object per line for programs "
                        "($VERILOCO_LOG_FORMAT)")
    g.add_argument("--log-file", type=Path, help="also append every event to this file as JSON lines")


def logger_from_args(args: argparse.Namespace, node: str) -> NodeLog:
    return node_logger(node, getattr(args, "log_format", "text"), getattr(args, "log_file", None),
                       run=getattr(args, "run", None))
