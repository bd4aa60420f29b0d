"""Start and stop a real, offline IPFS node (npm ipfs@0.66.1, js-ipfs) on 127.0.0.1.

Used by the integration tests and `veriloco devnet --store ipfs`; users run their own Kubo daemon
and point `--ipfs-api` at it instead. The node gets a fresh repo, no swarm addresses, no bootstrap
peers and no MDNS, so it talks to nobody; API and gateway listen on free loopback ports. js-ipfs
0.66.1 needs `Promise.withResolvers`, which Node 20 lacks: `ipfs_polyfill.js` (shipped next to this
module) is loaded with `node --require`. The daemon is started directly (an npx wrapper would leave
it running) and stopped by its PID.

Run `python -m devnet.ipfsnode [REPO_DIR]` to start one in the foreground and print its API.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from devnet.procs import stop_process
from protocol.errors import VerilocoError

POLYFILL = Path(__file__).with_name("ipfs_polyfill.js")
_CLI = Path("ipfs") / "src" / "cli.js"


class IpfsNodeError(VerilocoError):
    """The local IPFS node could not be started."""


def find_node_modules() -> Path:
    """node_modules holding ipfs: $VERILOCO_NODE_MODULES, else the project checkout's, else cwd's."""
    candidates = []
    if env := os.environ.get("VERILOCO_NODE_MODULES"):
        candidates.append(Path(env))
    candidates.append(Path(__file__).resolve().parents[1] / "node_modules")
    candidates += [p / "node_modules" for p in (Path.cwd(), *Path.cwd().parents)]
    for c in candidates:
        if (c / _CLI).is_file():
            return c
    raise IpfsNodeError(
        "npm package ipfs@0.66.1 not found (looked for node_modules/ipfs/src/cli.js); run "
        "`npm ci` in the project root, or set VERILOCO_NODE_MODULES"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class IpfsNode:
    """One js-ipfs daemon process. Use as a context manager or call start()/stop()."""

    def __init__(self, repo: Path | str | None = None, *, node_modules: Path | None = None,
                 api_port: int | None = None) -> None:
        """`api_port` pins the API port (a restarted node keeps its address); None picks free ports."""
        self._own_repo = repo is None
        self.repo = Path(repo) if repo is not None else Path(tempfile.mkdtemp(prefix="veriloco-ipfs-"))
        self.node_modules = node_modules or find_node_modules()
        self._fixed_api_port = api_port
        self.api_port = 0
        self.gateway_port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def api(self) -> str:
        """The Kubo RPC API as a multiaddr, for IpfsStore / --ipfs-api."""
        return f"/ip4/127.0.0.1/tcp/{self.api_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _cmd(self, *args: str) -> list[str]:
        node = shutil.which("node")
        if node is None:
            raise IpfsNodeError("`node` (Node.js 20+) is not on PATH; install Node.js to run an IPFS node")
        return [node, "--require", str(POLYFILL), str(self.node_modules / _CLI), *args]

    def _env(self) -> dict[str, str]:
        return {**os.environ, "IPFS_PATH": str(self.repo / "repo"), "DEBUG": ""}

    def _init_repo(self) -> None:
        cfg_path = self.repo / "repo" / "config"
        if not cfg_path.exists():
            self.repo.mkdir(parents=True, exist_ok=True)
            r = subprocess.run(
                self._cmd("init", "--empty-repo"), env=self._env(), capture_output=True, timeout=120,
                check=False,
            )
            if r.returncode != 0:
                raise IpfsNodeError(f"`jsipfs init` failed in {self.repo}: {r.stderr.decode()[-2000:]}")
        cfg = json.loads(cfg_path.read_text())
        self.api_port, self.gateway_port, rpc_port = self._fixed_api_port or free_port(), free_port(), free_port()
        cfg["Addresses"].update(
            Swarm=[],
            Announce=[],
            Delegates=[],
            API=self.api,
            Gateway=f"/ip4/127.0.0.1/tcp/{self.gateway_port}",
            RPC=f"/ip4/127.0.0.1/tcp/{rpc_port}",
        )
        cfg["Bootstrap"] = []
        cfg.setdefault("Discovery", {})["MDNS"] = {"Enabled": False, "Interval": 10}
        cfg["Discovery"]["webRTCStar"] = {"Enabled": False}
        cfg_path.write_text(json.dumps(cfg, indent=2))
        # a daemon killed hard leaves its lock and api file; the repo is ours, so clear them
        for stale in ("repo.lock", "api"):
            p = self.repo / "repo" / stale
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            elif p.exists():
                p.unlink()

    def _answers(self) -> bool:
        req = urllib.request.Request(f"http://127.0.0.1:{self.api_port}/api/v0/id", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start(self, timeout: float = 60.0, attempts: int = 3) -> Self:
        """Start the daemon and wait (up to `timeout` s) until its API answers.

        Ports are picked free just before the start; if another process takes one in between, the
        daemon reports EADDRINUSE and is stopped and started again on new ports (up to `attempts`).
        """
        if self.proc is not None and self.proc.poll() is None:
            return self
        deadline = time.monotonic() + timeout
        for attempt in range(attempts):
            self._init_repo()
            log_start = self._log_size()
            self._log = open(self.repo / "daemon.log", "ab")  # noqa: SIM115 - open while the daemon runs
            self.proc = subprocess.Popen(
                self._cmd("daemon", "--offline", "--enable-preload=false"),
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            while time.monotonic() < deadline:
                if self._answers():
                    return self
                exited = self.proc.poll() is not None
                tail = self.log_tail(since=log_start)
                if "EADDRINUSE" in tail and attempt + 1 < attempts:
                    self.stop()  # js-ipfs logs the clash but keeps running: stop it, new ports
                    break
                if exited:
                    self._log.close()
                    raise IpfsNodeError(f"IPFS daemon exited with {self.proc.returncode}: {tail}")
                time.sleep(0.1)  # polling interval of a condition wait, not synchronisation by sleep
            else:
                self.stop()
                raise IpfsNodeError(
                    f"IPFS daemon did not answer on {self.api} within {timeout} s: {self.log_tail()}"
                )
        raise IpfsNodeError(f"IPFS daemon could not bind free ports in {attempts} attempts")

    def _log_size(self) -> int:
        try:
            return (self.repo / "daemon.log").stat().st_size
        except OSError:
            return 0

    def log_tail(self, n: int = 2000, since: int = 0) -> str:
        try:
            return (self.repo / "daemon.log").read_bytes()[since:][-n:].decode(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """Kill the daemon at once (SIGKILL), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the daemon by PID: SIGTERM, then SIGKILL after `timeout` s."""
        if self.proc is not None:
            stop_process(self.proc, signal.SIGTERM, timeout)
        if getattr(self, "_log", None) is not None:
            self._log.close()

    def cleanup(self) -> None:
        """Stop the daemon and delete the repo if this object created it."""
        self.stop()
        if self._own_repo:
            shutil.rmtree(self.repo, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    node = IpfsNode(args[0] if args else None)
    try:
        node.start()
        print(f"IPFS node running: pid {node.pid}, API {node.api}, repo {node.repo}", flush=True)
        assert node.proc is not None
        node.proc.wait()
    except KeyboardInterrupt:
        pass
    except IpfsNodeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        node.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
