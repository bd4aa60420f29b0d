"""Devnets end to end: `veriloco devnet` as a process, in-process devnets, anvil with persisted state."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from eth_account import Account
from web3 import Web3

from devnet.anvil import Anvil, AnvilConfig, AnvilError, anvil_binary
from devnet.evmserver import DEFAULT_CHAIN_ID
from devnet.launch import (
    DevnetConfig,
    DevnetError,
    DevnetInfo,
    DevnetProcess,
    dev_accounts,
    start_devnet,
)
from protocol.chain.binding import Chain
from tests.fixtures.devnet import deploy_probe

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _have_anvil() -> bool:
    try:
        anvil_binary()
    except AnvilError:
        return False
    return True


needs_anvil = pytest.mark.skipif(not _have_anvil(), reason="npm @foundry-rs/anvil not installed")


def test_devnet_command_runs_until_sigint_and_frees_its_port(tmp_path: Path) -> None:
    config = DevnetConfig(state_dir=tmp_path / "dev", accounts=4, block_time=None)
    with DevnetProcess(config) as net:
        info = net.info
        on_disk = json.loads((tmp_path / "dev" / "devnet.json").read_text())
        assert on_disk["rpc_url"] == info.rpc_url and on_disk["pid"] == net.pid
        assert info.chain == "py-evm" and info.chain_id == DEFAULT_CHAIN_ID
        assert info.store.kind == "local" and Path(info.store.path or "").is_dir()
        w3 = net.web3()
        assert w3.eth.chain_id == DEFAULT_CHAIN_ID
        assert [a.address for a in info.accounts] == w3.eth.accounts
        # the deployed contract is exactly the committed build (Chain checks the code)
        assert info.contract is not None
        assert Chain(w3, info.contract).run_count() == 0
        port = int(info.rpc_url.rsplit(":", 1)[1])
        assert not _port_is_free(port)
        assert net.stop() == 0  # SIGINT, clean exit status
    assert not (tmp_path / "dev" / "devnet.json").exists()
    assert _port_is_free(port)
    log = (tmp_path / "dev" / "devnet.log").read_text()
    assert "ready" in log and "devnet: stopped" in log
    assert "Traceback" not in log


def test_in_process_devnet_accounts_sign_and_settings_read_the_file(tmp_path: Path) -> None:
    from veriloco.settings import add_connection_args, resolve

    with start_devnet(state_dir=tmp_path, accounts=3, deploy=False, block_time=None) as net:
        info = net.info
        assert info.contract is None
        w3 = net.web3()
        acct = Account.from_key(info.accounts[2].key)
        assert acct.address == info.accounts[2].address
        tx = {
            "to": info.accounts[0].address,
            "value": 10**18,
            "gas": 21_000,
            "nonce": 0,
            "chainId": info.chain_id,
            "maxFeePerGas": 10**10,
            "maxPriorityFeePerGas": 10**9,
        }
        receipt = w3.eth.wait_for_transaction_receipt(
            w3.eth.send_raw_transaction(acct.sign_transaction(tx).raw_transaction), timeout=30
        )
        assert receipt["status"] == 1
        # the node commands find the devnet through its file
        import argparse

        parser = argparse.ArgumentParser()
        add_connection_args(parser)
        args = parser.parse_args(["--devnet", str(tmp_path / "devnet.json"), "--account", "1"])
        settings = resolve(args, need_contract=False)
        assert settings.rpc_url == info.rpc_url
        assert settings.key == info.accounts[1].key
        assert settings.store == "local" and settings.store_dir == Path(info.store.path or "")
    assert not (tmp_path / "devnet.json").exists()


def test_devnet_fund_sends_eth_to_a_key_of_ones_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 46 item 9: `veriloco devnet fund ADDRESS [ETH]` funds a new key from the running devnet's last
    account; a bad address or amount, or no devnet, is one line."""
    from tests.fixtures.cli import run_cli

    mine = Account.create().address
    with start_devnet(state_dir=tmp_path, accounts=3, deploy=False, block_time=None) as net:
        code, out, err = run_cli(capsys, "devnet", "fund", mine, "2.5", "--dir", str(tmp_path))
        assert code == 0 and f"sent 2.5 ETH to {mine}" in out and "it holds 2.5 ETH" in out, err
        assert net.web3().eth.get_balance(mine) == 25 * 10**17  # type: ignore[arg-type]
        for argv, phrase in ((["fund", "0x12"], "not an Ethereum address"), (["fund", mine, "-1"], "outside"),
                             (["fnud", mine], "unknown devnet command")):
            code, _, err = run_cli(capsys, "devnet", *argv, "--dir", str(tmp_path))
            assert code == 2 and phrase in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run_cli(capsys, "devnet", "fund", mine, "--dir", str(tmp_path))
    assert code == 2 and "no devnet file" in err, err


def test_a_second_devnet_in_the_same_folder_is_refused_and_leaves_the_first_alone(tmp_path: Path) -> None:
    """Issue 46: a second devnet (in this process or as `veriloco devnet`) in a folder whose devnet
    runs is refused, naming it, and neither takes the devnet file over nor deletes it."""
    with start_devnet(state_dir=tmp_path, accounts=2, deploy=False, block_time=None) as first:
        before = (tmp_path / "devnet.json").read_bytes()
        with pytest.raises(DevnetError, match="a devnet already runs in .* give this one another --dir"):
            start_devnet(state_dir=tmp_path, accounts=2, deploy=False, block_time=None)
        out = subprocess.run([sys.executable, "-m", "veriloco.cli", "devnet", "--dir", str(tmp_path), "--no-deploy"],
                             cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 2 and "a devnet already runs in" in out.stderr, out.stderr
        assert (tmp_path / "devnet.json").read_bytes() == before
        assert Web3(Web3.HTTPProvider(first.info.rpc_url)).eth.chain_id == DEFAULT_CHAIN_ID  # still up
    with start_devnet(state_dir=tmp_path, accounts=2, deploy=False, block_time=None):  # the folder is free again
        assert (tmp_path / "devnet.json").exists()


def test_dev_accounts_are_the_public_test_accounts() -> None:
    accounts = dev_accounts(2)
    assert accounts[0].address == "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
    assert accounts[1].address == "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
    assert Account.from_key(accounts[1].key).address == accounts[1].address


def test_devnet_file_is_validated(tmp_path: Path) -> None:
    good = DevnetInfo.from_json(
        {
            "version": 1,
            "rpc_url": "http://127.0.0.1:8545",
            "chain_id": 1337,
            "chain": "py-evm",
            "contract": None,
            "accounts": [{"address": dev_accounts(1)[0].address, "key": dev_accounts(1)[0].key}],
            "store": {"kind": "local", "path": "/tmp/store"},
            "pid": 1,
        }
    )
    assert DevnetInfo.from_json(good.to_json()) == good
    bad_cases = [
        ([], "not a JSON object"),
        ({**good.to_json(), "version": 9}, "format version 9"),
        ({**good.to_json(), "chain": "geth"}, "chain 'geth'"),
        ({**good.to_json(), "contract": "0x12"}, "contract"),
        ({**good.to_json(), "accounts": [{"address": "0x1"}]}, r"accounts\[0\].key"),
        ({**good.to_json(), "store": {"kind": "ipfs"}}, "store.api"),
        ({k: v for k, v in good.to_json().items() if k != "rpc_url"}, "rpc_url"),
    ]
    for data, message in bad_cases:
        with pytest.raises(DevnetError, match=message):
            DevnetInfo.from_json(data)
    (tmp_path / "devnet.json").write_text("{truncated")
    with pytest.raises(DevnetError, match="not JSON"):
        DevnetInfo.read(tmp_path / "devnet.json")
    with pytest.raises(DevnetError, match="no devnet file"):
        DevnetInfo.read(tmp_path / "missing.json")


def test_devnet_command_reports_a_busy_port_cleanly(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "veriloco.cli", "devnet", "--dir", str(tmp_path),
             "--port", str(port), "--no-deploy"],
            capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
        )  # fmt: skip
    assert result.returncode == 2
    assert "cannot listen" in result.stderr and "Traceback" not in result.stderr


@needs_anvil
def test_anvil_starts_persists_state_and_restarts_from_it(tmp_path: Path) -> None:
    state = tmp_path / "anvil-state.json"
    config = AnvilConfig(accounts=2, state_file=state)
    with Anvil(config) as node:
        w3 = Web3(Web3.HTTPProvider(node.url))
        assert w3.eth.chain_id == 31337
        assert w3.eth.accounts == [a.address for a in dev_accounts(2)]
        probe = deploy_probe(w3)
        w3.eth.wait_for_transaction_receipt(
            probe.functions.store(77, "kept").transact({"from": w3.eth.accounts[1]}), timeout=30
        )
        pid = node.pid
        assert pid is not None
    assert state.is_file() and state.stat().st_size > 0  # dumped on SIGTERM
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)  # the anvil process is gone
    with Anvil(config) as node:
        w3 = Web3(Web3.HTTPProvider(node.url))
        again = w3.eth.contract(address=probe.address, abi=probe.abi)
        assert again.functions.value().call() == 77
        assert w3.eth.block_number == 2
    with Anvil(AnvilConfig(accounts=2)) as fresh:  # no state file: a new chain
        assert Web3(Web3.HTTPProvider(fresh.url)).eth.get_code(probe.address) == b""


@needs_anvil
def test_anvil_devnet_keeps_its_contract_across_restarts(tmp_path: Path) -> None:
    with start_devnet(chain="anvil", state_dir=tmp_path, accounts=2, block_time=None) as net:
        first = net.info
        assert first.chain_id == 31337 and first.contract is not None
        assert Chain(net.web3(), first.contract).run_count() == 0
    with start_devnet(chain="anvil", state_dir=tmp_path, accounts=2, block_time=None) as net:
        assert net.info.contract == first.contract  # reused from the persisted state
        assert Chain(net.web3(), first.contract).run_count() == 0


@needs_anvil
def test_anvil_refuses_a_busy_port_with_its_log(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        node = Anvil(AnvilConfig(accounts=1), port=busy.getsockname()[1])
        with pytest.raises(AnvilError, match="exited at start-up"):
            node.start(timeout=30)
        node.close()


def test_ipfs_store_devnet_starts_a_node(tmp_path: Path) -> None:
    from devnet.ipfsnode import IpfsNodeError, find_node_modules

    try:
        find_node_modules()
    except IpfsNodeError as exc:
        pytest.fail(f"{exc}; run `make test`, which installs the npm tooling from the lockfile")
    with start_devnet(store="ipfs", state_dir=tmp_path, accounts=1, deploy=False) as net:
        api = net.info.store.api
        assert api is not None and api.startswith("/ip4/127.0.0.1/tcp/")
        port = api.rsplit("/", 1)[1]
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v0/id", method="POST")
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert "ID" in json.loads(reply.read())
    assert _port_is_free(int(port))
