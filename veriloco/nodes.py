"""`veriloco trainer | verifier | coordinator --run ID`: the three node programs.

Each builds its edges (a `Chain` for its key, a `Store`) from the connection settings and hands
them to the role's node loop. From before its first transaction until it exits it holds the lock
that refuses a second process with the same key on its state folder (protocol/nodelock.py).
Progress goes to stdout as readable lines, or with `--log-format json` as one JSON object per line
for a supervisor (the demo) to parse (veriloco/logs.py). A node's first line, `loading`, comes before
it imports torch and the chain client, which take seconds (tens on a loaded machine): this module
imports neither at its top, so the node says at once that it has started (issue 32).

A requested stop (SIGTERM, as systemd and docker send, or SIGINT, Ctrl-C) ends the node through its
normal cleanup with one `stopped` line naming the signal, the state folder it kept, the command that
resumes it and anything its key still owes, and exit status 0; a second signal ends the process at once
(the default action). A trainer first reveals and answers every epoch it committed to, a verifier commits
and reveals the verdicts it owes (`draining`), as a missed one is slashed and a restart may not be ready
inside the window; the epoch a trainer was training is dropped uncommitted.

A node that was slashed in its run (and so removed from it) ends with one `slashed` line, an ERROR:
the reason by name (protocol/chain/binding.py SLASH_REASONS; a verifier's read from the votes around
it, a coordinator's from the model the attestation committee replaced, veriloco/earnings.py), the
epochs, the amount and the stake left, and the commands that show the account's earnings and take
the rest of the stake back; exit status SLASHED_EXIT (3), so a supervisor sees an ending that is no
success.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veriloco.argtypes import (
    device,
    gibibytes,
    host,
    is_loopback,
    positive,
    relay_url,
    run_id,
    seconds,
    tcp_port,
)
from veriloco.logs import Log, add_log_args, logger_from_args, node_logger, with_upload_progress
from veriloco.settings import (
    Settings,
    add_connection_args,
    check_workdir,
    open_store,
    resolve,
    withdraw_command,
)

if TYPE_CHECKING:
    from protocol.chain.binding import Chain

SLASHED_EXIT = 3  # a node that ends slashed (1: a crash, 2: a foreseeable error, 130: interrupted)
# adversarial behaviours for demos and security tests (trainer/cheats.py, trainer/adversaries.py)
CHEAT_KINDS = ["lazy", "noise", "copy", "abandon", "forge-final", "stale-copy", "skip-merge"]


class Stopped(KeyboardInterrupt):
    """A stop the operator asked for with a signal: raised in the node's main thread, so every
    `finally` and `with` on the way out runs (the engines close, the node lock is released)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal = signal.Signals(signum).name


def _stop(signum: int, frame: Any) -> None:
    if _in_finalizer(frame):
        # Python prints and drops an exception raised inside __del__ or a weakref callback, so the stop
        # would be lost and the node run on: the same signal again once the finalizer has returned
        threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
        return
    for s in (signal.SIGINT, signal.SIGTERM):  # a second signal: the default action, at once
        signal.signal(s, signal.SIG_DFL)
    raise Stopped(signum)


def _in_finalizer(frame: Any) -> bool:
    """Whether the interrupted code runs inside an object's finalizer, where a raised exception is lost."""
    while frame is not None:
        if frame.f_code.co_name == "__del__" or frame.f_code.co_filename.endswith("weakref.py"):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise Stopped while the node runs; the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, _stop)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def resume_command(args: argparse.Namespace) -> str:
    """The command line that started this node (veriloco/cli.py keeps it): what resumes it."""
    return shlex.join(["veriloco", *getattr(args, "argv", sys.argv[1:])])


def slashed_ending(args: argparse.Namespace, s: Settings, log: Log) -> int:
    """After a node's loop has ended: SLASHED_EXIT and one `slashed` line if the chain records a slash of
    this node's account in its run, else 0."""
    from veriloco.earnings import slashes

    chain = open_chain(s)
    me = str(chain.sender)
    found = slashes(chain, me, args.run)
    if not found:
        return 0
    stake = chain.member(args.run, me).stake
    log("slashed", reason="; ".join(dict.fromkeys(e.why for e in found)), epochs=sorted({e.epoch for e in found}),
        slashed_wei=-sum(e.amount_wei for e in found), stake_left_wei=int(stake), tx=found[-1].tx,
        detail=f"removed from run {args.run}; every slash and reward: `veriloco earnings --run {args.run} --address {me}`; "
               f"the stake left, once unbonded: `{withdraw_command(args)}`")
    return SLASHED_EXIT


def run_node(args: argparse.Namespace, role: str, body: Callable[[Settings, Log, list[Path]], None]) -> int:
    """Start the node (settings, first line), run `body` until it returns or a stop is requested.

    `body` appends the run folder it keeps its state in to its last argument once it holds the lock,
    which the `stopped` line then names. A node whose loop ended slashed says so last (`slashed_ending`).
    """
    s, log = starting(args, role)
    kept: list[Path] = []
    try:
        with stop_signals():
            body(s, log, kept)
    except Stopped as stop:
        where = str(kept[0]) if kept else "nothing (stopped before it locked a state folder)"
        if role == "coordinator" and kept:
            where += " (a coordinator's record is on the chain; the folder holds its lock)"
        due = open_duties(args, s, role)
        if due:  # before the stopped line, which stays the last
            log("warning", what="stopped with duties due",
                detail=f"restart it before the first deadline or be slashed for what is missed: {'; '.join(due)}")
        log("stopped", signal=stop.signal, kept=where, resume=resume_command(args), **({"due": due} if due else {}))
        return 0
    return slashed_ending(args, s, log)


def open_duties(args: argparse.Namespace, s: Settings, role: str) -> list[str]:
    """What this node's key still owes its run, with deadlines (protocol/duties.py); empty when the
    chain cannot be read now (the stop must not wait on it)."""
    if not s.key or getattr(args, "run", None) is None:
        return []
    from protocol.duties import pending
    from protocol.errors import VerilocoError

    try:
        chain = open_chain(s)
        return pending(chain, args.run, str(chain.sender), role)
    except (VerilocoError, OSError):  # ChainUnavailable among them
        return []


def json_logger(node: str, stream: Any = None) -> Callable[..., None]:
    return node_logger(node, "json", stream=stream)


def starting(args: argparse.Namespace, role: str) -> tuple[Settings, Log]:
    """The node's settings and log, the log's first line written: settings fail fast, the heavy imports follow."""
    s = resolve(args)
    check_workdir(s.workdir)
    log = logger_from_args(args, role)  # JSON lines carry the run id from the first one on
    log("loading", what="torch and the chain client")
    if s.key:  # and the node's account from the next one on
        from eth_account import Account

        log.bind(address=Account.from_key(s.key).address)
    return s, log


def open_chain(s: Settings, run: int | None = None) -> Chain:
    """The node's Chain; with `run`, checked to be one of the contract's runs before anything else happens."""
    from eth_account import Account

    from protocol.chain.binding import Chain
    from protocol.statedir import check_run

    assert s.contract is not None
    chain = Chain(s.rpc_url, s.contract, Account.from_key(s.key) if s.key else None, max_fee=s.max_fee_wei)
    if run is not None:
        check_run(chain, run)
    return chain


def state_folder(s: Settings, chain: Chain, role: str) -> Path:
    """The node's own folder under the workdir: one per role and key."""
    return s.workdir / f"{role}-{chain.sender}"


@contextlib.contextmanager
def locked(s: Settings, chain: Chain, run: int, role: str, kept: list[Path] | None = None) -> Iterator[None]:
    """The node's lock on its run directory (protocol/nodelock.py), that folder appended to `kept`;
    none without a key (the node refuses then)."""
    from protocol.nodelock import lock_key, lock_node

    if chain.sender is None:
        yield
        return
    folder = state_folder(s, chain, role)
    with lock_node(chain, run, folder) as lock, lock_key(chain, run, role, folder):
        if kept is not None:
            kept.append(lock.path.parent)
        yield


def observed(args: argparse.Namespace, s: Settings, chain: Chain, role: str, log: Log) -> tuple[Any, Log]:
    """The node's store and log, with Prometheus metrics on `--metrics-host`:`--metrics-port` (veriloco/metrics.py)
    unless the port is 0; a warning when that address is reachable from other machines (no authentication)."""
    store = with_upload_progress(open_store(s), log)  # a byte bar for large uploads, on a readable console only
    if not getattr(args, "metrics_port", 0):
        return store, log
    from protocol.chain.binding import Chain
    from protocol.store.backends import Metered
    from veriloco.metrics import NodeMetrics

    metrics, store = NodeMetrics(role, args.run, str(chain.sender or "")), Metered(store)
    metrics.watch_store(store)
    metrics.watch_slashes(Chain(s.rpc_url, str(s.contract)), args.run)  # its own client: scrapes run on another thread
    host = getattr(args, "metrics_host", "127.0.0.1")
    metrics.serve(args.metrics_port, host)
    shown = f"[{host}]" if ":" in host else host
    log("metrics", url=f"http://{shown}:{args.metrics_port}/metrics")
    if not is_loopback(host):
        log("warning", what="metrics", detail=f"the metrics endpoint listens on {host}:{args.metrics_port}, reachable "
            "from other machines, with no authentication (it shows this node's address, run and activity): "
            "firewall the port, or leave --metrics-host at 127.0.0.1 and scrape through a tunnel")
    return store, metrics.wrap(log)


def refuse_unwanted_test_run(chain: Chain, args: argparse.Namespace) -> None:
    """A trainer or verifier stakes into a test run only with --allow-test-run (protocol.membership.check_test_run)."""
    from protocol.membership import check_test_run

    check_test_run(chain.run_info(args.run), chain.member(args.run, str(chain.sender)).role, args.allow_test_run)


def _trainer(args: argparse.Namespace) -> int:
    return run_node(args, "trainer", lambda s, log, kept: _train(args, s, log, kept))


def _train(args: argparse.Namespace, s: Settings, log: Log, kept: list[Path]) -> None:
    from trainer.cheats import behaviours
    from trainer.node import TrainerNode

    chain = open_chain(s, args.run)
    behaviour = behaviours()[args.cheat]() if args.cheat else None
    with locked(s, chain, args.run, "trainer", kept):
        refuse_unwanted_test_run(chain, args)
        store, log = observed(args, s, chain, "trainer", log)
        TrainerNode(
            chain, store, args.run, state_folder(s, chain, "trainer"), behaviour=behaviour, log=log,
            threads=args.threads, checkpoint_every=args.checkpoint_every, checkpoint_every_logged=args.checkpoint_every_logged,
            max_epochs=args.epochs, stages=args.stages, microbatches=args.microbatches,
            keep_boundaries=not args.no_boundary_log,
            boundary_log_ram=args.boundary_log_ram, boundary_log_disk=args.boundary_log_disk, device=args.device,
            relay=args.relay, **({} if args.window_wait is None else {"window_wait_s": args.window_wait}),
        ).run()


def _verifier(args: argparse.Namespace) -> int:
    return run_node(args, "verifier", lambda s, log, kept: _verify(args, s, log, kept))


def _verify(args: argparse.Namespace, s: Settings, log: Log, kept: list[Path]) -> None:
    from verifier.node import VerifierNode

    chain = open_chain(s, args.run)
    with locked(s, chain, args.run, "verifier", kept):
        refuse_unwanted_test_run(chain, args)
        store, log = observed(args, s, chain, "verifier", log)
        VerifierNode(chain, store, args.run, state_folder(s, chain, "verifier"), log=log, threads=args.threads,
                     device=args.device).run()


def _coordinator(args: argparse.Namespace) -> int:
    return run_node(args, "coordinator", lambda s, log, kept: _coordinate(args, s, log, kept))


def _coordinate(args: argparse.Namespace, s: Settings, log: Log, kept: list[Path]) -> None:
    from coordinator.node import CoordinatorNode

    chain = open_chain(s, args.run)
    with locked(s, chain, args.run, "coordinator", kept):  # it keeps no state of its own; the lock alone is there
        store, log = observed(args, s, chain, "coordinator", log)
        CoordinatorNode(chain, store, args.run, log=log, relay_port=args.relay_port,
                        **({} if args.window_wait is None else {"relay_wait_s": args.window_wait})).run()


def register(sub: Any) -> None:
    for name, func, help_ in (
        ("trainer", _trainer, "run a trainer node: train, publish, commit, reveal, answer audits"),
        ("verifier", _verifier, "run a verifier node: replay sampled steps of assigned trainers, post verdicts"),
        ("coordinator", _coordinator, "run the coordinator node: aggregate verified pseudo-gradients, finalize epochs"),
    ):
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--run", type=run_id, required=True, help="run id (see `veriloco run create`)")
        add_connection_args(p, workdir=True)
        add_log_args(p)
        p.add_argument("--metrics-port", type=tcp_port, default=0,
                       help="serve Prometheus metrics on HOST:PORT/metrics (0: off, the default)")
        p.add_argument("--metrics-host", type=host, default="127.0.0.1",
                       help="the address the metrics endpoint listens on (default 127.0.0.1, this machine only; "
                            "0.0.0.0: every interface, unauthenticated: a warning says so)")
        if name != "coordinator":
            p.add_argument("--allow-test-run", action="store_true", default=os.environ.get("VERILOCO_ALLOW_TEST_RUN") == "1",
                           help="stake into a run its creator made a test run (quorum 1 or 2: a verdict or two decide); "
                                "refused otherwise, naming its risk (VERILOCO_ALLOW_TEST_RUN=1 does the same)")
            p.add_argument("--threads", type=positive, default=1, help="torch threads; replay is exact only at equal settings")
            p.add_argument("--device", type=device, default="cpu",
                           help="cpu, cuda or cuda:N: where steps (trainer) or segment replays (verifier) run; an "
                                "exact-mode run admits only the device class it pins (audit.device)")
        if name == "trainer":
            p.add_argument("--checkpoint-every", type=positive, default=4,
                           help="keep every N-th state to answer audits (and resume from) where the answer log misses a step")
            p.add_argument("--checkpoint-every-logged", type=positive, default=16,
                           help="keep every N-th state while the answer log holds the steps (an answer then replays one "
                                "block or AdamW alone from it: distance is cheap, state writes and disk are not)")
            p.add_argument("--epochs", type=positive, help="stop after this many epochs (default: the run's schedule)")
            p.add_argument("--stages", type=positive, default=1,
                           help="run inner steps as S pipeline stages, one process each (a whole-state run must be tolerant)")
            p.add_argument("--microbatches", type=positive, default=2, help="micro-batches per step with --stages")
            p.add_argument("--no-boundary-log", action="store_true",
                           help="sharded runs: do not keep each step's boundary tensors (2(B-1) activations "
                                "per step, deleted once the audit is answered; or, where those outgrow the model "
                                "and an epoch of them would not fit the budgets below, its total gradients; with "
                                "--stages, each stage keeps its blocks' total gradients within its share); "
                                "answers then replay whole steps")
            p.add_argument("--boundary-log-ram", type=gibibytes, metavar="GIB", default=None,
                           help="memory the boundary log may hold before it writes to disk (default: a quarter of "
                                "this machine's memory; 0: disk only); whatever the budget, it stops short of leaving "
                                "the machine less than a quarter of its memory available, so nodes sharing it cannot exhaust it")
            p.add_argument("--boundary-log-disk", type=gibibytes, metavar="GIB", default=None,
                           help="disk the boundary log may use past its memory (default: a quarter of the free space "
                                "in the state folder at start; never past a tenth of the disk left free); steps past "
                                "both are not logged and their audit answers replay whole steps")
            p.add_argument("--cheat", choices=CHEAT_KINDS, help=argparse.SUPPRESS)
            p.add_argument("--relay", type=relay_url, default=None, metavar="URL",
                           help="a windowed run's relay (the coordinator prints it as `relay` when it starts): window "
                                "roots go there signed, one aggregate per window; without it each root is posted "
                                "directly (about 30k gas a window)")
        if name == "coordinator":
            p.add_argument("--relay-port", type=tcp_port, default=None, metavar="PORT",
                           help="serve a windowed run's relay on 127.0.0.1:PORT (0: any free port) and post one "
                                "aggregate per window; trainers then pass its URL as --relay")
        if name in ("trainer", "coordinator"):
            p.add_argument("--window-wait", type=seconds, default=None, metavar="S",
                           help="windowed runs: how long a window waits for the rest of its roots (coordinator, "
                                "default 5) or a sent root for an aggregate that holds it before the trainer posts it "
                                "itself (default 30)")
        p.set_defaults(func=func)
