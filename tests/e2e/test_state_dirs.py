"""Two devnets one after the other in one working folder: the second run's nodes start from scratch.

A devnet started again has the same chain id, the same contract address and numbers runs from 1
again, so node state keyed by those alone would hand run 1 of the second chain the records of run 1
of the first (the verifier's verdict ledger, the trainers' closed epochs) and its epochs would
finalize with nobody included. The nodes key their state by the run's creation block too
(protocol/statedir.py); here both networks share one node folder and both must learn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.network import run_network
from veriloco.netdemo import DemoOptions

pytestmark = pytest.mark.e2e


def test_a_second_devnet_does_not_reuse_the_first_ones_node_state(tmp_path: Path) -> None:
    nodes = tmp_path / "node"
    opts = DemoOptions(trainers=2, verifiers=1, quorum=1, epochs=2, steps=8, workdir=tmp_path / "demo",
                       node_dir=nodes, timeout_s=600)
    summaries = []
    for _ in range(2):
        s, _ = run_network(opts)
        summaries.append(s)
    for s in summaries:
        assert s["run_id"] == 1 and s["epochs_finalized"] == 2
        assert s["verdicts"]["pass"] >= 4 and s["verdicts"]["fail"] == 0  # every trainer judged in every epoch
        assert s["slashed"] == []
        assert s["final_eval_loss"] < s["initial_eval_loss"] - 0.3

    # every node (2 trainers, 1 verifier, the coordinator for its lock) kept one directory per run,
    # told apart by the creation block
    idents = [json.loads(p.read_text()) for p in sorted(nodes.glob("*/*/run-1-*/identity.json"))]
    assert len(idents) == 8 and len(list(nodes.glob("*/*/run-1-*/node.lock"))) == 8
    for role_dir in nodes.iterdir():
        runs = sorted(role_dir.glob("*/run-1-*"))
        assert len(runs) == 2, role_dir
        a, b = (json.loads((r / "identity.json").read_text()) for r in runs)
        assert a["run_id"] == b["run_id"] == 1 and a["created_block_hash"] != b["created_block_hash"]
    assert not list(nodes.glob("*/run-1"))  # the unkeyed layout is gone
