"""Start and stop anvil (npm @foundry-rs/anvil) on loopback: the real-EVM devnet.

The npm package ships the native binary in a per-platform package; we run that binary directly
(not the node wrapper in node_modules/.bin), so the PID we hold is anvil's own and stopping it
stops the chain. anvil picks a free port when asked for port 0 and prints where it listens; we read
that from its log, then wait until eth_chainId answers. With a state file anvil loads it at start
(when it exists) and dumps the chain into it on exit, so a devnet survives a restart.

    with Anvil(AnvilConfig(state_file=Path("dev/anvil-state.json"))) as node:
        w3 = Web3(Web3.HTTPProvider(node.url))
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Self

from devnet.evmserver import DEV_MNEMONIC
from devnet.procs import stop_process
from protocol.errors import VerilocoError

ANVIL_CHAIN_ID = 31337  # anvil's own default, kept so tools that assume it keep working
REPO_ROOT = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"Listening on (\S+):(\d+)")


class AnvilError(VerilocoError):
    """anvil is missing, would not start, or would not stop."""


@dataclass(frozen=True)
class AnvilConfig:
    """How to run anvil. Accounts come from the public test mnemonic, as on the py-evm devnet."""

    chain_id: int = ANVIL_CHAIN_ID
    accounts: int = 10
    mnemonic: str = DEV_MNEMONIC
    balance_eth: int = 10_000
    state_file: Path | None = None  # load at start if present, dump on exit
    state_interval_s: int | None = None  # also dump every N seconds (survives a crash)
    gas_limit: int = 30_000_000
    block_time: float | None = None  # also mine an empty block every N s (automine stays on)

    def __post_init__(self) -> None:
        if not 1 <= self.accounts <= 1000:
            raise AnvilError(f"accounts={self.accounts}: choose between 1 and 1000")
        if self.state_interval_s is not None and self.state_file is None:
            raise AnvilError("state_interval_s needs a state_file to dump into")


def anvil_binary(root: Path = REPO_ROOT) -> Path:
    """The native anvil from node_modules (or $VERILOCO_ANVIL), with a fix-it message if absent."""
    override = os.environ.get("VERILOCO_ANVIL")
    if override:
        path = Path(override)
        if not path.is_file():
            raise AnvilError(f"VERILOCO_ANVIL={override} is not a file")
        return path
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    system = platform.system().lower()
    candidate = root / "node_modules" / "@foundry-rs" / f"anvil-{system}-{arch}" / "bin" / "anvil"
    if candidate.is_file():
        return candidate
    raise AnvilError(
        f"anvil not found at {candidate}; run `npm ci` in {root} (package.json pins "
        "@foundry-rs/anvil) or set VERILOCO_ANVIL to an anvil binary"
    )


def rpc_call(
    url: str, method: str, params: list[object] | None = None, timeout: float = 5
) -> object:
    """One JSON-RPC call with the standard library (no web3 import needed to probe a node)."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []})
    request = urllib.request.Request(
        url, data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        reply = json.loads(response.read())
    if "error" in reply:
        raise AnvilError(f"{method} failed: {reply['error']}")
    return reply["result"]


def wait_for_rpc(url: str, deadline: float, alive: Callable[[], bool] | None = None) -> int:
    """Poll eth_chainId until it answers (returns the chain id) or the deadline passes."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise AnvilError(f"the node at {url} exited before answering")
        try:
            return int(str(rpc_call(url, "eth_chainId", timeout=2)), 16)
        except (OSError, urllib.error.URLError, ValueError, AnvilError) as exc:
            last = exc
            time.sleep(0.05)
    raise AnvilError(f"no JSON-RPC answer from {url} before the deadline (last error: {last})")


class Anvil:
    """One anvil process on 127.0.0.1; `start()` returns once it answers JSON-RPC."""

    def __init__(
        self,
        config: AnvilConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        binary: Path | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.config = config or AnvilConfig()
        self.host = host
        self.requested_port = port
        self.binary = binary or anvil_binary()
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        if log_path is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="veriloco-anvil-")
            log_path = Path(self._tmpdir.name) / "anvil.log"
        self.log_path = log_path
        self._log: IO[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise AnvilError("anvil is not running; call start() first")
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def command(self) -> list[str]:
        c = self.config
        cmd = [
            str(self.binary),
            "--host", self.host,
            "--port", str(self.requested_port),
            "--chain-id", str(c.chain_id),
            "--accounts", str(c.accounts),
            "--mnemonic", c.mnemonic,
            "--balance", str(c.balance_eth),
            "--gas-limit", str(c.gas_limit),
        ]  # fmt: skip
        if c.block_time is not None:
            cmd += ["--block-time", f"{c.block_time:g}", "--mixed-mining"]
        if c.state_file is not None:
            cmd += ["--state", str(c.state_file)]
            if c.state_interval_s is not None:
                cmd += ["--state-interval", str(c.state_interval_s)]
        return cmd

    def start(self, timeout: float = 30.0) -> Self:
        if self.process is not None:
            return self
        if self.config.state_file is not None:
            self.config.state_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        # own session: a Ctrl-C meant for the devnet does not reach anvil before we stop it
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        try:
            self.port = self._wait_for_port(deadline)
            chain_id = wait_for_rpc(self.url, deadline, alive=lambda: self.process_alive)
        except BaseException:
            self.stop()
            raise
        if chain_id != self.config.chain_id:
            self.stop()
            raise AnvilError(f"anvil reports chain id {chain_id}, expected {self.config.chain_id}")
        return self

    @property
    def process_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _wait_for_port(self, deadline: float) -> int:
        while time.monotonic() < deadline:
            match = _LISTENING.search(self.log_text())
            if match:
                return int(match.group(2))
            if not self.process_alive:
                raise AnvilError(f"anvil exited at start-up:\n{self.log_tail()}")
            time.sleep(0.02)
        raise AnvilError(f"anvil did not report a listening port in time:\n{self.log_tail()}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (anvil dumps its state file then), SIGKILL if it hangs; returns the exit code."""
        code = None
        if self.process is not None:
            code = stop_process(self.process, signal.SIGTERM, timeout)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        self.port = None
        return code

    def close(self) -> None:
        self.stop()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
