"""A trainer closes an epoch only on the contract's own refusal, never on a failed transaction.

A reveal that ran out of gas (or was dropped, or reverted without a reason) is the protocol's edge,
not the trainer's choice: closing the epoch then would get an honest trainer slashed for not
revealing. `TrainerNode._send` leaves the epoch open so the caller retries while the phase lasts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protocol.chain.binding import ChainUnavailable, TxResult
from protocol.chain.errors import NotEligible, TransactionFailed
from trainer.answering import AnswerWorker
from trainer.checkpoints import EpochDir
from trainer.node import CLOSED, COMMITTED, TrainerNode

pytestmark = pytest.mark.unit


class _Node:
    """What `_send` touches of a node: its log, and how it closes an epoch (its answer job, its engine)."""

    _close = TrainerNode._close

    def __init__(self) -> None:
        self.events: list[str] = []
        self.answers, self.engine = AnswerWorker(threads=1), None

    def log(self, event: str, **fields: Any) -> None:
        self.events.append(event)


def _raise(exc: Exception) -> Any:
    def send() -> TxResult:
        raise exc
    return send


def test_a_failed_transaction_leaves_the_epoch_open_for_a_retry(tmp_path: Path) -> None:
    node, d = _Node(), EpochDir(tmp_path, 3)
    d.update(status=COMMITTED)
    assert TrainerNode._send(node, "reveal", d, _raise(TransactionFailed("out of gas"))) is None  # type: ignore[arg-type]
    assert d.meta["status"] == COMMITTED and node.events == ["reveal-retry"]


def test_the_contracts_refusal_closes_the_epoch(tmp_path: Path) -> None:
    node, d = _Node(), EpochDir(tmp_path, 3)
    d.update(status=COMMITTED)
    refusal = NotEligible(1, 3, "0x" + "11" * 20, 0, 3)
    assert TrainerNode._send(node, "reveal", d, _raise(refusal)) is None  # type: ignore[arg-type]
    assert d.meta["status"] == CLOSED and node.events == ["reveal-failed"]


def test_an_outage_propagates_to_be_waited_out(tmp_path: Path) -> None:
    node, d = _Node(), EpochDir(tmp_path, 3)
    d.update(status=COMMITTED)
    with pytest.raises(ChainUnavailable):
        TrainerNode._send(node, "reveal", d, _raise(ChainUnavailable("node down")))  # type: ignore[arg-type]
    assert d.meta["status"] == COMMITTED and node.events == []
