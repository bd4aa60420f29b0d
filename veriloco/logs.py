"""What a node prints: readable lines for a person (rich), or one JSON object per line for a program.

A node loop only calls `log(event, **fields)`. `node_logger` decides how that looks:

- `text` (the default): `HH:MM:SS LEVEL node event key=value ...`, one line per event, the level
  derived from the event name; on a terminal, the inner steps of an epoch show as a live progress
  bar instead of a line each, and a wait as a spinner until the node's next event.
- `json`: `{"t": unix_time, "node": ..., "event": ..., **fields}` per line on stdout, what the demo,
  the tests and the benchmarks parse (they pass `--log-format json`).

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
_ERRORS = {"error", "alarm", "aborted", "refused", "model-mismatch"}
_WARNINGS = {"warning", "skipped", "removed", "outage", "content-missing", "withholding"}
_STYLES = {"DEBUG": "dim", "INFO": "green", "WARN": "yellow", "ERROR": "bold red"}


class LogSetupError(VerilocoError):
    """The log file cannot be opened."""


def level(event: str, fields: dict[str, Any]) -> str:
    """DEBUG, INFO, WARN or ERROR for an event, from its name (and a failed verdict is a warning)."""
    if event in _ERRORS or event.endswith(("-failed", "-error")):
        return "ERROR"
    if event in _WARNINGS or event.endswith("-retry") or fields.get("passed") is False:
        return "WARN"
    return "DEBUG" if event == "step" else "INFO"


def json_line(node: str, event: str, fields: dict[str, Any]) -> str:
    return json.dumps({"t": round(time.time(), 3), "node": node, "event": event, **fields}, default=str)


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
    """Readable lines through a rich Console; a live progress line for steps and waits on a terminal."""

    def __init__(self, node: str, stream: IO[str] | None = None, *, force_terminal: bool | None = None):
        from rich.console import Console

        self.node = node
        self.console = Console(file=stream or sys.stdout, highlight=False, soft_wrap=True, force_terminal=force_terminal)
        self._lock = threading.Lock()
        self._progress: Any = None
        self._task: Any = None
        self._kind: tuple[str, Any] = ("", None)

    def __call__(self, event: str, **fields: Any) -> None:
        with self._lock:
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
            line.append(_value(v))
        return line

    def _live(self, event: str, fields: dict[str, Any]) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        if self._progress is None:
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(), console=self.console, transient=True)
            self._progress.start()
            self._task = None
        if event == "step":
            desc = f"{self.node} epoch {fields.get('epoch')} training  loss {fields.get('loss')}"
            total, done = fields.get("of"), fields.get("step")
        else:
            desc, total, done = f"{self.node} waiting for {fields.get('what', 'the chain')}", None, None
        kind = (event, fields.get("epoch"))
        if self._task is not None and kind != self._kind:  # a new bar (and clock) for each epoch or wait
            self._progress.remove_task(self._task)
            self._task = None
        self._kind = kind
        if self._task is None:
            self._task = self._progress.add_task(desc, total=total, completed=done or 0)
        else:
            self._progress.update(self._task, description=desc, total=total, completed=done or 0)

    def _stop_live(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = self._task = None

    def close(self) -> None:
        with self._lock:
            self._stop_live()


def _milestone(fields: dict[str, Any]) -> bool:
    """Off a terminal, a step is printed at each quarter of the epoch (and the last), not every step."""
    step, of = fields.get("step"), fields.get("of")
    if not isinstance(step, int) or not isinstance(of, int) or of <= 0:
        return True
    return step == of or step % max(1, of // 4) == 0


def node_logger(node: str, fmt: str = "text", log_file: Path | None = None, stream: IO[str] | None = None) -> Log:
    """The `log(event, **fields)` a node loop calls: `fmt` on the console, JSON lines into `log_file`."""
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
    console = TextLog(node, out) if fmt == "text" else None
    if console is not None:
        atexit.register(console.close)  # a live progress line must not outlive the process's last event
    lock = threading.Lock()

    def log(event: str, **fields: Any) -> None:
        line = json_line(node, event, fields) if (file or console is None) else ""
        if console is not None:
            console(event, **fields)
        else:
            with lock:
                out.write(line + "\n")
                out.flush()
        if file is not None:
            with lock:
                file.write(line + "\n")
                file.flush()

    return log


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


def logger_from_args(args: argparse.Namespace, node: str) -> Log:
    return node_logger(node, getattr(args, "log_format", "text"), getattr(args, "log_file", None))
