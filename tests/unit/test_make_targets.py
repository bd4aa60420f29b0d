"""The Makefile's inner-loop target: `make test-fast` runs the unit tier alone (issue 50), so a change can be
checked in minutes; `make test` (all tiers) stays what CI runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_test_fast_runs_the_unit_tier_and_make_test_runs_every_tier() -> None:
    def planned(target: str) -> str:
        out = subprocess.run(["make", "-n", target], check=False, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    fast = [line for line in planned("test-fast").splitlines() if "pytest" in line]
    assert len(fast) == 1 and "pytest tests/unit" in fast[0], fast
    full = [line for line in planned("test").splitlines() if "pytest" in line]
    assert full and all("tests/unit" not in line for line in full), full  # no path: every tier
