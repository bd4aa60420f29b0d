"""What a stopping node owes its run (issue 46): a trainer's reveal and audit answer, a verifier's
verdicts, each with its chain-time deadline, read from the contract alone (protocol/duties.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from protocol.duties import pending
from tests.fixtures.chain import make_run

pytestmark = pytest.mark.integration


def test_each_open_duty_is_named_with_its_deadline_and_none_once_done(fresh: Any) -> None:
    r = make_run(fresh, [1, 2], [3, 4, 5], quorum=3)
    a, b = r.trainers
    v = str(r.verifiers[0].sender)
    assert pending(r.coord, r.run_id, a.address, "trainer") == []  # nothing committed yet
    a.commit(0)
    due = pending(r.coord, r.run_id, a.address, "trainer")
    assert len(due) == 1 and due[0].startswith("epoch 0: reveal by ") and " UTC, in " in due[0], due
    b.commit(0)  # everyone committed: reveals open
    a.reveal(0)
    b.reveal(0)
    t = r.coord.epoch_times(r.run_id, 0)
    if not t.seeded:
        r.coord.fix_audit_seed(r.run_id, 0)
    due = pending(r.coord, r.run_id, a.address, "trainer")
    assert len(due) == 1 and due[0].startswith("epoch 0: audit answer by "), due
    left = int(re.search(r"UTC, in (\d+) s of chain time", due[0]).group(1))  # type: ignore[union-attr]
    assert 0 < left <= r.coord.run_info(r.run_id).params.response_window
    assert pending(r.coord, r.run_id, v, "verifier")[0].startswith("epoch 0: verdicts on its assigned trainers by ")
    a.respond(0)
    assert pending(r.coord, r.run_id, a.address, "trainer") == []  # answered: nothing left
    assert pending(r.coord, r.run_id, a.address, "coordinator") == []
