"""Typed Python client for the Veriloco contract (web3 8): deploy, transactions, views, event streams.

Nodes get a `Chain` object and never touch web3 themselves. The client
- checks the chain id and that the address holds exactly the committed contract build;
- manages nonces (local signing keys) or lets the node sign (unlocked accounts), estimates gas,
  waits for receipts;
- prices locally signed transactions from the node's fee history and re-sends one that is not
  mined in time with the same nonce and higher fees (protocol.chain.fees; docs/real-chain.md);
- turns every revert into the Python exception named after the contract's custom error, with its
  arguments (see protocol.chain.errors), and transport failures into ChainUnavailable;
- streams events by polling `eth_getLogs` with a block cursor, so a dropped connection only delays
  the stream and never loses or repeats an event.

Quick use:
    w3 = connect("http://127.0.0.1:8545")
    address = deploy(w3, account)
    chain = Chain(w3, address, account)
    run_id = chain.create_run(params)
"""

from __future__ import annotations

import ast
import functools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from enum import IntEnum
from pathlib import Path
from typing import Any, TypeVar

from eth_abi import decode as abi_decode
from eth_account.signers.local import LocalAccount
from eth_utils import function_abi_to_4byte_selector, keccak, to_checksum_address
from hexbytes import HexBytes
from web3 import HTTPProvider, Web3
from web3.exceptions import TransactionNotFound

from protocol.chain.audit import (
    AuditResponse,
    Verdict,
    assigned_verifiers,
    audit_seed,
    build_response,
    challenged_steps,
    commitment,
    final_check,
    pair_proof,
    response_indices,
    verdict_commitment,
    verify_pair,
    verify_response,
)
from protocol.chain.errors import (
    REVERT_CLASSES,
    ArtifactMissing,
    ChainError,
    ChainUnavailable,
    ContractRevert,
    InsufficientFunds,
    TransactionFailed,
    WrongChain,
    WrongContract,
)
from protocol.chain.fees import FeeCapExceeded, Fees
from protocol.chain.fees import cap as cap_fees
from protocol.chain.fees import from_history as fees_from_history
from protocol.chain.fees import replacement as fee_replacement
from protocol.cpumeter import RPC
from protocol.types import Address, Cid, Digest, RunId, Wei
from protocol.windowdraw import WindowPost

__all__ = [
    "ARTIFACT_PATH", "CREDIT_KINDS", "SLASH_REASONS", "Assignment", "AuditResponse", "Chain", "ChainError",
    "ChainEvent", "ChainUnavailable", "ContractRevert", "EpochStatus", "EpochTimes", "EventStream", "MemberInfo",
    "Phase", "Role", "RunInfo", "RunParams", "Sub", "SubmissionInfo", "TxResult", "artifact", "assigned_verifiers", "audit_seed",
    "build_response", "challenged_steps", "commitment", "connect", "decode_revert", "deploy", "final_check",
    "pair_proof", "response_indices", "revert_data", "verify_pair", "verify_response",
]

# An installed wheel carries contracts/build/*.json as the package protocol.contracts (setup.py maps
# one onto the other); a checkout reads contracts/build itself, where contracts/build.mjs writes.
_PACKAGED_BUILD = Path(__file__).resolve().parents[1] / "contracts"
_BUILD = _PACKAGED_BUILD if (_PACKAGED_BUILD / "Veriloco.json").is_file() else Path(__file__).resolve().parents[2] / "contracts" / "build"
ARTIFACT_PATH = _BUILD / "Veriloco.json"
# Veriloco's companions, created by its constructor at nonces 1, 2 (from blueprints that deploy() sends
# first) and run on its storage by DELEGATECALL.
COMPANIONS = ("VerilocoModule", "VerilocoViews")
NEVER_EPOCH = 2**32 - 1
# Slashed's `reason` (the contract's SLASH_* constants) and Credited's `kind` (CREDIT_*), by name
SLASH_REASONS = {1: "no reveal", 2: "no response", 3: "failed audit", 4: "payload unavailable",
                 5: "false availability report", 6: "abandoned an epoch it began"}
UNFUNDED_GAS = 1_000_000  # the gas an unfunded key is told to cover beside the value (more than any one call)
CREDIT_KINDS = {1: "trainer reward", 2: "verdict reward", 3: "bounty", 4: "compensation"}
_T = TypeVar("_T")


@functools.cache
def artifact() -> dict[str, Any]:
    """The committed build of contracts/Veriloco.sol (ABI, bytecode, compiler, settings)."""
    try:
        data: dict[str, Any] = json.loads(ARTIFACT_PATH.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactMissing(
            f"cannot read the contract artifact {ARTIFACT_PATH}: {exc}; rebuild it with `node contracts/build.mjs`"
        ) from exc
    return data


@functools.cache
def companion_code(name: str) -> tuple[bytes, bytes]:
    """(runtime, creation code) of one of COMPANIONS, from its committed build."""
    path = ARTIFACT_PATH.with_name(f"{name}.json")
    try:
        art = json.loads(path.read_text())
        return bytes.fromhex(art["deployedBytecode"][2:]), bytes.fromhex(art["bytecode"][2:])
    except (OSError, ValueError, KeyError) as exc:
        raise ArtifactMissing(
            f"cannot read the contract artifact {path}: {exc}; rebuild it with `node contracts/build.mjs`"
        ) from exc


def companion_address(contract: str, name: str) -> Address:
    """Where a Veriloco at `contract` keeps companion `name`: its creation number 1 (the module) or 2
    (the views), by CREATE from the contract's own address."""
    nonce = COMPANIONS.index(name) + 1
    raw = bytes.fromhex(to_checksum_address(contract)[2:])
    return Address(to_checksum_address(keccak(b"\xd6\x94" + raw + bytes([nonce]))[12:]))


def blueprint(initcode: bytes) -> bytes:
    """Creation code of a blueprint (EIP-5202 style): a contract whose code is 0xFE (so a call to it
    stops at once) followed by `initcode`, which Veriloco's constructor copies and runs with CREATE."""
    body = b"\xfe" + initcode
    n = len(body)
    # PUSH2 n, DUP1, PUSH1 12, PUSH1 0, CODECOPY, PUSH1 0, RETURN: return the 12-byte preamble's tail
    return bytes([0x61, n >> 8, n & 0xFF, 0x80, 0x60, 0x0C, 0x60, 0x00, 0x39, 0x60, 0x00, 0xF3]) + body


# ---------------------------------------------------------------- value types


class Phase(IntEnum):
    """Epoch phase as the contract derives it (DESIGN.md §3)."""

    NOT_STARTED = 0
    COMMITTING = 1
    REVEALING = 2
    AUDITING = 3
    FINALIZED = 4  # and its model confirmed by the attestation committee
    ABORTED = 5
    CONFIRMING = 6  # finalized; the model awaits its attestation committee (docs/contract.md)


@dataclass(frozen=True)
class RunParams:
    """The run-config fields the contract enforces (RunConfig.to_run_params() produces this).

    A quorum below 3 needs test_run (the contract refuses it otherwise). Windows and the unbonding
    delay are seconds; stakes and rewards are wei; *_bps are basis points
    of 10 000. Rewards are paid per finalized epoch out of the run's pool (Chain.create_run's
    reward_pool, Chain.fund_run): trainer_reward per included trainer, verifier_reward per verdict
    cast with the majority; 0 pays nothing.
    """

    config_cid: Cid
    config_digest: Digest
    init_model_cid: Cid
    init_model_digest: Digest
    coordinator: Address
    min_trainers: int = 1
    max_trainers: int = 256
    max_verifiers: int = 64
    commit_window: int = 600
    reveal_window: int = 600
    response_window: int = 600
    verdict_window: int = 600
    finalize_window: int = 600
    unbonding_delay: int = 3600
    audit_steps: int = 2
    final_check_bps: int = 10_000
    quorum: int = 3
    slash_bps: int = 5_000
    trainer_stake: Wei = 10**18  # type: ignore[assignment]
    verifier_stake: Wei = 10**18  # type: ignore[assignment]
    trainer_reward: Wei = 0  # type: ignore[assignment]
    verifier_reward: Wei = 0  # type: ignore[assignment]
    test_run: bool = False  # allows quorum 1..2 (a lone verifier decides): devnets and tests only
    audit_rate: int = 0  # per million transitions (0: audit_steps draws an epoch; else at most audit_steps)

    def to_abi(self) -> tuple[Any, ...]:
        values = [getattr(self, f.name) for f in fields(self)]
        values[4] = to_checksum_address(values[4])
        return tuple(values)

    @classmethod
    def from_abi(cls, t: Sequence[Any]) -> RunParams:
        v = list(t)
        v[1], v[3] = Digest(bytes(v[1])), Digest(bytes(v[3]))
        v[4] = Address(to_checksum_address(v[4]))
        return cls(*v)


@dataclass(frozen=True)
class RunInfo:
    run_id: RunId
    params: RunParams
    creator: Address
    next_epoch: int  # epochs [0, next_epoch) have opened
    active_trainers: int
    trainer_slots: int
    verifier_count: int
    pool: Wei = 0  # type: ignore[assignment]  # reward pool left


@dataclass(frozen=True)
class EpochStatus:
    phase: Phase
    committed: int
    revealed: int
    passed: int
    failed: int
    model_cid: Cid  # "" until finalized


@dataclass(frozen=True)
class EpochTimes:
    """Block timestamps; 0 where not yet determined."""

    opened_at: int
    commits_close: int
    reveals_close: int
    response_deadline: int
    verdict_deadline: int
    finalize_deadline: int
    done_at: int
    expected: int
    responded: int
    verifier_count: int
    seeded: bool
    seed: Digest
    model_digest: Digest


@dataclass(frozen=True)
class SubmissionInfo:
    """A trainer's submission in an epoch (``state``: ``Sub``).

    `commitment` is set only while merely committed and `trace_root` only after the reveal (the
    contract keeps one of them); the payload CID and digest are in the Revealed event.
    """

    commitment: Digest
    trace_root: Digest
    leaf_count: int
    state: Sub
    pass_votes: int
    fail_votes: int
    passed: bool


@dataclass(frozen=True)
class Assignment:
    """A trainer's audit assignment in one epoch: the challenged transitions (k -> k + 1, ascending), whether
    the final check is drawn, and its verifiers."""

    transitions: tuple[int, ...]
    final_check: bool
    verifiers: tuple[Address, ...]


@dataclass(frozen=True)
class Availability:
    """A trainer's availability challenge in one epoch: its committee (verifier addresses, index =
    bit), who reported (None: never reported), the vote masks, and the decision (None while open or
    never reported; True available, False unavailable)."""

    committee: list[Address]
    reporter: str | None
    available_votes: int
    unavailable_votes: int
    decision: bool | None


class Role(IntEnum):
    """A member's role in a run, as the contract's ROLE_* constants number it."""

    NONE = 0
    TRAINER = 1
    VERIFIER = 2
    COORDINATOR = 3


class Sub(IntEnum):
    """A trainer's submission state in an epoch, as the contract's SUB_* constants number it."""

    NONE = 0
    COMMITTED = 1
    REVEALED = 2
    RESPONDED = 3
    UNAVAILABLE = 4  # judged unavailable by its committee (docs/protocol.md §10.2)


@dataclass(frozen=True)
class MemberInfo:
    """A member of a run; leave_epoch is None while active."""

    role: Role
    stake: Wei
    slot: int
    join_epoch: int
    leave_epoch: int | None
    left_at: int


@dataclass(frozen=True)
class TxResult:
    tx_hash: str
    block_number: int
    gas_used: int
    events: tuple[ChainEvent, ...]


@dataclass(frozen=True)
class ChainEvent:
    name: str
    args: dict[str, Any]
    block_number: int
    tx_hash: str
    log_index: int


# ---------------------------------------------------------------- transport and revert decoding


def connect(rpc: Web3 | str, timeout: float = 30.0) -> Web3:
    """A Web3 for an RPC URL (or the given Web3), checked to answer."""
    w3 = rpc if isinstance(rpc, Web3) else Web3(HTTPProvider(rpc, request_kwargs={"timeout": timeout}))
    _rpc(lambda: w3.eth.chain_id, _where(w3))
    return w3


def _where(w3: Web3) -> str:
    uri = getattr(w3.provider, "endpoint_uri", None)
    return str(uri) if uri else type(w3.provider).__name__


def _is_transport(exc: BaseException) -> bool:
    return isinstance(exc, (ConnectionError, OSError, TimeoutError)) or (
        type(exc).__module__.startswith(("requests", "urllib3", "aiohttp")) or "ConnectionError" in type(exc).__name__
    )


def _rpc(call: Callable[[], _T], where: str) -> _T:
    """Run one RPC call (its CPU counted in ``cpumeter.RPC``); transport failures become
    ChainUnavailable with a hint."""
    try:
        with RPC.measure():
            return call()
    except ChainError:
        raise
    except Exception as exc:
        if _is_transport(exc):
            raise ChainUnavailable(
                f"cannot reach the chain at {where}: {exc}; is the node running (`veriloco devnet`) and the URL right?"
            ) from exc
        raise


@functools.cache
def _error_table() -> dict[bytes, tuple[str, list[str]]]:
    table: dict[bytes, tuple[str, list[str]]] = {}
    for item in artifact()["abi"]:
        if item["type"] == "error":
            sel = function_abi_to_4byte_selector(item)
            table[sel] = (item["name"], [i["type"] for i in item["inputs"]])
    return table


_HEX = re.compile(r"0x[0-9a-fA-F]{8,}")


def revert_data(exc: BaseException) -> bytes | None:
    """The raw revert data carried by a web3 / eth-tester / JSON-RPC exception, if any."""
    for cand in (getattr(exc, "data", None), *(exc.args if exc.args else ())):
        if isinstance(cand, (bytes, bytearray)) and len(cand) >= 4:
            return bytes(cand)
        if isinstance(cand, dict):
            inner = cand.get("data")
            if isinstance(inner, str) and inner.startswith("0x"):
                return bytes.fromhex(inner[2:])
        if isinstance(cand, str):
            if cand.startswith("0x") and len(cand) >= 10:
                try:
                    return bytes.fromhex(cand[2:])
                except ValueError:
                    pass
            m = re.search(r"execution reverted: (b'.*'|b\".*\")$", cand, re.DOTALL)
            if m:
                try:
                    lit = ast.literal_eval(m.group(1))
                    if isinstance(lit, bytes):
                        return lit
                except (ValueError, SyntaxError):
                    pass
            m2 = _HEX.search(cand)
            if m2 and len(m2.group(0)) % 2 == 0:
                return bytes.fromhex(m2.group(0)[2:])
    return None


def decode_revert(data: bytes) -> ChainError:
    """The exception for raw revert data: a ContractRevert subclass, or TransactionFailed."""
    if len(data) < 4:
        return TransactionFailed("transaction reverted without a reason")
    sel, body = data[:4], data[4:]
    if sel == bytes.fromhex("08c379a0"):
        (msg,) = abi_decode(["string"], body)
        return TransactionFailed(f"transaction reverted: {msg}")
    if sel == bytes.fromhex("4e487b71"):
        (code,) = abi_decode(["uint256"], body)
        return TransactionFailed(f"transaction panicked with code 0x{code:x}")
    entry = _error_table().get(sel)
    if entry is None:
        return TransactionFailed(f"transaction reverted with unknown error data 0x{data.hex()}")
    name, types = entry
    try:
        values = list(abi_decode(types, body))
    except Exception:  # noqa: BLE001 - untrusted revert bytes: any decode failure is reported, not raised
        return TransactionFailed(f"transaction reverted with malformed {name} data 0x{data.hex()}")
    values = [to_checksum_address(v) if t == "address" else v for t, v in zip(types, values)]
    cls = REVERT_CLASSES.get(name, ContractRevert)
    return cls(*values)


def _translate(exc: Exception) -> ChainError | None:
    data = revert_data(exc)
    if data is not None:
        return decode_revert(data)
    text = str(exc)
    if "revert" in text.lower():
        return TransactionFailed(f"transaction reverted: {text}")
    return None


# ---------------------------------------------------------------- deploy


_KEY_LEN = 66  # "0x" + 64 hex digits


def as_account(account: LocalAccount | str | None) -> LocalAccount | str | None:
    """A hex private key becomes a LocalAccount (signed here); an address stays an address (the node signs)."""
    if isinstance(account, str) and len(account) == _KEY_LEN:
        from eth_account import Account

        try:
            return Account.from_key(account)
        except (ValueError, TypeError) as exc:
            raise ChainError(f"the account string looks like a private key but is not one: {exc}") from None
    return account


def _sender(account: LocalAccount | str) -> Address:
    return Address(to_checksum_address(account if isinstance(account, str) else account.address))


def _send_raw(w3: Web3, account: LocalAccount | str, tx: dict[str, Any]) -> bytes:
    if isinstance(account, str):
        return bytes(w3.eth.send_transaction(tx))  # type: ignore[arg-type]
    signed = account.sign_transaction(tx)
    try:
        return bytes(w3.eth.send_raw_transaction(signed.raw_transaction))
    except Exception as exc:
        if _rejection(exc) == "known":  # this very transaction is already in the node's pool: sent
            return bytes(signed.hash)
        raise


# How nodes word a rejected transaction (geth, anvil, eth-tester), and what it asks the sender to do.
_NONCE = ("nonce too low", "invalid transaction nonce", "nonce has already been used", "oldnonce")
_KNOWN = ("already known", "already imported", "known transaction", "alreadyknown")
_UNDERPRICED = ("underpriced", "less than block base fee", "fee cap less than", "max fee per gas less than")
FEE_BLOCKS, FEE_PERCENTILE = 10, 50.0  # fee history window and the reward percentile whose median is the tip


def _rejection(exc: BaseException) -> str | None:
    """'nonce' (the nonce is used: resync), 'known' (already in the pool: sent), 'underpriced'
    (offer more), or None for anything else."""
    text = str(exc).lower()
    for kind, words in (("known", _KNOWN), ("nonce", _NONCE), ("underpriced", _UNDERPRICED)):
        if any(w in text for w in words):
            return kind
    return None


def suggest_fees(w3: Web3, max_fee: int | None = None) -> Fees:
    """Fees for the next transaction from the node's fee history (protocol.chain.fees), capped at
    `max_fee` wei per gas; legacy gasPrice where the node has no fee history."""
    where = _where(w3)

    def history() -> Any:
        try:
            return dict(w3.eth.fee_history(FEE_BLOCKS, "latest", [FEE_PERCENTILE]))
        except Exception as exc:
            if _is_transport(exc):
                raise
            return None

    fees = _rpc(lambda: fees_from_history(
        history(),
        fallback_priority=lambda: int(w3.eth.max_priority_fee),
        gas_price=lambda: int(w3.eth.gas_price),
    ), where)
    return cap_fees(fees, max_fee)


@dataclass
class _Sent:
    """One logical transaction on its way: its nonce, the unsigned fields, the latest fees, and every
    hash sent for it (the original and its replacements; any of them may be the one mined)."""

    what: str
    nonce: int | None  # None: the node signed it (no replacement)
    tx: dict[str, Any]
    fees: Fees | None
    hashes: list[bytes]
    replaceable: bool = True
    note: str = ""

    def fee_fields(self, fees: Fees) -> dict[str, Any]:
        tx = {k: v for k, v in self.tx.items() if k not in ("gasPrice", "maxFeePerGas", "maxPriorityFeePerGas")}
        if fees.legacy:
            tx.pop("type", None)
        return {**tx, **fees.tx_fields()}

    def shown(self) -> str:
        return ", ".join("0x" + h.hex() for h in self.hashes)


def _mined(w3: Web3, hashes: Sequence[bytes]) -> tuple[Any, bytes] | None:
    """The receipt and hash of the first of `hashes` that is mined, or None."""
    for h in hashes:
        try:
            return _rpc(lambda: w3.eth.get_transaction_receipt(HexBytes(h)), _where(w3)), h  # noqa: B023
        except TransactionNotFound:
            continue
    return None


def _await_mined(w3: Web3, account: LocalAccount | str, sent: _Sent, timeout: float, replace_after: float,
                 max_replacements: int, max_fee: int | None) -> tuple[Any, bytes]:
    """The receipt of whichever of `sent`'s hashes is mined, and that hash. While none is, after each
    `replace_after` seconds the same nonce is re-sent with bumped fees (fee history re-read), up to
    `max_replacements` times. Raises ChainError naming the nonce and hashes after `timeout` s, or at
    once if another transaction of this key took the nonce."""
    start = time.monotonic()
    next_replace, replaced, pause = start + replace_after, 0, 0.05
    while True:
        found = _mined(w3, sent.hashes)
        if found is not None:
            return found
        now = time.monotonic()
        if now - start >= timeout:
            nonce = "" if sent.nonce is None else f"nonce {sent.nonce}, "
            raise ChainError(
                f"{sent.what} ({nonce}sent as {sent.shown()}) was not mined within {timeout:.0f} s"
                f"{sent.note}; is the node mining? On a busy chain raise the fee cap or the receipt timeout"
            )
        if sent.nonce is not None and sent.replaceable and replaced < max_replacements and now >= next_replace:
            replaced += 1
            next_replace = now + replace_after
            if _replace(w3, account, sent, max_fee) == "nonce" and _mined(w3, sent.hashes) is None:
                raise ChainError(
                    f"{sent.what} did not happen: nonce {sent.nonce} of {_sender(account)} was used by another "
                    f"transaction (another process sending from this key?) while ours ({sent.shown()}) waited; "
                    "run it again"
                )
        time.sleep(pause)
        pause = min(pause * 1.5, 1.0)


def _replace(w3: Web3, account: LocalAccount | str, sent: _Sent, max_fee: int | None) -> str | None:
    """Re-send `sent` with the same nonce and higher fees; returns the node's rejection kind, if any."""
    assert sent.fees is not None
    try:
        fees = cap_fees(fee_replacement(sent.fees, suggest_fees(w3)), max_fee)
    except FeeCapExceeded as exc:
        sent.replaceable, sent.note = False, f" (not replaced: {exc})"
        return None
    if fees.max_fee <= sent.fees.max_fee:  # the cap leaves no room for a higher offer
        sent.replaceable, sent.note = False, f" (not replaced: at the max fee, {fees.describe()})"
        return None
    try:
        h = _rpc(lambda: _send_raw(w3, account, sent.fee_fields(fees)), _where(w3))
    except ChainUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - classified below; the original may still be mined
        kind = _rejection(exc)
        if kind == "underpriced":
            sent.fees = fees  # the next replacement bumps from here
        elif kind == "nonce":  # mined: ours (its receipt is found next) or someone else's
            sent.replaceable = False
        else:
            sent.replaceable, sent.note = False, f" (a replacement was refused: {exc})"
        return kind
    if h not in sent.hashes:
        sent.hashes.append(h)
    sent.fees = fees
    return None


def deploy(w3: Web3, account: LocalAccount | str, timeout: float = 120.0, *, max_fee: int | None = None) -> Address:
    """Deploy the committed Veriloco build from `account`; returns the contract address. Three
    transactions: a blueprint of each companion (COMPANIONS), then Veriloco, whose constructor creates
    the companions from them. A local key pays fees from the node's fee history (capped at `max_fee`
    wei per gas) and a deployment stuck for a quarter of `timeout` is re-sent with higher fees, as
    Chain does for its transactions."""
    art = artifact()
    account = as_account(account)  # type: ignore[assignment]
    sender = _sender(account)
    where = _where(w3)

    def create(what: str, factory: Any, *args: Any) -> Address:
        tx: dict[str, Any] = {"from": sender}
        fees = None
        if not isinstance(account, str):
            tx["nonce"] = w3.eth.get_transaction_count(to_checksum_address(sender), "pending")
            fees = suggest_fees(w3, max_fee)
            tx.update(fees.tx_fields())
        gas = factory.constructor(*args).estimate_gas({"from": sender})
        tx["gas"] = min(int(gas * 1.2) + 50_000, _block_gas_limit(w3))
        built = dict(factory.constructor(*args).build_transaction(tx))
        h = _send_raw(w3, account, built)
        sent = _Sent(what, tx.get("nonce"), built, fees, [h])
        receipt, h = _await_mined(w3, account, sent, timeout, timeout / 4, 3, max_fee)
        created = receipt.get("contractAddress")
        if receipt["status"] != 1 or not created:
            raise TransactionFailed(f"{what} transaction 0x{h.hex()} failed")
        return Address(to_checksum_address(created))

    def go() -> Address:
        prints = [create(f"{name} blueprint deployment", w3.eth.contract(abi=[], bytecode=blueprint(companion_code(name)[1])))
                  for name in COMPANIONS]
        return create("deployment", w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"]), *prints)

    try:
        return _rpc(go, where)
    except ChainError:
        raise
    except Exception as exc:
        err = _translate(exc)
        if err is None:
            raise ChainError(f"deployment failed: {exc}") from exc
        raise err from exc


def _block_gas_limit(w3: Web3) -> int:
    return int(w3.eth.get_block("latest")["gasLimit"])


# ---------------------------------------------------------------- the client


class Chain:
    """One contract deployment seen by one account (or read-only when `account` is None).

    `account` is an eth_account LocalAccount or a 0x hex private key (signed locally; nonces tracked
    here), or the address of an account the node signs for (eth-tester, anvil's dev accounts).
    """

    def __init__(
        self,
        w3: Web3 | str,
        address: str,
        account: LocalAccount | str | None = None,
        *,
        chain_id: int | None = None,
        receipt_timeout: float = 120.0,
        replace_after_s: float | None = None,
        max_replacements: int = 3,
        max_fee: int | None = None,
    ) -> None:
        self.w3 = connect(w3)
        self.where = _where(self.w3)
        try:
            self.address = Address(to_checksum_address(address))
        except ValueError as exc:
            raise WrongContract(f"{address!r} is not an Ethereum address; pass the deployed contract's 0x address") from exc
        self.chain_id = int(_rpc(lambda: self.w3.eth.chain_id, self.where))
        if chain_id is not None and chain_id != self.chain_id:
            raise WrongChain(
                f"the node at {self.where} serves chain id {self.chain_id}, expected {chain_id}; check the RPC URL"
            )
        code = bytes(_rpc(lambda: self.w3.eth.get_code(to_checksum_address(self.address)), self.where))
        expected = bytes.fromhex(artifact()["deployedBytecode"][2:])
        if not code:
            raise WrongContract(
                f"no contract at {self.address} on chain {self.chain_id}; deploy one with `veriloco deploy` "
                "or check the address and the RPC URL"
            )
        if code != expected:
            raise WrongContract(
                f"the contract at {self.address} on chain {self.chain_id} is not this Veriloco build "
                f"({len(code)} bytes of code, expected {len(expected)}); deploy the current build or update veriloco"
            )
        for name in COMPANIONS:
            at = companion_address(self.address, name)
            have = bytes(_rpc(functools.partial(self.w3.eth.get_code, to_checksum_address(at)), self.where))
            if have != companion_code(name)[0]:
                raise WrongContract(
                    f"the contract at {self.address} on chain {self.chain_id} is not this Veriloco build: its "
                    f"{name} at {at} has {len(have)} bytes of code, expected {len(companion_code(name)[0])}; "
                    "deploy the current build or update veriloco"
                )
        self.contract = self.w3.eth.contract(address=to_checksum_address(self.address), abi=artifact()["abi"])
        self.account = as_account(account)
        self.sender: Address | None = _sender(self.account) if self.account is not None else None
        self.receipt_timeout = receipt_timeout
        # a locally signed transaction not mined after replace_after_s is re-sent with the same nonce
        # and higher fees, up to max_replacements times; max_fee caps what any of them offers (wei/gas)
        self.replace_after_s = receipt_timeout / 4 if replace_after_s is None else replace_after_s
        self.max_replacements = max_replacements
        self.max_fee = max_fee
        self._nonce: int | None = None
        self._lock = threading.Lock()
        self._events_by_topic = {
            bytes(self.w3.keccak(text=_event_signature(e))): e["name"]
            for e in artifact()["abi"]
            if e["type"] == "event"
        }

    # -------------------------------------------------------------- plumbing

    def _call(self, fn_name: str, *args: Any) -> Any:
        fn = getattr(self.contract.functions, fn_name)(*args)
        try:
            return _rpc(lambda: fn.call(), self.where)
        except ChainError:
            raise
        except Exception as exc:
            err = _translate(exc)
            if err is None:
                raise ChainError(f"{fn_name} call failed: {exc}") from exc
            raise err from exc

    def _transact(self, fn_name: str, *args: Any, value: int = 0) -> TxResult:
        if self.account is None or self.sender is None:
            raise ChainError(f"{fn_name} needs an account; pass --key (or VERILOCO_KEY)")
        fn = getattr(self.contract.functions, fn_name)(*args)
        base: dict[str, Any] = {"from": self.sender, "value": value}
        with self._lock:
            try:
                gas = _rpc(lambda: fn.estimate_gas(base), self.where)
            except ChainError:
                raise
            except Exception as exc:
                err = _translate(exc) or self._unfunded(fn_name, exc, value)
                if err is None:
                    raise ChainError(f"{fn_name} failed: {exc}") from exc
                raise err from exc
            tx = dict(base)
            tx["gas"] = int(gas * 1.25) + 30_000
            try:
                sent = self._send(fn_name, fn, tx)
            except Exception as exc:
                self._nonce = None  # resynchronise from the node next time
                if isinstance(exc, ChainError):
                    raise
                err = _translate(exc) or self._unfunded(fn_name, exc, value)
                if err is None:
                    raise ChainError(f"{fn_name} could not be sent: {exc}") from exc
                raise err from exc
        try:
            receipt, h = _await_mined(self.w3, self.account, sent, self.receipt_timeout, self.replace_after_s,
                                      self.max_replacements, self.max_fee)
        except ChainError:
            # The node may have lost the transaction (a devnet restarted from an older dump, a
            # dropped mempool) or another process took the nonce: re-read the nonce next time
            # instead of leaving a gap that stalls every later transaction of this key.
            with self._lock:
                self._nonce = None
            raise
        if receipt["status"] != 1:
            # replay at the parent state to recover the revert reason
            try:
                fn.call(base, block_identifier=receipt["blockNumber"] - 1)
            except Exception as exc:
                err = _translate(exc)
                if err is not None:
                    raise err from exc
            raise TransactionFailed(f"{fn_name} transaction 0x{h.hex()} reverted (gas used {receipt['gasUsed']})")
        events = tuple(e for e in (self._decode_log(lg) for lg in receipt["logs"]) if e is not None)
        return TxResult("0x" + bytes(h).hex(), int(receipt["blockNumber"]), int(receipt["gasUsed"]), events)

    def _unfunded(self, fn_name: str, exc: Exception, value: int) -> InsufficientFunds | None:
        """The node's "insufficient funds" refusal as what to do: the ETH to send this key, with room for
        gas (UNFUNDED_GAS at today's gas price), instead of a raw JSON-RPC error in wei."""
        text = str(exc).lower()
        if "insufficient funds" not in text and "cannot afford" not in text:  # geth and anvil; py-evm
            return None
        try:
            have = int(self.w3.eth.get_balance(self.sender))  # type: ignore[arg-type]
            price = int(self.w3.eth.gas_price)
        except Exception:  # noqa: BLE001 - the advice is best effort; the refusal stands either way
            return InsufficientFunds(f"{fn_name}: {self.sender} cannot pay {value / 1e18:g} ETH plus gas; send it ETH")
        need = max(0, value + UNFUNDED_GAS * price - have)
        short = -(-need // 10**15) / 1000  # rounded up to 0.001 ETH
        return InsufficientFunds(f"{fn_name}: {self.sender} holds {have / 1e18:g} ETH and needs {value / 1e18:g} ETH plus "
                                 f"gas: send at least {short:g} ETH to {self.sender}")

    def _send(self, fn_name: str, fn: Any, tx: dict[str, Any]) -> _Sent:
        """Send under the lock. A local key takes the next nonce from the local counter (read from
        the node's pending count when unknown) and fees from the fee history; a nonce the node says
        is used (another process with this key) is re-read, an underpriced offer is raised, and only
        an accepted transaction advances the counter, once."""
        account = self.account
        assert account is not None
        if isinstance(account, str):  # the node signs and prices
            built = _rpc(lambda: dict(fn.build_transaction(tx)), self.where)
            return _Sent(fn_name, None, built, None, [_rpc(lambda: _send_raw(self.w3, account, built), self.where)])
        floor: Fees | None = None
        last: Exception | None = None
        for _ in range(4):
            if self._nonce is None:
                self._nonce = int(_rpc(lambda: self.w3.eth.get_transaction_count(self.sender, "pending"), self.where))  # type: ignore[arg-type]
            fees = suggest_fees(self.w3)
            fees = cap_fees(fees if floor is None else fee_replacement(floor, fees), self.max_fee)
            fields = {**tx, "chainId": self.chain_id, "nonce": self._nonce, **fees.tx_fields()}
            built = _rpc(lambda f=fields: dict(fn.build_transaction(f)), self.where)  # type: ignore[misc]
            try:
                h = _rpc(lambda b=built: _send_raw(self.w3, account, b), self.where)  # type: ignore[misc]
            except ChainError:
                raise
            except Exception as exc:
                kind, last = _rejection(exc), exc
                if kind == "nonce" or (kind == "underpriced" and "replacement" in str(exc).lower()):
                    self._nonce = None  # taken by another transaction of this key: re-read, send again
                elif kind == "underpriced":
                    floor = fees
                else:
                    raise
                continue
            sent = _Sent(fn_name, self._nonce, built, fees, [h])
            self._nonce += 1
            return sent
        raise ChainError(f"{fn_name} could not be sent from {self.sender}: the node kept refusing it ({last}); "
                         "is another process sending from this key?")

    def _decode_log(self, log: Any) -> ChainEvent | None:
        if to_checksum_address(log["address"]) != self.address or not log["topics"]:
            return None
        name = self._events_by_topic.get(bytes(log["topics"][0]))
        if name is None:
            return None
        ev = getattr(self.contract.events, name)().process_log(log)
        args = {k: _plain(v) for k, v in ev["args"].items()}
        return ChainEvent(name, args, int(log["blockNumber"]), "0x" + bytes(log["transactionHash"]).hex(), int(log["logIndex"]))

    def now(self) -> int:
        """Timestamp of the latest block (the contract's clock)."""
        return int(_rpc(lambda: self.w3.eth.get_block("latest")["timestamp"], self.where))

    def block_number(self) -> int:
        return int(_rpc(lambda: self.w3.eth.block_number, self.where))

    def gas_used(self, tx: str) -> int:
        """Gas a mined transaction used (its receipt's ``gasUsed``)."""
        receipt = _rpc(lambda: self.w3.eth.get_transaction_receipt(tx), self.where)  # type: ignore[arg-type]
        return int(receipt["gasUsed"])

    def block_hash(self, number: int) -> bytes:
        """Hash of block `number` (what tells two chains with the same id and contract apart)."""
        return bytes(_rpc(lambda: self.w3.eth.get_block(number)["hash"], self.where))

    # -------------------------------------------------------------- transactions

    def create_run(self, params: RunParams, reward_pool: int = 0) -> RunId:
        """Create a run funding its reward pool with `reward_pool` wei; returns its id."""
        res = self._transact("createRun", params.to_abi(), value=reward_pool)
        for e in res.events:
            if e.name == "RunCreated":
                return RunId(int(e.args["runId"]))
        raise ChainError("createRun succeeded but emitted no RunCreated event")

    def fund_run(self, run_id: int, amount: int) -> TxResult:
        """Add `amount` wei to a run's reward pool (anyone may; never refunded)."""
        return self._transact("fundRun", run_id, value=amount)

    def join_trainer(self, run_id: int, stake: int | None = None) -> TxResult:
        """Stake and join as a trainer (stake defaults to the run's trainer stake)."""
        if stake is None:
            stake = self.run_info(run_id).params.trainer_stake
        return self._transact("joinTrainer", run_id, value=stake)

    def join_verifier(self, run_id: int, stake: int | None = None) -> TxResult:
        """Stake and join as a verifier (stake defaults to the run's verifier stake)."""
        if stake is None:
            stake = self.run_info(run_id).params.verifier_stake
        return self._transact("joinVerifier", run_id, value=stake)

    def stake_coordinator(self, run_id: int, stake: int | None = None) -> TxResult:
        """Stake as the run's coordinator (defaults to the verifier stake); needed before finalizing."""
        if stake is None:
            stake = self.run_info(run_id).params.verifier_stake
        return self._transact("stakeCoordinator", run_id, value=stake)

    def leave(self, run_id: int) -> TxResult:
        return self._transact("leaveRun", run_id)

    def withdraw(self, run_id: int) -> TxResult:
        return self._transact("withdraw", run_id)

    def claim(self) -> TxResult:
        return self._transact("claim")

    def commitment_for(
        self, run_id: int, epoch: int, payload_digest: bytes, trace_root: bytes, leaf_count: int, salt: bytes,
        trainer: str | None = None,
    ) -> Digest:
        """The §4 commitment for this chain, contract and account (computed locally)."""
        who = trainer or self.sender
        if who is None:
            raise ChainError("commitment_for needs a trainer address or an account")
        return commitment(self.chain_id, self.address, run_id, epoch, who, payload_digest, trace_root, leaf_count, salt)

    def commit(self, run_id: int, epoch: int, commitment_: bytes) -> TxResult:
        return self._transact("commit", run_id, epoch, bytes(commitment_))

    def reveal(
        self, run_id: int, epoch: int, payload_cid: str, payload_digest: bytes, trace_root: bytes, leaf_count: int, salt: bytes
    ) -> TxResult:
        return self._transact("reveal", run_id, epoch, payload_cid, bytes(payload_digest), bytes(trace_root), leaf_count, bytes(salt))

    def start_audit(self, run_id: int, epoch: int) -> TxResult:
        """One step of the two-step seed: schedule it, or fix it once the seed block is past."""
        return self._transact("startAudit", run_id, epoch)

    def fix_audit_seed(self, run_id: int, epoch: int, tries: int = 3) -> Digest | None:
        """The epoch's audit seed, calling startAudit (each call mined after the last) until it is
        fixed; None while it is still pending after `tries` calls (retry later)."""
        for attempt in range(tries + 1):
            times = self.epoch_times(run_id, epoch)
            if times.seeded:
                return times.seed
            if attempt < tries:
                self.start_audit(run_id, epoch)
        return None

    def respond(self, run_id: int, epoch: int, manifest_cid: str, response: AuditResponse) -> TxResult:
        """Post the audit response (build it with build_response from the epoch's trace)."""
        return self._transact("respond", run_id, epoch, manifest_cid, list(response.leaves), list(response.proofs))

    def verdict_commitment_for(self, run_id: int, epoch: int, verdicts: Sequence[Verdict], salt: bytes) -> Digest:
        """The §5.2 verdict commitment of this account (computed locally)."""
        if self.sender is None:
            raise ChainError("verdict_commitment_for needs an account")
        return verdict_commitment(self.chain_id, self.address, run_id, epoch, self.sender, verdicts, salt)

    def commit_verdicts(self, run_id: int, epoch: int, verdicts: Sequence[Verdict], salt: bytes) -> TxResult:
        """Commit to (trainer, passed, witness) verdicts (possibly none) before reveals open."""
        return self._transact("commitVerdicts", run_id, epoch, self.verdict_commitment_for(run_id, epoch, verdicts, salt))

    def submit_verdicts(self, run_id: int, epoch: int, verdicts: Sequence[Verdict], salt: bytes, evidence_cid: str = "") -> TxResult:
        """Reveal the committed verdicts, same order, same salt (contract: VerdictsNotOpen until all
        committed), with the CID of the one evidence document that holds their findings."""
        return self._transact(
            "submitVerdicts", run_id, epoch,
            [to_checksum_address(t) for t, _, _ in verdicts], [bool(p) for _, p, _ in verdicts],
            [bytes(w) for _, _, w in verdicts], evidence_cid, bytes(salt),
        )

    def finalize(self, run_id: int, epoch: int, model_cid: str, model_digest: bytes, included: Sequence[str]) -> TxResult:
        """Submit the aggregate; `included` is sorted here (the contract wants ascending addresses), and
        the audit seed is fixed first if nobody has yet (the attestation committee is drawn from it)."""
        ordered = sorted((to_checksum_address(a) for a in included), key=lambda a: int(a, 16))
        self.fix_audit_seed(run_id, epoch)
        return self._transact("finalize", run_id, epoch, model_cid, bytes(model_digest), ordered)

    def attest_model(self, run_id: int, epoch: int, model_digest: bytes, model_cid: str) -> TxResult:
        """Attest the model digest this node recomputed for a Confirming epoch (committee members only)."""
        return self._transact("attestModel", run_id, epoch, bytes(model_digest), model_cid)

    def report_unavailable(self, run_id: int, epoch: int, trainer: str) -> TxResult:
        """Report a passing trainer's payload as unfetchable (staked members; a rejected report is slashed)."""
        return self._transact("reportUnavailable", run_id, epoch, to_checksum_address(trainer))

    def post_window(self, run_id: int, epoch: int, window: int, root: bytes, bitmap: int, positions: int,
                    evidence_cid: str) -> TxResult:
        """The relay's aggregate root of a window (the run's coordinator; docs/protocol.md §5.4) and the CID of
        its evidence: the bitmap travels as ceil(positions / 8) bytes, position 0 in the lowest bit of the last byte."""
        return self._transact("postWindow", run_id, epoch, window, bytes(root), bitmap_bytes(bitmap, positions), evidence_cid)

    def post_own_window(self, run_id: int, epoch: int, window: int, root: bytes) -> TxResult:
        """A trainer's own window root, where the relay left it out."""
        return self._transact("postOwnWindow", run_id, epoch, window, bytes(root))

    def report_abandoned(self, run_id: int, epoch: int, trainer: str, window: int = 0, root: bytes = bytes(32),
                         signature: bytes = b"") -> TxResult:
        """Slash a trainer that began `epoch`'s windows and never committed it (anyone, once commits closed;
        burned): its signature over a window root, or none where it posted a window itself."""
        return self._transact("reportAbandoned", run_id, epoch, to_checksum_address(trainer), window, bytes(root),
                              bytes(signature))

    def window_posts(self, run_id: int, epoch: int) -> list[WindowPost]:
        """Every window post of an epoch in chain order (`protocol.windowdraw.first_post` says which counts):
        the relay's aggregates (poster the run's coordinator) and trainers' own roots (bitmap 0)."""
        coordinator = None
        out = []
        for e in self.events(["WindowPosted", "OwnWindowPosted"], run_id=run_id, epoch=epoch):
            if e.name == "WindowPosted":
                coordinator = coordinator or self.run_info(run_id).params.coordinator
                poster, bitmap, evidence = coordinator, int.from_bytes(e.args["bitmap"], "big"), e.args["evidenceCid"]
            else:
                poster, bitmap, evidence = e.args["trainer"], 0, ""
            out.append(WindowPost(e.args["window"], poster, bytes(e.args["root"]), bitmap, e.block_number, e.log_index,
                                  evidence))
        return out

    def vote_availability(self, run_id: int, epoch: int, trainer: str, available: bool) -> TxResult:
        """Vote on a reported payload (its availability committee only): available = fetched, checked, kept."""
        return self._transact("voteAvailability", run_id, epoch, to_checksum_address(trainer), bool(available))

    def availability(self, run_id: int, epoch: int, trainer: str) -> Availability:
        """A trainer's availability committee and the state of its challenge (docs/protocol.md §10.2)."""
        committee, word = self._call("availabilityCommittee", run_id, epoch, to_checksum_address(trainer))
        reporter = to_checksum_address(f"0x{word & ((1 << 160) - 1):040x}") if word else None
        decision = {0: None, 1: False, 2: True}[(word >> 192) & 3]
        return Availability([Address(a) for a in committee], reporter, (word >> 160) & 0xFFFF,
                            (word >> 176) & 0xFFFF, decision)

    def settle(self, run_id: int, epoch: int) -> TxResult:
        return self._transact("settle", run_id, epoch)

    # -------------------------------------------------------------- views

    def current_epoch(self, run_id: int) -> int:
        return int(self._call("currentEpoch", run_id))

    def epoch_status(self, run_id: int, epoch: int) -> EpochStatus:
        ph, c, r, p, f, cid = self._call("epochStatus", run_id, epoch)
        return EpochStatus(Phase(ph), c, r, p, f, Cid(cid))

    def epoch_times(self, run_id: int, epoch: int) -> EpochTimes:
        o, cc, rc, rd, vd, fd, done = self._call("epochTimes", run_id, epoch)
        exp, resp, vc, seeded, seed, md = self._call("epochAudit", run_id, epoch)
        return EpochTimes(o, cc, rc, rd, vd, fd, done, exp, resp, vc, bool(seeded), Digest(bytes(seed)), Digest(bytes(md)))

    def run_count(self) -> int:
        return int(self._call("runCount"))

    def run_info(self, run_id: int) -> RunInfo:
        params = RunParams.from_abi(self._call("runParams", run_id))
        creator, nxt, active, slots, vcount, pool = self._call("runState", run_id)
        return RunInfo(RunId(run_id), params, Address(to_checksum_address(creator)), nxt, active, slots, vcount, Wei(pool))

    def submission(self, run_id: int, epoch: int, trainer: str) -> SubmissionInfo:
        c, tr, lc, st, pv, fv, ok = self._call("submission", run_id, epoch, to_checksum_address(trainer))
        return SubmissionInfo(Digest(bytes(c)), Digest(bytes(tr)), lc, Sub(st), pv, fv, bool(ok))

    def assignment(self, run_id: int, epoch: int, trainer: str) -> Assignment:
        steps, fin, vs = self._call("assignment", run_id, epoch, to_checksum_address(trainer))
        return Assignment(tuple(int(s) for s in steps), bool(fin), tuple(Address(to_checksum_address(v)) for v in vs))

    def frozen_verifiers(self, run_id: int, epoch: int) -> list[Address]:
        """The epoch's frozen verifier list (the first verifierCount at scheduling): who must commit verdicts."""
        return self.participants(run_id)[1][: self.epoch_times(run_id, epoch).verifier_count]

    def model_committee(self, run_id: int, epoch: int) -> list[Address]:
        """The epoch's attestation committee: assigned like a trainer's verifiers, with the contract's
        address as the trainer (docs/protocol.md §9); empty until the audit seed is fixed. Read while
        the epoch is Auditing or Confirming (the verifier list is frozen until the model is confirmed)."""
        t = self.epoch_times(run_id, epoch)
        if not t.seeded:
            return []
        verifiers = self.participants(run_id)[1][: t.verifier_count]
        return assigned_verifiers(t.seed, self.address, verifiers, self.run_info(run_id).params.quorum)

    def member(self, run_id: int, account: str) -> MemberInfo:
        role, stake, slot, je, le, left = self._call("member", run_id, to_checksum_address(account))
        return MemberInfo(Role(role), Wei(stake), slot, je, None if le == NEVER_EPOCH else le, left)

    def trainer_at(self, run_id: int, slot: int) -> Address:
        """The trainer holding a slot, or that held it last (a withdrawn trainer's slot is reused)."""
        return Address(to_checksum_address(self._call("trainerAt", run_id, slot)))

    def participants(self, run_id: int) -> tuple[list[Address], list[Address]]:
        """(active trainers by slot, verifier list in assignment order)."""
        ts, vs = self._call("participants", run_id)
        return [Address(to_checksum_address(t)) for t in ts], [Address(to_checksum_address(v)) for v in vs]

    def totals(self) -> tuple[Wei, Wei]:
        """(total staked, total claimable credits); with total_burned() and total_pools(), they make up the contract balance."""
        return Wei(int(self._call("totalStaked"))), Wei(int(self._call("totalCredits")))

    def total_pools(self) -> Wei:
        """Reward pools of all runs not yet paid out; part of the contract balance."""
        return Wei(int(self._call("totalPools")))

    def total_burned(self) -> Wei:
        """Slashed stake nobody earned, locked in the contract for good."""
        return Wei(int(self._call("totalBurned")))

    def credits(self, account: str) -> Wei:
        return Wei(int(self._call("credits", to_checksum_address(account))))

    def balance(self) -> Wei:
        return Wei(int(_rpc(lambda: self.w3.eth.get_balance(to_checksum_address(self.address)), self.where)))

    def revealed(self, run_id: int, epoch: int, trainer: str | None = None) -> list[ChainEvent]:
        """Revealed events of an epoch (payload CIDs live there, not in storage)."""
        return self.events(["Revealed"], run_id=run_id, epoch=epoch, trainer=trainer)

    def events(
        self, names: Sequence[str] | None = None, *, run_id: int | None = None, epoch: int | None = None,
        trainer: str | None = None, from_block: int = 0,
    ) -> list[ChainEvent]:
        """All matching events so far (one-shot; use EventStream to follow)."""
        stream = EventStream(self, names, run_id=run_id, from_block=from_block)
        out = []
        while True:
            batch = stream.poll()
            out += batch
            if stream.cursor > stream.last_seen_head:
                break
        if epoch is not None:
            out = [e for e in out if e.args.get("epoch") == epoch]
        if trainer is not None:
            who = to_checksum_address(trainer)
            out = [e for e in out if e.args.get("trainer") == who]
        return out

    def stream(self, names: Sequence[str] | None = None, *, run_id: int | None = None, from_block: int = 0) -> EventStream:
        return EventStream(self, names, run_id=run_id, from_block=from_block)


def bitmap_bytes(bitmap: int, positions: int) -> bytes:
    if bitmap < 0 or bitmap >> positions:
        raise ChainError(f"an inclusion bitmap over {positions} positions has bits past them: {bitmap:#x}")
    return bitmap.to_bytes((positions + 7) // 8, "big")


def _event_signature(e: dict[str, Any]) -> str:
    def ty(i: dict[str, Any]) -> str:
        if i["type"].startswith("tuple"):
            return "(" + ",".join(ty(c) for c in i["components"]) + ")" + i["type"][5:]
        return str(i["type"])

    return f"{e['name']}({','.join(ty(i) for i in e['inputs'])})"


def _plain(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, str) and v.startswith("0x") and len(v) == 42:
        return to_checksum_address(v)
    return v


class EventStream:
    """Follows the contract's events with a block cursor (eth_getLogs polling).

    `poll()` returns the events of the blocks since the last poll, in chain order. If the node is
    unreachable it raises ChainUnavailable and keeps its cursor, so the next successful poll resumes
    exactly where it stopped: no event is lost or repeated across a reconnect. Reorgs are not
    handled (devnets do not reorg; on public chains pass `confirmations`).
    """

    def __init__(
        self, chain: Chain, names: Sequence[str] | None = None, *, run_id: int | None = None,
        from_block: int = 0, confirmations: int = 0, max_range: int = 2000,
    ) -> None:
        self.chain = chain
        self.names = set(names) if names else None
        self.run_id = run_id
        self.cursor = from_block
        self.confirmations = confirmations
        self.max_range = max_range
        self.last_seen_head = -1
        if self.names:
            unknown = self.names - set(chain._events_by_topic.values())
            if unknown:
                raise ChainError(f"unknown event name(s) {sorted(unknown)}; see docs/contract.md for the list")

    def poll(self) -> list[ChainEvent]:
        ch = self.chain
        head = ch.block_number() - self.confirmations
        self.last_seen_head = head
        if self.cursor > head:
            return []
        to = min(head, self.cursor + self.max_range - 1)
        # topic 0 is the event signature (None: any), topic 1 the indexed run id of every run event
        sigs = ["0x" + t.hex() for t, n in ch._events_by_topic.items() if self.names is None or n in self.names]
        topics: list[Any] = [sigs if self.names else None]
        if self.run_id is not None:
            topics.append("0x" + self.run_id.to_bytes(32, "big").hex())
        flt: dict[str, Any] = {"address": ch.address, "fromBlock": self.cursor, "toBlock": to}
        if any(t is not None for t in topics):
            flt["topics"] = topics
        logs = _rpc(lambda: ch.w3.eth.get_logs(flt), ch.where)  # type: ignore[arg-type]
        out = [e for e in (ch._decode_log(lg) for lg in logs) if e is not None]
        if self.names:
            out = [e for e in out if e.name in self.names]
        out.sort(key=lambda e: (e.block_number, e.log_index))
        self.cursor = to + 1
        return out

    def follow(self, timeout: float, interval: float = 0.1) -> Iterator[ChainEvent]:
        """Yield events as they arrive until `timeout` seconds pass; survives temporary outages."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                batch = self.poll()
            except ChainUnavailable:
                batch = []
            yield from batch
            if not batch:
                time.sleep(interval)
