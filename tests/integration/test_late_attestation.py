"""A verifier on the attestation committee whose attestation lands after the committee's majority
has already confirmed the model: routine in every network run, so it is logged as `attest-late`
(info), not `attest-failed` (an error), and the node does not try again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from protocol.chain.binding import Phase
from protocol.store.backends import LocalStore
from tests.fixtures.chain import MODEL, PyEvmNet, make_run
from verifier.node import VerifierNode

pytestmark = pytest.mark.integration


def test_an_attestation_after_the_majority_is_late_not_failed(fresh: PyEvmNet, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    r = make_run(fresh, [1, 2], [6, 7, 8, 9], 0, quorum=3)
    r.open_epoch(0)
    r.judge_all(0)
    r.finalize(0, r.trainers, confirm=False)
    assert r.coord.epoch_status(r.run_id, 0).phase is Phase.CONFIRMING
    committee = r.coord.model_committee(r.run_id, 0)
    assert len(committee) > len(committee) // 2 + 1  # one member outside the first majority
    late = r.verifier(committee[-1])
    events: list[tuple[str, dict[str, Any]]] = []
    node = VerifierNode(late, LocalStore(tmp_path / "store"), r.run_id, tmp_path / "verifier",
                        log=lambda event, **kv: events.append((event, kv)))
    # the model it recomputes is the finalized one (the aggregation itself is tested elsewhere)
    monkeypatch.setattr("public.globals.build_global", lambda *a, **k: ({"w": torch.zeros(2)}, [], MODEL))
    monkeypatch.setattr(node, "_globals", lambda: None)
    monkeypatch.setattr(node, "ctx", None, raising=False)
    send = late.attest_model

    def after_the_majority(*args: Any, **kwargs: Any) -> Any:
        r.attest(0, MODEL)  # the first majority confirms between the node's phase read and its transaction
        return send(*args, **kwargs)

    monkeypatch.setattr(late, "attest_model", after_the_majority)
    node._check_aggregate(0)
    assert r.coord.epoch_status(r.run_id, 0).phase is Phase.FINALIZED
    assert [(e, "WrongPhase" in kv["error"]) for e, kv in events if e.startswith("attest")] == [("attest-late", True)]
    assert node._done()["attested:0"] is True
