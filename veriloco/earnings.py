"""`veriloco earnings`: what an account earned and lost on a contract, read from its events alone.

    veriloco earnings --account N | --key FILE | --address 0x... [--run ID] [--json]

Every reward and bounty is a `Credited` event (one per credit, with its kind and, for a bounty, the
account whose slash paid it); every slash is a `Slashed` (reason by name), a `VerifierSlashed`, or a
`ModelConfirmed` that replaced the model this account finalized. So an operator can see why they
were (not) paid without trusting any node's log, and the totals agree with `credits` on the
contract (rewards + bounties - claimed = claimable now).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from protocol.errors import VerilocoError
from veriloco.argtypes import address, run_id
from veriloco.settings import add_connection_args, resolve

if TYPE_CHECKING:
    from protocol.chain.binding import Chain, ChainEvent

EVENTS = ["Credited", "Slashed", "VerifierSlashed", "ModelConfirmed", "EpochFinalized"]
ZERO = "0x" + "00" * 20


class EarningsError(VerilocoError):
    """No account to report on."""


@dataclass(frozen=True)
class Entry:
    """One credit (positive `amount_wei`) or slash (negative) of the account."""

    run_id: int
    epoch: int
    kind: str  # "reward", "bounty" or "slash"
    amount_wei: int
    why: str
    tx: str
    block: int
    log_index: int  # with `block`: the entry's place in the chain


def register(sub: Any) -> None:
    help_ = "every reward, bounty and slash of an account, from the contract's events, with totals"
    p = sub.add_parser("earnings", help=help_, description=help_)
    p.add_argument("--address", type=address,
                   help="the account to report on (default: the signing key's, from --key or --account)")
    p.add_argument("--run", type=run_id, help="only this run (default: every run of the contract)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_connection_args(p)
    p.set_defaults(func=cmd_earnings)


def cmd_earnings(args: argparse.Namespace) -> int:
    from eth_account import Account

    from protocol.chain.binding import Chain
    from protocol.statedir import check_run

    s = resolve(args, need_key=False, need_contract=True)
    who = args.address or (Account.from_key(s.key).address if s.key else None)
    if who is None:
        raise EarningsError("no account: pass --address 0x..., or --key FILE / --account N for a key's own account")
    chain = Chain(s.rpc_url, str(s.contract))
    if args.run is not None:
        check_run(chain, args.run)
    report = earnings(chain, who, args.run)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def earnings(chain: Chain, account: str, run: int | None = None) -> dict[str, Any]:
    """The account's entries (chain order) and totals, as JSON-able data."""
    events = chain.events(EVENTS, run_id=run)
    entries = sorted([*_credits(events, account), *_slashes(chain, events, account)], key=lambda e: (e.block, e.log_index))
    claims = [ev for ev in chain.events(["Claimed"]) if ev.args["account"] == account]
    rewards = sum(e.amount_wei for e in entries if e.kind == "reward")
    bounties = sum(e.amount_wei for e in entries if e.kind == "bounty")
    slashed = -sum(e.amount_wei for e in entries if e.kind == "slash")
    return {
        "account": account,
        "contract": chain.address,
        "chain_id": chain.chain_id,
        "run_id": run,
        "entries": [asdict(e) for e in entries],
        "totals": {
            "rewards_wei": rewards,
            "bounties_wei": bounties,
            "slashed_wei": slashed,
            "net_wei": rewards + bounties - slashed,
            "claimed_wei": sum(int(ev.args["amount"]) for ev in claims),  # every run's credits: one balance
            "claimable_wei": int(chain.credits(account)),
        },
    }


def slashes(chain: Chain, account: str, run: int) -> list[Entry]:
    """The account's slashes in `run`, in chain order, each with its reason by name (what a node that
    ends slashed says, veriloco/nodes.py)."""
    events = chain.events(EVENTS, run_id=run)
    return sorted(_slashes(chain, events, account), key=lambda e: (e.block, e.log_index))


def _entry(ev: ChainEvent, kind: str, amount: int, why: str) -> Entry:
    return Entry(int(ev.args["runId"]), int(ev.args["epoch"]), kind, amount, why, ev.tx_hash, ev.block_number,
                 ev.log_index)


def _credits(events: list[ChainEvent], account: str) -> Iterable[Entry]:
    """Rewards and bounties: the account's Credited events; a bounty names the slash that paid it."""
    from protocol.chain.binding import CREDIT_KINDS, SLASH_REASONS

    for ev in events:
        if ev.name != "Credited":
            continue
        a, kind = ev.args, CREDIT_KINDS.get(int(ev.args["kind"]), f"credit of kind {ev.args['kind']}")
        if kind == "compensation" and a["source"] == account:  # paid out of this verifier's stake
            yield _entry(ev, "slash", -int(a["amount"]), f"no verdict on {a['account']} by the deadline: paid its trainer reward")
            continue
        if a["account"] != account:
            continue
        if kind == "compensation":
            yield _entry(ev, "reward", int(a["amount"]), f"trainer reward paid by {a['source']}, which cast no verdict on it in time")
            continue
        if kind != "bounty":
            why = {"trainer reward": "passed its audit (trainer reward)",
                   "verdict reward": "verdicts with the majority (verifier reward)"}.get(kind, kind)
            yield _entry(ev, "reward", int(a["amount"]), why)
            continue
        src = a["source"]
        same_tx = [x for x in events if x.tx_hash == ev.tx_hash]
        slash = next((x for x in same_tx if x.name == "Slashed" and x.args["trainer"] == src), None)
        if slash is not None:
            cause = SLASH_REASONS.get(int(slash.args["reason"]), f"reason {slash.args['reason']}")
        elif any(x.name == "ModelConfirmed" for x in same_tx):
            cause = "finalized a wrong model"
        else:
            cause = "slashed"
        why = f"share of {src}'s slash ({cause})"
        yield _entry(ev, "bounty", int(a["amount"]), why)


def _slashes(chain: Chain, events: list[ChainEvent], account: str) -> Iterable[Entry]:
    """The account's slashes: as a trainer or reporter (Slashed), as a verifier (VerifierSlashed, the
    reason read from the votes and slashes around it), as a finalizer (a corrected ModelConfirmed)."""
    from protocol.chain.binding import SLASH_REASONS

    for ev in events:
        a = ev.args
        if ev.name == "Slashed" and a["trainer"] == account:
            why = SLASH_REASONS.get(int(a["reason"]), f"reason {a['reason']}")
        elif ev.name == "VerifierSlashed" and a["verifier"] == account:
            why = _verifier_slash(chain, events, ev)
        elif ev.name == "ModelConfirmed" and a["corrected"] and int(a["slashed"]) and _finalizer(chain, events, ev) == account:
            why = "finalized a wrong model (the attestation committee replaced it)"
            yield _entry(ev, "slash", -int(a["slashed"]), why)
            continue
        else:
            continue
        yield _entry(ev, "slash", -int(a["amount"]), why)


def _verifier_slash(chain: Chain, events: list[ChainEvent], ev: ChainEvent) -> str:
    """Why a verifier was slashed: its verdicts never revealed, a pass on a payload nobody could
    produce, a vote against the majority, or the majority's vote with another replay witness."""
    a, trainer = ev.args, ev.args["trainer"]
    if trainer == ZERO:
        return "verdicts committed and never revealed"
    same_tx = [x for x in events if x.tx_hash == ev.tx_hash and x.name == "Slashed" and x.args["trainer"] == trainer]
    reasons = {int(x.args["reason"]) for x in same_tx}
    if 4 in reasons:
        return f"passed {trainer}, whose payload nobody could produce"
    votes = chain.events(["VerdictSubmitted"], run_id=int(a["runId"]), epoch=int(a["epoch"]), trainer=trainer)
    vote = next((x.args["passed"] for x in votes if x.args["verifier"] == a["verifier"]), None)
    majority_passed = 3 not in reasons
    if vote is not None and bool(vote) == majority_passed:
        return f"voted with the majority on {trainer} but with another replay witness (did not replay)"
    return f"voted against the majority on {trainer}"


def _finalizer(chain: Chain, events: list[ChainEvent], confirmed: ChainEvent) -> str | None:
    """Who finalized the epoch a ModelConfirmed is about: the sender of its EpochFinalized transaction."""
    a = confirmed.args
    fin = next((x for x in events if x.name == "EpochFinalized" and x.args["runId"] == a["runId"]
                and x.args["epoch"] == a["epoch"]), None)
    if fin is None:
        return None
    return str(chain.w3.eth.get_transaction(fin.tx_hash)["from"])  # type: ignore[arg-type]


def _eth(wei: int, sign: bool = False) -> str:
    if not wei:
        return "0 ETH"
    return f"{wei / 1e18:+.6g} ETH" if sign else f"{wei / 1e18:.6g} ETH"


def render(r: dict[str, Any]) -> str:
    """A readable table: one line per credit or slash, then the totals."""
    t = r["totals"]
    scope = f"run {r['run_id']}" if r["run_id"] is not None else "all runs"
    lines = [f"earnings of {r['account']} on chain {r['chain_id']} at {r['contract']} ({scope})"]
    if r["entries"]:
        lines.append(f"{'run':>4} {'epoch':>5}  {'kind':<7} {'amount':>16}  {'transaction':<66}  why")
    for e in r["entries"]:
        lines.append(f"{e['run_id']:>4} {e['epoch']:>5}  {e['kind']:<7} {_eth(e['amount_wei'], True):>16}  "
                     f"{e['tx']:<66}  {e['why']}")
    if not r["entries"]:
        lines.append("  no rewards, bounties or slashes")
    lines.append(f"totals: rewards {_eth(t['rewards_wei'])}, bounties {_eth(t['bounties_wei'])}, "
                 f"slashed {_eth(t['slashed_wei'])}, net {_eth(t['net_wei'], True)}")
    lines.append(f"credits: claimed {_eth(t['claimed_wei'])} so far, claimable now {_eth(t['claimable_wei'])}"
                 + (" (`veriloco claim`)" if t["claimable_wei"] else ""))
    return "\n".join(lines)
