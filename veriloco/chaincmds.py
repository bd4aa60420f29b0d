"""`veriloco deploy`, `veriloco run create` and `veriloco status`: the contract from the command line.

    veriloco deploy --rpc-url URL --key FILE [--json]      deploy the committed Veriloco build
    veriloco run create --config run.toml [...]            publish the run's config + G_0, create it
    veriloco status --run ID [--epoch N] [--json]          round status, as the contract derives it

Connection settings come from flags, then VERILOCO_* variables, then a devnet file
(`veriloco.settings`). `status` needs no key.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from eth_account import Account

from protocol.chain import Chain, ChainEvent, Phase, connect, deploy
from veriloco.settings import add_connection_args, open_store, resolve

STATE_NAMES = {0: "-", 1: "committed", 2: "revealed", 3: "responded"}
SLASH_REASONS = {1: "no reveal", 2: "no response", 3: "failed audit"}


def register(sub: Any) -> None:
    d = sub.add_parser("deploy", help="deploy the Veriloco contract to any EVM JSON-RPC endpoint")
    add_connection_args(d)
    d.add_argument("--json", action="store_true", help="print a JSON object instead of the address")
    d.set_defaults(func=cmd_deploy)

    r = sub.add_parser("run", help="create runs on the contract")
    rsub = r.add_subparsers(dest="run_command", required=True, metavar="SUBCOMMAND")
    c = rsub.add_parser("create", help="publish a run's config and initial model, then create it on-chain")
    c.add_argument("--config", type=Path, required=True, help="run.toml (missing keys take the defaults)")
    c.add_argument("--coordinator", help="coordinator address (default: the signing account)")
    c.add_argument("--corpus", type=Path, help="corpus directory (veriloco data prepare|import; default: stdlib bytes)")
    c.add_argument("--json", action="store_true", help="print a JSON object instead of the run id")
    add_connection_args(c)
    c.set_defaults(func=cmd_run_create)

    s = sub.add_parser("status", help="query a run's round status from the contract")
    s.add_argument("--run", type=int, required=True, help="run id")
    s.add_argument("--epoch", type=int, help="epoch to show (default: the current one)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_connection_args(s)
    s.set_defaults(func=cmd_status)


def cmd_deploy(args: argparse.Namespace) -> int:
    s = resolve(args, need_key=True, need_contract=False)
    w3 = connect(s.rpc_url)
    account = Account.from_key(s.key)
    address = deploy(w3, account)
    if args.json:
        print(json.dumps({"contract": address, "chain_id": int(w3.eth.chain_id), "rpc_url": s.rpc_url,
                          "deployer": account.address}))
    else:
        print(address)
    return 0


def cmd_run_create(args: argparse.Namespace) -> int:
    from protocol.config import load_toml
    from protocol.run import publish_run
    from protocol.tokens import load_corpus_dir

    s = resolve(args, need_key=True, need_contract=True)
    cfg = load_toml(args.config)
    chain = Chain(s.rpc_url, str(s.contract), Account.from_key(s.key))
    own = load_corpus_dir(args.corpus) if args.corpus else None  # users' own data, published with the run
    run_id, _ = publish_run(chain, open_store(s), cfg, coordinator=args.coordinator, corpus=own.corpus if own else None,
                            tokenizer=own.tokenizer if own else None, vocab_size=own.vocab_size if own else 0)
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
    report = status_report(chain, args.run, args.epoch)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def status_report(chain: Chain, run_id: int, epoch: int | None = None) -> dict[str, Any]:
    """Everything `status` shows, as plain JSON-able data (also used by tests and the demo)."""
    info = chain.run_info(run_id)
    current = chain.current_epoch(run_id)
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
        if sub.state == 0 and (mem.role != 1 or not (mem.join_epoch <= e < (mem.leave_epoch or 2**32))):
            continue
        mine = [ev for ev in events if ev.args.get("trainer") == addr]
        trainers.append(_trainer_row(chain, run_id, e, slot, addr, sub, mem, mine))
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
            "final_check_bps": p.final_check_bps,
            "trainer_stake_wei": p.trainer_stake,
            "verifier_stake_wei": p.verifier_stake,
            "slash_bps": p.slash_bps,
        },
        "trainers": trainers,
        "previous_epoch": previous,
    }


def _trainer_row(chain: Chain, run_id: int, epoch: int, slot: int, addr: str, sub: Any, mem: Any,
                 events: list[ChainEvent]) -> dict[str, Any]:
    revealed = next((ev for ev in events if ev.name == "Revealed"), None)
    responded = next((ev for ev in events if ev.name == "Responded"), None)
    slashed = next((ev for ev in events if ev.name == "Slashed"), None)
    verdicts = [
        {"verifier": ev.args["verifier"], "passed": bool(ev.args["passed"]), "evidence_cid": ev.args["evidenceCid"]}
        for ev in events if ev.name == "VerdictSubmitted"
    ]
    assigned = chain.assignment(run_id, epoch, addr)
    if sub.passed:
        outcome = "passed"
    elif assigned.verifiers and sub.fail_votes > len(assigned.verifiers) // 2:
        outcome = "failed"
    elif slashed is not None:
        outcome = "slashed: " + SLASH_REASONS.get(int(slashed.args["reason"]), "?")
    else:
        outcome = "pending" if sub.state else "-"
    return {
        "address": addr,
        "slot": slot,
        "stake_wei": mem.stake,
        "state": STATE_NAMES.get(sub.state, str(sub.state)),
        "leaf_count": sub.leaf_count,
        "trace_root": "0x" + sub.trace_root.hex() if sub.state >= 2 else "",
        "payload_cid": revealed.args["payloadCid"] if revealed else "",
        "payload_digest": "0x" + revealed.args["payloadDigest"].hex() if revealed else "",
        "manifest_cid": responded.args["manifestCid"] if responded else "",
        "challenged_steps": list(assigned.steps),
        "final_check": assigned.final_check,
        "assigned_verifiers": list(assigned.verifiers),
        "pass_votes": sub.pass_votes,
        "fail_votes": sub.fail_votes,
        "verdicts": verdicts,
        "outcome": outcome,
        "slashed_wei": int(slashed.args["amount"]) if slashed else 0,
    }


def _when(ts: int, now: int) -> str:
    if not ts:
        return "-"
    delta = ts - now
    stamp = time.strftime("%H:%M:%S", time.gmtime(ts))
    return f"{stamp} ({'in ' + str(delta) + 's' if delta > 0 else str(-delta) + 's ago'})"


def _short(a: str, n: int = 10) -> str:
    return a if len(a) <= 2 * n + 1 else f"{a[:n]}…{a[-6:]}"


def render(r: dict[str, Any]) -> str:
    """A readable table of a status report."""
    d, now, run = r["deadlines"], r["chain_time"], r["run"]
    lines = [
        f"run {r['run_id']} on chain {r['chain_id']} at {r['contract']}",
        f"  config {run['config_cid']}   coordinator {run['coordinator']}",
        (f"  trainers {run['active_trainers']}/{run['max_trainers']} (min {run['min_trainers']})   "
         f"verifiers {run['verifiers']}   quorum {run['quorum']}   audit steps {run['audit_steps']}"),
        "",
        f"epoch {r['epoch']} (current {r['current_epoch']}): {r['phase'].upper()}",
        (f"  committed {r['committed']}/{r['expected']}   revealed {r['revealed']}   responded {r['responded']}   "
         f"passed {r['passed']}   failed {r['failed']}"),
        f"  model {r['model_cid'] or '-'}",
        f"  commits close   {_when(d['commits_close'], now)}",
        f"  reveals close   {_when(d['reveals_close'], now)}",
        f"  responses due   {_when(d['response_deadline'], now)}",
        f"  verdicts due    {_when(d['verdict_deadline'], now)}",
        f"  finalize by     {_when(d['finalize_deadline'], now)}",
    ]
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
        votes = f"{t['pass_votes']}+/{t['fail_votes']}-/{need}" if t["state"] in ("responded",) or need else "-"
        lines.append(
            f"{t['slot']:>4}  {_short(t['address']):<22} {t['state']:<10} {t['leaf_count'] or '-':>6}  "
            f"{votes:>7}  {t['outcome']:<22} {t['payload_cid'] or '-'}"
        )
    if not r["trainers"]:
        lines.append("  (no trainers in this epoch)")
    return "\n".join(lines)
