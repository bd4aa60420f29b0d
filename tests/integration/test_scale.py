"""Issue 6's protocol-level scale check: 64 trainers and 8 verifiers on anvil, 3 epochs, all finalize.

Runs the driver of benchmarks/scale.py in process (a fresh anvil, every node its own account and
Chain, every phase's transactions sent concurrently) and checks what it read back from the contract.
About 40 s on the project's 2-core machine; a hang meets the suite's per-test timeout (pyproject.toml),
not a limit of its own that a slow machine would reach on time alone.
"""

from __future__ import annotations

import pytest

from benchmarks.scale import PHASES, QUORUM, run_scale

pytestmark = pytest.mark.integration

TRAINERS, VERIFIERS, EPOCHS = 64, 8, 3


def test_64_trainers_8_verifiers_3_epochs_all_finalize() -> None:
    result = run_scale(trainers=TRAINERS, verifiers=VERIFIERS, epochs=EPOCHS)

    setup = result["setup"]
    assert setup["active_trainers"] == TRAINERS and setup["verifier_count"] == VERIFIERS
    assert len(set(setup["trainer_slots"])) == TRAINERS

    per_epoch = result["per_epoch"]
    assert [r["epoch"] for r in per_epoch] == list(range(EPOCHS))
    for r in per_epoch:
        st = r["status"]
        assert r["finalized"] and st["phase"] == "FINALIZED", r
        assert st["committed"] == st["revealed"] == st["passed"] == TRAINERS and st["failed"] == 0, st
        assert r["included"] == r["included_event"] == TRAINERS
        assert r["slashed"] == []
        # one commit, reveal and response per trainer, one batch per verifier, one finalize, and the
        # startAudit calls (if any) that fixed the seed
        by = r["transactions_by_phase"]
        assert by["commit"] == by["reveal"] == by["respond"] == TRAINERS
        assert by["verdicts"] == len(r["verifier_batches"]) <= VERIFIERS
        assert sum(r["verifier_batches"].values()) == QUORUM * TRAINERS
        assert by["finalize"] == 1 and by["seed"] == r["seed_start_audit_calls"] <= 5
        assert r["transactions"] == sum(by.values())
        # gas and latency are real measurements
        assert r["gas_total"] == sum(r["gas_by_phase"].values()) > 0
        assert all(r["gas_by_phase"][p] > 0 for p in PHASES if by[p])
        assert 0 < r["largest_tx_gas"] <= r["gas_total"] and r["largest_tx_gas"] < 30_000_000
        assert r["gas_per_trainer"] == round(r["gas_total"] / TRAINERS) > 0
        assert r["latency_s"] > 0 and all(r["phase_s"][p] >= 0 for p in PHASES)
        assert sum(r["phase_s"].values()) <= r["latency_s"] + 0.01

    assert result["summary"]["slashed"] == [] and result["summary"]["trainer_stakes_intact"]
    assert result["summary"]["epochs_finalized"] == EPOCHS
    assert result["ok"] is True
