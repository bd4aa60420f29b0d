"""benchmarks/gpu.py at a toy size on the CPU: the device script's every path runs before it is spent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import gpu

pytestmark = pytest.mark.unit


def test_the_device_script_runs_and_reports_replay(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    assert gpu.main(["--device", "cpu", "--preset", "llama-tiny", "--rows", "2", "--seq", "16", "--steps", "2",
                     "--segment", "2", "--hash-mb", "0.1", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["environment"]["device_class"] == "cpu" and r["environment"]["torch"]
    assert set(r["precisions"]) == {"fp32", "bf16"}
    for m in r["precisions"].values():
        t = m["throughput"]
        assert t["protocol_step"]["tokens_per_s"] > 0 and t["payload_bytes"] > 0
        assert t["plain_step"]["mfu_vs_bf16_peak"] is None  # no peak is known for a CPU
        assert m["replay"]["same_steps_twice_bitwise"] and m["replay"]["block_replay_bitwise"]
        assert m["replay"]["one_step_max_rel_error_vs_cpu"] == 0.0  # the CPU against itself
    assert "| bf16 | protocol_step |" in r["markdown"]
    assert r["hashing"]["digests_agree"] and r["hashing"]["device_gb_per_s"] > 0  # torch's BLAKE3 is the library's
