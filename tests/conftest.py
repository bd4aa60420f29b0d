"""Shared fixtures of the contract tests: one py-evm chain per module, reset per test (a module may define its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.chain import PyEvmNet


@pytest.fixture(scope="module")
def net() -> PyEvmNet:
    return PyEvmNet(accounts=12)


@pytest.fixture
def fresh(net: PyEvmNet) -> Iterator[PyEvmNet]:
    """The module's chain, reverted to this point after the test."""
    snap = net.snapshot()
    try:
        yield net
    finally:
        net.revert(snap)
