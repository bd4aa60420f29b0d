"""The results file of the benchmarks measured setting by setting on one trainer's code path
(``commitments``, ``answers``, ``diskwrite``): their rows with the command that made them, the
machine and the versions, and the Markdown table printed."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def write_settings(name: str, argv: Sequence[str] | None, machine: dict[str, Any], rows: list[dict[str, Any]],
                   started: float, table: str, out: Path | None, runner: str = ".venv/bin/python") -> int:
    """Print ``table`` and write ``out`` (when given) for benchmark ``name`` run with ``argv``
    (``sys.argv`` when None) since ``started`` (``time.perf_counter``); returns the exit status."""
    doc = {"benchmark": name,
           "command": " ".join([f"{runner} -m benchmarks.{name}", *(sys.argv[1:] if argv is None else argv)]),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), **machine},
           "versions": {"python": platform.python_version(), "torch": torch.__version__},
           "settings": rows, "wall_seconds": round(time.perf_counter() - started, 1)}
    print(table)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0
