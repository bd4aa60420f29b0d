"""py-evm served over HTTP JSON-RPC on loopback: the embedded devnet chain any Ethereum client can use.

web3, ethers and cast talk JSON-RPC over HTTP; eth-tester talks Python (ints, bytes, snake_case
keys). This module is the translation between them, field by field, with one lock around the chain
so concurrent clients see a consistent sequence of blocks. It is what `veriloco devnet --chain
py-evm` runs; `start_devnet` (devnet.launch) runs it on a thread for in-process use.

Behaviour worth knowing (docs/devnet.md has the user-facing version):
- automine: every transaction is mined into its own block at once (eth-tester rejects a second
  pending transaction from the same sender, so batching blocks is not offered);
- block.timestamp follows the injected clock (wall time by default) plus the offset that
  `evm_increaseTime` accumulates, and is always at least parent + 1;
- `eth_call` at "latest" runs in the latest block's context (its timestamp), as on geth and
  anvil; at "pending" it runs in the block that would be mined now, so a view that derives a phase
  from block.timestamp sees the current time even when no block was mined for a while.
  `eth_estimateGas` without a block (or at "latest") estimates for that pending block, where the
  transaction will land. Without fee fields both run at gas price 0, so any address may call;
- reverts are JSON-RPC error 3 "execution reverted" with the revert data, as geth and anvil send it.

Run it alone: `python -m devnet.evmserver --port 8545` (or use `veriloco devnet`).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from eth_abi import decode as abi_decode
from eth_abi.exceptions import DecodingError
from eth_bloom import BloomFilter
from eth_tester import EthereumTester, PyEVMBackend
from eth_tester.exceptions import (
    BlockNotFound,
    FilterNotFound,
    SnapshotNotFound,
    TransactionNotFound,
)
from eth_utils import decode_hex, encode_hex, keccak, to_canonical_address, to_checksum_address

from protocol.errors import VerilocoError
from protocol.formats.jsondepth import MAX_JSON_DEPTH, json_depth  # JSON-RPC needs about 6 levels

# The public test mnemonic anvil and hardhat use: the same dev accounts on every devnet.
# These keys are published everywhere; never send real funds to them.
DEV_MNEMONIC = "test test test test test test test test test test test junk"
DEV_HD_PATH = "m/44'/60'/0'/0"  # account i is DEV_HD_PATH/i, as anvil derives them
DEFAULT_CHAIN_ID = 1337  # py-evm devnet; anvil keeps its own default, 31337
DEFAULT_PRIORITY_FEE = 10**9  # 1 gwei, what eth_maxPriorityFeePerGas suggests
MAX_REQUEST_BYTES = 32 * 1024 * 1024

_BLOCK_TAGS = frozenset({"latest", "earliest", "pending", "safe", "finalized"})
_ERROR_STRING_SELECTOR = bytes.fromhex("08c379a0")  # Error(string)


class EvmServerError(VerilocoError):
    """The embedded JSON-RPC chain could not start or serve (bad config, port in use)."""


class RpcError(Exception):
    """A JSON-RPC error object: code, message and optional data, sent back to the client."""

    def __init__(self, code: int, message: str, data: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


def _invalid(message: str) -> RpcError:
    return RpcError(-32602, f"invalid params: {message}")


class _Reverted(Exception):
    """Execution failed; `data` is the revert payload (empty for non-REVERT failures)."""

    def __init__(self, data: bytes, reason: str) -> None:
        super().__init__(reason)
        self.data = data
        self.reason = reason


@dataclass(frozen=True)
class EvmConfig:
    """What the embedded chain looks like: id, funded dev accounts, block gas limit."""

    chain_id: int = DEFAULT_CHAIN_ID
    accounts: int = 10
    mnemonic: str = DEV_MNEMONIC
    balance_wei: int = 10_000 * 10**18  # as anvil funds its dev accounts
    gas_limit: int = 30_000_000

    def __post_init__(self) -> None:
        if not 1 <= self.chain_id < 2**63:
            raise EvmServerError(f"chain id {self.chain_id} is out of range; use 1 .. 2**63-1")
        if not 1 <= self.accounts <= 1000:
            raise EvmServerError(f"accounts={self.accounts}: choose between 1 and 1000")
        if self.gas_limit < 5_000_000:
            raise EvmServerError(f"gas limit {self.gas_limit} is too small; use >= 5,000,000")


class _Backend(PyEVMBackend):  # type: ignore[misc]
    """PyEVMBackend with our chain id kept across resets (py-evm fixes it per chain class)."""

    def __init__(self, chain_id: int, **kwargs: Any) -> None:
        self._chain_id = chain_id
        super().__init__(**kwargs)

    def reset_to_genesis(self, *args: Any, **kwargs: Any) -> None:
        super().reset_to_genesis(*args, **kwargs)
        self.chain.chain_id = self._chain_id

    def revert_to_snapshot(self, snapshot: Any) -> None:
        super().revert_to_snapshot(snapshot)
        self.chain.chain_id = self._chain_id

    def _locate(self, tx_hash: bytes) -> tuple[Any, Any, int]:
        """(block, transaction, index) through py-evm's hash index.

        eth-tester scans every block from the head down; on a devnet that mines idle blocks that
        grows with uptime, and an unknown hash costs a scan of the whole chain.
        """
        from eth.exceptions import HeaderNotFound
        from eth.exceptions import TransactionNotFound as EvmTxNotFound

        chain = self.chain
        pending = chain.get_block()
        for index, tx in enumerate(pending.transactions):
            if tx.hash == tx_hash:
                return pending, tx, index
        try:
            number, index = chain.chaindb.get_transaction_index(tx_hash)
            block = chain.get_canonical_block_by_number(number)
            tx = block.transactions[index]
        except (EvmTxNotFound, HeaderNotFound, IndexError):
            tx = None
        if tx is None or tx.hash != tx_hash:  # unknown, or left behind by evm_revert
            raise TransactionNotFound(f"no transaction {encode_hex(tx_hash)}")
        return block, tx, index

    def get_transaction_by_hash(self, transaction_hash: bytes) -> Any:
        from eth_tester.backends.pyevm.serializers import serialize_transaction

        block, tx, index = self._locate(transaction_hash)
        return serialize_transaction(
            block, tx, index, block.number == self.chain.header.block_number
        )

    def get_transaction_receipt(self, transaction_hash: bytes) -> Any:
        from eth_tester.backends.pyevm.serializers import serialize_transaction_receipt

        block, tx, index = self._locate(transaction_hash)
        return serialize_transaction_receipt(
            block,
            block.get_receipts(self.chain.chaindb),
            tx,
            index,
            block.number == self.chain.header.block_number,
            self.chain.get_vm(),
        )


class EvmChain:
    """eth-tester + py-evm with wall-clock block times, time travel and raw revert data.

    Not thread-safe on its own: EvmRpc serialises every call with one lock.
    """

    def __init__(self, config: EvmConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock
        self._offset = 0  # seconds added by evm_increaseTime
        self._next_timestamp: int | None = None  # set by evm_setNextBlockTimestamp
        genesis_state = PyEVMBackend.generate_genesis_state(
            overrides={"balance": config.balance_wei},
            num_accounts=config.accounts,
            mnemonic=config.mnemonic,
            hd_path=DEV_HD_PATH,
        )
        genesis_params = PyEVMBackend.generate_genesis_params(
            overrides={"timestamp": int(clock()), "gas_limit": config.gas_limit}
        )
        self.backend = _Backend(
            config.chain_id,
            genesis_parameters=genesis_params,
            genesis_state=genesis_state,
            mnemonic=config.mnemonic,
            hd_path=DEV_HD_PATH,
        )
        self.tester = EthereumTester(self.backend, auto_mine_transactions=True)

    # -- time --------------------------------------------------------------------------------

    def refresh_pending(self) -> None:
        """Stamp the (empty) pending block with the current time before anything executes in it."""
        chain = self.backend.chain
        if chain.header.gas_used != 0:
            return  # never re-stamp a block that already holds transactions
        parent_ts = chain.get_canonical_head().timestamp
        if self._next_timestamp is not None:
            target = self._next_timestamp
        else:
            target = self.now()
        stamp = max(target, parent_ts + 1)
        if chain.header.timestamp != stamp:
            chain.set_header_timestamp(stamp)

    def now(self) -> int:
        """The chain's clock: injected wall time plus the evm_increaseTime offset."""
        return int(self._clock()) + self._offset

    def mine_if_idle(self, block_time: float) -> bool:
        """Mine an empty block when the latest one is `block_time` old (keeps "latest" fresh)."""
        latest = self.backend.chain.get_canonical_head().timestamp
        if self._next_timestamp is None and self.now() - latest < block_time:
            return False
        self.mine(1)
        return True

    def increase_time(self, seconds: int) -> int:
        self._offset += seconds
        return self._offset

    def set_next_timestamp(self, timestamp: int) -> None:
        latest = self.backend.chain.get_canonical_head().timestamp
        if timestamp <= latest:
            raise RpcError(
                -32602, f"timestamp {timestamp} is not after the latest block ({latest})"
            )
        self._next_timestamp = timestamp

    def mined(self) -> None:
        """A block was mined: a one-shot next timestamp is used up."""
        self._next_timestamp = None

    def mine(self, blocks: int) -> None:
        for _ in range(blocks):
            self.refresh_pending()
            self.tester.mine_blocks(1)
            self.mined()

    # -- execution without a transaction ------------------------------------------------------

    def _spoof(self, tx: dict[str, Any], at: str | int) -> Any:
        from eth.vm.spoof import SpoofTransaction

        self.tester.validator.validate_inbound_transaction(tx, txn_internal_type="call")
        raw = self.tester.normalizer.normalize_inbound_transaction(tx)
        if not any(k in raw for k in ("gas_price", "max_fee_per_gas", "max_priority_fee_per_gas")):
            # like geth: no fee fields means gas price 0, so an unfunded address can call
            raw["max_fee_per_gas"] = 0
            raw["max_priority_fee_per_gas"] = 0
        raw.setdefault("gas", self.backend.chain.header.gas_limit)
        nonce_at = "pending" if at in ("latest", "pending") else at
        unsigned = self.backend._get_normalized_and_unsigned_evm_transaction(raw, nonce_at)
        return SpoofTransaction(unsigned, from_=raw["from"])

    def _scratch_state(self, at: str | int) -> Any:
        """A throwaway state at base fee 0 in the context of block `at`.

        "pending" is the block that would be mined now (current time, latest state); "latest"
        and numbers are that mined block's own context (its number and timestamp), as geth and
        anvil run eth_call.
        """
        chain = self.backend.chain
        if at == "pending":
            self.refresh_pending()
            header = chain.header
        else:
            head = chain.get_canonical_head().block_number
            number = {"latest": head, "earliest": 0}.get(at, at) if isinstance(at, str) else at
            if not isinstance(number, int) or number > head:
                raise BlockNotFound(f"block {at} does not exist yet (head is {head})")
            header = chain.get_canonical_block_header_by_number(number)
        vm = chain.get_vm(header)
        free = header.copy(base_fee_per_gas=0) if hasattr(header, "base_fee_per_gas") else header
        return vm.build_state(chain.chaindb.db, free, vm.chain_context, vm.previous_hashes)

    def call(self, tx: dict[str, Any], at: str | int) -> bytes:
        computation = self._execute(self._spoof(tx, at), at)
        if computation.is_error:
            raise _reverted(computation.error)
        return bytes(computation.output)

    def logs(
        self,
        first: int,
        last: int,
        addresses: list[bytes] | None,
        topics: list[list[bytes] | None],
    ) -> list[dict[str, Any]]:
        """Matching logs of canonical blocks first..last, skipping blocks by their header bloom.

        Straight from py-evm's receipts (eth-tester's get_logs looks every receipt up by hash with
        a scan from the head, which grows with chain length). logIndex is block-wide, as in geth.
        """
        chain = self.backend.chain
        last = min(last, chain.get_canonical_head().block_number)
        out: list[dict[str, Any]] = []
        for number in range(max(first, 0), last + 1):
            header = chain.get_canonical_block_header_by_number(number)
            bloom = BloomFilter(header.bloom)
            if addresses and not any(a in bloom for a in addresses):
                continue
            if any(alts and not any(t in bloom for t in alts) for alts in topics):
                continue
            block = chain.get_canonical_block_by_number(number)
            log_index = 0
            for tx_index, (tx, receipt) in enumerate(
                zip(block.transactions, block.get_receipts(chain.chaindb), strict=True)
            ):
                for log in receipt.logs:
                    words = [t.to_bytes(32, "big") for t in log.topics]
                    if _log_matches(log.address, words, addresses, topics):
                        out.append(
                            {
                                "address": to_checksum_address(log.address),
                                "topics": [encode_hex(w) for w in words],
                                "data": encode_hex(log.data),
                                "blockNumber": hex(number),
                                "blockHash": encode_hex(block.hash),
                                "transactionHash": encode_hex(tx.hash),
                                "transactionIndex": hex(tx_index),
                                "logIndex": hex(log_index),
                                "removed": False,
                            }
                        )
                    log_index += 1
        return out

    def estimate_gas(self, tx: dict[str, Any], at: str | int) -> int:
        """Gas limit for `tx` in the block it would land in.

        As geth does: run once with the whole block's gas, then try the gas that used plus the
        63/64 reserve calls keep back; only if that fails fall back to py-evm's binary search
        (which alone needs a dozen executions).
        """
        from eth.exceptions import VMError

        tx = {k: v for k, v in tx.items() if k != "gas"}
        if at == "latest":
            at = "pending"  # estimate for the block the transaction would land in: now
        full = self._spoof(tx, at)
        computation = self._execute(full, at)
        if computation.is_error:
            raise _reverted(computation.error)
        used = int(full.gas) - int(computation.get_gas_remaining())
        guess = min(int(full.gas), (used + 2300) * 64 // 63)
        if not self._execute(self._spoof({**tx, "gas": guess}, at), at).is_error:
            return guess
        try:
            return int(self.backend.chain.gas_estimator(self._scratch_state(at), full))
        except VMError as exc:
            raise _reverted(exc) from None

    def _execute(self, spoof: Any, at: str | int) -> Any:
        state = self._scratch_state(at)
        snapshot = state.snapshot()
        try:
            return state.apply_transaction(spoof)
        finally:
            state.revert(snapshot)


def _log_matches(
    address: bytes,
    words: list[bytes],
    addresses: list[bytes] | None,
    topics: list[list[bytes] | None],
) -> bool:
    if addresses and address not in addresses:
        return False
    if len(topics) > len(words):
        return False
    return all(alts is None or not alts or words[i] in alts for i, alts in enumerate(topics))


def _reverted(error: Exception) -> _Reverted:
    from eth.exceptions import Revert

    if isinstance(error, Revert):
        data = error.args[0] if error.args and isinstance(error.args[0], bytes) else b""
        reason = "execution reverted"
        if data[:4] == _ERROR_STRING_SELECTOR:
            try:
                reason += ": " + abi_decode(["string"], data[4:])[0]
            except DecodingError:  # malformed Error(string): keep the bare message
                reason += " (undecodable reason string)"
        return _Reverted(data, reason)
    return _Reverted(b"", f"execution failed: {type(error).__name__} {error}".strip())


# -- parameter parsing (JSON-RPC -> eth-tester) -------------------------------------------------


def _quantity(value: Any, name: str = "quantity") -> int:
    if isinstance(value, bool):
        raise _invalid(f"{name} must be a hex quantity, got {value!r}")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and value[:2] in ("0x", "0X") and len(value) > 2:
        try:
            return int(value, 16)
        except ValueError:
            pass
    raise _invalid(f"{name} must be a hex quantity like '0x1a', got {value!r}")


def _data(value: Any, name: str = "data") -> str:
    if isinstance(value, str) and value[:2] in ("0x", "0X") and len(value) % 2 == 0:
        try:
            bytes.fromhex(value[2:])
            return "0x" + value[2:].lower()
        except ValueError:
            pass
    raise _invalid(f"{name} must be 0x-prefixed hex bytes, got {str(value)[:80]!r}")


def _hash32(value: Any, name: str = "hash") -> str:
    text = _data(value, name)
    if len(text) != 66:
        raise _invalid(f"{name} must be 32 bytes, got {len(text) // 2 - 1}")
    return text


def _address(value: Any, name: str = "address") -> str:
    text = _data(value, name)
    if len(text) != 42:
        raise _invalid(f"{name} must be a 20-byte address, got {value!r}")
    return to_checksum_address(text)


_TX_QUANTITIES = {
    "gas": "gas",
    "gasPrice": "gas_price",
    "maxFeePerGas": "max_fee_per_gas",
    "maxPriorityFeePerGas": "max_priority_fee_per_gas",
    "value": "value",
    "nonce": "nonce",
    "chainId": "chain_id",
}


def _tx(value: Any, default_from: str | None) -> dict[str, Any]:
    """A JSON-RPC transaction object as eth-tester wants it (snake_case, ints, hex data)."""
    if not isinstance(value, dict):
        raise _invalid("transaction must be an object")
    tx: dict[str, Any] = {}
    for key, snake in _TX_QUANTITIES.items():
        if value.get(key) is not None:
            tx[snake] = _quantity(value[key], key)
    sender = value.get("from") or default_from
    if sender is None:
        raise _invalid("transaction needs 'from'")
    tx["from"] = _address(sender, "from")
    if value.get("to") is not None:
        tx["to"] = _address(value["to"], "to")
    payload = value.get("input", value.get("data"))
    if payload is not None:
        tx["data"] = _data(payload, "input")
    if value.get("accessList"):
        try:
            tx["access_list"] = [
                {
                    "address": _address(entry["address"]),
                    "storage_keys": [_hash32(k, "storage key") for k in entry["storageKeys"]],
                }
                for entry in value["accessList"]
            ]
        except (KeyError, TypeError):
            raise _invalid("accessList entries need 'address' and 'storageKeys'") from None
    if "gas_price" in tx and ("max_fee_per_gas" in tx or "max_priority_fee_per_gas" in tx):
        raise _invalid("give either gasPrice or maxFeePerGas/maxPriorityFeePerGas, not both")
    return tx


# -- result formatting (eth-tester -> JSON-RPC) ------------------------------------------------


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _json(value: Any) -> Any:
    """Ints become hex quantities, bytes hex data, snake_case keys camelCase, tuples lists."""
    if isinstance(value, bool) or value is None or isinstance(value, float | str):
        return value
    if isinstance(value, int):
        return hex(value)
    if isinstance(value, bytes | bytearray):
        return encode_hex(bytes(value))
    if isinstance(value, dict):
        return {_camel(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    raise TypeError(f"cannot encode {type(value).__name__} as JSON-RPC")


def _bloom_hex(bloom: int) -> str:
    return encode_hex(bloom.to_bytes(256, "big"))


def _fmt_tx(tx: dict[str, Any]) -> dict[str, Any]:
    out = dict(tx)
    out["input"] = out.pop("data", "0x")
    if out.get("to") == "":
        out["to"] = None
    return _json(out)


def _fmt_log(log: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in log.items() if k != "type"}
    out["removed"] = False
    return _json(out)


def _fmt_receipt(receipt: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in receipt.items() if k not in ("state_root", "logs")}
    if out.get("to") == "":
        out["to"] = None
    bloom = BloomFilter()
    for log in receipt["logs"]:
        bloom.add(decode_hex(log["address"]))
        for topic in log["topics"]:
            bloom.add(decode_hex(topic))
    result = _json(out)
    result["logs"] = [_fmt_log(log) for log in receipt["logs"]]
    result["logsBloom"] = _bloom_hex(int(bloom))
    return result


def _fmt_block(block: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in block.items() if k not in ("logs_bloom", "transactions", "coinbase")}
    result = _json(out)
    result["miner"] = block["coinbase"]
    result["logsBloom"] = _bloom_hex(int(block["logs_bloom"]))
    result["transactions"] = [
        tx if isinstance(tx, str) else _fmt_tx(tx) for tx in block["transactions"]
    ]
    return result


# -- the JSON-RPC dispatcher -------------------------------------------------------------------


Handler = Callable[[list[Any]], Any]


class EvmRpc:
    """JSON-RPC 2.0 over an EvmChain: `handle(request_object_or_batch) -> response(s)`.

    Pure request/response (no sockets), so it is testable and servable by any transport.
    """

    def __init__(self, chain: EvmChain) -> None:
        self.chain = chain
        self.lock = threading.RLock()
        self._methods: dict[str, Handler] = {
            "web3_clientVersion": self._client_version,
            "web3_sha3": lambda p: encode_hex(keccak(hexstr=_data(self._arg(p, 0), "data"))),
            "net_version": lambda p: str(self.chain.config.chain_id),
            "net_listening": lambda p: True,
            "net_peerCount": lambda p: "0x0",
            "eth_chainId": lambda p: hex(self.chain.config.chain_id),
            "eth_syncing": lambda p: False,
            "eth_mining": lambda p: False,
            "eth_hashrate": lambda p: "0x0",
            "eth_accounts": lambda p: list(self.chain.tester.get_accounts()),
            "eth_blockNumber": lambda p: hex(self._latest_number()),
            "eth_gasPrice": self._gas_price,
            "eth_maxPriorityFeePerGas": lambda p: hex(DEFAULT_PRIORITY_FEE),
            "eth_feeHistory": self._fee_history,
            "eth_getBalance": self._account_reader("get_balance"),
            "eth_getCode": self._account_reader("get_code"),
            "eth_getTransactionCount": self._account_reader("get_nonce"),
            "eth_getStorageAt": self._get_storage_at,
            "eth_getBlockByNumber": self._get_block_by_number,
            "eth_getBlockByHash": self._get_block_by_hash,
            "eth_getBlockTransactionCountByNumber": self._tx_count_by_number,
            "eth_getBlockTransactionCountByHash": self._tx_count_by_hash,
            "eth_getBlockReceipts": self._get_block_receipts,
            "eth_getTransactionByHash": self._get_transaction_by_hash,
            "eth_getTransactionByBlockNumberAndIndex": self._tx_by_number_and_index,
            "eth_getTransactionByBlockHashAndIndex": self._tx_by_hash_and_index,
            "eth_getTransactionReceipt": self._get_transaction_receipt,
            "eth_call": self._call,
            "eth_estimateGas": self._estimate_gas,
            "eth_sendTransaction": self._send_transaction,
            "eth_sendRawTransaction": self._send_raw_transaction,
            "eth_getLogs": self._get_logs,
            "eth_newFilter": self._new_filter,
            "eth_newBlockFilter": lambda p: hex(self.chain.tester.create_block_filter()),
            "eth_newPendingTransactionFilter": lambda p: hex(
                self.chain.tester.create_pending_transaction_filter()
            ),
            "eth_getFilterChanges": self._filter_reader("get_only_filter_changes"),
            "eth_getFilterLogs": self._filter_reader("get_all_filter_logs"),
            "eth_uninstallFilter": self._uninstall_filter,
            "evm_increaseTime": lambda p: hex(
                self.chain.increase_time(_quantity(self._arg(p, 0), "seconds"))
            ),
            "evm_setNextBlockTimestamp": self._set_next_block_timestamp,
            "evm_mine": self._evm_mine,
            "evm_snapshot": lambda p: hex(self.chain.tester.take_snapshot()),
            "evm_revert": self._evm_revert,
        }

    @property
    def methods(self) -> list[str]:
        return sorted(self._methods)

    # -- transport-facing entry points -----------------------------------------------------

    def handle_bytes(self, body: bytes) -> bytes | None:
        """One HTTP body in, one out (None when the request held only notifications)."""
        if json_depth(body) > MAX_JSON_DEPTH:
            # py-evm raises the recursion limit to 100000, so a deeply nested body would overflow
            # the C stack inside json.loads instead of raising RecursionError
            return _dump(
                _error_response(None, RpcError(-32600, "invalid request: nested too deep"))
            )
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return _dump(_error_response(None, RpcError(-32700, "parse error: body is not JSON")))
        response = self.handle(request)
        return None if response is None else _dump(response)

    def handle(self, request: Any) -> Any:
        if isinstance(request, list):
            if not request:
                return _error_response(None, RpcError(-32600, "invalid request: empty batch"))
            responses = [r for r in (self._handle_one(item) for item in request) if r is not None]
            return responses or None
        return self._handle_one(request)

    def _handle_one(self, request: Any) -> dict[str, Any] | None:
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return _error_response(None, RpcError(-32600, "invalid request: need a 'method'"))
        req_id = request.get("id")
        is_notification = "id" not in request
        method = request["method"]
        params = request.get("params", [])
        if isinstance(params, dict):
            params = [params]
        if not isinstance(params, list):
            response = _error_response(req_id, _invalid("params must be an array"))
            return None if is_notification else response
        handler = self._methods.get(method)
        try:
            if handler is None:
                raise RpcError(-32601, f"method {method!r} is not supported by the py-evm devnet")
            with self.lock:
                result = handler(params)
            response = {"jsonrpc": "2.0", "id": req_id, "result": result}
        except RpcError as exc:
            response = _error_response(req_id, exc)
        except _Reverted as exc:
            response = _error_response(req_id, RpcError(3, exc.reason, encode_hex(exc.data)))
        except (BlockNotFound, TransactionNotFound, FilterNotFound, SnapshotNotFound) as exc:
            response = _error_response(req_id, RpcError(-32001, f"not found: {exc}"))
        except Exception as exc:  # noqa: BLE001 -- the server boundary: any failure becomes an error reply
            response = _error_response(req_id, RpcError(-32000, _describe(exc)))
        return None if is_notification else response

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _arg(params: list[Any], index: int, default: Any = ...) -> Any:
        if index < len(params):
            return params[index]
        if default is ...:
            raise _invalid(f"missing parameter #{index + 1}")
        return default

    def _block_id(self, value: Any) -> str | int:
        """A block tag, a number, or an EIP-1898 {blockNumber|blockHash} object."""
        if isinstance(value, str) and value in _BLOCK_TAGS:
            return "latest" if value in ("safe", "finalized") else value
        if isinstance(value, dict):
            if "blockHash" in value:
                block = self.chain.tester.get_block_by_hash(_hash32(value["blockHash"]))
                return int(block["number"])
            if "blockNumber" in value:
                return self._block_id(value["blockNumber"])
            raise _invalid("block object needs 'blockNumber' or 'blockHash'")
        return _quantity(value, "block number")

    def _latest_number(self) -> int:
        return int(self.chain.backend.chain.get_canonical_head().block_number)

    def _client_version(self, params: list[Any]) -> str:
        from importlib.metadata import version

        return f"veriloco-evmserver/py-evm-{version('py-evm')}/eth-tester-{version('eth-tester')}"

    def _pending_base_fee(self) -> int:
        return int(self.chain.backend.chain.header.base_fee_per_gas)

    def _gas_price(self, params: list[Any]) -> str:
        return hex(self._pending_base_fee() + DEFAULT_PRIORITY_FEE)

    def _fee_history(self, params: list[Any]) -> dict[str, Any]:
        count = _quantity(self._arg(params, 0), "blockCount")
        newest = self._block_id(self._arg(params, 1, "latest"))
        percentiles = self._arg(params, 2, None) or []
        if not isinstance(percentiles, list) or not all(
            isinstance(p, int | float) and 0 <= p <= 100 for p in percentiles
        ):
            raise _invalid("rewardPercentiles must be numbers between 0 and 100")
        if list(percentiles) != sorted(percentiles):
            raise _invalid("rewardPercentiles must be increasing")
        chain = self.chain.backend.chain
        latest = self._latest_number()
        last = latest if newest == "pending" or not isinstance(newest, int) else newest
        if newest == "earliest":
            last = 0
        if last > latest:
            raise BlockNotFound(f"block {last} does not exist yet (head is {latest})")
        count = max(0, min(count, 1024, last + 1))
        first = last - count + 1
        base_fees: list[int] = []
        ratios: list[float] = []
        rewards: list[list[int]] = []
        for number in range(first, last + 1):
            block = chain.get_canonical_block_by_number(number)
            header = block.header
            base_fees.append(int(header.base_fee_per_gas))
            ratios.append(header.gas_used / header.gas_limit)
            if percentiles:
                tips = sorted(_tip(t, base_fees[-1]) for t in block.transactions)
                # per-transaction percentiles (not gas-weighted); 0 for an empty block, as geth
                rewards.append(
                    [
                        tips[min(len(tips) - 1, int(len(tips) * p / 100))] if tips else 0
                        for p in percentiles
                    ]
                )
        if last == latest:
            base_fees.append(self._pending_base_fee())
        else:
            base_fees.append(
                int(chain.get_canonical_block_header_by_number(last + 1).base_fee_per_gas)
            )
        result: dict[str, Any] = {
            "oldestBlock": hex(first),
            "baseFeePerGas": [hex(b) for b in base_fees],
            "gasUsedRatio": ratios,
        }
        if percentiles:
            result["reward"] = [[hex(r) for r in row] for row in rewards]
        return result

    def _account_reader(self, name: str) -> Handler:
        def read(params: list[Any]) -> Any:
            account = _address(self._arg(params, 0))
            at = self._block_id(self._arg(params, 1, "latest"))
            return _json(getattr(self.chain.tester, name)(account, at))

        return read

    def _get_storage_at(self, params: list[Any]) -> str:
        account = _address(self._arg(params, 0))
        slot = _quantity(self._arg(params, 1), "slot")
        at = self._block_id(self._arg(params, 2, "latest"))
        value = self.chain.backend.get_storage(to_canonical_address(account), slot, at)
        return (
            encode_hex(bytes(value).rjust(32, b"\0"))
            if isinstance(value, bytes)
            else encode_hex(int(value).to_bytes(32, "big"))
        )

    def _get_block_by_number(self, params: list[Any]) -> Any:
        at = self._block_id(self._arg(params, 0))
        full = bool(self._arg(params, 1, False))
        try:
            return _fmt_block(self.chain.tester.get_block_by_number(at, full_transactions=full))
        except BlockNotFound:
            return None

    def _get_block_by_hash(self, params: list[Any]) -> Any:
        block_hash = _hash32(self._arg(params, 0), "block hash")
        full = bool(self._arg(params, 1, False))
        try:
            return _fmt_block(
                self.chain.tester.get_block_by_hash(block_hash, full_transactions=full)
            )
        except BlockNotFound:
            return None

    def _tx_count_by_number(self, params: list[Any]) -> Any:
        block = self._get_block_by_number([self._arg(params, 0)])
        return None if block is None else hex(len(block["transactions"]))

    def _tx_count_by_hash(self, params: list[Any]) -> Any:
        block = self._get_block_by_hash([self._arg(params, 0)])
        return None if block is None else hex(len(block["transactions"]))

    def _get_block_receipts(self, params: list[Any]) -> Any:
        block = self._get_block_by_number([self._arg(params, 0)])
        if block is None:
            return None
        return [self._get_transaction_receipt([h]) for h in block["transactions"]]

    def _get_transaction_by_hash(self, params: list[Any]) -> Any:
        tx_hash = _hash32(self._arg(params, 0), "transaction hash")
        try:
            return _fmt_tx(self.chain.tester.get_transaction_by_hash(tx_hash))
        except TransactionNotFound:
            return None

    def _tx_by_number_and_index(self, params: list[Any]) -> Any:
        block = self._get_block_by_number([self._arg(params, 0), True])
        index = _quantity(self._arg(params, 1), "index")
        if block is None or index >= len(block["transactions"]):
            return None
        return block["transactions"][index]

    def _tx_by_hash_and_index(self, params: list[Any]) -> Any:
        block = self._get_block_by_hash([self._arg(params, 0), True])
        index = _quantity(self._arg(params, 1), "index")
        if block is None or index >= len(block["transactions"]):
            return None
        return block["transactions"][index]

    def _get_transaction_receipt(self, params: list[Any]) -> Any:
        tx_hash = _hash32(self._arg(params, 0), "transaction hash")
        try:
            receipt = self.chain.tester.get_transaction_receipt(tx_hash)
        except TransactionNotFound:
            return None
        if receipt.get("block_number") is None:
            return None
        return _fmt_receipt(receipt)

    def _default_from(self) -> str:
        return "0x0000000000000000000000000000000000000000"

    def _call(self, params: list[Any]) -> str:
        tx = _tx(self._arg(params, 0), self._default_from())
        at = self._block_id(self._arg(params, 1, "latest"))
        return encode_hex(self.chain.call(tx, at))

    def _estimate_gas(self, params: list[Any]) -> str:
        tx = _tx(self._arg(params, 0), self._default_from())
        at = self._block_id(self._arg(params, 1, "latest"))
        return hex(self.chain.estimate_gas(tx, at))

    def _send_transaction(self, params: list[Any]) -> str:
        tx = _tx(self._arg(params, 0), None)
        accounts = set(self.chain.tester.get_accounts())
        if tx["from"] not in accounts:
            raise RpcError(
                -32000,
                f"account {tx['from']} is not unlocked here; sign locally and use "
                "eth_sendRawTransaction",
            )
        self.chain.refresh_pending()
        if "gas" not in tx:
            tx["gas"] = self.chain.estimate_gas(tx, "pending")
        tx_hash = self.chain.tester.send_transaction(tx)
        self.chain.mined()
        return str(tx_hash)

    def _send_raw_transaction(self, params: list[Any]) -> str:
        raw = _data(self._arg(params, 0), "raw transaction")
        chain_id = _raw_chain_id(decode_hex(raw))
        if chain_id is not None and chain_id != self.chain.config.chain_id:
            raise RpcError(
                -32000,
                f"transaction signed for chain id {chain_id}, this devnet is "
                f"{self.chain.config.chain_id}",
            )
        self.chain.refresh_pending()
        tx_hash = self.chain.tester.send_raw_transaction(raw)
        self.chain.mined()
        return str(tx_hash)

    def _filter_params(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _invalid("filter must be an object")
        out: dict[str, Any] = {}
        if value.get("blockHash") is not None:
            if value.get("fromBlock") is not None or value.get("toBlock") is not None:
                raise _invalid("give blockHash or fromBlock/toBlock, not both")
            number = self._block_id({"blockHash": value["blockHash"]})
            out["from_block"] = out["to_block"] = number
        else:
            for key, snake in (("fromBlock", "from_block"), ("toBlock", "to_block")):
                if value.get(key) is not None:
                    block = self._block_id(value[key])
                    out[snake] = self._latest_number() if block == "pending" else block
        address = value.get("address")
        if isinstance(address, list):
            out["address"] = [_address(a) for a in address] or None
        elif address is not None:
            out["address"] = _address(address)
        topics = value.get("topics")
        if topics is not None:
            if not isinstance(topics, list):
                raise _invalid("topics must be an array")
            out["topics"] = [
                None
                if t is None
                else [_hash32(x, "topic") for x in t]
                if isinstance(t, list)
                else _hash32(t, "topic")
                for t in topics
            ]
        if out.get("address") is None:
            out.pop("address", None)
        return out

    def _get_logs(self, params: list[Any]) -> list[Any]:
        query = self._filter_params(self._arg(params, 0, {}))
        latest = self._latest_number()

        def bound(value: Any) -> int:
            if value is None or value in ("latest", "pending"):
                return latest
            return 0 if value == "earliest" else int(value)

        address = query.get("address")
        addresses = None
        if address is not None:
            listed = address if isinstance(address, list) else [address]
            addresses = [bytes(to_canonical_address(a)) for a in listed]
        topics = [
            None if t is None else [decode_hex(x) for x in (t if isinstance(t, list) else [t])]
            for t in query.get("topics") or []
        ]
        first, last = bound(query.get("from_block")), bound(query.get("to_block"))
        if last - first > 100_000:
            raise _invalid(
                f"block range {first}..{last} is too wide; ask for at most 100000 blocks"
            )
        return self.chain.logs(first, last, addresses, topics)

    def _new_filter(self, params: list[Any]) -> str:
        query = self._filter_params(self._arg(params, 0, {}))
        return hex(self.chain.tester.create_log_filter(**query))

    def _filter_reader(self, name: str) -> Handler:
        def read(params: list[Any]) -> Any:
            filter_id = _quantity(self._arg(params, 0), "filter id")
            items = getattr(self.chain.tester, name)(filter_id)
            return [item if isinstance(item, str) else _fmt_log(item) for item in items]

        return read

    def _uninstall_filter(self, params: list[Any]) -> bool:
        try:
            self.chain.tester.delete_filter(_quantity(self._arg(params, 0), "filter id"))
        except FilterNotFound:
            return False
        return True

    def _set_next_block_timestamp(self, params: list[Any]) -> None:
        self.chain.set_next_timestamp(_quantity(self._arg(params, 0), "timestamp"))

    def _evm_mine(self, params: list[Any]) -> str:
        """anvil/hardhat shapes: [], [timestamp] or [{"timestamp": t, "blocks": n}]."""
        arg = self._arg(params, 0, None)
        blocks = 1
        if isinstance(arg, dict):
            blocks = _quantity(arg.get("blocks", 1), "blocks")
            arg = arg.get("timestamp")
        if arg is not None:
            self.chain.set_next_timestamp(_quantity(arg, "timestamp"))
        if not 1 <= blocks <= 10_000:
            raise _invalid("blocks must be between 1 and 10000")
        self.chain.mine(blocks)
        return "0x0"

    def _evm_revert(self, params: list[Any]) -> bool:
        try:
            self.chain.tester.revert_to_snapshot(_quantity(self._arg(params, 0), "snapshot id"))
        except SnapshotNotFound:
            return False
        self.chain.mined()
        return True


def _tip(tx: Any, base_fee: int) -> int:
    """The priority fee a mined transaction actually paid per gas."""
    if getattr(tx, "type_id", None) in (2, 3, 4):  # EIP-1559 fee fields
        return int(min(tx.max_priority_fee_per_gas, tx.max_fee_per_gas - base_fee))
    return int(tx.gas_price) - base_fee


def _raw_chain_id(raw: bytes) -> int | None:
    """The chain id a signed transaction commits to, or None for a pre-EIP-155 legacy one."""
    import rlp

    try:
        if raw and raw[0] < 0x7F:  # typed transaction: type byte, then an RLP list
            return int.from_bytes(rlp.decode(raw[1:])[0], "big")
        fields = rlp.decode(raw)
        v = int.from_bytes(fields[6], "big")
    except (rlp.DecodingError, IndexError, TypeError):
        raise RpcError(-32602, "invalid params: raw transaction is not valid RLP") from None
    return (v - 35) // 2 if v >= 35 else None


def _describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 500 else text[:500] + "..."




def _error_response(req_id: Any, error: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "error": error.to_json()}


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


# -- HTTP transport --------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: web3's session reuses one connection
    disable_nagle_algorithm = True  # headers and body go out as separate writes
    server: _HttpServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._reply(411, b'{"error":"Content-Length required"}')
            return
        if length < 0:
            self._reply(400, b'{"error":"negative Content-Length"}')
            self.close_connection = True
            return
        if length > MAX_REQUEST_BYTES:
            self._reply(413, b'{"error":"request too large"}')
            self.close_connection = True
            return
        body = self.rfile.read(length)
        response = self.server.rpc.handle_bytes(body)
        self._reply(200, response if response is not None else b"")

    def do_GET(self) -> None:
        self._reply(405, b'{"error":"POST JSON-RPC requests to this URL"}')

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown the devnet's own output


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], rpc: EvmRpc) -> None:
        self.rpc = rpc
        self._connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        super().__init__(address, _Handler)

    def track(self, conn: socket.socket, alive: bool) -> None:
        with self._conn_lock:
            (self._connections.add if alive else self._connections.discard)(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-reply is its own business; anything else is printed."""
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        """Drop keep-alive connections so no client is served after stop()."""
        with self._conn_lock:
            conns = list(self._connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class EvmServer:
    """An EvmRpc on 127.0.0.1 over HTTP, served from a background thread.

    with EvmServer(EvmConfig()) as server:
        w3 = Web3(Web3.HTTPProvider(server.url))
    """

    def __init__(
        self,
        config: EvmConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.time,
        block_time: float | None = None,
    ) -> None:
        """`block_time`: also mine an empty block whenever none was mined for that many seconds,
        so calls at "latest" see time pass on an idle chain (as anvil --block-time does)."""
        if block_time is not None and block_time <= 0:
            raise EvmServerError(
                f"block_time={block_time}: use a positive number of seconds or None"
            )
        self.block_time = block_time
        self._stopping = threading.Event()
        self._miner: threading.Thread | None = None
        self.config = config or EvmConfig()
        self.rpc = EvmRpc(EvmChain(self.config, clock))
        try:
            self._http = _HttpServer((host, port), self.rpc)
        except OSError as exc:
            raise EvmServerError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port "
                "or 0 for a free one"
            ) from None
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._http.server_address[0])

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def chain(self) -> EvmChain:
        return self.rpc.chain

    def dev_keys(self) -> list[tuple[str, str]]:
        """(checksummed address, 0x private key) of each funded dev account."""
        return [
            (to_checksum_address(k.public_key.to_canonical_address()), k.to_hex())
            for k in self.chain.backend.account_keys
        ]

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._http.serve_forever,
                kwargs={"poll_interval": 0.1},
                name=f"evmserver:{self.port}",
                daemon=True,
            )
            self._thread.start()
        if self.block_time is not None and self._miner is None:
            self._stopping.clear()
            self._miner = threading.Thread(
                target=self._mine_idle, name=f"evmserver-miner:{self.port}", daemon=True
            )
            self._miner.start()
        return self

    def _mine_idle(self) -> None:
        assert self.block_time is not None
        while not self._stopping.wait(min(self.block_time, 1.0) / 4):
            with self.rpc.lock:
                self.chain.mine_if_idle(self.block_time)

    def serve_forever(self) -> None:
        """Serve on the calling thread until stop() is called from another one."""
        self._http.serve_forever(poll_interval=0.1)

    def stop(self) -> None:
        self._stopping.set()
        if self._miner is not None:
            self._miner.join()
            self._miner = None
        if self._thread is not None:
            self._http.shutdown()
            self._thread.join()
            self._thread = None
        self._http.close_connections()
        self._http.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="py-evm over JSON-RPC on 127.0.0.1 (dev only)")
    parser.add_argument("--port", type=int, default=8545)
    parser.add_argument("--chain-id", type=int, default=DEFAULT_CHAIN_ID)
    parser.add_argument("--accounts", type=int, default=10)
    args = parser.parse_args(argv)
    try:
        server = EvmServer(
            EvmConfig(chain_id=args.chain_id, accounts=args.accounts), port=args.port
        )
    except VerilocoError as exc:
        print(f"evmserver: error: {exc}", file=sys.stderr)
        return 2
    print(f"py-evm JSON-RPC on {server.url} (chain id {args.chain_id})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
