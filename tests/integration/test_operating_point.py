"""benchmarks/operating_point.py end to end at `tiny` size: a network of the config's nodes measured as
it runs, and the same network measured again from its kept folder, give the same figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.operating_point import main

pytestmark = pytest.mark.integration

SAME = ("traffic_reduction_vs_allreduce", "traffic_reduction_per_verifier_fetch", "payload_only_traffic_reduction",
        "verification_share_of_bytes", "answer_compute_fraction", "verifier_compute_fraction", "slashed_honest",
        "epochs_finalized", "network_final_eval_loss")


def test_a_kept_network_measures_as_it_ran(tmp_path: Path) -> None:
    common = ["--config", "examples/run.toml", "--epochs", "1", "--windows-s", "60", "--eval-rows", "16", "--no-engine"]
    assert main([*common, "--keep", str(tmp_path / "net"), "--out", str(tmp_path / "live.json")]) == 0
    assert main([*common, "--from-kept", str(tmp_path / "net"), "--out", str(tmp_path / "kept.json")]) == 0
    live, kept = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("live", "kept"))
    assert {k: live[k] for k in SAME} == {k: kept[k] for k in SAME}
    assert live["epochs_finalized"] == 1 and live["slashed_honest"] == 0 and live["engine_final_eval_loss"] is None
    assert live["traffic_reduction_vs_allreduce"] > 0 and live["config"] == "examples/run.toml"
