"""Transaction fees from the node's own fee history, their replacement bump, and an operator's cap.

Pure functions over JSON-RPC answers, so they are tested with recorded shapes and used by
protocol.chain.binding for every locally signed transaction:

- EIP-1559 chains: the priority fee is the median of the last blocks' reward percentile (blocks
  with no transactions say nothing about tips and are skipped), the max fee is twice the next
  block's base fee plus that tip: room for six full blocks of base-fee growth (+12.5% each) before
  the transaction stops being includable.
- Nodes without fee history or base fees (pre-London chains, some L2s): one legacy `gasPrice`,
  the node's `eth_gasPrice`.
- A stuck transaction is re-sent with the same nonce and `bump`ed fees: +12.5% on both, above the
  +10% that geth and most pools require to accept a replacement.
- `cap` keeps the max fee at or under an operator's limit and refuses, with the reason, when the
  chain's price is above it now.

docs/real-chain.md is the operator's version.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from protocol.chain.errors import ChainError

GWEI = 10**9
BUMP_NUM, BUMP_DEN = 9, 8  # +12.5% per replacement
MIN_BUMP_NUM, MIN_BUMP_DEN = 11, 10  # the pools' rule: a replacement pays at least +10% on both fees


class FeeCapExceeded(ChainError):
    """The chain's current price is above the configured max fee (--max-fee-gwei); raise it or wait."""


@dataclass(frozen=True)
class Fees:
    """What one transaction offers per gas, in wei.

    EIP-1559: `max_fee` (maxFeePerGas) and `priority` (maxPriorityFeePerGas). Legacy: `max_fee` is
    the gasPrice and `priority` equals it. `base_fee` is the next block's base fee it was computed
    for (0 when unknown), what the cap is checked against.
    """

    max_fee: int
    priority: int
    legacy: bool = False
    base_fee: int = 0

    def tx_fields(self) -> dict[str, int]:
        """The transaction fields these fees set."""
        if self.legacy:
            return {"gasPrice": self.max_fee}
        return {"maxFeePerGas": self.max_fee, "maxPriorityFeePerGas": self.priority}

    def describe(self) -> str:
        if self.legacy:
            return f"gas price {gwei(self.max_fee)} gwei"
        return f"max fee {gwei(self.max_fee)} gwei, priority {gwei(self.priority)} gwei"


def gwei(wei: int) -> str:
    return f"{wei / GWEI:.9g}"


def _int(v: Any) -> int:
    return int(v, 16) if isinstance(v, str) else int(v)


def next_base_fee(history: Mapping[str, Any]) -> int | None:
    """The next block's base fee from an eth_feeHistory answer (its last baseFeePerGas entry);
    None when the chain reports no base fees (not EIP-1559)."""
    base = history.get("baseFeePerGas") or []
    if not base or all(_int(b) == 0 for b in base):
        return None
    return _int(base[-1])


def median_tip(history: Mapping[str, Any]) -> int | None:
    """Median of the first reward percentile over the blocks that carried transactions; None when
    no block in the window did (or the node reports no rewards)."""
    rewards: Sequence[Sequence[Any]] = history.get("reward") or []
    ratios: Sequence[float] = history.get("gasUsedRatio") or []
    tips = [_int(row[0]) for i, row in enumerate(rewards) if row and (i >= len(ratios) or ratios[i] > 0)]
    return int(statistics.median_low(tips)) if tips else None


def from_history(history: Mapping[str, Any] | None, *, fallback_priority: Callable[[], int],
                 gas_price: Callable[[], int]) -> Fees:
    """EIP-1559 fees from an eth_feeHistory answer: priority = median tip (or `fallback_priority()`,
    the node's eth_maxPriorityFeePerGas, when the window has no tips), max = 2 x next base fee +
    priority. Without fee history or base fees (`history` None or all zero): legacy `gas_price()`.
    The two callables are asked only when needed (each is one RPC call)."""
    base = next_base_fee(history) if history is not None else None
    if history is None or base is None:
        price = gas_price()
        return Fees(price, price, legacy=True)
    tip = median_tip(history)
    priority = fallback_priority() if tip is None else tip
    return Fees(2 * base + priority, priority, base_fee=base)


def _up(x: int, num: int, den: int) -> int:
    return -(-x * num // den)  # ceil(x * num / den) in integers


def bump(fees: Fees) -> Fees:
    """The fees of a replacement: +12.5% on both (rounded up), never under the pools' +10%."""
    mf = max(_up(fees.max_fee, BUMP_NUM, BUMP_DEN), _up(fees.max_fee, MIN_BUMP_NUM, MIN_BUMP_DEN))
    tip = max(_up(fees.priority, BUMP_NUM, BUMP_DEN), _up(fees.priority, MIN_BUMP_NUM, MIN_BUMP_DEN))
    if fees.legacy:
        return Fees(mf, mf, legacy=True, base_fee=fees.base_fee)
    return Fees(mf, min(tip, mf), base_fee=fees.base_fee)


def replacement(sent: Fees, fresh: Fees) -> Fees:
    """Fees for re-sending a transaction sent with `sent`: the bump, or today's price if that is
    higher (the base fee may have risen past the bump)."""
    bumped = bump(sent)
    if bumped.legacy or fresh.legacy:
        price = max(bumped.max_fee, fresh.max_fee)
        return Fees(price, price, legacy=True, base_fee=fresh.base_fee)
    mf = max(bumped.max_fee, fresh.max_fee)
    return Fees(mf, min(max(bumped.priority, fresh.priority), mf), base_fee=fresh.base_fee)


def cap(fees: Fees, max_fee: int | None) -> Fees:
    """`fees` with the max fee lowered to `max_fee` wei per gas (None: no cap). Raises
    FeeCapExceeded when even the next block's base fee plus the priority fee (or the legacy gas
    price) is above the cap: a transaction under it could not be mined now."""
    if max_fee is None or fees.max_fee <= max_fee:
        return fees
    need = fees.max_fee if fees.legacy else fees.base_fee + fees.priority
    if need > max_fee:
        now = f"gas price {gwei(fees.max_fee)} gwei" if fees.legacy else (
            f"next base fee {gwei(fees.base_fee)} gwei + priority {gwei(fees.priority)} gwei")
        raise FeeCapExceeded(
            f"the chain's price ({now}) is above the max fee of {gwei(max_fee)} gwei "
            "(--max-fee-gwei / VERILOCO_MAX_FEE_GWEI); raise the cap or wait for fees to fall"
        )
    return Fees(max_fee, min(fees.priority, max_fee), legacy=fees.legacy, base_fee=fees.base_fee)
