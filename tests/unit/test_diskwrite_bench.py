"""benchmarks/diskwrite.py: both ways write the same stream and leave nothing behind; the table reads
the figures it is given."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.diskwrite import markdown, measure, step_files

pytestmark = pytest.mark.unit


def test_a_stream_is_written_both_ways_and_removed(tmp_path: Path) -> None:
    r = measure({"a": torch.randn(5000), "b": torch.zeros(3)}, tmp_path, repeats=2, gap_s=0.0, stream_bytes=0)
    assert r["files_per_mode"] == 8 and r["bytes"] > 20_000 and list(tmp_path.iterdir()) == []
    for mode in ("buffered", "direct"):
        assert r[f"{mode}_cpu_s_median"] <= r[f"{mode}_cpu_s_p90"]
    assert r["cpu_ratio_buffered_over_direct"] == round(r["buffered_cpu_s"] / max(r["direct_cpu_s"], 1e-9), 2)
    row = markdown([{"preset": "small", "rows": 8, "seq_len": 128, "file": "log step", **r}]).splitlines()[-1]
    assert row.startswith("| small 8 x 128 | log step |") and f"{r['bytes'] / 1e6:.1f}" in row


def test_the_files_written_are_the_trainers_own_step_and_state() -> None:
    files = step_files("tiny", 2, 16)
    assert sorted(files) == ["checkpoint", "log step (boundaries)"]
    assert any(k.startswith("act/") for k in files["log step (boundaries)"]) and "meta/step" in files["checkpoint"]
