"""`veriloco doctor`: check, before starting a node, everything that would otherwise fail minutes later.

    veriloco doctor [--role trainer|verifier|coordinator] [--run ID] [--device D] [--metrics-port P [--metrics-host H]] [...]

One line per check, `ok` or `FAIL` and what to do (`skip` where a check lacks what it needs, e.g.
no --run), exit status 1 if any check failed. The settings come from the same flags, VERILOCO_*
variables and devnet file as the node's (veriloco/settings.py), so what doctor passes is what the
node will use. Each check reads only: nothing is staked or sent, and the store is only read.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protocol.errors import VerilocoError
from veriloco.argtypes import host, is_loopback, positive, run_id, tcp_port
from veriloco.settings import Settings, add_connection_args, resolve

if TYPE_CHECKING:
    from protocol.chain.binding import Chain, RunInfo
    from protocol.config import RunConfig

PYTHON_MIN = (3, 11)
DISK_FLOOR = 1 << 30  # a node's state folder gets at least this much room, whatever the model
CLOCK_AHEAD_S = 15  # a chain clock further ahead of this machine's means this clock is slow
BLOCK_AGE_S = 300  # a latest block older than this: the RPC node is not following the chain
# Gas a node spends, upper ends from benchmarks/results/gas.json (8 trainers, quorum 3): joining once,
# then per epoch a trainer's commit, reveal, seed and response; a verifier's verdict commit and reveal,
# attestation and, when the coordinator is silent, a finalize; the coordinator's finalize and seed.
JOIN_GAS = {"trainer": 131_000, "verifier": 107_000, "coordinator": 62_000}
EPOCH_GAS = {"trainer": 350_000, "verifier": 600_000, "coordinator": 320_000}
STAKE_ROLES = {"trainer": 1, "verifier": 2, "coordinator": 3}


class DoctorError(VerilocoError):
    """A check that could not be made."""


@dataclass
class Context:
    """What earlier checks learned, for the later ones (None: not known, those checks skip)."""

    args: argparse.Namespace
    settings: Settings | None = None
    chain: Chain | None = None
    info: RunInfo | None = None
    config: RunConfig | None = None
    store: Any = None
    notes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Result:
    status: str  # "ok", "FAIL" or "skip"
    detail: str


def ok(detail: str) -> Result:
    return Result("ok", detail)


def fail(detail: str) -> Result:
    return Result("FAIL", detail)


def skip(detail: str) -> Result:
    return Result("skip", detail)


def register(sub: Any) -> None:
    help_ = "check this machine, the chain, the key and the store before running a node"
    p = sub.add_parser("doctor", help=help_, description=help_)
    p.add_argument("--role", choices=list(STAKE_ROLES), default="trainer",
                   help="the node you mean to run (default: trainer): which stake and gas the key must cover")
    p.add_argument("--run", type=run_id, help="the run you mean to join: checks it exists, its store, device and stake")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N, as the node's --device (default: cpu)")
    p.add_argument("--threads", type=positive, default=1, help="torch threads, as the node's --threads (default: 1)")
    p.add_argument("--metrics-port", type=tcp_port, default=0, help="the node's --metrics-port, checked to be free")
    p.add_argument("--metrics-host", type=host, default="127.0.0.1", help="the node's --metrics-host (default 127.0.0.1)")
    add_connection_args(p, workdir=True)
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    ctx = Context(args)
    failed = 0
    for name, check in CHECKS:
        try:
            res = check(ctx)
        except (VerilocoError, OSError) as exc:  # foreseeable failures (settings, outages): a FAIL line like any other
            res = fail(str(exc))
        failed += res.status == "FAIL"
        print(f"{res.status:<5} {name:<12} {res.detail}", flush=True)
    print(f"{failed} check(s) failed" if failed else "all checks passed", flush=True)
    return 1 if failed else 0


# ---------------------------------------------------------------- this machine


def check_python(ctx: Context) -> Result:
    have = sys.version_info[:3]
    shown = ".".join(map(str, have))
    if have[:2] < PYTHON_MIN:
        need = ".".join(map(str, PYTHON_MIN))
        return fail(f"Python {shown}; veriloco needs {need} or newer: install it and make the venv with it")
    return ok(f"Python {shown} ({sys.executable})")


def check_torch(ctx: Context) -> Result:
    try:
        import torch
    except ImportError as exc:
        return fail(f"torch does not import ({exc}); install it first (`pip install torch`, the CPU or CUDA build)")
    from importlib.metadata import PackageNotFoundError, requires

    try:  # the range veriloco was installed with (pyproject.toml), so the check cannot drift from it
        wanted = next((r for r in requires("veriloco") or [] if r.replace(" ", "").startswith("torch")), "")
    except PackageNotFoundError:
        wanted = ""
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    if not wanted:
        return ok(f"torch {torch.__version__} ({build})")
    from packaging.requirements import Requirement
    from packaging.version import Version

    spec = Requirement(wanted).specifier
    if Version(torch.__version__.split("+")[0]) not in spec:
        return fail(f"torch {torch.__version__}, but veriloco needs torch {spec}: install a matching build first")
    return ok(f"torch {torch.__version__} ({build}; veriloco needs {spec})")


def check_device(ctx: Context) -> Result:
    from dilocox.device import device_class, resolve_device
    from dilocox.inner import TrainerError

    try:
        dev = resolve_device(ctx.args.device)
    except TrainerError as exc:
        return fail(str(exc))
    have = device_class(dev)
    ctx.notes["device"] = have
    return ok(f"--device {ctx.args.device}: {have}")


def check_determinism(ctx: Context) -> Result:
    import torch

    from dilocox.inner import configure_determinism

    device = ctx.args.device if "device" in ctx.notes else "cpu"  # an unusable --device failed its own check
    configure_determinism(ctx.args.threads, "cuda" if device.startswith("cuda") else "cpu")  # as the node does
    if not torch.are_deterministic_algorithms_enabled():
        return fail("torch refuses deterministic algorithms here; exact replay cannot hold: use another torch build")
    threads = torch.get_num_threads()
    detail = f"deterministic algorithms on, {threads} torch thread(s) (a verifier must use its trainers' count)"
    if device.startswith("cuda"):
        ws = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")
        if ws not in (":4096:8", ":16:8"):
            return fail(f"CUBLAS_WORKSPACE_CONFIG={ws!r} makes cuBLAS nondeterministic; unset it (the node sets :4096:8)")
        detail += f", CUBLAS_WORKSPACE_CONFIG={ws}, TF32 off"
    return ok(detail)


# ---------------------------------------------------------------- settings, disk


def check_settings(ctx: Context) -> Result:
    s = resolve(ctx.args, need_key=False, need_contract=False)
    ctx.settings = s
    where = [f"RPC {s.rpc_url}", f"contract {s.contract or '-'}", f"store {s.store}"]
    return ok(", ".join(where))


def check_disk(ctx: Context) -> Result:
    if ctx.settings is None:
        return skip("no settings")
    folder = ctx.settings.workdir
    near = next((p for p in [folder, *folder.absolute().parents] if p.exists()), Path("/"))
    if not os.access(near, os.W_OK):
        return fail(f"cannot write the state folder {folder} ({near} is not writable); pass a --workdir you own")
    free = shutil.disk_usage(near).free
    need, why = DISK_FLOOR, "the floor"
    if ctx.config is not None:
        need, why = max(DISK_FLOOR, state_bytes(ctx.config)), f"run {ctx.args.run}'s checkpoints"
    text = f"{_gib(free)} free for {folder} (needs about {_gib(need)}: {why})"
    if free < need:
        return fail(f"{text}; free some space or pass a --workdir on a larger disk")
    return ok(text)


def state_bytes(cfg: RunConfig) -> int:
    """About what a node keeps for two overlapping epochs: parameters, two moments and the error
    buffer in fp32 per checkpoint (one every segment, at most h_max steps), plus start and end."""
    from protocol.model import n_params

    per_state = 16 * n_params(cfg.model_config())
    every = max(4, cfg.audit.segment)
    return 2 * per_state * (cfg.schedule.h_max // every + 2)


# ---------------------------------------------------------------- the chain


def check_rpc(ctx: Context) -> Result:
    if ctx.settings is None:
        return skip("no settings")
    from protocol.chain.binding import connect

    w3 = connect(ctx.settings.rpc_url, timeout=10)
    chain_id = int(w3.eth.chain_id)
    ctx.notes["chain_id"] = str(chain_id)
    return ok(f"{ctx.settings.rpc_url} answers: chain id {chain_id}, block {w3.eth.block_number}")


def check_clock(ctx: Context) -> Result:
    if "chain_id" not in ctx.notes or ctx.settings is None:
        return skip("no chain")
    from protocol.chain.binding import connect

    w3 = connect(ctx.settings.rpc_url, timeout=10)
    block = w3.eth.get_block("latest")
    ahead = int(block["timestamp"]) - time.time()
    if ahead > CLOCK_AHEAD_S:
        return fail(f"the chain's latest block is {ahead:.0f} s ahead of this machine's clock: this clock is slow, "
                    "and deadlines will look further off than they are; sync it (NTP, e.g. `timedatectl`)")
    if -ahead > BLOCK_AGE_S:
        return fail(f"the chain's latest block is {-ahead:.0f} s old: the RPC node is not following the chain "
                    "(syncing, or stalled), or this machine's clock is fast; wait for it or use another --rpc-url")
    return ok(f"latest block {abs(ahead):.0f} s {'ahead of' if ahead > 0 else 'behind'} this machine's clock")


def check_contract(ctx: Context) -> Result:
    s = ctx.settings
    if s is None or "chain_id" not in ctx.notes:
        return skip("no chain")
    if not s.contract:
        return fail("no contract address: pass --contract, set VERILOCO_CONTRACT, or use a devnet file")
    from protocol.chain.binding import Chain

    ctx.chain = Chain(s.rpc_url, s.contract)  # refuses an address without this build's code, naming what is there
    return ok(f"this Veriloco build at {s.contract}: {ctx.chain.run_count()} run(s)")


def check_run(ctx: Context) -> Result:
    run = ctx.args.run
    if run is None:
        return skip("no --run given: pass --run ID to check the run, its stake, store and device pin")
    if ctx.chain is None:
        return skip("no contract")
    from protocol.membership import no_availability_committee, no_spare_verifier, verifier_shortfall
    from protocol.statedir import check_run as exists

    exists(ctx.chain, run)
    ctx.info = info = ctx.chain.run_info(run)
    short = verifier_shortfall(info)
    detail = (f"run {run}: next epoch {info.next_epoch}, {info.active_trainers}/{info.params.max_trainers} trainers, "
              f"{info.verifier_count} verifier(s), quorum {info.params.quorum}")
    if short:
        return ok(f"{detail} (stalled: {short})")
    spare = "; ".join(n for n in (no_spare_verifier(info), no_availability_committee(info)) if n)
    return ok(f"{detail} (warning: {spare})" if spare else detail)


# ---------------------------------------------------------------- the store


def check_store(ctx: Context) -> Result:
    s = ctx.settings
    if s is None:
        return skip("no settings")
    from protocol.store.backends import IpfsStore, LocalStore

    if s.store == "local":
        if not s.store_dir.is_dir():  # not made here: doctor only reads
            near = next((p for p in s.store_dir.absolute().parents if p.exists()), Path("/"))
            if ctx.info is not None:
                return fail(f"the local store {s.store_dir} does not exist, so it cannot hold run {ctx.args.run}; "
                            "pass the run's --store-dir (a devnet's is in its devnet file)")
            if not os.access(near, os.W_OK):
                return fail(f"the local store {s.store_dir} cannot be created ({near} is not writable)")
            return ok(f"the local store {s.store_dir} does not exist yet; a node creates it")
        if not os.access(s.store_dir, os.W_OK):
            return fail(f"the local store {s.store_dir} is not writable; pass a --store-dir you own")
        store: Any = LocalStore(s.store_dir)
    else:
        store = IpfsStore(s.ipfs_api, timeout=5.0, deadline=20.0)
    ctx.store = store
    if ctx.info is None:
        if s.store == "ipfs":
            store.has("QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH")  # the empty file: answers, or says why not
        return ok(f"{store.where} answers" + ("" if ctx.args.run is None else " (the run's config not checked)"))
    return _run_config(ctx, store)


def _run_config(ctx: Context, store: Any) -> Result:
    """The run's config, fetched and checked against its on-chain digest: the first thing a node reads."""
    from protocol.config import from_json
    from protocol.digest import keccak

    assert ctx.info is not None
    p = ctx.info.params
    raw = store.get(p.config_cid, max_size=1 << 20)
    if keccak(raw) != p.config_digest:
        return fail(f"{store.where} serves run {ctx.args.run}'s config {p.config_cid} with another digest; "
                    "point --store / --ipfs-api at the run's store")
    ctx.config = from_json(raw)
    return ok(f"{store.where} serves run {ctx.args.run}'s config {p.config_cid} (digest checked)")


def check_pin(ctx: Context) -> Result:
    """The run's pinned device class (exact replay) against this machine's."""
    if ctx.config is None or "device" not in ctx.notes:
        return skip("no run config" if ctx.config is None else "no device")
    if ctx.args.role == "coordinator":
        return skip("the coordinator replays nothing")
    from dilocox.device import check_device as pinned
    from dilocox.device import resolve_device
    from dilocox.inner import TrainerError

    a = ctx.config.audit
    try:
        pinned(resolve_device(ctx.args.device), a.device, a.mode, a.unit, ctx.args.run)
    except TrainerError as exc:
        return fail(str(exc))
    return ok(f"run {ctx.args.run} replays in {a.mode} mode on {a.device!r}: this machine matches")


def check_numerics(ctx: Context) -> Result:
    """The run's CPU numerics class and fingerprint against this process's (exact CPU runs): what a
    node checks before it stakes, computed here first."""
    if ctx.config is None:
        return skip("no run config")
    a = ctx.config.audit
    if ctx.args.role == "coordinator" or a.mode != "exact" or a.device != "cpu":
        return skip("the coordinator replays nothing" if ctx.args.role == "coordinator" else
                    f"run {ctx.args.run} does not replay bit for bit on the CPU")
    from dilocox.numerics import numerics_problem

    why = numerics_problem(ctx.config)  # computes the canary when the run recorded a fingerprint
    if why is not None:
        return fail(why)
    return ok(f"class {a.numerics}, {a.threads} thread(s), " + (f"fingerprint {a.numerics_digest[:18]}… matches the run's"
                                                              if a.numerics_digest else "the run recorded no fingerprint"))


# ---------------------------------------------------------------- the key


def check_key(ctx: Context) -> Result:
    s = ctx.settings
    if s is None:
        return skip("no settings")
    if not s.key:
        return fail("no signing key: pass --key FILE, set VERILOCO_KEY, or --account N with a devnet file")
    if ctx.chain is None:
        return skip("no contract: the balance is not checked")
    from eth_account import Account

    from protocol.chain.binding import suggest_fees

    me = Account.from_key(s.key).address
    chain, role = ctx.chain, ctx.args.role
    balance = int(chain.w3.eth.get_balance(me))
    fee = suggest_fees(chain.w3, s.max_fee_wei).max_fee
    if ctx.info is None:
        if balance == 0:
            return fail(f"{me} holds nothing: fund it for its stake and gas (a devnet's accounts are funded)")
        return ok(f"{me} holds {_eth(balance)} (pass --run ID to compare it with the run's stake and gas)")
    info, run = ctx.info, ctx.args.run
    m = chain.member(run, me)
    if m.role not in (0, STAKE_ROLES[role]):
        from protocol.membership import ROLE_NAMES

        return fail(f"{me} is already a {ROLE_NAMES.get(m.role, m.role)} in run {run}; a {role} needs its own key")
    if role == "coordinator" and me.lower() != info.params.coordinator.lower():
        return fail(f"run {run}'s coordinator is {info.params.coordinator}, not {me}; start it with that key")
    stake = 0 if m.role else (info.params.trainer_stake if role == "trainer" else info.params.verifier_stake)
    epochs = max(1, (ctx.config.schedule.epochs if ctx.config is not None else info.next_epoch + 1) - info.next_epoch)
    gas = (0 if m.role else JOIN_GAS[role]) + EPOCH_GAS[role] * epochs
    need = stake + gas * fee
    text = (f"{me} holds {_eth(balance)}; a {role} needs about {_eth(need)} "
            f"({'stake ' + _eth(stake) + ' + ' if stake else 'staked already; '}{gas:,} gas for {epochs} epoch(s) "
            f"at {fee / 1e9:.3g} gwei)")
    if balance < need:
        return fail(f"{text}: send it {_eth(need - balance)} more")
    return ok(text)


# ---------------------------------------------------------------- ports


def check_ports(ctx: Context) -> Result:
    port, where = ctx.args.metrics_port, getattr(ctx.args, "metrics_host", "127.0.0.1")
    if not port:
        return skip("no --metrics-port given")
    family = socket.AF_INET6 if ":" in where else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((where, port))
        except OSError as exc:
            return fail(f"metrics port {port} on {where} is taken or not this machine's ({exc.strerror}): "
                        "pick another --metrics-port (or --metrics-host)")
    if not is_loopback(where):
        return ok(f"metrics port {port} on {where} is free; reachable from other machines, unauthenticated: firewall it")
    return ok(f"metrics port {port} on {where} is free")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _eth(wei: int) -> str:
    return f"{wei / 1e18:.6g} ETH"


# in order: a later check reads what an earlier one left in the context (the run before its store,
# the store's config before the disk estimate and the device pin)
CHECKS: list[tuple[str, Callable[[Context], Result]]] = [
    ("python", check_python),
    ("torch", check_torch),
    ("device", check_device),
    ("determinism", check_determinism),
    ("settings", check_settings),
    ("rpc", check_rpc),
    ("clock", check_clock),
    ("contract", check_contract),
    ("run", check_run),
    ("store", check_store),
    ("device pin", check_pin),
    ("numerics", check_numerics),
    ("state disk", check_disk),
    ("key", check_key),
    ("ports", check_ports),
]
