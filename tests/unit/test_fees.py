"""protocol.chain.fees on eth_feeHistory answers of the shapes nodes send (hex strings from JSON-RPC, ints
from web3's formatter), the legacy fallback, the replacement bump and the operator's cap."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.chain import fees as f
from protocol.chain.binding import _rejection
from protocol.errors import VerilocoError

pytestmark = pytest.mark.unit

GWEI = 10**9

# anvil 1.x, `eth_feeHistory ["0x3", "latest", [50]]` after one transfer and a raised base fee
ANVIL = {
    "baseFeePerGas": ["0x3b9aca00", "0x3b9aca00", "0xba43b7400", "0xa2fb40580"],
    "gasUsedRatio": [0.0, 0.0007, 0.0],
    "baseFeePerBlobGas": ["0x1", "0x1", "0x1", "0x1"],
    "blobGasUsedRatio": [0.0, 0.0, 0.0],
    "oldestBlock": "0x0",
    "reward": [["0x0"], ["0x3b9aca00"], ["0x0"]],
}
# a busy chain, as web3 formats it (ints): five blocks, tips 1, 2, 3, 50 (an outlier) and 2 gwei
BUSY = {
    "oldestBlock": 100,
    "baseFeePerGas": [30 * GWEI, 31 * GWEI, 29 * GWEI, 30 * GWEI, 32 * GWEI, 33 * GWEI],
    "gasUsedRatio": [0.6, 0.4, 0.55, 0.7, 0.5],
    "reward": [[1 * GWEI], [2 * GWEI], [3 * GWEI], [50 * GWEI], [2 * GWEI]],
}
# eth-tester: base fees but no rewards; a pre-London node: base fees all zero
NO_REWARDS = {"oldestBlock": 1, "baseFeePerGas": [840790264, 875000000, 10**9], "gasUsedRatio": [0.0007, 0.34, 0.0], "reward": []}
PRE_LONDON = {"oldestBlock": 5, "baseFeePerGas": ["0x0", "0x0"], "gasUsedRatio": [0.5], "reward": [["0x5"]]}


def never() -> int:
    raise AssertionError("an RPC call that was not needed")


def test_busy_chain_median_tip_and_twice_the_next_base_fee() -> None:
    fees = f.from_history(BUSY, fallback_priority=never, gas_price=never)
    assert fees.priority == 2 * GWEI  # median of 1, 2, 2, 3, 50: the outlier does not move it
    assert fees.base_fee == 33 * GWEI  # the last entry is the next block's
    assert fees.max_fee == 2 * 33 * GWEI + 2 * GWEI and not fees.legacy
    assert fees.tx_fields() == {"maxFeePerGas": 68 * GWEI, "maxPriorityFeePerGas": 2 * GWEI}


def test_hex_answer_skips_empty_blocks() -> None:
    fees = f.from_history(ANVIL, fallback_priority=never, gas_price=never)
    assert fees.priority == GWEI  # only block 1 carried a transaction; empty blocks' zeros are not tips
    assert fees.base_fee == 0xA2FB40580 and fees.max_fee == 2 * 0xA2FB40580 + GWEI


def test_no_tips_in_the_window_asks_the_node() -> None:
    fees = f.from_history(NO_REWARDS, fallback_priority=lambda: 7, gas_price=never)
    assert (fees.priority, fees.max_fee) == (7, 2 * 10**9 + 7)
    quiet = dict(ANVIL, gasUsedRatio=[0.0, 0.0, 0.0])
    assert f.from_history(quiet, fallback_priority=lambda: 3, gas_price=never).priority == 3


@pytest.mark.parametrize("history", [None, PRE_LONDON, {"oldestBlock": 0, "baseFeePerGas": [], "gasUsedRatio": []}])
def test_legacy_gas_price_without_fee_history_or_base_fees(history: dict | None) -> None:
    fees = f.from_history(history, fallback_priority=never, gas_price=lambda: 20 * GWEI)
    assert fees.legacy and fees.max_fee == fees.priority == 20 * GWEI
    assert fees.tx_fields() == {"gasPrice": 20 * GWEI}


def test_bump_is_an_eighth_up_and_at_least_the_pools_tenth() -> None:
    b = f.bump(f.Fees(80 * GWEI, 2 * GWEI, base_fee=39 * GWEI))
    assert (b.max_fee, b.priority) == (90 * GWEI, 2_250_000_000)
    for x in (1, 7, 9, 10, 11, 99, 10**9 + 1):  # rounding up keeps every bump >= +10% (geth compares in integers)
        b = f.bump(f.Fees(x, x))
        assert b.max_fee * 10 >= x * 11 and b.priority * 10 >= x * 11 and b.max_fee > x
    legacy = f.bump(f.Fees(8, 8, legacy=True))
    assert legacy.legacy and legacy.max_fee == legacy.priority == 9


def test_replacement_follows_a_rising_base_fee() -> None:
    sent = f.Fees(3 * GWEI, GWEI, base_fee=GWEI)
    fresh = f.Fees(2 * 44 * GWEI + GWEI, GWEI, base_fee=44 * GWEI)  # the base fee jumped meanwhile
    r = f.replacement(sent, fresh)
    assert r.max_fee == fresh.max_fee and r.priority == 1_125_000_000  # tip still bumped
    calm = f.replacement(sent, f.Fees(GWEI, GWEI // 2, base_fee=GWEI // 4))
    assert (calm.max_fee, calm.priority) == (3_375_000_000, 1_125_000_000)  # never below the bump


def test_cap_lowers_the_max_fee_or_refuses_with_the_reason() -> None:
    fees = f.Fees(68 * GWEI, 2 * GWEI, base_fee=33 * GWEI)
    assert f.cap(fees, None) is fees and f.cap(fees, 100 * GWEI) is fees
    capped = f.cap(fees, 40 * GWEI)
    assert (capped.max_fee, capped.priority) == (40 * GWEI, 2 * GWEI)
    with pytest.raises(f.FeeCapExceeded, match=r"next base fee 33 gwei \+ priority 2 gwei.*max fee of 30 gwei") as e:
        f.cap(fees, 30 * GWEI)
    assert isinstance(e.value, VerilocoError)
    with pytest.raises(f.FeeCapExceeded, match="gas price 20 gwei"):
        f.cap(f.Fees(20 * GWEI, 20 * GWEI, legacy=True), 10 * GWEI)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("{'code': -32003, 'message': 'nonce too low'}", "nonce"),  # anvil, geth
        ("Invalid transaction nonce: Expected 1, but got 0", "nonce"),  # eth-tester
        ("{'code': -32000, 'message': 'replacement transaction underpriced'}", "underpriced"),
        ("max fee per gas less than block base fee", "underpriced"),
        ("{'code': -32000, 'message': 'already known'}", "known"),  # geth
        ("transaction already imported", "known"),  # anvil
        ("insufficient funds for gas * price + value", None),
    ],
)
def test_node_rejections_are_classified(message: str, kind: str | None) -> None:
    assert _rejection(ValueError(message)) == kind


def test_the_cap_setting_from_flag_or_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import argparse

    from veriloco.settings import SettingsError, add_connection_args, resolve

    p = argparse.ArgumentParser()
    add_connection_args(p)
    monkeypatch.chdir(tmp_path)  # no devnet file
    base = ["--rpc-url", "http://127.0.0.1:8545"]
    assert resolve(p.parse_args(base), need_key=False, need_contract=False).max_fee_wei is None
    assert resolve(p.parse_args([*base, "--max-fee-gwei", "2.5"]), need_key=False, need_contract=False).max_fee_wei == 2_500_000_000
    monkeypatch.setenv("VERILOCO_MAX_FEE_GWEI", "40")
    assert resolve(p.parse_args(base), need_key=False, need_contract=False).max_fee_wei == 40 * GWEI
    assert resolve(p.parse_args([*base, "--max-fee-gwei", "7"]), need_key=False, need_contract=False).max_fee_wei == 7 * GWEI
    for bad in ("abc", "0", "-3", "inf", "nan"):
        with pytest.raises(SettingsError, match="not a positive number of gwei"):
            resolve(p.parse_args([*base, "--max-fee-gwei", bad]), need_key=False, need_contract=False)
