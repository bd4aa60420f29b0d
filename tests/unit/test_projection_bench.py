"""benchmarks/projection.py prices files from shapes alone: the sizes must be the code's own."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from benchmarks.projection import Setting, project, render
from dilocox.compress import CompressionConfig, compress, payload_size
from protocol.formats.codec import save_state, spec_of, state_file_size
from protocol.leaf import block_count, block_names
from protocol.model import param_shapes, preset
from protocol.shard_audit import challenge_spec, data_ends


@pytest.mark.parametrize("cfg", [CompressionConfig(), CompressionConfig(bits=8, dense_bits=8, group_size=32),
                                 CompressionConfig(lowrank=False), CompressionConfig(bits=32, dense_bits=32)])
@pytest.mark.parametrize("rank", [2, 64])
def test_payload_size_is_the_encoded_payloads_length(cfg: CompressionConfig, rank: int) -> None:
    shapes = param_shapes(preset("tiny"))
    gen = torch.Generator().manual_seed(rank)
    delta = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    assert payload_size(shapes, rank, cfg) == len(compress(delta, {}, rank, 7, cfg).payload)


def test_state_file_size_is_the_written_files_length() -> None:
    cfg = preset("tiny")
    shapes = param_shapes(cfg)
    names = block_names(cfg)[1]
    spec = challenge_spec(shapes, names, 1, block_count(cfg), 8, 16, (3, 5, cfg.d_model), merge=True)
    state = {n: torch.ones(s.shape, dtype=s.dtype) for n, s in spec.items()}
    assert state_file_size(spec) == len(save_state(state)) == state_file_size(spec_of(state))
    assert state_file_size({**spec, "x": spec["meta/step"]}) != state_file_size(spec)


def test_past_one_group_a_challenge_does_not_grow_with_the_batch() -> None:
    """Groups of 512 tokens, segments of 1 step: 8 x 64 is one group, 64 x 64 eight and 128 x 64 sixteen.
    The challenge of the last two is the same file; only the trainer's boundary log grows."""
    one, eight, sixteen = (project(Setting("small", rows, 64, 64, 4, r=1, group_tokens=512)) for rows in (8, 64, 128))
    assert (one["groups"], eight["groups"], sixteen["groups"]) == (1, 8, 16)
    assert eight["audit_bytes_per_challenge"] == sixteen["audit_bytes_per_challenge"]
    assert eight["boundary_bytes_per_challenge"] == one["boundary_bytes_per_challenge"]
    # the one-group step carries no sums; past it, two block-sized sums per step in each file of a draw
    # (the drawn block and the data ends, protocol.shard_audit.data_ends)
    cfg = replace(preset("small"), seq_len=64)  # the settings' context: wpe has 64 rows
    B = block_count(cfg)
    sizes = [sum(math.prod(param_shapes(cfg)[n]) for n in names) for names in block_names(cfg)]
    sums = 2 * 4 * sum(sum(sizes[x] for x in data_ends(b, B)) for b in range(B)) / B
    assert math.isclose(eight["audit_bytes_per_challenge"] - one["audit_bytes_per_challenge"], sums, rel_tol=1e-2)
    assert sixteen["boundary_log_bytes_per_epoch"] == 2 * eight["boundary_log_bytes_per_epoch"]
    for key in ("start_file_bytes", "payload_bytes", "final_check_bytes", "allreduce_bytes_per_trainer_per_epoch"):
        assert sixteen[key] == eight[key], key
    doc = {"command": "benchmarks/projection.py --out x", "rows": [one, eight]}
    assert render(doc).count("\n| small |") == 2


def test_error_feedback_in_the_parameters_prices_no_start_file() -> None:
    """With no buffer there is no start file and no start parameters in a challenge; the carried-buffer
    figures beside it are the same setting priced with them (the buffer row's own projection)."""
    st = Setting("small", 8, 128, 256, 4)
    params, buffer = project(st), project(Setting("small", 8, 128, 256, 4, ef_in_params=False))
    assert params["ef_in_params"] and not buffer["ef_in_params"]
    assert params["start_file_bytes"] == 0 and buffer["start_file_bytes"] == params["buffer_start_file_bytes"] > 0
    assert params["audit_bytes_per_challenge"] < buffer["audit_bytes_per_challenge"]  # no start.param/ over the merge
    assert params["traffic_reduction_vs_allreduce_buffer"] == buffer["traffic_reduction_vs_allreduce"]
    assert params["traffic_reduction_per_verifier_fetch_buffer"] == buffer["traffic_reduction_per_verifier_fetch"]
    assert params["traffic_reduction_vs_allreduce"] > buffer["traffic_reduction_vs_allreduce"]
    delay = project(Setting("small", 8, 128, 256, 4, merge=False))  # no merge rule: always a buffer
    assert not delay["ef_in_params"] and delay["start_file_bytes"] > 0


def _run(parent: str, tokens: int, work: float, seconds: float, verifier_work: float = 5.0) -> dict:
    """A kept run's validation record as ``validate`` writes it, every figure the same line."""
    c = {"train_cpu_s": seconds, "train_flops": work, "answer_cpu_s": seconds, "answer_flops": work,
         "verifier_cpu_s": 2.0, "verifier_flops": verifier_work, "commit_cpu_s": seconds, "hashed_bytes": work}
    return {"workdir": f"/{parent}/run-{tokens}", "tokens_per_step": tokens, "d_model": 64,
            "settings_key": [64, 4, 8, "merge", True], "compute": c}


def test_the_compute_check_predicts_the_largest_batch_from_the_two_smallest() -> None:
    """Seconds = 1 + 2 · work at the two smallest batches; a third run on that line is predicted exactly,
    one off it by its own ratio; work that does not grow with the batch keeps the fixed cost; runs of
    another invocation, or of one batch size, are not mixed in."""
    from benchmarks.projection import compute_check

    on_line = [_run("a", 512, 1.0, 3.0), _run("a", 2048, 4.0, 9.0), _run("a", 4096, 8.0, 17.0)]
    rows = compute_check([*on_line, _run("b", 512, 1.0, 100.0), _run("c", 512, 1.0, 3.0), _run("c", 512, 2.0, 5.0)])
    assert [r["figure"] for r in rows] == ["training", "audit answers", "verification", "commitments"]
    train, _, verify, _ = rows
    assert (train["fixed_s"], train["s_per_unit"], train["ratio"]) == (1.0, 2.0, 1.0)
    assert train["fitted_at_tokens"] == [512, 2048] and train["predicted_at_tokens"] == 4096
    assert verify["s_per_unit"] == 0.0 and verify["predicted_s"] == 2.0  # the same groups at every batch
    off = compute_check([*on_line[:2], _run("a", 4096, 8.0, 34.0)])
    assert off[0]["ratio"] == 0.5  # predicted 17 s, measured 34 s


def test_a_per_step_rate_prices_verification_per_step_of_work() -> None:
    """With audit.rate each step carries the same expected challenge bytes whatever H is (r = 1 here):
    an epoch ships H·rate draws, its manifest their mean, and the final check at its own probability."""
    rows = {H: project(Setting("small", 128, 64, H, 4, group_tokens=2048, rate=0.0165, s=8, final_check=0.125))
            for H in (4, 8, 64, 256)}
    for H, r in rows.items():
        assert math.isclose(r["challenges_per_epoch"], H * 0.0165, rel_tol=1e-3)
        draws = r["audit_answer_bytes_per_epoch"] - r["manifest_bytes"] - 0.125 * r["final_check_bytes"]
        assert math.isclose(draws / H, 0.0165 * r["audit_bytes_per_challenge"], rel_tol=1e-3)
        assert r["skip10_detection_within_256_steps"] == rows[4]["skip10_detection_within_256_steps"] > 0.34
    # the per-epoch policy ships s draws an epoch: at H = 8 that is 30 times the rate's bytes
    count = project(Setting("small", 128, 64, 8, 4, group_tokens=2048))
    assert count["challenges_per_epoch"] == 4 and count["traffic_reduction_vs_allreduce"] < rows[8]["traffic_reduction_vs_allreduce"] / 5
    assert rows[8]["answer_flops_fraction"] < count["answer_flops_fraction"] / 25


def test_windows_keep_a_few_states_where_the_post_hoc_draw_keeps_an_epoch() -> None:
    """Issue 48's rows: the narrowest W the gas allowance buys, memory from the retention rule; an
    allowance too small for more than one window buys nothing (W spans the trace)."""
    st = Setting("llama-1b", 128, 4096, 256, 64, rate=0.0165, s=8, final_check=0.125, window_gas=10_000)
    r = project(st)
    assert r["W"] == 16 and r["window_gas_per_trainer_per_epoch"] <= 10_000
    assert r["answer_memory_windowed_fraction_of_state"] < r["answer_memory_gradient_log_fraction_of_state"] / 10
    wider = project(replace(st, seed_lag_steps=32))
    assert wider["answer_memory_windowed_fraction_of_state"] > r["answer_memory_windowed_fraction_of_state"] + 10
    one = project(replace(st, K=1, window_gas=1_000))
    assert one["windows_per_epoch"] == 1
    assert "W" not in project(replace(st, window_gas=0))
    assert "Windowed challenges" in render({"command": "x", "rows": [r], "window_rows": [r]})
