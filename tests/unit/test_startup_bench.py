"""The start-time benchmark: each figure a real command, timed from its start (issue 32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.startup import BUDGET_S, main, render

pytestmark = pytest.mark.unit


def test_the_version_and_help_figures_time_the_real_commands(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    assert main(["--repeat", "2", "--only=--version,trainer --help", "--out", str(out), "--md", str(tmp_path / "s.md")]) == 0
    doc = json.loads(out.read_text())
    assert [r["name"] for r in doc["rows"]] == ["--version", "trainer --help"]
    for r in doc["rows"]:
        assert len(r["runs_s"]) == 2 and 0 < r["min_s"] <= r["median_s"] <= r["max_s"] and r["budget_s"] == BUDGET_S
    assert doc["machine"]["cpus"] >= 1 and len(doc["load_before"]) == 3
    assert "| veriloco --version |" in render(doc) and (tmp_path / "s.md").read_text() == render(doc)


def test_a_failing_command_is_an_error_not_a_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import startup

    monkeypatch.setattr(startup, "veriloco", lambda: [startup.sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(RuntimeError, match="exited 3"):
        main(["--repeat", "1", "--only=--version"])
