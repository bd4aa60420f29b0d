"""Shared fixtures: one py-evm chain per module, reset per test, a module-scoped anvil and a module-scoped
devnet (chain, contract and store, as `veriloco devnet` starts them); a module may define its own."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from protocol.numerics import pin_environment

# before any test computes: the suite runs in the CPU numerics class exact runs pin, as every node
# does, so its bit-for-bit comparisons hold on any x86-64-v3 host, not only on this one's kernels
pin_environment()

from tests.fixtures.chain import PyEvmNet

# the suite's runs are test runs by design (quorum 1 or 2, for speed): its nodes and the processes it
# starts stake into them as if every one passed --allow-test-run; test_lifecycle_cli checks the refusal
os.environ.setdefault("VERILOCO_ALLOW_TEST_RUN", "1")


@pytest.fixture(autouse=True)
def _own_key_locks(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's nodes take their per-user key locks (protocol/nodelock.py) in a folder of its own:
    devnets repeat chain ids, contract addresses and run ids, so a node still exiting from one test
    must not refuse the next test's node with the same key."""
    monkeypatch.setenv("VERILOCO_LOCK_DIR", str(tmp_path_factory.mktemp("key-locks")))


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


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A module's own devnet (py-evm, the contract deployed, a local store; eight funded accounts),
    for tests that run the CLI's node commands against it."""
    from devnet.launch import start_devnet

    with start_devnet(state_dir=tmp_path_factory.mktemp("devnet"), accounts=8) as net:
        yield net
