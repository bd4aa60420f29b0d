"""On a real EVM node (anvil): fees follow the fee history, a stuck transaction is replaced with the
same nonce, and a nonce taken by another process sending from the same key is recovered.

anvil stands in for a public chain: `anvil_setNextBlockBaseFeePerGas` plays a fee spike and
`evm_setAutomine false` plus `evm_mine` a chain that produces blocks on its own schedule.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from protocol.chain import errors as ce
from protocol.chain.binding import Chain, TxResult
from protocol.chain.fees import FeeCapExceeded
from tests.fixtures.chain import AnvilNet, params

pytestmark = pytest.mark.integration

GWEI = 10**9


@pytest.fixture(scope="module")
def net() -> Iterator[AnvilNet]:
    n = AnvilNet(accounts=2)
    try:
        yield n
    finally:
        n.close()


def rpc(net: AnvilNet, method: str, *args: Any) -> Any:
    reply = net.w3.provider.make_request(method, list(args))  # type: ignore[arg-type]
    assert "error" not in reply, reply
    return reply["result"]


@pytest.fixture
def key(net: AnvilNet) -> Iterator[LocalAccount]:
    """A fresh funded key per test; automine restored afterwards."""
    acct = Account.create()
    net.w3.eth.send_transaction({"from": net.accounts[0], "to": acct.address, "value": 100 * 10**18})
    try:
        yield acct
    finally:
        rpc(net, "evm_setAutomine", True)


def signer(net: AnvilNet, key: LocalAccount, **kw: Any) -> tuple[Chain, int]:
    c = Chain(net.node.url, net.address, key, **kw)
    return c, c.create_run(params(key.address, quorum=1))


def pending(net: AnvilNet, key: LocalAccount) -> dict[str, Any]:
    """The one transaction of `key` waiting in anvil's pool."""
    pool = rpc(net, "txpool_content")["pending"]
    (tx,) = next(v for k, v in pool.items() if k.lower() == key.address.lower()).values()
    return dict(tx)


def sent_tx(net: AnvilNet, res: TxResult) -> Any:
    return net.w3.eth.get_transaction(res.tx_hash)


def test_fees_follow_the_fee_history_after_a_base_fee_spike(net: AnvilNet, key: LocalAccount) -> None:
    c, run_id = signer(net, key)
    rpc(net, "anvil_setNextBlockBaseFeePerGas", hex(50 * GWEI))
    res = c.fund_run(run_id, 1)
    block = net.w3.eth.get_block(res.block_number)
    tx = sent_tx(net, res)
    assert block["baseFeePerGas"] == 50 * GWEI
    assert tx["maxFeePerGas"] >= 2 * 50 * GWEI  # room for the base fee to keep rising
    assert net.w3.eth.get_transaction_receipt(res.tx_hash)["effectiveGasPrice"] >= 50 * GWEI
    # an operator's cap under the next base fee refuses before anything is sent
    capped = Chain(net.node.url, net.address, key, max_fee=10 * GWEI)
    before = net.w3.eth.get_transaction_count(key.address)
    with pytest.raises(FeeCapExceeded, match="max fee of 10 gwei"):
        capped.fund_run(run_id, 1)
    assert net.w3.eth.get_transaction_count(key.address) == before


def test_a_stuck_transaction_is_replaced_with_the_same_nonce(net: AnvilNet, key: LocalAccount) -> None:
    c, run_id = signer(net, key, receipt_timeout=20, replace_after_s=0.5)
    nonce = net.w3.eth.get_transaction_count(key.address)
    rpc(net, "evm_setAutomine", False)
    out: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: out.setdefault("res", c.fund_run(run_id, 1)), daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while not rpc(net, "txpool_content")["pending"] and time.monotonic() < deadline:
        time.sleep(0.05)
    first = pending(net, key)
    # the fee spikes past what the first offer allows: blocks keep coming, it cannot be included
    rpc(net, "anvil_setNextBlockBaseFeePerGas", hex(int(first["maxFeePerGas"], 16) * 20))
    while worker.is_alive() and time.monotonic() < deadline + 10:
        rpc(net, "evm_mine")
        time.sleep(0.2)
    worker.join(1)
    res = out["res"]
    tx = sent_tx(net, res)
    assert res.tx_hash != first["hash"] and tx["nonce"] == nonce == int(first["nonce"], 16)
    assert tx["maxFeePerGas"] > int(first["maxFeePerGas"], 16) * 10  # re-read the fee history, not just +12.5%
    rpc(net, "evm_setAutomine", True)
    assert sent_tx(net, c.fund_run(run_id, 1))["nonce"] == nonce + 1  # the counter moved once


def test_a_nonce_taken_by_another_process_is_recovered(net: AnvilNet, key: LocalAccount) -> None:
    c, run_id = signer(net, key)
    other, _ = signer(net, key)  # another process with the same key: c's local counter is now stale
    assert other.fund_run(run_id, 1)
    res = c.fund_run(run_id, 1)  # refused as "nonce too low", resynchronised, sent again
    assert sent_tx(net, res)["nonce"] == net.w3.eth.get_transaction_count(key.address) - 1 == 3


def test_a_pending_transaction_displaced_by_another_process_says_so(net: AnvilNet, key: LocalAccount) -> None:
    c, run_id = signer(net, key, receipt_timeout=20, replace_after_s=0.3)
    rpc(net, "evm_setAutomine", False)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            c.fund_run(run_id, 1)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while not rpc(net, "txpool_content")["pending"] and time.monotonic() < deadline:
        time.sleep(0.05)
    mine = pending(net, key)
    # another process sends its own transaction with that nonce and far higher fees; it is mined
    theirs = key.sign_transaction({
        "to": key.address, "value": 0, "gas": 21_000, "nonce": int(mine["nonce"], 16), "chainId": c.chain_id,
        "maxFeePerGas": int(mine["maxFeePerGas"], 16) * 4, "maxPriorityFeePerGas": int(mine["maxFeePerGas"], 16) * 2,
    })
    net.w3.eth.send_raw_transaction(theirs.raw_transaction)
    rpc(net, "evm_mine")
    worker.join(15)
    assert not worker.is_alive() and len(errors) == 1
    assert isinstance(errors[0], ce.ChainError)
    assert f"nonce {int(mine['nonce'], 16)}" in str(errors[0]) and "another process" in str(errors[0])
    rpc(net, "evm_setAutomine", True)
    res = c.fund_run(run_id, 1)  # resynchronised: the next call goes through
    assert sent_tx(net, res)["nonce"] == int(mine["nonce"], 16) + 1


def test_a_transaction_never_mined_names_its_nonce_and_hashes(net: AnvilNet, key: LocalAccount) -> None:
    """Blocks stop (automine off, nothing mines): after the receipt timeout the call fails with the
    nonce and every hash it sent, the replacements included, and the next call re-reads the nonce."""
    c, run_id = signer(net, key, receipt_timeout=2.5, replace_after_s=0.5, max_replacements=2)
    nonce = net.w3.eth.get_transaction_count(key.address)
    rpc(net, "evm_setAutomine", False)
    with pytest.raises(ce.ChainError, match=rf"fundRun \(nonce {nonce}, sent as 0x\w+, 0x\w+, 0x\w+\) was not mined within 2 s"):
        c.fund_run(run_id, 1)
    assert c._nonce is None  # resynchronised on the next call
    rpc(net, "evm_mine")  # the last replacement is what the pool kept
    rpc(net, "evm_setAutomine", True)
    assert sent_tx(net, c.fund_run(run_id, 1))["nonce"] == nonce + 1
