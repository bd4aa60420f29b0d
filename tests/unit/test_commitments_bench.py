"""The commitment-cost benchmark measures the trainer's own code path: one state leaf per segment."""

import pytest

from benchmarks.commitments import markdown, measure

pytestmark = pytest.mark.unit


def test_one_segment_of_tiny_is_measured_with_one_state_leaf() -> None:
    r = measure("tiny", rows=2, seq=16, segment=3)
    assert r["boundary_tensors_per_step"] == 2 * (2 * 2 + 1)  # two per edge between B = 2 n_layer + 2 blocks
    assert r["tokens_per_step"] == 32 and r["compute_s_per_step"] > 0 and r["commit_s_per_step"] > 0
    assert r["commitment_fraction_of_training"] > 0 and r["segment"] == 3
    # the boundary log holds exactly the boundary tensors: 2 (B - 1) of 2 x 16 x d_model fp32, one norm per block
    assert r["boundary_log_bytes_per_step"] > 10 * 32 * 64 * 4 and r["boundary_log_fraction"] > 0
    assert "| tiny |" in markdown([r])


def test_repeats_report_the_median_run_and_every_fraction() -> None:
    from benchmarks.commitments import median_run

    runs = [{"commitment_fraction_of_training": x, "tag": t} for x, t in ((0.03, "a"), (0.01, "b"), (0.02, "c"))]
    m = median_run(runs)
    assert m["tag"] == "c" and m["commitment_fraction_runs"] == [0.03, 0.01, 0.02]
    assert median_run(runs[:2])["tag"] == "b"  # an even count reports the lower middle
