"""`veriloco demo`: a whole verifiable training network on one machine.

It starts a devnet (py-evm over JSON-RPC in this process, or anvil; a LocalStore or a js-ipfs
node), builds the corpus, publishes and creates a run, then launches N trainers, M verifiers and the
coordinator as separate processes with the same `veriloco trainer|verifier|coordinator` commands a
user would type (forked from one server that imported the node code once: veriloco/nodeprocs.py).
It shows live progress from the chain and the nodes' JSON logs, and ends with a summary (and, with
--report DIR, summary.json plus a loss-curve PNG).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from eth_account import Account

from dilocox.numerics import fingerprint
from protocol.chain.binding import Chain, Phase
from protocol.chain.errors import ChainUnavailable
from protocol.config import RunConfig
from protocol.errors import VerilocoError
from protocol.model import PRESETS, n_params, preset
from protocol.run import (
    eval_model,
    initial_model,
    latest_model,
    load_model,
    open_run,
    params_of,
    publish_run,
)
from protocol.store.backends import LocalStore
from protocol.tokens import load_corpus_dir
from veriloco.argtypes import non_negative, positive, seconds, tcp_port
from veriloco.logs import fields_text
from veriloco.nodeprocs import NodeProcess, start_node
from veriloco.nodeprocs import warm as warm_node_server
from veriloco.nodes import CHEAT_KINDS, SLASHED_EXIT
from veriloco.traffic import compare, headline, trainer_traffic

PHASES = {p: p.name.lower() for p in Phase}


class DemoError(VerilocoError):
    """The demo network could not be started or did not finish."""


@dataclass(frozen=True)
class DemoOptions:
    trainers: int = 4
    verifiers: int = 4  # the quorum and a spare: one verifier removed (silent, outvoted) or gone stops nothing
    epochs: int = 6
    preset: str = "tiny"
    steps: int = 24  # H in the first epoch (the adaptive rule moves it within [steps/2, 2*steps])
    chain: str = "py-evm"
    store: str = "local"
    cheats: tuple[tuple[str, int], ...] = ()
    workdir: Path = Path(".veriloco/demo")
    report: Path | None = None
    timeout_s: float = 900.0
    windows_s: int = 60  # every chain window; the contract advances early when everyone has acted
    stages: int = 1  # pipeline stages per trainer, each owning its blocks' state (trainer/stages.py)
    quorum: int = 3  # verifiers judging each trainer (and attesting each model); a majority decides
    node_dir: Path | None = None  # the nodes' --workdir; default workdir/nodes, emptied by each demo
    corpus: Path | None = None  # a corpus directory (veriloco data prepare|import); None: the stdlib bytes
    dashboard_port: int = 0  # > 0: serve `veriloco dashboard`'s page of the run on it while the nodes run
    metrics_port: int = 0  # > 0: the nodes serve Prometheus metrics on it and the ports after (verifiers, trainers, coordinator)
    audit: str = "shard"  # "shard": one block of a segment per challenge; "state": whole states (docs/protocol.md §5)
    checkpoint_every: int = 4  # trainers keep every N-th state where the answer log misses a step (a `small` state is 174 MB)
    checkpoint_every_logged: int = 16  # ... and every N-th while it holds them (trainer/checkpoints.py CheckpointRule)
    # the trainers' answer-log budgets in GiB (--boundary-log-ram, --boundary-log-disk); None: the node's
    # defaults. Budgets an epoch of boundaries does not fit make a trainer keep the gradient log instead
    log_ram_gib: float | None = None
    log_disk_gib: float | None = None
    # the merge rule (docs/protocol.md §8): fold each new global model in after this many steps; 0: the
    # one-step delay. On `small`, H = 64, 1 ended 4.7% lower in eval loss at the same epoch cycle
    # (docs/results-protocol.md)
    merge_step: int = 1
    batch_size: int = 8  # rows per trainer and step (benchmarks/protocol.py --batch-sizes: audits at larger batches)
    seq_len: int = 64  # tokens per row, at most the preset's context (128 on `small`; examples/small.toml trains on 64)
    # rows per group (micro-batch): a shard challenge opens one group per step, with the running gradient
    # sums around it (docs/protocol.md §5.3), so the demo runs the token-bounded unit at M = 2; 0: one group
    group_rows: int = 4
    segment: int = 4  # steps per shard challenge (audit.segment)
    # where the merge rule keeps the compression residual (compression.error_feedback, docs/protocol.md §8):
    # "params" needs no error buffer and no start file; "buffer" carries one (ignored without the merge rule)
    error_feedback: str = "params"
    # a held compression rank (rank_initial = rank_min = rank_max, as examples/small.toml ships 128);
    # None: the adaptive rule from the config's default rank
    rank: int | None = None
    first_merge_step: int = -1  # schedule.first_merge_step (examples/small.toml: 0, epoch 1 waits for G_1)
    # audit.window (docs/protocol.md §5.4): > 0 draws each window's steps at `audit_rate` from a block after
    # its post, the coordinator serving the relay; 0: challenges drawn after the epoch (`audit.challenges`)
    window: int = 0
    audit_rate: float = 0.25
    # > 0: the demo mines a block every this many seconds, as a chain with its own block time does (the
    # devnet otherwise mines only with transactions, and a window's seed needs blocks after its post)
    block_time_s: float = 0.0
    # environment a node's process starts with beside the demo's own, by node name ("trainer0",
    # "verifier1"): what another host would have (tests: ATen's capability levels, docs/protocol.md §11)
    host_env: dict[str, dict[str, str]] = field(default_factory=dict, hash=False)

    @property
    def groups(self) -> int:
        """inner.microbatches: the batch in groups of ``group_rows`` (one group where they do not divide it)."""
        ok = 0 < self.group_rows <= self.batch_size and self.batch_size % self.group_rows == 0
        return self.batch_size // self.group_rows if ok else 1

    def config(self) -> RunConfig:
        w = self.windows_s
        return RunConfig(name="veriloco-demo").replace(
            model={"preset": self.preset},
            data={"seq_len": min(self.seq_len, preset(self.preset).seq_len), "batch_size": self.batch_size,
                  "corpus_bytes": 2_000_000},
            inner={"lr": 3e-3, "warmup_steps": 8, "total_steps": self.steps * self.epochs * 2,
                   "microbatches": self.groups},
            # plain averaging: in a run of a few rounds momentum overshoots; see docs/results-engine.md.
            # The trimmed mean, as examples/run.toml ships it (the median of three at three trainers)
            outer={"lr": 1.0, "momentum": 0.0, "aggregate": "trimmed"},
            schedule={"epochs": self.epochs, "h_initial": self.steps, "h_min": max(1, self.steps // 2),
                      "h_max": self.steps * 2, "merge_step": self.merge_step,
                      "first_merge_step": self.first_merge_step if self.merge_step else -1},
            compression={"error_feedback": self.error_feedback if self.merge_step else "buffer",
                         **({"rank_initial": self.rank, "rank_min": self.rank, "rank_max": self.rank} if self.rank else {})},
            # shard audits: 4 segments of 4 steps, one block each (docs/protocol.md §5.3; the policy of
            # docs/results-protocol.md); whole states: 3 steps. Pipelined whole-state audits are
            # tolerant; shard audits are exact at any number of stages.
            audit={"challenges": 4 if self.audit == "shard" else 3, "segment": self.segment if self.audit == "shard" else 1,
                   "final_check_bps": 10_000, "quorum": self.quorum, "unit": self.audit,
                   "test_run": self.quorum < 3,  # a devnet: a quorum below 3 is a test
                   "mode": "tolerant" if self.stages > 1 and self.audit == "state" else "exact",
                   **({"window": self.window, "rate": self.audit_rate} if self.window else {})},
            windows={"commit_s": w, "reveal_s": w, "response_s": w, "verdict_s": w, "finalize_s": w},
            stakes={"min_trainers": 1},
            # a small pool, so rewards show: 0.001 ETH per included trainer and 0.0001 per majority verdict
            rewards={"trainer_wei": 10**15, "verifier_wei": 10**14, "pool_wei": 10**17},
        )


@dataclass
class NodeProc:
    role: str
    index: int
    account: int
    address: str
    log_path: Path
    cmd: list[str]
    proc: NodeProcess
    cheat: str | None = None
    killed: bool = False  # stopped on purpose (fault injection): its exit status is expected
    offset: int = 0
    last: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # its own environment beside the demo's (DemoOptions.host_env)

    @property
    def name(self) -> str:
        return f"{self.role}{self.index}" + (f"[{self.cheat}]" if self.cheat else "")

    def read(self) -> list[dict[str, Any]]:
        """New JSON log lines since the last read."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        new = []
        for line in chunk[:end].splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a traceback or a warning: kept in the log file
            if isinstance(ev, dict):
                new.append(ev)
        self.events += new
        if new:
            self.last = new[-1]
        return new


def _spawn(role: str, index: int, account: int, devnet_file: Path, run_id: int, opts: DemoOptions,
           address: str, cheat: str | None = None, relay_port: int | None = None) -> NodeProc:
    log_path = opts.workdir / "logs" / f"{role}{index}.jsonl"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "veriloco.cli", role, "--run", str(run_id), "--devnet", str(devnet_file),
           "--account", str(account), "--workdir", str(opts.node_dir or opts.workdir / "nodes")]
    cmd += ["--log-format", "json"]  # the demo reads the nodes' events
    if role in ("trainer", "verifier"):
        cmd += ["--allow-test-run"]  # its own run: a quorum below 3 makes it a test run (DemoOptions.config)
    if opts.metrics_port:
        cmd += ["--metrics-port", str(opts.metrics_port + metrics_offset(opts, role, index))]
    if cheat:
        cmd += ["--cheat", cheat]
    if role == "trainer" and opts.stages > 1:
        cmd += ["--stages", str(opts.stages)]
    if role == "trainer" and opts.checkpoint_every != 4:
        cmd += ["--checkpoint-every", str(opts.checkpoint_every)]
    if role == "trainer" and opts.checkpoint_every_logged != 16:
        cmd += ["--checkpoint-every-logged", str(opts.checkpoint_every_logged)]
    for flag, gib in (("--boundary-log-ram", opts.log_ram_gib), ("--boundary-log-disk", opts.log_disk_gib)):
        if role == "trainer" and gib is not None:
            cmd += [flag, str(gib)]
    if relay_port is not None:  # a windowed run: the coordinator serves the relay, trainers send to it
        cmd += (["--relay-port", str(relay_port), "--window-wait", "2"] if role == "coordinator" else
                ["--relay", f"http://127.0.0.1:{relay_port}", "--window-wait", "10"] if role == "trainer" else [])
    env = opts.host_env.get(f"{role}{index}", {})
    return NodeProc(role, index, account, address, log_path, cmd, start_node(cmd, log_path, env), cheat, env=env)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the relay binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def metrics_offset(opts: DemoOptions, role: str, index: int) -> int:
    """Where a node's metrics port lies after `opts.metrics_port`: verifiers, then trainers, then the coordinator."""
    return {"verifier": index, "trainer": opts.verifiers + index, "coordinator": opts.verifiers + opts.trainers}[role]


class Control:
    """What a fault-injection hook may do to the running network (tests use it via run_demo(on_tick=...))."""

    def __init__(self, chain: Chain, run_id: int, nodes: list[NodeProc], devnet: Any = None) -> None:
        self.chain, self.run_id, self.nodes, self.devnet = chain, run_id, nodes, devnet

    def node(self, name: str) -> NodeProc:
        return next(n for n in self.nodes if f"{n.role}{n.index}" == name)

    def kill(self, name: str) -> None:
        """SIGKILL the node: no cleanup, as if its machine died."""
        n = self.node(name)
        n.killed = True
        n.proc.kill()
        n.proc.wait()

    def restart(self, name: str) -> None:
        """Start the node again with the same command, key and work directory."""
        n = self.node(name)
        n.proc = start_node(n.cmd, n.log_path, n.env)
        n.killed = False

    def restart_chain(self) -> None:
        """Stop anvil (it dumps its state) and start it again from that state on the same port."""
        anvil = getattr(self.devnet, "_anvil", None)
        if anvil is None:
            raise DemoError("only an anvil devnet can be restarted (py-evm keeps its chain in memory)")
        port = anvil.port
        anvil.stop()
        anvil.requested_port = port
        anvil.start()

    def restart_store(self) -> None:
        """Kill the IPFS node (SIGKILL) and start it again on its repo and API port."""
        from devnet.ipfsnode import IpfsNode

        node = getattr(self.devnet, "_ipfs", None)
        if node is None:
            raise DemoError("only an IPFS store can be restarted")
        node.kill()
        node.stop()
        self.devnet._ipfs = IpfsNode(node.repo, api_port=node.api_port).start()


def _stop(nodes: list[NodeProc]) -> None:
    for n in nodes:
        if n.proc.poll() is None:
            n.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for n in nodes:
        try:
            n.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            n.proc.kill()
            n.proc.wait()


CHAIN_LEGEND = ("chain lines: eN:phase is epoch N and its phase; then trainers that c committed, r revealed, "
                "ok passed their audit, x failed it")


def _status_line(chain: Chain, run_id: int, epochs: int, done: dict[int, str] | None = None) -> str:
    """The chain line; `done` keeps the parts of finalized epochs (they never change), so each tick
    asks the chain only about the epochs still open."""
    parts = []
    for e in range(epochs):
        if done is not None and e in done:
            parts.append(done[e])
            continue
        s = chain.epoch_status(run_id, e)
        if s.phase is Phase.NOT_STARTED:
            break
        parts.append(f"e{e}:{PHASES[s.phase]} c{s.committed} r{s.revealed} ok{s.passed} x{s.failed}")
        if done is not None and s.phase is Phase.FINALIZED:
            done[e] = parts[-1]
    return " | ".join(parts) or "waiting for the first commitment"


def _describe(n: NodeProc) -> str:
    ev = n.last
    if not ev:
        return "starting"
    kind = ev.get("event", "?")
    if kind == "step":
        return f"e{ev['epoch']} step {ev['step']}/{ev['of']} loss {ev['loss']}"
    if kind == "finalized":
        return f"e{ev['epoch']} finalized, eval loss {ev.get('eval_loss')}"
    bits = [kind] + [f"{k}={ev[k]}" for k in ("epoch", "passed", "trainer", "what") if k in ev]
    return " ".join(str(b) for b in bits)


def check_options(opts: DemoOptions) -> None:
    """Refuse options the network could not run with, before a devnet starts."""
    preset(opts.preset)  # ModelError naming the presets
    for name in ("trainers", "verifiers", "epochs", "steps", "stages", "quorum", "windows_s"):
        if getattr(opts, name) < 1:
            raise DemoError(f"--{name.replace('_s', '')} must be at least 1, got {getattr(opts, name)}")
    if opts.verifiers < opts.quorum:
        raise DemoError(f"--verifiers {opts.verifiers} is fewer than --quorum {opts.quorum}: no epoch would ever be audited "
                        "(an audit waits for a quorum of verifiers); add verifiers or lower the quorum")
    if not opts.timeout_s > 0:
        raise DemoError(f"--timeout must be a positive number of seconds, got {opts.timeout_s}")
    n_cheat = sum(c for _, c in opts.cheats)
    if any(c < 1 for _, c in opts.cheats):
        raise DemoError("--cheat KIND:COUNT needs a COUNT of at least 1")
    if n_cheat >= opts.trainers:
        raise DemoError(f"{n_cheat} cheaters need at least {n_cheat + 1} trainers so someone is honest")
    if not 0 <= opts.merge_step < max(1, opts.steps // 2):
        raise DemoError(f"--merge-step must be below the shortest epoch, --steps / 2 = {max(1, opts.steps // 2)}, "
                        f"got {opts.merge_step}; raise --steps, or use --merge-step 0 (the one-step delay)")


def run_demo(opts: DemoOptions, out: TextIO = sys.stdout,
             inspect: Callable[[Chain, Any, int], None] | None = None,
             on_tick: Callable[[Control], None] | None = None, config: RunConfig | None = None) -> dict[str, Any]:
    """Run the network to completion; returns the summary (also written to --report).

    `inspect(chain, store, run_id)` runs after the nodes stop and before the devnet does (tests use
    it to recompute aggregates against the live chain). `on_tick(control)` runs about twice a second
    while the network runs, to kill and restart nodes. `config` replaces the run config `opts` derives.
    """
    from devnet.launch import start_devnet

    def say(msg: str) -> None:
        out.write(msg + "\n")
        out.flush()

    check_options(opts)
    warm_node_server()  # the nodes' imports run while the devnet and the run are set up
    # A demo is a fresh network: node records and chain state of an earlier demo would not match it.
    for old in ("devnet", "nodes", "logs"):
        shutil.rmtree(opts.workdir / old, ignore_errors=True)
    opts.workdir.mkdir(parents=True, exist_ok=True)
    accounts = 1 + opts.trainers + opts.verifiers
    t_start = time.monotonic()
    say(f"veriloco demo: {opts.trainers} trainers, {opts.verifiers} verifiers, {opts.epochs} epochs, "
        f"preset {opts.preset}, chain {opts.chain}, store {opts.store}")
    with start_devnet(chain=opts.chain, store=opts.store, state_dir=opts.workdir / "devnet",  # type: ignore[arg-type]
                      accounts=accounts, persist=opts.chain == "anvil") as net:
        info = net.info
        devnet_file = opts.workdir / "devnet" / "devnet.json"
        from veriloco.settings import Settings, open_store

        store = open_store(Settings(info.rpc_url, info.contract, None, info.store.kind,
                                    Path(info.store.path or opts.workdir / "store"), info.store.api or "", opts.workdir))
        keys = [Account.from_key(a.key) for a in info.accounts]
        assert info.contract is not None
        creator = Chain(info.rpc_url, info.contract, keys[0])
        say("building the corpus and publishing the run ...")
        own = load_corpus_dir(opts.corpus) if opts.corpus else None
        run_id, cfg = publish_run(creator, store, config or opts.config(), corpus=own.corpus if own else None,
                                  tokenizer=own.tokenizer if own else None, vocab_size=own.vocab_size if own else 0,
                                  fingerprint=fingerprint)
        say(f"run {run_id} created on {info.rpc_url} (contract {info.contract}); config {creator.run_info(run_id).params.config_cid}")
        # Stake everyone in before any node starts, so epoch 0 opens with the whole network
        # (a node joins by itself when it is not a member yet).
        for i in range(opts.verifiers):
            Chain(info.rpc_url, info.contract, keys[1 + opts.trainers + i]).join_verifier(run_id)
        for i in range(opts.trainers):
            Chain(info.rpc_url, info.contract, keys[1 + i]).join_trainer(run_id)
        creator.stake_coordinator(run_id)  # the coordinator's stake answers for the models it finalizes
        say(f"{opts.trainers} trainers and {opts.verifiers} verifiers staked; starting the nodes")
        cheat_list = [kind for kind, count in opts.cheats for _ in range(count)]
        nodes: list[NodeProc] = []
        dashboard = None
        if opts.dashboard_port:
            from veriloco.dashweb import start_dashboard  # the run's page while the network runs

            dashboard = start_dashboard(Chain(info.rpc_url, info.contract), store, run_id, opts.dashboard_port)
            say(f"dashboard: http://127.0.0.1:{opts.dashboard_port}/ (until the nodes stop)")
        relay = free_port() if opts.window else None
        try:
            for i in range(opts.verifiers):
                acct = 1 + opts.trainers + i
                nodes.append(_spawn("verifier", i, acct, devnet_file, run_id, opts, keys[acct].address))
            for i in range(opts.trainers):
                cheat = cheat_list[i] if i < len(cheat_list) else None
                nodes.append(_spawn("trainer", i, 1 + i, devnet_file, run_id, opts, keys[1 + i].address, cheat, relay))
            nodes.append(_spawn("coordinator", 0, 0, devnet_file, run_id, opts, keys[0].address, relay_port=relay))
            _monitor(creator, run_id, cfg, nodes, opts, say, t_start, on_tick, net)
        finally:
            _stop(nodes)
            if dashboard is not None:
                dashboard.shutdown()
                dashboard.server_close()
        summary = _summarize(creator, store, run_id, cfg, nodes, opts, time.monotonic() - t_start)
        if inspect is not None:
            inspect(creator, store, run_id)
    _print_summary(summary, say)
    if opts.report is not None:
        _write_report(summary, nodes, opts.report)
        say(f"report written to {opts.report}/summary.json and {opts.report}/loss.png")
    return summary


def _monitor(chain: Chain, run_id: int, cfg: RunConfig, nodes: list[NodeProc], opts: DemoOptions, say: Any,
             t_start: float, on_tick: Callable[[Control], None] | None = None, devnet: Any = None) -> None:
    control = Control(chain, run_id, nodes, devnet)
    coordinator = nodes[-1]
    last_line, last_table, last_block = "", 0.0, time.monotonic()
    done: dict[int, str] = {}  # the status parts of finalized epochs: they no longer change
    deadline = time.monotonic() + opts.timeout_s
    say(CHAIN_LEGEND)
    while True:
        # Whether the coordinator had ended before this tick reads the logs: its last lines (`removed`,
        # `slashed`) are then read below, so the decision to stop never misses them.
        ended = coordinator.proc if coordinator.proc.poll() is not None else None
        for n in nodes:
            for ev in n.read():
                if ev.get("event") in ("committed", "revealed", "responded", "verified", "finalized", "skipped",
                                       "commit-failed", "reveal-failed", "alarm", "error", "joined", "slashed"):
                    detail = {k: v for k, v in ev.items() if k not in ("t", "level", "node", "run", "address", "event", "sent_bytes", "received_bytes")}
                    say(f"  [{time.monotonic() - t_start:6.1f}s] {n.name:18s} {ev['event']:10s} {fields_text(detail)[:150]}")
        try:
            line = _status_line(chain, run_id, cfg.schedule.epochs, done)
        except ChainUnavailable:
            line = "chain unreachable (restarting?)"
        if line != last_line or time.monotonic() - last_table > 15:
            say(f"[{time.monotonic() - t_start:6.1f}s] chain: {line}")
            if time.monotonic() - last_table > 15:
                for n in nodes:
                    say(f"           {n.name:18s} {_describe(n)}")
                last_table = time.monotonic()
            last_line = line
        if opts.block_time_s and time.monotonic() - last_block >= opts.block_time_s:
            last_block = time.monotonic()
            with contextlib.suppress(ChainUnavailable):
                chain.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
        if on_tick is not None:
            on_tick(control)
        # a coordinator slashed and removed stops at once; a verifier finalizes the rest in its place
        if (ended is coordinator.proc and not coordinator.killed
                and (not _removed(coordinator) or _all_terminal(chain, run_id, cfg.schedule.epochs))):
            break
        # a cheater caught ends slashed (SLASHED_EXIT): the summary's slashes say whom, and the tests check them
        dead = [n for n in nodes if n.proc.poll() not in (None, 0, SLASHED_EXIT) and not n.killed]
        if dead:
            raise DemoError(f"{dead[0].name} exited with status {dead[0].proc.returncode}; see {dead[0].log_path}")
        if time.monotonic() > deadline:
            raise DemoError(f"the network did not finish within {opts.timeout_s:.0f} s; logs in {opts.workdir / 'logs'}")
        time.sleep(0.5)
    if coordinator.proc.returncode != 0 and not _removed(coordinator):
        raise DemoError(f"the coordinator failed; see {coordinator.log_path}")
    # trainers and verifiers finish once the last epoch's audits close
    end = time.monotonic() + 60
    while any(n.proc.poll() is None for n in nodes if not n.killed) and time.monotonic() < end:
        for n in nodes:
            n.read()
        time.sleep(0.3)
    for n in nodes:
        n.read()


def _removed(n: NodeProc) -> bool:
    """Whether a node ended because the run removed it (slashed, or it left)."""
    return any(ev.get("event") in ("removed", "slashed") for ev in n.events)


def _all_terminal(chain: Chain, run_id: int, epochs: int) -> bool:
    return all(chain.epoch_status(run_id, e).phase in (Phase.FINALIZED, Phase.ABORTED) for e in range(epochs))


def _store_args(store: Any) -> str:
    """`veriloco store get` flags that reach the demo's store once the demo has ended (its chain is gone)."""
    if isinstance(store, LocalStore):
        root = store.root.absolute()
        with contextlib.suppress(ValueError):  # the shorter path when it lies under the current folder
            root = root.relative_to(Path.cwd())
        return f"--store-dir {shlex.quote(str(root))}"
    return f"--store ipfs --ipfs-api {getattr(store, 'api', '')}"  # an IPFS node: reachable while it runs


def _summarize(chain: Chain, store: Any, run_id: int, cfg: RunConfig, nodes: list[NodeProc], opts: DemoOptions,
               seconds: float) -> dict[str, Any]:
    ctx = open_run(chain, store, run_id)
    epochs = cfg.schedule.epochs
    finalized = [e for e in range(epochs) if chain.epoch_status(run_id, e).phase is Phase.FINALIZED]
    initial = eval_model(ctx, params_of(initial_model(cfg)))
    cid, digest, last = latest_model(chain, ctx, epochs)
    final = eval_model(ctx, params_of(load_model(store, cid, digest)))
    eval_curve = [{"epoch": -1, "eval_loss": initial}]
    for n in nodes:
        if n.role == "coordinator":
            eval_curve += [{"epoch": ev["epoch"], "eval_loss": ev["eval_loss"]} for ev in n.events
                           if ev.get("event") == "finalized" and "eval_loss" in ev]
    verdicts = Counter("pass" if ev.args["passed"] else "fail" for ev in chain.events(["VerdictSubmitted"], run_id=run_id))
    slashes = [{"account": ev.args["trainer"], "epoch": ev.args["epoch"], "reason": ev.args["reason"]}
               for ev in chain.events(["Slashed"], run_id=run_id)]
    slashes += [{"account": ev.args["verifier"], "epoch": ev.args["epoch"], "reason": "outvoted"}
                for ev in chain.events(["VerifierSlashed"], run_id=run_id)]
    slashed = sorted({s["account"] for s in slashes})
    rewards = sum(int(ev.args["paid"]) for ev in chain.events(["RewardsPaid"], run_id=run_id))
    trainers = [n for n in nodes if n.role == "trainer"]
    honest = [n for n in trainers if n.cheat is None] or trainers
    traffic = compare([trainer_traffic(n.events) for n in honest], opts.trainers, n_params(cfg.model_config()))
    gas = 0
    for n in nodes:
        gas += sum(int(ev.get("gas", 0)) for ev in n.events)
    return {
        "run_id": run_id,
        "seconds": round(seconds, 1),
        "trainers": opts.trainers,
        "verifiers": opts.verifiers,
        "cheaters": {n.address: n.cheat for n in trainers if n.cheat},
        "epochs": epochs,
        "epochs_finalized": len(finalized),
        "initial_eval_loss": round(initial, 4),
        "final_eval_loss": round(final, 4),
        "final_model_epoch": last,
        "eval_curve": eval_curve,
        "slashed": slashed,
        "slashes": slashes,  # one entry per slash: every offence is slashed once
        "verdicts": {"pass": verdicts.get("pass", 0), "fail": verdicts.get("fail", 0)},
        "rewards_paid_wei": rewards,
        "reward_pool_left_wei": int(chain.run_info(run_id).pool),
        "final_model_cid": cid,
        "config_cid": ctx.info.params.config_cid,
        "fetch_model": f"veriloco store get {cid} {_store_args(store)} -o model.safetensors",
        "export_model": f"veriloco store get {ctx.info.params.config_cid} {_store_args(store)} -o run.json && "
                        "veriloco export --state model.safetensors --config run.json --out model/",
        # every store byte an honest trainer sent and received, against AllReduce for its steps (veriloco/traffic.py)
        **traffic,
        "gas_used": gas,
    }


def _print_summary(s: dict[str, Any], say: Any) -> None:
    say("")
    say("summary")
    say(f"  epochs finalized      {s['epochs_finalized']}/{s['epochs']} in {s['seconds']} s")
    say(f"  eval loss             {s['initial_eval_loss']} -> {s['final_eval_loss']}")
    say(f"  verdicts              {s['verdicts']['pass']} pass, {s['verdicts']['fail']} fail")
    say(f"  slashed               {', '.join(s['slashed']) or 'nobody'}")
    say(f"  rewards paid          {s['rewards_paid_wei'] / 1e18:g} ETH (pool left {s['reward_pool_left_wei'] / 1e18:g} ETH)")
    if s["cheaters"]:
        say(f"  cheaters              {', '.join(f'{a} ({k})' for a, k in s['cheaters'].items())}")
    moved, baseline = headline(s)
    say(f"  bytes per trainer     {moved}")
    say(f"  baseline              {baseline}")
    say(f"  gas used              {s['gas_used']:,}")
    which = "the initial model" if s["final_model_epoch"] < 0 else f"finalized in epoch {s['final_model_epoch']}"
    say(f"  final model           {s['final_model_cid']} ({which})")
    say(f"  fetch it              {s['fetch_model']}")
    say(f"  export it             {s['export_model']}")


def _trained_steps(events: list[dict[str, Any]]) -> dict[int, int]:
    return {int(ev["epoch"]): int(ev["steps"]) for ev in events if ev.get("event") == "trained"}


def loss_curve(events: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """A trainer's inner-step losses against its own step count across epochs (H adapts per epoch);
    steps replayed after a resume count once, with their latest loss."""
    steps = {(int(ev["epoch"]), int(ev["step"])): (int(ev["of"]), float(ev["loss"]))
             for ev in events if ev.get("event") == "step"}
    h = {e: of for (e, _), (of, _) in steps.items()}
    before, offset = {}, 0
    for e in sorted(h):
        before[e], offset = offset, offset + h[e]
    points = sorted((before[e] + k, loss) for (e, k), (_, loss) in steps.items())
    return [x for x, _ in points], [y for _, y in points]


def eval_steps(epochs: list[int], trained: list[dict[int, int]]) -> list[float]:
    """Where each global eval point goes on the plot's inner-step axis: the steps trainers actually
    trained up to and including that epoch (H adapts per epoch), averaged over trainers; epoch -1
    (the initial model) is step 0."""
    n = max(1, len(trained))
    return [sum(h for t in trained for e, h in t.items() if e <= epoch) / n for epoch in epochs]


def _write_report(summary: dict[str, Any], nodes: list[NodeProc], report: Path) -> None:
    report.mkdir(parents=True, exist_ok=True)
    (report / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for n in nodes:
        if n.role != "trainer":
            continue
        xs, losses = loss_curve(n.events)
        ax.plot(xs, losses, alpha=0.5, lw=1, label=f"{n.name} train loss")
    at = eval_steps([p["epoch"] for p in summary["eval_curve"]],
                    [_trained_steps(n.events) for n in nodes if n.role == "trainer" and n.cheat is None])
    ax.plot(at, [p["eval_loss"] for p in summary["eval_curve"]], "k-o", lw=2, label="global model eval loss")
    ax.set_xlabel("inner step")
    ax.set_ylabel("loss (nats/byte)")
    ax.set_title("veriloco demo: verified DiLoCoX training")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(report / "loss.png", dpi=120)
    plt.close(fig)


def _parse_cheats(items: list[str]) -> tuple[tuple[str, int], ...]:
    out = []
    for item in items:
        kind, _, count = item.partition(":")
        if kind not in CHEAT_KINDS:
            raise DemoError(f"--cheat {item}: the kind must be one of {', '.join(CHEAT_KINDS)}")
        try:
            n = int(count or "1")
        except ValueError:
            raise DemoError(f"--cheat {item}: COUNT must be a number, as in lazy:1") from None
        out.append((kind, n))
    return tuple(out)


def _cmd(args: argparse.Namespace) -> int:
    opts = DemoOptions(
        trainers=args.trainers, verifiers=args.verifiers, epochs=args.epochs, preset=args.preset, steps=args.steps,
        chain=args.chain, store=args.store, cheats=_parse_cheats(args.cheat), workdir=args.workdir,
        report=args.report, timeout_s=args.timeout, stages=args.stages, audit=args.audit, quorum=args.quorum, corpus=args.corpus,
        metrics_port=args.metrics_port, dashboard_port=args.dashboard, windows_s=args.windows,
        merge_step=args.merge_step,
    )
    check_options(opts)
    summary = run_demo(opts)
    return 0 if summary["epochs_finalized"] == summary["epochs"] else 1


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run a whole verifiable training network on this machine",
                       description=__doc__.split("\n\n")[1] if __doc__ else None)
    d = DemoOptions()
    p.add_argument("--trainers", type=positive, default=d.trainers)
    p.add_argument("--verifiers", type=positive, default=d.verifiers)
    p.add_argument("--quorum", type=positive, default=d.quorum,
                   help="verifiers per trainer and per model attestation; a majority decides (1 lets one verifier decide)")
    p.add_argument("--epochs", type=positive, default=d.epochs)
    p.add_argument("--preset", default=d.preset, choices=sorted(PRESETS), help="model preset")
    p.add_argument("--corpus", type=Path, help="corpus directory from `veriloco data prepare` (default: stdlib bytes)")
    p.add_argument("--steps", type=positive, default=d.steps, help="local steps H in the first epoch")
    p.add_argument("--chain", choices=["py-evm", "anvil"], default=d.chain)
    p.add_argument("--store", choices=["local", "ipfs"], default=d.store)
    p.add_argument("--cheat", action="append", default=[], metavar="KIND:COUNT",
                   help="make COUNT trainers cheat: lazy, noise, copy, forge-final, stale-copy or skip-merge (repeatable)")
    p.add_argument("--workdir", type=Path, default=d.workdir, help="devnet, store, node state and logs")
    p.add_argument("--report", type=Path, help="write DIR/summary.json and DIR/loss.png")
    p.add_argument("--stages", type=positive, default=d.stages,
                   help="run each trainer as S pipeline stages, each owning its blocks' state (tolerant with --audit state)")
    p.add_argument("--audit", choices=["shard", "state"], default=d.audit,
                   help="what a challenge reveals: one block of a segment (shard) or whole states (state)")
    p.add_argument("--merge-step", type=non_negative, default=d.merge_step, metavar="M",
                   help="fold each new global model in after M local steps instead of starting from it "
                        "(the merge rule, default 1; 0: the one-step delay)")
    p.add_argument("--timeout", type=seconds, default=d.timeout_s, help="give up after this many seconds")
    p.add_argument("--windows", type=positive, default=d.windows_s, metavar="S",
                   help="every chain window in seconds (a node that stays silent is waited for this long)")
    p.add_argument("--dashboard", type=tcp_port, default=0, metavar="PORT",
                   help="serve the run's live dashboard on 127.0.0.1:PORT while the nodes run")
    p.add_argument("--metrics-port", type=tcp_port, default=0, metavar="P",
                   help="nodes serve Prometheus metrics on 127.0.0.1:P, P+1, ... (verifiers, trainers, coordinator)")
    p.set_defaults(func=_cmd)
