"""`veriloco trainer | verifier | coordinator --run ID`: the three node programs.

Each builds its edges (a `Chain` for its key, a `Store`) from the connection settings and hands
them to the role's node loop. From before its first transaction until it exits it holds the lock
that refuses a second process with the same key on its state folder (protocol/nodelock.py).
Progress goes to stdout as readable lines, or with `--log-format json` as one JSON object per line
for a supervisor (the demo) to parse (veriloco/logs.py). A node's first line, `loading`, comes before
it imports torch and the chain client, which take seconds (tens on a loaded machine): this module
imports neither at its top, so the node says at once that it has started (issue 32).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veriloco.argtypes import device, gibibytes, positive, run_id, tcp_port
from veriloco.logs import Log, add_log_args, logger_from_args, node_logger, with_upload_progress
from veriloco.settings import Settings, add_connection_args, open_store, resolve

if TYPE_CHECKING:
    from protocol.chain.binding import Chain

# adversarial behaviours for demos and security tests (trainer/cheats.py, trainer/adversaries.py)
CHEAT_KINDS = ["lazy", "noise", "copy", "forge-final", "stale-copy", "skip-merge"]


def json_logger(node: str, stream: Any = None) -> Callable[..., None]:
    return node_logger(node, "json", stream=stream)


def starting(args: argparse.Namespace, role: str) -> tuple[Settings, Log]:
    """The node's settings and log, the log's first line written: settings fail fast, the heavy imports follow."""
    s = resolve(args)
    log = logger_from_args(args, role)
    log("loading", what="torch and the chain client")
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


def locked(s: Settings, chain: Chain, run: int, role: str) -> contextlib.AbstractContextManager[object]:
    """The node's lock on its run directory (protocol/nodelock.py); none without a key (the node refuses then)."""
    from protocol.nodelock import lock_node

    if chain.sender is None:
        return contextlib.nullcontext()
    return lock_node(chain, run, state_folder(s, chain, role))


def observed(args: argparse.Namespace, s: Settings, chain: Chain, role: str, log: Log) -> tuple[Any, Log]:
    """The node's store and log, with Prometheus metrics on `--metrics-port` (veriloco/metrics.py) unless 0."""
    store = with_upload_progress(open_store(s), log)  # a byte bar for large uploads, on a readable console only
    if not getattr(args, "metrics_port", 0):
        return store, log
    from protocol.chain.binding import Chain
    from protocol.store.backends import Metered
    from veriloco.metrics import NodeMetrics

    metrics, store = NodeMetrics(role, args.run, str(chain.sender or "")), Metered(store)
    metrics.watch_store(store)
    metrics.watch_slashes(Chain(s.rpc_url, str(s.contract)), args.run)  # its own client: scrapes run on another thread
    metrics.serve(args.metrics_port)
    log("metrics", url=f"http://127.0.0.1:{args.metrics_port}/metrics")
    return store, metrics.wrap(log)


def _trainer(args: argparse.Namespace) -> int:
    s, log = starting(args, "trainer")
    from trainer.cheats import behaviours
    from trainer.node import TrainerNode

    chain = open_chain(s, args.run)
    behaviour = behaviours()[args.cheat]() if args.cheat else None
    with locked(s, chain, args.run, "trainer"):
        store, log = observed(args, s, chain, "trainer", log)
        TrainerNode(
            chain, store, args.run, state_folder(s, chain, "trainer"), behaviour=behaviour, log=log,
            threads=args.threads, checkpoint_every=args.checkpoint_every,
            max_epochs=args.epochs, stages=args.stages, microbatches=args.microbatches,
            keep_boundaries=not args.no_boundary_log,
            boundary_log_ram=args.boundary_log_ram, device=args.device,
        ).run()
    return 0


def _verifier(args: argparse.Namespace) -> int:
    s, log = starting(args, "verifier")
    from verifier.node import VerifierNode

    chain = open_chain(s, args.run)
    with locked(s, chain, args.run, "verifier"):
        store, log = observed(args, s, chain, "verifier", log)
        VerifierNode(chain, store, args.run, state_folder(s, chain, "verifier"), log=log, threads=args.threads,
                     device=args.device).run()
    return 0


def _coordinator(args: argparse.Namespace) -> int:
    s, log = starting(args, "coordinator")
    from coordinator.node import CoordinatorNode

    chain = open_chain(s, args.run)
    with locked(s, chain, args.run, "coordinator"):  # it keeps no state of its own; the lock alone is there
        store, log = observed(args, s, chain, "coordinator", log)
        CoordinatorNode(chain, store, args.run, log=log).run()
    return 0


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
                       help="serve Prometheus metrics on 127.0.0.1:PORT/metrics (0: off, the default)")
        if name != "coordinator":
            p.add_argument("--threads", type=positive, default=1, help="torch threads; replay is exact only at equal settings")
            p.add_argument("--device", type=device, default="cpu",
                           help="cpu, cuda or cuda:N: where steps (trainer) or segment replays (verifier) run; an "
                                "exact-mode run admits only the device class it pins (audit.device)")
        if name == "trainer":
            p.add_argument("--checkpoint-every", type=positive, default=4, help="keep every N-th state to answer audits")
            p.add_argument("--epochs", type=positive, help="stop after this many epochs (default: the run's schedule)")
            p.add_argument("--stages", type=positive, default=1,
                           help="run inner steps as S pipeline stages, one process each (a whole-state run must be tolerant)")
            p.add_argument("--microbatches", type=positive, default=2, help="micro-batches per step with --stages")
            p.add_argument("--no-boundary-log", action="store_true",
                           help="sharded runs: do not keep each step's boundary tensors (2(B-1) activations "
                                "per step, deleted once the audit is answered); answers then replay whole steps")
            p.add_argument("--boundary-log-ram", type=gibibytes, metavar="GIB", default=None,
                           help="memory the boundary log may hold before it writes to disk (default: a quarter of "
                                "this machine's memory; 0: disk only)")
            p.add_argument("--cheat", choices=CHEAT_KINDS, help=argparse.SUPPRESS)
        p.set_defaults(func=func)
