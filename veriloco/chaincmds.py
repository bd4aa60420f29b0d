"""`veriloco deploy`, `run create`, `runs` and `status`: the contract from the command line.

    veriloco deploy --rpc-url URL --key FILE [--json]      deploy the committed Veriloco build
    veriloco run init [--out run.toml] [--force]           write the commented example config (veriloco/runinit.py)
    veriloco run create --config run.toml [...]            publish the run's config + G_0, create it
    veriloco runs [--json]                                 every run of the contract and its state
    veriloco status --run ID [--epoch N] [--json]          round status, as the contract derives it

Connection settings come from flags, then VERILOCO_* variables, then a devnet file
(`veriloco.settings`). `status` needs no key.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from eth_account import Account

from protocol.chain.binding import (
    SLASH_REASONS,
    Chain,
    ChainEvent,
    Phase,
    Role,
    RunInfo,
    Sub,
    connect,
    deploy,
)
from protocol.config import ScheduleSection, from_json
from protocol.errors import VerilocoError
from protocol.membership import (
    no_availability_committee,
    no_spare_verifier,
    silent_coordinator,
    trainer_shortfall,
    verifier_shortfall,
)
from protocol.statedir import check_run
from veriloco.argtypes import address
from veriloco.argtypes import epoch as epoch_arg
from veriloco.argtypes import run_id as run_id_arg
from veriloco.runinit import register_init
from veriloco.settings import Settings, add_connection_args, open_store, resolve

STATE_NAMES = {0: "-", 1: "committed", 2: "revealed", 3: "responded", 4: "unavailable"}


class StatusError(VerilocoError):
    """A status query that names something the run does not have."""


def register(sub: Any) -> None:
    d = sub.add_parser("deploy", help="deploy the Veriloco contract to any EVM JSON-RPC endpoint")
    add_connection_args(d)
    d.add_argument("--json", action="store_true", help="print a JSON object instead of the address")
    d.set_defaults(func=cmd_deploy)

    r = sub.add_parser("run", help="write an example run config (init), create a run on the contract (create)")
    rsub = r.add_subparsers(dest="run_command", required=True, metavar="SUBCOMMAND")
    register_init(rsub)
    c = rsub.add_parser("create", help="publish a run's config and initial model, then create it on-chain")
    c.add_argument("--config", type=Path, required=True, help="run.toml (missing keys take the defaults)")
    c.add_argument("--coordinator", type=address, help="coordinator address (default: the signing account)")
    c.add_argument("--corpus", type=Path, help="corpus directory (veriloco data prepare|import; default: stdlib bytes)")
    c.add_argument("--json", action="store_true", help="print a JSON object instead of the run id")
    add_connection_args(c)
    c.set_defaults(func=cmd_run_create)

    ls = sub.add_parser("runs", help="list the runs of a contract with their state")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_connection_args(ls, signing=False)
    ls.set_defaults(func=cmd_runs)

    s = sub.add_parser("status", help="query a run's round status from the contract")
    s.add_argument("--run", type=run_id_arg, required=True, help="run id")
    s.add_argument("--epoch", type=epoch_arg, help="epoch to show (default: the current one)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_connection_args(s, signing=False)
    s.set_defaults(func=cmd_status)


def cmd_deploy(args: argparse.Namespace) -> int:
    s = resolve(args, need_key=True, need_contract=False)
    w3 = connect(s.rpc_url)
    account = Account.from_key(s.key)
    address = deploy(w3, account, max_fee=s.max_fee_wei)
    if args.json:
        print(json.dumps({"contract": address, "chain_id": int(w3.eth.chain_id), "rpc_url": s.rpc_url,
                          "deployer": account.address}))
    else:
        print(address)
    return 0


def cmd_run_create(args: argparse.Namespace) -> int:
    from dilocox.numerics import fingerprint
    from protocol.config import load_toml
    from protocol.run import publish_run
    from protocol.tokens import load_corpus_dir

    s = resolve(args, need_key=True, need_contract=True)
    cfg = load_toml(args.config)
    chain = Chain(s.rpc_url, str(s.contract), Account.from_key(s.key), max_fee=s.max_fee_wei)
    print("publishing the run's corpus, initial model and config, then creating it ...", file=sys.stderr, flush=True)
    own = load_corpus_dir(args.corpus) if args.corpus else None  # users' own data, published with the run
    run_id, _ = publish_run(chain, open_store(s), cfg, coordinator=args.coordinator, corpus=own.corpus if own else None,
                            tokenizer=own.tokenizer if own else None, vocab_size=own.vocab_size if own else 0,
                            fingerprint=fingerprint)
    if args.json:
        p = chain.run_info(run_id).params
        print(json.dumps({"run_id": run_id, "config_cid": p.config_cid, "config_digest": "0x" + p.config_digest.hex(),
                          "init_model_cid": p.init_model_cid, "coordinator": p.coordinator, "contract": chain.address}))
    else:
        print(run_id)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    s = resolve(args, need_key=False, need_contract=True)
    chain = Chain(s.rpc_url, str(s.contract))
    check_run(chain, args.run)
    report = status_report(chain, args.run, args.epoch, store=_config_store(s))
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    s = resolve(args, need_key=False, need_contract=True)
    chain = Chain(s.rpc_url, str(s.contract))
    store = _config_store(s)
    rows = []
    for rid in range(1, chain.run_count() + 1):
        info = chain.run_info(rid)
        schedule = run_schedule(info, store)
        epochs = schedule.epochs if schedule is not None else None
        state = run_state(chain, info, schedule)
        rows.append({"run_id": rid, "state": state["state"], "summary": state["text"], "epochs": epochs,
                     "next_epoch": info.next_epoch, "trainers": info.active_trainers,
                     "max_trainers": info.params.max_trainers, "verifiers": info.verifier_count,
                     "coordinator": info.params.coordinator, "creator": info.creator,
                     "config_cid": info.params.config_cid, "pool_wei": int(info.pool)})
    if args.json:
        print(json.dumps({"contract": chain.address, "chain_id": chain.chain_id, "runs": rows}, indent=2))
        return 0
    print(f"{len(rows)} run(s) on chain {chain.chain_id} at {chain.address}")
    if rows:
        print(f"{'run':>4}  {'state':<9} {'trainers':>9} {'verifiers':>9}  {'coordinator':<22} summary")
    for r in rows:
        print(f"{r['run_id']:>4}  {r['state']:<9} {str(r['trainers']) + '/' + str(r['max_trainers']):>9} "
              f"{r['verifiers']:>9}  {_short(r['coordinator']):<22} {r['summary']}")
    return 0


TERMINAL = (Phase.FINALIZED, Phase.ABORTED)


def _config_store(s: Settings) -> Any:
    """The store, for reading run configs only: an unreachable IPFS node costs seconds, not minutes."""
    if s.store == "ipfs":
        from protocol.store.backends import IpfsStore, StoreError

        try:
            return IpfsStore(s.ipfs_api, timeout=5.0, deadline=10.0)
        except StoreError:
            return None
    return open_store(s)


def run_schedule(info: RunInfo, store: Any) -> ScheduleSection | None:
    """The run's schedule, from its config (None when the store cannot serve it).

    The contract knows neither how many epochs a run has nor its start rule; its config,
    digest-checked, does.
    """
    from protocol.digest import keccak

    if store is None:
        return None
    try:
        raw = store.get(info.params.config_cid, max_size=1 << 20)
        if keccak(raw) != info.params.config_digest:
            return None
        return from_json(raw).schedule
    except (VerilocoError, OSError):
        return None


def run_state(chain: Chain, info: RunInfo, schedule: ScheduleSection | None) -> dict[str, Any]:
    """Where the run stands as a whole: not started, running, waiting for an epoch, stalled (no active
    trainer once it has begun: no epoch can open; fewer verifiers than its quorum: nothing is audited;
    or a silent coordinator: an epoch past the coordinator's half of its finalize window, unfinalized),
    or finished. An epoch that aborted because nobody finalized it is named in the summary.

    Under the merge rule the trainers are inside epoch e from epoch e-1's commit on: once e-1 has
    closed they train past the merge towards e's commitment, so that run is "running", not waiting.
    """
    nxt, rid = info.next_epoch, info.run_id
    epochs = schedule.epochs if schedule is not None else None
    of = f" of {epochs}" if epochs is not None else ""
    if epochs is not None and nxt >= epochs:
        phases = [chain.epoch_status(rid, e).phase for e in range(epochs)]
        if all(p in TERMINAL for p in phases):
            done = sum(p is Phase.FINALIZED for p in phases)
            return {"state": "finished", "epoch": epochs - 1,
                    "text": f"finished: {done}{of} epochs finalized, {epochs - done} aborted"}
    if (short := trainer_shortfall(info) or verifier_shortfall(info)) is not None:
        return {"state": "stalled", "epoch": max(0, nxt - 1), "text": short}
    spare = "; ".join(n for n in (no_spare_verifier(info), no_availability_committee(info)) if n) or None
    if nxt == 0:
        return {"state": "waiting", "epoch": 0, "text": f"waiting for epoch 0{of} (the first trainer's commitment "
                                                        f"opens it{f'; {spare}' if spare else ''})"}
    last = nxt - 1
    st = chain.epoch_status(rid, last)
    ph = st.phase
    silent = (silent_coordinator(info, last, st, chain.epoch_times(rid, last), chain.now())
              if ph in (Phase.AUDITING, Phase.ABORTED) else None)
    if silent is not None and ph is Phase.AUDITING:  # the run waits on a finalize its coordinator does not send
        return {"state": "stalled", "epoch": last, "text": silent}
    note = "".join(f"; {n}" for n in (silent, spare) if n is not None)
    if ph in TERMINAL and schedule is not None and schedule.merge_step:
        return {"state": "running", "epoch": nxt,
                "text": f"epoch {nxt}{of} training (epoch {last} {ph.name.lower()}; trainers merged its model at "
                        f"step {schedule.merge_step_in(nxt)} and open epoch {nxt} when they commit{note})"}
    if ph in TERMINAL:
        return {"state": "waiting", "epoch": nxt,
                "text": f"waiting for epoch {nxt}{of} (epoch {last} {ph.name.lower()}; the next commitment opens it{note})"}
    text = f"epoch {last}{of} {ph.name.lower()}"
    if spare is not None:
        text += f" ({spare})"
    if last > 0 and (before := chain.epoch_status(rid, last - 1)).phase not in TERMINAL:
        if before.phase is Phase.AUDITING and (silent := silent_coordinator(
                info, last - 1, before, chain.epoch_times(rid, last - 1), chain.now())) is not None:
            return {"state": "stalled", "epoch": last - 1, "text": silent}
        text += f", epoch {last - 1} {before.phase.name.lower()}"
    return {"state": "running", "epoch": last, "text": text}


def status_report(chain: Chain, run_id: int, epoch: int | None = None, store: Any = None) -> dict[str, Any]:
    """Everything `status` shows, as plain JSON-able data (also used by tests and the demo).

    With a store the run's config is read too, so the report knows how many epochs the run has and
    can say that it has finished.
    """
    info = chain.run_info(run_id)
    schedule = run_schedule(info, store) if store is not None else None
    epochs = schedule.epochs if schedule is not None else None
    if epoch is not None and epochs is not None and epoch >= epochs:
        raise StatusError(f"run {run_id} has {epochs} epochs (0..{epochs - 1}); there is no epoch {epoch}")
    current = chain.current_epoch(run_id)
    overall = run_state(chain, info, schedule)
    # default: the newest epoch that has opened (the current one may not have opened yet)
    e = max(0, min(current, info.next_epoch - 1)) if epoch is None else epoch
    st = chain.epoch_status(run_id, e)
    times = chain.epoch_times(run_id, e)
    events = chain.events(["Revealed", "Responded", "VerdictSubmitted", "Slashed"], run_id=run_id, epoch=e)
    trainers = []
    for slot in range(info.trainer_slots):
        addr = chain.contract.functions.trainerAt(run_id, slot).call()
        sub = chain.submission(run_id, e, addr)
        mem = chain.member(run_id, addr)
        if sub.state == Sub.NONE and (mem.role != Role.TRAINER or not (mem.join_epoch <= e < (mem.leave_epoch or 2**32))):
            continue
        mine = [ev for ev in events if ev.args.get("trainer") == addr]
        trainers.append(_trainer_row(chain, run_id, e, slot, addr, sub, mem, mine, st.phase in TERMINAL))
    p = info.params
    previous = None
    if e > 0:
        ps = chain.epoch_status(run_id, e - 1)
        previous = {"epoch": e - 1, "phase": ps.phase.name.lower(), "passed": ps.passed, "failed": ps.failed,
                    "model_cid": ps.model_cid}
    return {
        "run_id": run_id,
        "contract": chain.address,
        "chain_id": chain.chain_id,
        "current_epoch": current,
        "epoch": e,
        "phase": st.phase.name.lower(),
        "phase_code": int(st.phase),
        "committed": st.committed,
        "revealed": st.revealed,
        "passed": st.passed,
        "failed": st.failed,
        "expected": times.expected,
        "responded": times.responded,
        "model_cid": st.model_cid,
        "model_digest": "0x" + times.model_digest.hex() if st.phase == Phase.FINALIZED else "",
        "audit_seed": "0x" + times.seed.hex() if times.seeded else "",
        "deadlines": {
            "opened_at": times.opened_at,
            "commits_close": times.commits_close,
            "reveals_close": times.reveals_close,
            "response_deadline": times.response_deadline,
            "verdict_deadline": times.verdict_deadline,
            "finalize_deadline": times.finalize_deadline,
            "done_at": times.done_at,
        },
        "chain_time": chain.now(),
        "wall_time": int(time.time()),
        "epochs": epochs,
        "run_state": overall["state"],
        "run_summary": overall["text"],
        "run": {
            "config_cid": p.config_cid,
            "config_digest": "0x" + p.config_digest.hex(),
            "init_model_cid": p.init_model_cid,
            "coordinator": p.coordinator,
            "creator": info.creator,
            "min_trainers": p.min_trainers,
            "max_trainers": p.max_trainers,
            "active_trainers": info.active_trainers,
            "verifiers": info.verifier_count,
            "quorum": p.quorum,
            "audit_steps": p.audit_steps,
            "audit_rate_ppm": p.audit_rate,
            "final_check_bps": p.final_check_bps,
            "trainer_stake_wei": p.trainer_stake,
            "verifier_stake_wei": p.verifier_stake,
            "slash_bps": p.slash_bps,
        },
        "trainers": trainers,
        "previous_epoch": previous,
    }


def _trainer_row(chain: Chain, run_id: int, epoch: int, slot: int, addr: str, sub: Any, mem: Any,
                 events: list[ChainEvent], over: bool = False) -> dict[str, Any]:
    revealed = next((ev for ev in events if ev.name == "Revealed"), None)
    responded = next((ev for ev in events if ev.name == "Responded"), None)
    slashed = next((ev for ev in events if ev.name == "Slashed"), None)
    verdicts = [
        {"verifier": ev.args["verifier"], "passed": bool(ev.args["passed"])}
        for ev in events if ev.name == "VerdictSubmitted"
    ]
    assigned = chain.assignment(run_id, epoch, addr)
    if sub.passed:
        outcome = "passed"
    elif assigned.verifiers and sub.fail_votes > len(assigned.verifiers) // 2:
        outcome = "failed"
    elif slashed is not None:
        outcome = "slashed: " + SLASH_REASONS.get(int(slashed.args["reason"]), "?")
    elif sub.state and over:
        outcome = "no verdict (excluded)"  # the epoch is over: nothing is pending any more
    elif sub.state:
        outcome = "pending"
    else:
        outcome = "missed" if over else "-"
    return {
        "address": addr,
        "slot": slot,
        "stake_wei": mem.stake,
        "state": STATE_NAMES.get(sub.state, str(sub.state)),
        "leaf_count": sub.leaf_count,
        "trace_root": "0x" + sub.trace_root.hex() if sub.state >= Sub.REVEALED else "",
        "payload_cid": revealed.args["payloadCid"] if revealed else "",
        "payload_digest": "0x" + revealed.args["payloadDigest"].hex() if revealed else "",
        "manifest_cid": responded.args["manifestCid"] if responded else "",
        "challenged_steps": list(assigned.transitions),
        "final_check": assigned.final_check,
        "assigned_verifiers": list(assigned.verifiers),
        "pass_votes": sub.pass_votes,
        "fail_votes": sub.fail_votes,
        "verdicts": verdicts,
        "outcome": outcome,
        "slashed_wei": int(slashed.args["amount"]) if slashed else 0,
    }


def _audit_policy(run: dict) -> str:
    """The run's draw in words: s an epoch, or each step at its rate with the cap (docs/protocol.md §5)."""
    if run.get("audit_rate_ppm"):
        return f"audits {run['audit_rate_ppm'] / 1e6:g} a step (at most {run['audit_steps']} an epoch)"
    return f"audit steps {run['audit_steps']}"


def _clock(ts: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def _when(ts: int, now: int, wall: int | None = None) -> str:
    """A chain timestamp, with the wall-clock time it corresponds to and how far away it is.

    The contract's clock is the latest block's timestamp, which may run behind this machine's clock
    (an idle chain makes no blocks); `wall` - `now` is that offset.
    """
    if not ts:
        return "not fixed yet"
    delta = ts - now
    away = f"in {delta}s" if delta > 0 else f"{-delta}s ago"
    shown = f"{_clock(ts)} UTC chain time"
    if wall is not None and abs(wall - now) >= 2:
        shown += f" = {_clock(ts + wall - now)} UTC wall clock"
    return f"{shown} ({away})"


# which deadlines matter in which phase (an earlier one has passed, a later one is not fixed yet)
DEADLINES = {
    Phase.COMMITTING: [("commits close", "commits_close")],
    Phase.REVEALING: [("reveals close", "reveals_close")],
    Phase.AUDITING: [("responses due", "response_deadline"), ("verdicts due", "verdict_deadline"),
                     ("finalize by", "finalize_deadline")],
}


def _short(a: str, n: int = 10) -> str:
    return a if len(a) <= 2 * n + 1 else f"{a[:n]}…{a[-6:]}"


def render(r: dict[str, Any]) -> str:
    """A readable table of a status report: only what is true in the epoch's phase."""
    d, now, run = r["deadlines"], r["chain_time"], r["run"]
    wall = r.get("wall_time")
    phase = Phase(r["phase_code"])
    lines = [
        f"run {r['run_id']} on chain {r['chain_id']} at {r['contract']}: {r.get('run_summary', '')}",
        f"  config {run['config_cid']}   coordinator {run['coordinator']}",
        (f"  trainers {run['active_trainers']}/{run['max_trainers']} (min {run['min_trainers']})   "
         f"verifiers {run['verifiers']}   quorum {run['quorum']}   {_audit_policy(run)}"),
        f"  chain time {_clock(now)} UTC" + (f", wall clock {_clock(wall)} UTC" if wall is not None else ""),
        "",
    ]
    of = f" of {r['epochs']}" if r.get("epochs") else ""
    if phase is Phase.NOT_STARTED:
        after = ", once epoch {} is auditing or done".format(r["epoch"] - 1) if r["epoch"] > 0 else ""
        lines.append(f"epoch {r['epoch']}{of}: NOT OPENED — waiting for epoch {r['epoch']} "
                     f"(the first trainer's commitment opens it{after})")
    else:
        current = (f" (current {r['current_epoch']})"
                   if r["current_epoch"] != r["epoch"] and r.get("run_state") != "finished" else "")
        lines += [
            f"epoch {r['epoch']}{of}{current}: {r['phase'].upper()}",
            (f"  committed {r['committed']}/{r['expected']}   revealed {r['revealed']}   responded {r['responded']}   "
             f"passed {r['passed']}   failed {r['failed']}"),
            f"  model {r['model_cid'] or '-'}",
            f"  opened          {_when(d['opened_at'], now, wall)}",
        ]
        if phase in TERMINAL:
            lines.append(f"  {phase.name.lower():<15} {_when(d['done_at'], now, wall)}")
        for label, key in DEADLINES.get(phase, []):
            lines.append(f"  {label:<15} {_when(d[key], now, wall)}")
    prev = r.get("previous_epoch")
    if prev:
        lines.append(f"  previous epoch {prev['epoch']}: {prev['phase'].upper()}   passed {prev['passed']}   "
                     f"failed {prev['failed']}   model {prev['model_cid'] or '-'}")
    lines.append("")
    header = f"{'slot':>4}  {'trainer':<22} {'state':<10} {'leaves':>6}  {'votes':>7}  {'outcome':<22} payload"
    lines.append(header)
    lines.append("-" * len(header))
    for t in r["trainers"]:
        need = len(t["assigned_verifiers"])
        votes = f"{t['pass_votes']}+/{t['fail_votes']}-" + (f"/{need}" if need else "")
        votes = votes if t["state"] == "responded" or need or t["pass_votes"] or t["fail_votes"] else "-"
        lines.append(
            f"{t['slot']:>4}  {_short(t['address']):<22} {t['state']:<10} {t['leaf_count'] or '-':>6}  "
            f"{votes:>7}  {t['outcome']:<22} {t['payload_cid'] or '-'}"
        )
    if not r["trainers"]:
        lines.append("  (no trainers in this epoch)")
    return "\n".join(lines)
