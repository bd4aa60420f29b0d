"""benchmarks/projection.py prices files from shapes alone: the sizes must be the code's own."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.projection import Setting, project, render
from protocol.formats.codec import save_state, spec_of, state_file_size
from protocol.leaf import block_count, block_names
from protocol.model import param_shapes, preset
from protocol.shard_audit import challenge_spec
from trainer.compress import CompressionConfig, compress, payload_size


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


def test_only_the_boundaries_grow_with_the_batch() -> None:
    small, big = project(Setting("small", 8, 64, 64, 4)), project(Setting("small", 64, 64, 64, 4))
    cfg = preset("small")
    B = block_count(cfg)
    per_token = 2 * (B - 1) * cfg.d_model * 4 * 8 / B  # a segment of r = 8 steps, one block's in and gout
    grown = big["audit_bytes_per_challenge"] - small["audit_bytes_per_challenge"]
    assert math.isclose(grown, per_token * (64 - 8) * 64, rel_tol=1e-3)
    assert big["boundary_log_bytes_per_epoch"] == 8 * small["boundary_log_bytes_per_epoch"]
    for key in ("start_file_bytes", "payload_bytes", "final_check_bytes", "allreduce_bytes_per_trainer_per_epoch"):
        assert big[key] == small[key], key
    assert big["traffic_reduction_vs_allreduce"] < small["traffic_reduction_vs_allreduce"]
    doc = {"command": "benchmarks/projection.py --out x", "rows": [small, big]}
    assert render(doc).count("\n| small |") == 2


def test_the_token_bounded_design_prices_challenges_by_the_group_not_the_batch() -> None:
    from benchmarks.projection import project_group_unit

    at = {rows: project_group_unit(Setting("small", rows, 64, 256, 4)) for rows in (128, 1024)}
    assert at[128]["groups"] == 2 and at[1024]["groups"] == 16
    assert at[1024]["audit_bytes_per_challenge"] <= 1.25 * at[128]["audit_bytes_per_challenge"]
    today = {rows: project(Setting("small", rows, 64, 256, 4))["audit_bytes_per_challenge"] for rows in (128, 1024)}
    assert today[1024] > 7 * today[128]  # today's challenge carries the whole batch's boundaries
