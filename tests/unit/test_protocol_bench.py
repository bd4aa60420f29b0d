"""Repeated runs of one protocol scenario are reported as their mean, with every run kept."""

import json
import sys

import pytest

from benchmarks.protocol import SAMPLED, combine, main, markdown

pytestmark = pytest.mark.unit


def _run(h: int, x: float) -> dict:
    fixed = {"preset": "small", "H": h, "audit_mode": "shard", "audit_steps": 4, "audit_segment": 8, "stages": 1,
             "quorum": 3, "trainers": 2, "verifiers": 3, "epochs": 2, "state_bytes_largest_process_fraction": 1}
    return {**fixed, **{k: x for k in SAMPLED}, "wall_seconds": x}


def test_repeats_average_and_distinct_scenarios_stay_apart() -> None:
    one, two, other = _run(256, 1.0), _run(256, 2.0), _run(64, 5.0)
    merged = combine([other, one, two])
    assert merged[0] is other
    assert merged[1]["traffic_reduction_vs_allreduce"] == 1.5 and merged[1]["runs"] == [one, two]
    assert "wall_seconds" not in merged[1]  # a run's own seconds stay with the run
    assert "(mean of 2 runs)" in markdown(merged)


def test_merge_writes_the_means_and_every_run(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    parts = []
    for n, x in enumerate((1.0, 3.0)):
        part = tmp_path / f"run{n}.json"
        part.write_text(json.dumps({"scenarios": [_run(256, x)], "command": f"run {n}", "machine": {"load_average": [x]}}))
        parts.append(str(part))
    out = tmp_path / "protocol.json"
    monkeypatch.setattr(sys, "argv", ["protocol.py", "--merge", *parts, "--out", str(out)])
    assert main() == 0
    r = json.loads(out.read_text())
    assert r["commands"] == ["run 0", "run 1"] and [m["load_average"] for m in r["machines"]] == [[1.0], [3.0]]
    (sc,) = r["scenarios"]
    assert sc["verifier_compute_fraction"] == 2.0 and len(sc["runs"]) == 2
    assert "(mean of 2 runs)" in capsys.readouterr().out
