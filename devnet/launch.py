"""A local devnet: a chain, a content store and a deployed contract, described by one file.

A devnet starts the chain (py-evm served over JSON-RPC on a thread of this process, or anvil as a
child process), points to or starts the store (a directory, or a js-ipfs node), deploys the Veriloco
contract with protocol.chain.binding.deploy and writes DIR/devnet.json (format in docs/devnet.md); stopped,
it stops everything it started and removes the devnet file. `veriloco devnet`
(veriloco/devnetcmd.py) runs one until Ctrl-C or SIGTERM.

Library use (the demo, e2e tests):

    with start_devnet(chain="py-evm", store="local", state_dir=tmp) as net:   # in this process
        w3 = net.web3(); address = net.info.contract
    with spawn_devnet(state_dir=tmp) as net:   # `veriloco devnet` as a subprocess
        ...

The dev accounts come from the public test mnemonic ("test test ... junk"): their keys are
published everywhere and are for local devnets only, never for real funds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

from devnet.anvil import ANVIL_CHAIN_ID, Anvil, AnvilConfig, wait_for_rpc
from devnet.evmserver import DEFAULT_CHAIN_ID, DEV_HD_PATH, DEV_MNEMONIC, EvmConfig, EvmServer
from devnet.procs import stop_process
from protocol.errors import VerilocoError
from protocol.nodelock import NodeLock, NodeRunningError, acquire

DEVNET_FILE = "devnet.json"
DEFAULT_DIR = Path(".veriloco")  # veriloco.settings looks for .veriloco/devnet.json
LOCK_FILE = "devnet.lock"  # held by the running devnet (protocol/nodelock.py)
FORMAT_VERSION = 1
ChainKind = Literal["py-evm", "anvil"]
StoreKind = Literal["local", "ipfs"]


class DevnetError(VerilocoError):
    """The devnet could not start, or a devnet file is missing or malformed."""


@dataclass(frozen=True)
class DevAccount:
    address: str  # checksummed
    key: str  # 0x-hex private key, public test key


@dataclass(frozen=True)
class StoreInfo:
    kind: StoreKind
    path: str | None = None  # LocalStore directory (kind "local")
    api: str | None = None  # Kubo RPC API multiaddr (kind "ipfs")


@dataclass(frozen=True)
class DevnetInfo:
    """What the devnet file says: everything a node needs to join the devnet."""

    rpc_url: str
    chain_id: int
    chain: ChainKind
    contract: str | None
    accounts: tuple[DevAccount, ...]
    store: StoreInfo
    pid: int  # the process serving the devnet (this one, for in-process devnets)

    def to_json(self) -> dict[str, Any]:
        store: dict[str, Any] = {"kind": self.store.kind}
        if self.store.path is not None:
            store["path"] = self.store.path
        if self.store.api is not None:
            store["api"] = self.store.api
        return {
            "version": FORMAT_VERSION,
            "rpc_url": self.rpc_url,
            "chain_id": self.chain_id,
            "chain": self.chain,
            "contract": self.contract,
            "accounts": [{"address": a.address, "key": a.key} for a in self.accounts],
            "store": store,
            "pid": self.pid,
            "warning": "dev keys from the public test mnemonic: never use them for real funds",
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "devnet file") -> DevnetInfo:
        """Parse and check a devnet file's JSON; any problem is a DevnetError naming the field."""

        def need(obj: Any, key: str, kind: type | tuple[type, ...], ctx: str) -> Any:
            if not isinstance(obj, dict) or key not in obj or not isinstance(obj[key], kind):
                raise DevnetError(f"{where}: '{ctx}{key}' is missing or not a {_kind_name(kind)}")
            return obj[key]

        if not isinstance(data, dict):
            raise DevnetError(f"{where}: not a JSON object")
        version = need(data, "version", int, "")
        if version != FORMAT_VERSION:
            raise DevnetError(
                f"{where}: format version {version}, this veriloco reads {FORMAT_VERSION}"
            )
        chain = need(data, "chain", str, "")
        if chain not in ("py-evm", "anvil"):
            raise DevnetError(f"{where}: chain {chain!r} is not py-evm or anvil")
        contract = data.get("contract")
        if contract is not None and not _is_address(contract):
            raise DevnetError(f"{where}: contract {contract!r} is not a 0x address")
        accounts = []
        for i, entry in enumerate(need(data, "accounts", list, "")):
            address = need(entry, "address", str, f"accounts[{i}].")
            key = need(entry, "key", str, f"accounts[{i}].")
            if not _is_address(address) or not (key.startswith("0x") and len(key) == 66):
                raise DevnetError(f"{where}: accounts[{i}] needs a 0x address and a 32-byte 0x key")
            accounts.append(DevAccount(address, key))
        store = need(data, "store", dict, "")
        kind = need(store, "kind", str, "store.")
        if kind not in ("local", "ipfs"):
            raise DevnetError(f"{where}: store.kind {kind!r} is not local or ipfs")
        if kind == "local":
            need(store, "path", str, "store.")
        else:
            need(store, "api", str, "store.")
        return cls(
            rpc_url=need(data, "rpc_url", str, ""),
            chain_id=need(data, "chain_id", int, ""),
            chain=chain,
            contract=contract,
            accounts=tuple(accounts),
            store=StoreInfo(kind, store.get("path"), store.get("api")),
            pid=need(data, "pid", int, ""),
        )

    def write(self, path: Path) -> None:
        """Write atomically (temp file + rename): a reader never sees half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> DevnetInfo:
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise DevnetError(
                f"no devnet file at {path}; start one with `veriloco devnet`"
            ) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DevnetError(
                f"devnet file {path} is not JSON ({exc}); restart the devnet"
            ) from None
        return cls.from_json(data, where=str(path))


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "number", str: "string", list: "list", dict: "object"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _is_address(value: Any) -> bool:
    if not isinstance(value, str) or len(value) != 42 or not value.startswith("0x"):
        return False
    try:
        bytes.fromhex(value[2:])
    except ValueError:
        return False
    return True


def dev_accounts(count: int, mnemonic: str = DEV_MNEMONIC) -> tuple[DevAccount, ...]:
    """The first `count` accounts of the mnemonic at DEV_HD_PATH/i, as anvil and the py-evm devnet fund them."""
    from eth_account import Account

    Account.enable_unaudited_hdwallet_features()
    out = []
    for i in range(count):
        acct = Account.from_mnemonic(mnemonic, account_path=f"{DEV_HD_PATH}/{i}")
        out.append(DevAccount(acct.address, "0x" + bytes(acct.key).hex()))
    return tuple(out)


@dataclass(frozen=True)
class DevnetConfig:
    chain: ChainKind = "py-evm"
    store: StoreKind = "local"
    state_dir: Path = DEFAULT_DIR
    port: int = 0  # 0: a free port
    accounts: int = 10
    chain_id: int | None = None  # default: 1337 on py-evm, 31337 on anvil
    deploy: bool = True
    block_time: float | None = 1.0  # an empty block when idle this long; None: only on demand
    persist: bool = True  # anvil: keep chain state in state_dir across restarts

    def __post_init__(self) -> None:
        if self.chain not in ("py-evm", "anvil"):
            raise DevnetError(f"chain {self.chain!r}: choose py-evm or anvil")
        if self.store not in ("local", "ipfs"):
            raise DevnetError(f"store {self.store!r}: choose local or ipfs")
        if not 0 <= self.port <= 65535:
            raise DevnetError(f"port {self.port} is not a TCP port (0 picks a free one)")
        if not 1 <= self.accounts <= 1000:
            raise DevnetError(f"accounts={self.accounts}: choose between 1 and 1000")
        if self.block_time is not None and self.block_time <= 0:
            raise DevnetError("block time must be positive seconds (or omitted)")

    @property
    def devnet_file(self) -> Path:
        return self.state_dir / DEVNET_FILE

    @property
    def resolved_chain_id(self) -> int:
        if self.chain_id is not None:
            return self.chain_id
        return DEFAULT_CHAIN_ID if self.chain == "py-evm" else ANVIL_CHAIN_ID


class Devnet:
    """A devnet run by this process: chain (thread or anvil child), store, contract, devnet file."""

    def __init__(self, config: DevnetConfig) -> None:
        self.config = config
        self._server: EvmServer | None = None
        self._anvil: Anvil | None = None
        self._ipfs: Any = None  # devnet.ipfsnode.IpfsNode when store == "ipfs"
        self._info: DevnetInfo | None = None
        self._lock: NodeLock | None = None

    @property
    def info(self) -> DevnetInfo:
        if self._info is None:
            raise DevnetError("the devnet is not running; call start() first")
        return self._info

    @property
    def rpc_url(self) -> str:
        return self.info.rpc_url

    def web3(self) -> Any:
        from web3 import Web3

        return Web3(Web3.HTTPProvider(self.rpc_url, request_kwargs={"timeout": 60}))

    def start(self) -> Self:
        if self._info is not None:
            return self
        c = self.config
        c.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = self._take_folder()
        c.devnet_file.unlink(missing_ok=True)  # a stale file must not point at a dead chain
        try:
            rpc_url = self._start_chain()
            store = self._start_store()
            contract = self._deploy(rpc_url) if c.deploy else None
            self._info = DevnetInfo(
                rpc_url=rpc_url,
                chain_id=c.resolved_chain_id,
                chain=c.chain,
                contract=contract,
                accounts=dev_accounts(c.accounts),
                store=store,
                pid=os.getpid(),
            )
            self._info.write(c.devnet_file)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_chain(self) -> str:
        c = self.config
        if c.chain == "py-evm":
            self._server = EvmServer(
                EvmConfig(chain_id=c.resolved_chain_id, accounts=c.accounts),
                port=c.port,
                block_time=c.block_time,
            ).start()
            return self._server.url
        state_file = c.state_dir / "anvil-state.json" if c.persist else None
        self._anvil = Anvil(
            AnvilConfig(
                chain_id=c.resolved_chain_id,
                accounts=c.accounts,
                state_file=state_file,
                block_time=c.block_time,
            ),
            port=c.port,
            log_path=c.state_dir / "anvil.log",
        ).start()
        return self._anvil.url

    def _start_store(self) -> StoreInfo:
        c = self.config
        if c.store == "local":
            path = (c.state_dir / "store").resolve()
            path.mkdir(parents=True, exist_ok=True)
            return StoreInfo("local", path=str(path))
        from devnet.ipfsnode import IpfsNode

        self._ipfs = IpfsNode(c.state_dir / "ipfs").start()
        return StoreInfo("ipfs", api=str(self._ipfs.api))

    def _memo_path(self) -> Path:
        return self.config.state_dir / "anvil-contract.json"

    def _deploy(self, rpc_url: str) -> str:
        """Deploy from dev account 0, or reuse the contract a persisted anvil state still holds."""
        from eth_account import Account
        from web3 import Web3

        from protocol.chain.binding import deploy

        w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": 60}))
        memo = self._memo_path()
        if self.config.chain == "anvil" and self.config.persist and memo.exists():
            try:
                address = str(json.loads(memo.read_text())["contract"])
                if len(w3.eth.get_code(Web3.to_checksum_address(address))) > 0:
                    return address
            except (ValueError, KeyError, TypeError):
                pass  # unreadable memo: deploy afresh below
        account = Account.from_key(dev_accounts(1)[0].key)
        address = str(deploy(w3, account))
        if self.config.chain == "anvil" and self.config.persist:
            memo.write_text(json.dumps({"contract": address}) + "\n")
        return address

    def _take_folder(self) -> NodeLock:
        """The folder's lock, held while this devnet lives (issue 46): a second devnet in the same
        folder would take its devnet file over, and delete it on stopping, under the running one."""
        c = self.config
        try:
            return acquire(c.state_dir / LOCK_FILE, note=str(c.state_dir.absolute()),
                           what=f"a devnet already runs in {c.state_dir} (its file {c.devnet_file} is in use)")
        except NodeRunningError as exc:
            raise DevnetError(f"{exc}, or give this one another --dir") from None

    def stop(self) -> None:
        """Stop whatever started (anvil dumps its state first), remove the devnet file, free the folder."""
        if self._info is not None and self._info.pid == os.getpid():
            self.config.devnet_file.unlink(missing_ok=True)
        self._info = None
        if self._ipfs is not None:
            self._ipfs.stop()
            self._ipfs = None
        if self._anvil is not None:
            self._anvil.close()
            self._anvil = None
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DevnetProcess:
    """`veriloco devnet` as a child process: start() returns once its devnet file and RPC are up."""

    def __init__(self, config: DevnetConfig, log_path: Path | None = None) -> None:
        self.config = config
        self.log_path = log_path or config.state_dir / "devnet.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._info: DevnetInfo | None = None

    def command(self) -> list[str]:
        c = self.config
        cmd = [
            sys.executable, "-m", "veriloco.cli", "devnet",
            "--chain", c.chain, "--store", c.store, "--dir", str(c.state_dir.resolve()),  # the child runs in the package's folder
            "--port", str(c.port), "--accounts", str(c.accounts),
        ]  # fmt: skip
        if c.chain_id is not None:
            cmd += ["--chain-id", str(c.chain_id)]
        if not c.deploy:
            cmd.append("--no-deploy")
        cmd += ["--block-time", str(c.block_time if c.block_time is not None else 0)]
        if not c.persist:
            cmd.append("--no-persist")
        return cmd

    @property
    def info(self) -> DevnetInfo:
        if self._info is None:
            raise DevnetError("the devnet process is not running; call start() first")
        return self._info

    @property
    def rpc_url(self) -> str:
        return self.info.rpc_url

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def web3(self) -> Any:
        from web3 import Web3

        return Web3(Web3.HTTPProvider(self.rpc_url, request_kwargs={"timeout": 60}))

    def start(self, timeout: float = 120.0) -> Self:
        if self.process is not None:
            return self
        c = self.config
        c.state_dir.mkdir(parents=True, exist_ok=True)  # the child removes a stale file once the folder is its own
        log = self.log_path.open("wb")
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=Path(__file__).resolve().parent.parent,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        try:
            self._info = self._wait_for_file(deadline)
            wait_for_rpc(self._info.rpc_url, deadline, alive=self.alive)
        except BaseException:
            self.stop()
            raise
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _wait_for_file(self, deadline: float) -> DevnetInfo:
        path = self.config.devnet_file
        while time.monotonic() < deadline:
            if not self.alive():
                raise DevnetError(f"`veriloco devnet` exited at start-up:\n{self._log_tail()}")
            if path.exists():
                info = DevnetInfo.read(path)  # written atomically, so complete when present
                if self.process is not None and info.pid == self.process.pid:
                    return info
            time.sleep(0.05)
        raise DevnetError(f"no devnet file at {path} before the deadline:\n{self._log_tail()}")

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGINT (what Ctrl-C sends), then SIGKILL if it does not exit; returns the exit code."""
        self._info = None
        if self.process is None:
            return None
        code = stop_process(self.process, signal.SIGINT, timeout)
        self.process = None
        return code

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_devnet(
    chain: ChainKind = "py-evm",
    store: StoreKind = "local",
    state_dir: Path | str = DEFAULT_DIR,
    *,
    in_process: bool = True,
    **options: Any,
) -> Devnet | DevnetProcess:
    """Start a devnet and return it running (use as a context manager to stop it).

    in_process=True runs the chain in this process (py-evm on a thread; anvil as our child);
    False runs `veriloco devnet` as a subprocess and waits for its devnet file. `options` are the
    other DevnetConfig fields (port, accounts, chain_id, deploy, block_time, persist).
    """
    config = DevnetConfig(chain=chain, store=store, state_dir=Path(state_dir), **options)
    return Devnet(config).start() if in_process else DevnetProcess(config).start()


def spawn_devnet(
    chain: ChainKind = "py-evm",
    store: StoreKind = "local",
    state_dir: Path | str = DEFAULT_DIR,
    **options: Any,
) -> DevnetProcess:
    """`veriloco devnet` as a subprocess, started and ready."""
    config = DevnetConfig(chain=chain, store=store, state_dir=Path(state_dir), **options)
    return DevnetProcess(config).start()
