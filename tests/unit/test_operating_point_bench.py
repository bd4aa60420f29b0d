"""benchmarks/operating_point.py: the shipped config reaches the network unchanged but for its windows,
and the committed files it reads are read as what they are."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.operating_point import (
    AUDIT_RATE,
    HELDOUT,
    ROOT,
    demo_options,
    heldout_gaps,
    network_config,
    render,
    sampled_detection,
)
from protocol.config import load_toml

pytestmark = pytest.mark.unit


def test_the_network_runs_the_shipped_config_with_this_machines_windows(tmp_path: Path) -> None:
    shipped = load_toml(ROOT / "examples" / "small.toml")
    net = network_config(shipped, 900)
    assert (net.windows.commit_s, net.windows.verdict_s, net.windows.unbonding_s) == (900, 900, shipped.windows.unbonding_s)
    assert net.replace(windows=shipped.windows.__dict__) == shipped  # nothing else moved
    opts = demo_options(shipped, 4, 3, tmp_path, 900, 60.0)
    assert (opts.trainers, opts.epochs, opts.steps, opts.quorum, opts.preset) == (4, 8, 8, 3, "small")
    assert (opts.batch_size, opts.seq_len, opts.segment, opts.merge_step, opts.first_merge_step) == (128, 64, 1, 1, 0)


def test_committed_detection_and_held_out_gaps_are_read_for_their_own_settings() -> None:
    got = sampled_detection(ROOT / AUDIT_RATE, 8, 1, 0.0165)
    assert got is not None and 0.3 < got < 0.4
    assert sampled_detection(ROOT / AUDIT_RATE, 8, 1, 0.02) is None  # another rate: not this config's figure
    assert sampled_detection(ROOT / "missing.json", 8, 1, 0.0165) is None
    h = heldout_gaps(ROOT / HELDOUT)
    assert h is not None and h["seeds"] == [3, 4, 5] and h["held_out_seeds"] == [5] and h["gap_vs_allreduce"]["mean"] > 0


def test_the_table_says_whether_the_models_matched() -> None:
    r = {"config": "examples/small.toml", "config_digest": "0x" + "ab" * 32, "H": 8, "tokens_per_step": 8192, "K": 4,
         "quorum": 3, "verifiers": 3, "epochs": 8, "epochs_finalized": 8, "audit_rate": 0.0165, "final_check_bps": 1250,
         "windows_s": 900, "command": "benchmarks/operating_point.py --out x", "seconds": 60, "host": "x86_64",
         "traffic_reduction_vs_allreduce": 30.0, "traffic_reduction_per_verifier_fetch": 20.0,
         "payload_only_traffic_reduction": 45.0, "traffic_reduction_vs_allreduce_both_directions": 60.0,
         "traffic_reduction_busiest_direction": 50.0, "verification_share_of_bytes": 0.3, "answer_compute_fraction": 0.01,
         "verifier_compute_fraction": 0.002, "stall_fraction": 0.1, "commitment_fraction": 0.01,
         "skip10_detection_within_256_steps": 0.35, "skip10_detection_within_256_steps_sampled": None,
         "network_final_eval_loss": 2.5, "engine_final_eval_loss": 2.5, "models_bit_identical": False,
         "engine_heldout": None, "slashed_honest": 0}
    md = render(r)
    assert "models differ" in md and "35.0% (closed form) |" in md and "none benchmarked" in md
    assert "| 60.0x; 50.0x |" in md  # like for like, and the busier direction
    assert "every model bit for bit" in render({**r, "models_bit_identical": True})
