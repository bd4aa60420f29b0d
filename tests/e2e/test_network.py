"""The whole network as processes: honest runs finalize and learn; every cheat is caught and slashed.

Each test runs `veriloco.netdemo.run_demo`, which starts a devnet, creates a run and launches the
trainer, verifier and coordinator processes with the same CLI a user types. After the nodes stop,
the aggregate of every finalized epoch is recomputed from the chain and the store: it must equal
the model the coordinator finalized, and no cheater may be among the included trainers.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from coordinator.build import build_global, passing_trainers
from protocol.chain import Chain, Phase
from protocol.run import open_run
from veriloco.netdemo import DemoOptions, run_demo

pytestmark = pytest.mark.e2e


def _run(tmp_path: Path, **kw: Any) -> tuple[dict[str, Any], dict[int, list[str]]]:
    included: dict[int, list[str]] = {}

    def inspect(chain: Chain, store: Any, run_id: int) -> None:
        ctx = open_run(chain, store, run_id)
        for e in range(ctx.config.schedule.epochs):
            if chain.epoch_status(run_id, e).phase is not Phase.FINALIZED:
                continue
            _, inc, digest = build_global(chain, store, ctx, e)
            assert digest == chain.epoch_times(run_id, e).model_digest, f"epoch {e}: finalized model is not the aggregate"
            assert inc == passing_trainers(chain, run_id, e)
            included[e] = inc

    kw.setdefault("trainers", 3)
    opts = DemoOptions(verifiers=2, epochs=2, steps=8, workdir=tmp_path / "demo",
                       report=tmp_path / "report", timeout_s=420, **kw)
    log = io.StringIO()
    try:
        summary = run_demo(opts, out=log, inspect=inspect)
    except Exception:
        print(log.getvalue())
        raise
    return summary, included


def test_honest_network_learns_and_nobody_is_slashed(tmp_path: Path) -> None:
    s, included = _run(tmp_path)
    assert s["epochs_finalized"] == 2
    assert s["verdicts"]["fail"] == 0 and s["verdicts"]["pass"] >= 6
    assert s["slashed"] == []
    assert s["final_eval_loss"] < s["initial_eval_loss"] - 0.5
    assert all(len(v) == 3 for v in included.values())
    assert (tmp_path / "report" / "summary.json").exists() and (tmp_path / "report" / "loss.png").exists()


def test_every_cheater_is_slashed_and_never_aggregated(tmp_path: Path) -> None:
    """One network, one cheater of each kind among two honest trainers."""
    s, included = _run(tmp_path, trainers=5, cheats=(("lazy", 1), ("noise", 1), ("copy", 1)))
    cheaters = set(s["cheaters"])
    assert sorted(s["cheaters"].values()) == ["copy", "lazy", "noise"]
    assert s["epochs_finalized"] == 2
    assert set(s["slashed"]) == cheaters  # every cheater, and no honest trainer
    assert included and all(not cheaters & set(inc) and len(inc) == 2 for inc in included.values())
    assert s["final_eval_loss"] < s["initial_eval_loss"] - 0.5


@pytest.mark.integration
def test_honest_network_on_anvil_and_ipfs(tmp_path: Path) -> None:
    s, included = _run(tmp_path, chain="anvil", store="ipfs")
    assert s["epochs_finalized"] == 2 and s["slashed"] == [] and s["verdicts"]["fail"] == 0
