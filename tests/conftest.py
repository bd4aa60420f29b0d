"""Shared fixtures: one py-evm chain per module, reset per test, and a module-scoped anvil (a module may define its own)."""

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


@pytest.fixture(scope="module")
def anvil() -> Iterator[object]:
    """A module's own anvil (two funded accounts), for tests that drive the CLI against a real node."""
    from devnet.anvil import Anvil, AnvilConfig

    node = Anvil(AnvilConfig(accounts=2)).start()
    try:
        yield node
    finally:
        node.close()
