"""The py-evm JSON-RPC server against web3's HTTPProvider: deploy, transact, logs, reverts, time."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from eth_abi import decode as abi_decode
from eth_account import Account
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from web3 import Web3
from web3.exceptions import ContractCustomError, ContractLogicError, Web3RPCError

from devnet.evmserver import (
    DEFAULT_CHAIN_ID,
    EvmChain,
    EvmConfig,
    EvmRpc,
    EvmServer,
    EvmServerError,
)
from tests.fixtures.devnet import deploy_probe, load_probe

pytestmark = pytest.mark.integration


def _w3(server: EvmServer) -> Web3:
    return Web3(Web3.HTTPProvider(server.url, request_kwargs={"timeout": 30}))


def _rpc(server: EvmServer, body: Any) -> Any:
    return requests.post(server.url, json=body, timeout=30).json()


@pytest.fixture
def evm_server() -> Iterator[EvmServer]:
    with EvmServer(EvmConfig(accounts=6)) as server:
        yield server


class FakeClock:
    """Wall time under the test's control (the server reads time only through its clock)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_identity_and_funded_dev_accounts(evm_server: EvmServer) -> None:
    w3 = _w3(evm_server)
    assert w3.eth.chain_id == DEFAULT_CHAIN_ID
    assert w3.net.version == str(DEFAULT_CHAIN_ID)
    accounts = w3.eth.accounts
    assert len(accounts) == 6
    # the public anvil/hardhat dev account #0 (test mnemonic), so keys match across devnets
    assert accounts[0] == "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
    assert [a for a, _ in evm_server.dev_keys()] == accounts
    assert Account.from_key(evm_server.dev_keys()[3][1]).address == accounts[3]
    assert w3.eth.get_balance(accounts[5]) == 10_000 * 10**18
    assert w3.eth.block_number == 0


def test_deploy_transact_and_read_back(evm_server: EvmServer) -> None:
    w3 = _w3(evm_server)
    probe = deploy_probe(w3)
    assert w3.eth.get_code(probe.address) != b""
    tx = probe.functions.store(42, "hello").transact({"from": w3.eth.accounts[1]})
    receipt = w3.eth.wait_for_transaction_receipt(tx, timeout=30)
    assert receipt["status"] == 1 and receipt["blockNumber"] == 2
    assert probe.functions.value().call() == 42
    assert probe.functions.value().call(block_identifier=1) == 0  # state as of block 1
    (event,) = probe.events.Stored().process_receipt(receipt)
    assert event["args"]["sender"] == w3.eth.accounts[1]
    assert event["args"]["note"] == "hello"
    fetched = w3.eth.get_transaction(tx)
    assert fetched["from"] == w3.eth.accounts[1] and fetched["to"] == probe.address
    block = w3.eth.get_block(receipt["blockNumber"], full_transactions=True)
    assert block["transactions"][0]["hash"] == tx
    assert (
        block["transactions"][0]["input"]
        .hex()
        .startswith(probe.functions.store(42, "hello")._encode_transaction_data()[2:10])
    )


def test_signed_raw_transactions_and_pending_nonce(evm_server: EvmServer) -> None:
    w3 = _w3(evm_server)
    probe = deploy_probe(w3)
    acct = Account.from_key(evm_server.dev_keys()[2][1])
    for i in range(3):
        nonce = w3.eth.get_transaction_count(acct.address, "pending")
        assert nonce == i
        tx = probe.functions.store(i, "raw").build_transaction(
            {"from": acct.address, "nonce": nonce}
        )
        signed = acct.sign_transaction(tx)
        receipt = w3.eth.wait_for_transaction_receipt(
            w3.eth.send_raw_transaction(signed.raw_transaction), timeout=30
        )
        assert receipt["status"] == 1
    assert probe.functions.value().call() == 2
    # a transaction signed for another chain is refused, not mined
    wrong = acct.sign_transaction({**tx, "nonce": 3, "chainId": 31337})
    with pytest.raises(Web3RPCError, match="chain id 31337"):
        w3.eth.send_raw_transaction(wrong.raw_transaction)
    # a replayed nonce is refused with the node's reason
    with pytest.raises(Web3RPCError):
        w3.eth.send_raw_transaction(signed.raw_transaction)
    assert w3.eth.get_transaction_count(acct.address) == 3


def test_logs_by_block_range_and_topics(evm_server: EvmServer) -> None:
    w3 = _w3(evm_server)
    probe = deploy_probe(w3)
    a, b = w3.eth.accounts[1], w3.eth.accounts[2]
    log_filter = w3.eth.filter({"address": probe.address})
    for sender, value in [(a, 1), (b, 2), (a, 3), (b, 4)]:
        w3.eth.wait_for_transaction_receipt(
            probe.functions.store(value, f"v{value}").transact({"from": sender}), timeout=30
        )
    stored = probe.events.Stored().topic
    sender_b = "0x" + "00" * 12 + b[2:].lower()
    logs = w3.eth.get_logs({"fromBlock": 0, "toBlock": "latest", "topics": [stored, sender_b]})
    assert [int.from_bytes(log["topics"][2], "big") for log in logs] == [2, 4]
    either = w3.eth.get_logs(
        {"fromBlock": 0, "topics": [None, None, ["0x" + "00" * 31 + "01", "0x" + "00" * 31 + "04"]]}
    )
    assert [int.from_bytes(log["topics"][2], "big") for log in either] == [1, 4]
    ranged = w3.eth.get_logs({"fromBlock": 3, "toBlock": 4, "address": probe.address})
    assert [log["blockNumber"] for log in ranged] == [3, 4]
    decoded = probe.events.Stored().get_logs(from_block=0, argument_filters={"sender": a})
    assert [e["args"]["note"] for e in decoded] == ["v1", "v3"]
    by_hash = w3.eth.get_logs({"blockHash": ranged[0]["blockHash"]})
    assert len(by_hash) == 1 and by_hash[0]["transactionHash"] == ranged[0]["transactionHash"]
    changes = log_filter.get_new_entries()
    assert [log["blockNumber"] for log in changes] == [2, 3, 4, 5]  # each log exactly once
    assert log_filter.get_new_entries() == []
    assert w3.eth.uninstall_filter(log_filter.filter_id)


def test_custom_error_and_reason_string_reverts(evm_server: EvmServer) -> None:
    w3 = _w3(evm_server)
    probe = deploy_probe(w3)
    with pytest.raises(ContractCustomError) as info:
        probe.functions.store(5000, "too big").transact({"from": w3.eth.accounts[0]})
    data = bytes.fromhex(str(info.value.data)[2:])
    selector = Web3.keccak(text="TooLarge(uint256,uint256)")[:4]
    assert data[:4] == selector
    assert abi_decode(["uint256", "uint256"], data[4:]) == (5000, 1000)
    with pytest.raises(ContractLogicError, match="execution reverted: boom"):
        probe.functions.fail("boom").call()
    # the raw wire format geth and anvil use: code 3, revert data in error.data
    call = {"to": probe.address, "data": probe.functions.store(7000, "")._encode_transaction_data()}
    reply = _rpc(
        evm_server, {"jsonrpc": "2.0", "id": 1, "method": "eth_estimateGas", "params": [call]}
    )
    assert reply["error"]["code"] == 3
    assert reply["error"]["data"].startswith("0x" + selector.hex())
    # a reverting transaction sent with explicit gas is mined with status 0, as on a real chain
    tx = probe.functions.store(5000, "x").transact({"from": w3.eth.accounts[0], "gas": 100_000})
    assert w3.eth.wait_for_transaction_receipt(tx, timeout=30)["status"] == 0


def test_unfunded_address_can_call_and_estimate(evm_server: EvmServer) -> None:
    w3 = _w3(evm_server)
    probe = deploy_probe(w3)
    nobody = "0x000000000000000000000000000000000000dEaD"
    assert probe.functions.value().call({"from": nobody}) == 0
    assert probe.functions.store(1, "").estimate_gas({"from": nobody}) > 21_000


def test_gas_estimate_is_enough_and_tight(evm_server: EvmServer) -> None:
    w3 = _w3(evm_server)
    probe = deploy_probe(w3)
    sender = w3.eth.accounts[1]
    for value, note in [(7, ""), (8, "a longer note " * 20)]:
        estimate = probe.functions.store(value, note).estimate_gas({"from": sender})
        tx = probe.functions.store(value, note).transact({"from": sender, "gas": estimate})
        receipt = w3.eth.wait_for_transaction_receipt(tx, timeout=30)
        assert receipt["status"] == 1  # the estimate sufficed
        # refunds make gasUsed lower than the limit needed; the estimate stays within a few %
        assert receipt["gasUsed"] <= estimate <= receipt["gasUsed"] * 1.3 + 5_000


def test_block_time_follows_the_clock_without_new_blocks() -> None:
    clock = FakeClock(1_800_000_000.0)
    with EvmServer(EvmConfig(accounts=2), clock=clock) as server:
        w3 = _w3(server)
        probe = deploy_probe(w3)
        deployed_at = w3.eth.get_block("latest")["timestamp"]
        assert deployed_at == 1_800_000_001  # genesis at the clock, then parent + 1
        clock.now += 600  # ten idle minutes: no block mined meanwhile
        assert probe.functions.now_().call(block_identifier="pending") == 1_800_000_600
        assert probe.functions.now_().call() == deployed_at  # "latest": the mined block's time
        tx = probe.functions.store(1, "").transact({"from": w3.eth.accounts[0]})
        mined = w3.eth.get_block(w3.eth.get_transaction_receipt(tx)["blockNumber"])
        assert mined["timestamp"] == 1_800_000_600
        # a burst within one second still gets strictly increasing timestamps
        for i in range(3):
            probe.functions.store(i, "").transact({"from": w3.eth.accounts[0]})
        stamps = [w3.eth.get_block(n)["timestamp"] for n in range(2, w3.eth.block_number + 1)]
        assert stamps == sorted(set(stamps))


def test_idle_chain_mines_a_block_once_block_time_passes() -> None:
    clock = FakeClock(1_800_000_000.0)
    with EvmServer(EvmConfig(accounts=1), clock=clock, block_time=5) as server:
        w3 = _w3(server)
        assert w3.eth.block_number == 0
        clock.now += 6
        deadline = time.monotonic() + 20
        while w3.eth.block_number == 0:  # the miner thread polls at least every 0.25 s
            assert time.monotonic() < deadline, "no idle block within 20 s"
            time.sleep(0.02)
        assert w3.eth.get_block("latest")["timestamp"] == 1_800_000_006


def test_time_travel_mine_and_snapshots() -> None:
    clock = FakeClock(1_800_000_000.0)
    with EvmServer(EvmConfig(accounts=2), clock=clock) as server:
        w3 = _w3(server)
        probe = deploy_probe(w3)  # block 1 at 1_800_000_001
        clock.now += 100
        assert probe.functions.now_().call(block_identifier="pending") == 1_800_000_100
        offset = int(w3.provider.make_request("evm_increaseTime", [3600])["result"], 16)
        assert offset == 3600
        assert probe.functions.now_().call(block_identifier="pending") == 1_800_003_700
        number = w3.eth.block_number
        w3.provider.make_request("evm_mine", [])
        assert w3.eth.block_number == number + 1
        assert w3.eth.get_block("latest")["timestamp"] == 1_800_003_700
        assert int(w3.provider.make_request("evm_increaseTime", ["0x64"])["result"], 16) == 3700
        assert probe.functions.now_().call(block_identifier="pending") == 1_800_003_800
        target = 1_900_000_000
        w3.provider.make_request("evm_mine", [{"timestamp": target, "blocks": 2}])
        assert w3.eth.get_block(number + 2)["timestamp"] == target
        assert w3.eth.get_block("latest")["timestamp"] == target + 1
        assert "error" in w3.provider.make_request("evm_setNextBlockTimestamp", [target])
        kept = probe.functions.store(5, "").transact({"from": w3.eth.accounts[0]})
        snap = w3.provider.make_request("evm_snapshot", [])["result"]
        gone = probe.functions.store(99, "").transact({"from": w3.eth.accounts[0]})
        w3.eth.wait_for_transaction_receipt(gone, timeout=30)
        assert probe.functions.value().call() == 99
        assert w3.provider.make_request("evm_revert", [snap])["result"] is True
        assert probe.functions.value().call() == 5
        assert w3.eth.block_number == number + 4
        assert w3.provider.make_request("evm_revert", ["0x99"])["result"] is False
        # the reverted transaction is gone; the ones before the snapshot are still found
        assert (
            w3.provider.make_request("eth_getTransactionReceipt", [Web3.to_hex(gone)])["result"]
            is None
        )
        assert w3.eth.get_transaction_receipt(kept)["status"] == 1
        unknown = "0x" + "ab" * 32
        assert w3.provider.make_request("eth_getTransactionByHash", [unknown])["result"] is None


def test_batch_requests_and_error_objects(evm_server: EvmServer) -> None:
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []},
        {"jsonrpc": "2.0", "id": "two", "method": "eth_blockNumber"},
        {"jsonrpc": "2.0", "method": "eth_chainId", "params": []},  # notification: no reply
        {"jsonrpc": "2.0", "id": 3, "method": "eth_noSuchMethod", "params": []},
        {"jsonrpc": "2.0", "id": 4, "method": "eth_getBalance", "params": ["0x12", "latest"]},
        {"jsonrpc": "2.0", "id": 5, "method": "eth_getBlockByNumber", "params": ["0x64", False]},
    ]
    replies = {r["id"]: r for r in _rpc(evm_server, batch)}
    assert set(replies) == {1, "two", 3, 4, 5}
    assert replies[1]["result"] == hex(DEFAULT_CHAIN_ID)
    assert replies["two"]["result"] == "0x0"
    assert replies[3]["error"]["code"] == -32601
    assert replies[4]["error"]["code"] == -32602
    assert replies[5]["result"] is None
    garbage = requests.post(evm_server.url, data=b"{not json", timeout=30).json()
    assert garbage["error"]["code"] == -32700
    assert _rpc(evm_server, [])["error"]["code"] == -32600
    assert _rpc(evm_server, {"id": 1})["error"]["code"] == -32600


def test_concurrent_clients_from_threads(evm_server: EvmServer) -> None:
    w3 = _w3(evm_server)
    probe = deploy_probe(w3)
    keys = [key for _, key in evm_server.dev_keys()[1:5]]
    per_thread = 8
    errors: list[BaseException] = []

    def worker(key: str) -> None:
        try:
            client = _w3(evm_server)
            acct = Account.from_key(key)
            contract = client.eth.contract(address=probe.address, abi=load_probe()["abi"])
            for i in range(per_thread):
                tx = contract.functions.store(i, acct.address).build_transaction(
                    {"from": acct.address, "nonce": i, "gas": 100_000}
                )
                raw = acct.sign_transaction(tx).raw_transaction
                receipt = client.eth.wait_for_transaction_receipt(
                    client.eth.send_raw_transaction(raw), timeout=30
                )
                assert receipt["status"] == 1
                assert contract.functions.value().call() < per_thread
        except Exception as exc:  # noqa: BLE001 -- surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert w3.eth.block_number == 1 + len(keys) * per_thread
    for key in keys:
        assert w3.eth.get_transaction_count(Account.from_key(key).address) == per_thread
    logs = probe.events.Stored().get_logs(from_block=0)
    assert len(logs) == len(keys) * per_thread


def test_stop_frees_the_port_and_busy_port_is_a_clear_error() -> None:
    server = EvmServer(EvmConfig(accounts=1)).start()
    port = server.port
    assert _w3(server).eth.chain_id == DEFAULT_CHAIN_ID
    with pytest.raises(EvmServerError, match="cannot listen"):
        EvmServer(EvmConfig(accounts=1), port=port)
    server.stop()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))  # raises if the server still held it


def test_config_is_validated() -> None:
    with pytest.raises(EvmServerError, match="accounts"):
        EvmConfig(accounts=0)
    with pytest.raises(EvmServerError, match="chain id"):
        EvmConfig(chain_id=0)


_FUZZ_RPC = EvmRpc(EvmChain(EvmConfig(accounts=2)))  # one chain for all examples

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-5, max_value=40)
    | st.sampled_from(
        ["latest", "pending", "earliest", "0x", "0x0", "0x1", "0xzz", "", "0x" + "11" * 20,
         "0x" + "22" * 32, "0x02f8", "0xf86c808504a817c800825208"]
    ),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(
        st.sampled_from(["from", "to", "data", "input", "gas", "value", "fromBlock", "toBlock",
                         "topics", "address", "blockHash", "timestamp", "blocks", "x"]),
        inner,
        max_size=4,
    ),
    max_leaves=8,
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_params_get_a_json_rpc_answer_never_a_crash(data: st.DataObject) -> None:
    rpc = _FUZZ_RPC
    method = data.draw(st.sampled_from(rpc.methods))
    params = data.draw(st.lists(_json_values, max_size=3) | _json_values)
    reply = rpc.handle({"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
    assert reply["id"] == 7 and reply["jsonrpc"] == "2.0"
    if "error" in reply:
        assert isinstance(reply["error"]["code"], int) and reply["error"]["message"]
    else:
        json.dumps(reply["result"])  # always JSON-encodable


def test_hostile_http_requests_are_refused_cleanly(evm_server: EvmServer) -> None:
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    assert requests.post(evm_server.url, data=deep, timeout=30).json()["error"]["code"] == -32600
    with socket.create_connection((evm_server.host, evm_server.port), timeout=30) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 400")
    with socket.create_connection((evm_server.host, evm_server.port), timeout=30) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 413")
    assert requests.get(evm_server.url, timeout=30).status_code == 405
    assert _w3(evm_server).eth.chain_id == DEFAULT_CHAIN_ID  # still serving
