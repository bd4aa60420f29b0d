"""The demo's node processes, forked from one server that imported the node code once.

Each node of `veriloco demo` is its own process running the command a user would type
(`python -m veriloco.cli trainer ...`). Started with exec, every node imports torch, web3 and the
node code again: seconds of CPU apiece, nine at once on a two-core machine, and again at every
restart. Forked from a server (multiprocessing's forkserver) that imported them once, a node starts
at once and shares those pages. It is still the same process a user would start: its own pid and
session, its log file as stdout and stderr, the command's environment and working directory, the
command's module run as ``__main__`` with the command's arguments, its exit status as its own.
Where a platform has no forkserver, nodes are started with exec as before.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Protocol

# what every node imports: preloaded in the server, so that a fork finds them imported
PRELOAD = ["torch", "veriloco.cli", "trainer.node", "verifier.node", "coordinator.node"]
# one OpenMP thread per node, as each is started: a node's numbers must not depend on the machine's
# core count, and the server must run no parallel region before it forks (GNU OpenMP is not fork-safe)
NODE_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
FORKS = "forkserver" in multiprocessing.get_all_start_methods()  # POSIX; elsewhere every node is exec'd


class NodeProcess(Protocol):
    """What the demo and its fault injection do with a node's process (a subset of subprocess.Popen)."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...

    def send_signal(self, sig: int) -> None: ...


class Forked:
    """A node forked from the server: subprocess.Popen's face over a multiprocessing process."""

    def __init__(self, cmd: list[str], process: BaseProcess) -> None:
        self.args, self._process = cmd, process
        assert process.pid is not None, "started"
        self.pid: int = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


def warm() -> None:
    """Start the server now: it imports while the caller sets up, so the first node need not wait."""
    if FORKS:
        _start_server(multiprocessing.get_context("forkserver"))


def start_node(cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> NodeProcess:
    """Start ``cmd`` (``[python, "-m", module, *args]``) in a new session with its output appended
    to ``log_path``, with ``env`` over this process's environment: forked from the preloaded server
    where there is one, else with exec."""
    env = {**os.environ, **NODE_ENV, **(env or {})}
    if not FORKS or cmd[1:2] != ["-m"]:
        with open(log_path, "ab") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    open(log_path, "ab").close()  # there once this returns, as an exec'd node's is
    ctx = multiprocessing.get_context("forkserver")
    _start_server(ctx)
    process = ctx.Process(target=_run, args=(cmd[2], cmd[3:], env, str(log_path), os.getcwd()),
                          name=f"node:{cmd[2]}", daemon=False)  # a node may start processes of its own (stages)
    process.start()
    return Forked(cmd, process)


def _start_server(ctx: multiprocessing.context.ForkServerContext) -> None:
    """Start the server (once a process; again if it died), preloaded, with the nodes' environment."""
    from multiprocessing import forkserver

    ctx.set_forkserver_preload(PRELOAD)
    with _environ(NODE_ENV):
        forkserver.ensure_running()


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run(module: str, args: list[str], env: dict[str, str], log_path: str, cwd: str) -> None:
    """In the forked child: become the command (session, output, environment, directory, argv), run
    its module as ``__main__``; its SystemExit is the process's exit status."""
    os.setsid()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if "OMP_NUM_THREADS" in env and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
    atexit._clear()  # the server's exit hooks are not this node's; the node's own run below
    sys.argv = [module, *args]
    sys.modules.pop(module, None)  # preloaded as a module; run afresh as __main__, as `python -m` would
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
