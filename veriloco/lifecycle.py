"""`veriloco leave | withdraw | claim`: the end of a membership, with the contract's own functions.

    veriloco leave --run ID      stop taking part (a trainer after the epochs already opened); the stake starts unbonding
    veriloco withdraw --run ID   take the stake back once it has unbonded (says when, if not yet)
    veriloco claim               take out the credits (rewards and bounties) the contract holds for this account

Each command reads the membership first and refuses, with the reason and the time to come back,
what the contract would revert; a revert the checks did not foresee is still one clean line.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from eth_account import Account

from protocol.chain.binding import Chain, MemberInfo, Role, Sub
from protocol.errors import VerilocoError
from protocol.membership import ROLE_NAMES
from protocol.statedir import check_run
from public.windowaudit import may_bind
from veriloco.argtypes import run_id
from veriloco.settings import add_connection_args, resolve, withdraw_command


class LifecycleError(VerilocoError):
    """A leave, withdraw or claim that cannot happen (yet)."""


def _eth(wei: int) -> str:
    return f"{wei / 1e18:g} ETH"


def _at(ts: int, now: int) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))
    delta = ts - now
    return f"{stamp} UTC chain time ({'in ' + str(delta) + ' s' if delta > 0 else 'now'})"


def _chain(args: argparse.Namespace) -> Chain:
    s = resolve(args, need_key=True, need_contract=True)
    chain = Chain(s.rpc_url, str(s.contract), Account.from_key(s.key), max_fee=s.max_fee_wei)
    if getattr(args, "run", None) is not None:
        check_run(chain, args.run)
    return chain


def _member(chain: Chain, run: int, none: str) -> tuple[MemberInfo, int]:
    """This account's membership and when its stake unbonds (if it left); ``none`` is the refusal for a non-member."""
    assert chain.sender is not None
    m = chain.member(run, chain.sender)
    if m.role == Role.NONE:
        raise LifecycleError(f"{chain.sender} {none}")
    return m, m.left_at + chain.run_info(run).params.unbonding_delay


def cmd_leave(args: argparse.Namespace) -> int:
    chain = _chain(args)
    m, available = _member(chain, args.run, f"is not a member of run {args.run}; there is nothing to leave")
    if m.leave_epoch is not None:
        raise LifecycleError(
            f"{chain.sender} already left run {args.run} (its last epoch was {m.leave_epoch - 1}); its stake unbonds "
            f"at {_at(available, chain.now())}, then `{withdraw_command(args)}`"
        )
    assert chain.sender is not None
    e = chain.run_info(args.run).next_epoch  # the epoch in training: leaving now takes it out of it
    if (m.role == Role.TRAINER and not args.anyway and chain.submission(args.run, e, chain.sender).state == Sub.NONE
            and may_bind(chain.window_posts(args.run, e), chain.sender, m.slot)):
        raise LifecycleError(
            f"{chain.sender}'s window roots of epoch {e} are posted (a windowed run): leaving now takes it out of "
            f"epoch {e} before it commits, which is slashed as abandoning it (docs/protocol.md §5.4). Leave once "
            f"epoch {e} is committed (its trainer node commits it; `veriloco status --run {args.run}` shows it), "
            "or pass --anyway to leave and lose that stake")
    chain.leave(args.run)
    m, available = _member(chain, args.run, f"is not a member of run {args.run}")
    role = ROLE_NAMES.get(m.role, str(m.role))
    print(f"left run {args.run} as {role} {chain.sender}: "
          + (f"it takes part in no epoch from {m.leave_epoch} on (a running trainer node stops before training it); "
             if m.role == Role.TRAINER else "")
          + f"the stake of {_eth(m.stake)} unbonds at {_at(available, chain.now())}; "
          f"then `{withdraw_command(args)}`")
    return 0


def cmd_withdraw(args: argparse.Namespace) -> int:
    chain = _chain(args)
    m, available = _member(chain, args.run, f"has no stake in run {args.run} (never joined, or already withdrew)")
    if m.leave_epoch is None:
        raise LifecycleError(f"{chain.sender} is still a member of run {args.run}; `veriloco leave --run {args.run}` "
                             "first, then withdraw once the stake has unbonded")
    now = chain.now()
    if now < available:
        raise LifecycleError(f"the stake in run {args.run} is still bonded: it unbonds at {_at(available, now)}; "
                             "run `veriloco withdraw` again then")
    res = chain.withdraw(args.run)
    paid = next((int(e.args["amount"]) for e in res.events if e.name == "Withdrawn"), 0)
    print(f"withdrew {_eth(paid)} from run {args.run} to {chain.sender} (tx {res.tx_hash})")
    return 0


def cmd_claim(args: argparse.Namespace) -> int:
    chain = _chain(args)
    assert chain.sender is not None
    credits = int(chain.credits(chain.sender))
    if credits == 0:
        print(f"nothing to claim: {chain.sender} has no credits on {chain.address}")
        return 0
    res = chain.claim()
    print(f"claimed {_eth(credits)} to {chain.sender} (tx {res.tx_hash})")
    return 0


def register(sub: Any) -> None:
    for name, func, help_ in (
        ("leave", cmd_leave, "leave a run: stop taking part; the stake starts unbonding"),
        ("withdraw", cmd_withdraw, "withdraw a run's stake once it has unbonded after `leave`"),
    ):
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--run", type=run_id, required=True, help="run id (see `veriloco runs`)")
        if name == "leave":
            p.add_argument("--anyway", action="store_true",
                           help="leave even while window roots of the epoch in training are posted (that is slashed)")
        add_connection_args(p)
        p.set_defaults(func=func)
    c = sub.add_parser("claim", help="claim this account's credits (rewards and bounties) from the contract")
    add_connection_args(c)
    c.set_defaults(func=cmd_claim)
