"""What a verifier derives about a trainer's windows (issue 48, docs/protocol.md §5.4): which post fixed
each window's root, whether the revealed trace is the one those roots make, and which transitions are
challenged. Pure over injected reads (the chain's posts and block hashes, the store's evidence).

The trainer's manifest names all of its window roots; each root a post fixed must be that one, and
together they must rebuild the revealed trace root (so a trace cannot differ from its posted windows,
across a boundary or anywhere). A window with a fixed root and a safe seed is drawn from its own seed;
a window nobody posted (a stalled chain, a relay and a trainer both offline) is drawn after the epoch
from the audit seed, at the same per-step rate: it costs that trainer the memory it kept, not a
slashing, and buys no escape, since each step's chance is the same either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol import relay, windows
from protocol.chain import errors as ce
from protocol.chain.audit import rate_draw
from protocol.chain.binding import Chain, ChainUnavailable, Phase, Role, Sub
from protocol.errors import VerilocoError
from protocol.relay import Domain
from protocol.windowdraw import (
    ChainOrdering,
    WindowPost,
    evidence_root,
    first_post,
    window_challenges,
)


@dataclass
class WindowedAudit:
    """The outcome for one trainer-epoch. `findings` empty: its windows agree with its trace."""

    drawn: list[int] = field(default_factory=list)  # challenged transitions k -> k + 1, ascending
    fixed: dict[int, WindowPost] = field(default_factory=dict)  # window -> the post that fixed its root
    post_hoc: list[int] = field(default_factory=list)  # windows drawn from the audit seed (never posted)
    pending: list[int] = field(default_factory=list)  # windows posted whose seed is not yet deep enough
    seeds: dict[int, bytes] = field(default_factory=dict)  # window -> the seed its draws came from
    findings: list[str] = field(default_factory=list)

    def seed_of(self, k: int, W: int) -> bytes:
        """The seed transition k -> k + 1 was drawn from (its block and group come from it too)."""
        return self.seeds[windows.transition_window(k, W)]


def audit_windows(
    *, posts: Sequence[WindowPost], evidence: Callable[[str], bytes], domain: Domain, position: int,
    relay_address: str, trainer: str, claimed: Sequence[bytes], trace_root: bytes, leaf_count: int, W: int,
    rate: int, audit_seed: bytes, block_hash: Callable[[int], bytes | None], head: int, depth: int,
    before: tuple[int, int] | None = None,
) -> WindowedAudit:
    """`claimed`: the window roots the trainer's manifest names, in window order; `position`: the
    trainer's slot. `before`: the (block, log index) of the trainer's reveal: a post from then on does
    not count, so a trainer that has seen the audit seed (which draws its unposted windows) cannot post
    such a window late to draw it again from a seed it likes better."""
    out = WindowedAudit()
    W = windows.width(W, leaf_count)
    try:
        rebuilt = windows.root_from_windows(claimed, leaf_count, W)
    except windows.WindowError as exc:
        out.findings.append(f"the manifest's window roots do not fit the trace: {exc}")
        return out
    if rebuilt != bytes(trace_root):
        out.findings.append("the manifest's window roots do not rebuild the revealed trace root")
        return out
    if before is not None:
        posts = [p for p in posts if (p.block, p.log_index) < before]

    def holds(p: WindowPost) -> bytes | None:
        return evidence_root(p, evidence, domain, trainer, position)

    for w in range(windows.window_count(leaf_count, W)):
        got = first_post(posts, w, trainer, position, relay_address, holds)
        if got is None:
            out.post_hoc.append(w)
            out.seeds[w] = bytes(audit_seed)
            out.drawn += [k for k in windows.transitions(w, W, leaf_count) if rate_draw(audit_seed, trainer, k) < rate]
            continue
        post, root = got
        out.fixed[w] = post
        if root != bytes(claimed[w]):
            out.findings.append(f"window {w}'s posted root is not the one the manifest names (the trace changed after posting)")
            continue
        seed = ChainOrdering(domain, {w: post.block}.get, block_hash, lambda: head, depth).seed(w)
        if seed is None:
            out.pending.append(w)
            continue
        out.seeds[w] = bytes(seed)
        out.drawn += window_challenges(seed, trainer, rate, W, w, leaf_count)
    out.drawn.sort()
    return out


class SeedsPending(ChainUnavailable):
    """A window's seed is not yet deep enough to act on: like an outage, it passes once the chain has made
    a few more blocks (a node waits and tries again; a verifier never fails a trainer on it)."""


def domain_of(chain: Chain, run_id: int, epoch: int) -> Domain:
    return Domain(chain.chain_id, chain.address, run_id, epoch)


def epoch_positions(chain: Chain, run_id: int, epoch: int) -> list[str]:
    """The relay's positions for an epoch: the trainer at each contract slot eligible in it, "" elsewhere.
    A trainer's position is its slot, which no reader needs this list to know (`read_evidence`)."""
    out = []
    for slot in range(chain.run_info(run_id).trainer_slots):
        t = chain.trainer_at(run_id, slot)
        m = chain.member(run_id, t)
        ok = m.role == Role.TRAINER and m.slot == slot and m.join_epoch <= epoch and (
            m.leave_epoch is None or epoch < m.leave_epoch)
        out.append(t if ok else "")
    return out


def chain_windows(chain: Chain, store: Any, *, run_id: int, epoch: int, trainer: str, slot: int,
                  claimed: Sequence[bytes], trace_root: bytes, leaf_count: int, W: int, depth: int) -> WindowedAudit:
    """`audit_windows` over what the chain and the store say (the trainer's and the verifiers' one reading):
    the posts before the trainer's reveal, the epoch's audit seed and rate, the coordinator as relay.
    Raises SeedsPending while a posted window's seed is not `depth` blocks deep."""
    info, times = chain.run_info(run_id), chain.epoch_times(run_id, epoch)
    reveal = chain.revealed(run_id, epoch, trainer)
    out = audit_windows(
        posts=chain.window_posts(run_id, epoch),
        evidence=lambda cid: store.get(cid, max_size=relay.MAX_EVIDENCE_BYTES),
        domain=domain_of(chain, run_id, epoch), position=slot, relay_address=info.params.coordinator,
        trainer=trainer, claimed=claimed, trace_root=trace_root, leaf_count=leaf_count, W=W,
        rate=info.params.audit_rate, audit_seed=times.seed,
        block_hash=lambda n: chain.block_hash(n) if n <= chain.block_number() else None,
        head=chain.block_number(), depth=depth,
        before=(reveal[0].block_number, reveal[0].log_index) if reveal else None,
    )
    if out.pending and not out.findings:
        raise SeedsPending(f"epoch {epoch}'s windows {out.pending} of {trainer}: their seeds are not {depth} blocks deep")
    return out


def bound_to_commit(posts: Sequence[WindowPost], evidence: Callable[[str], bytes], domain: Domain,
                    relay_address: str) -> dict[str, relay.SignedRoot | None]:
    """Every trainer a window post of the epoch binds to commit it (docs/protocol.md §5.4): the signer of a
    root an aggregate's evidence holds (the signature is the proof the contract checks), and the poster of
    its own root (None: the contract remembers it). Once a window is posted its draws are known, so a
    trainer bound here that never commits is slashed (`reportAbandoned`). Evidence that cannot be read or
    does not rebuild its post binds nobody."""
    out: dict[str, relay.SignedRoot | None] = {}
    for p in posts:
        if p.poster.lower() != relay_address.lower():
            out[p.poster] = None
            continue
        try:
            bound = relay.read_evidence(evidence(p.evidence), domain, p.window, p.root, p.bitmap)
        except VerilocoError:
            continue
        for m in bound.values():
            out.setdefault(m.trainer, m)
    return out


def may_bind(posts: Sequence[WindowPost], trainer: str, slot: int) -> bool:
    """Whether a post of the epoch may bind `trainer` (`bound_to_commit` without reading evidence): its own
    post, or its bit in an aggregate. The cautious reading, for a check that needs no store (`leave`)."""
    return any(p.poster.lower() == trainer.lower() or (p.bitmap >> slot) & 1 for p in posts)


def abandoned(chain: Chain, store: Any, run_id: int, epoch: int) -> dict[str, relay.SignedRoot | None]:
    """The trainers bound to commit `epoch` (`bound_to_commit`) that did not, with their proof; call once
    its commits closed (a trainer the contract let leave or removed first is its to refuse)."""
    info = chain.run_info(run_id)
    bound = bound_to_commit(chain.window_posts(run_id, epoch),
                            lambda cid: store.get(cid, max_size=relay.MAX_EVIDENCE_BYTES),
                            domain_of(chain, run_id, epoch), info.params.coordinator)
    return {t: m for t, m in bound.items() if chain.submission(run_id, epoch, t).state == Sub.NONE}


def report_abandoned(chain: Chain, store: Any, run_id: int, epoch: int, log: Callable[..., None]) -> bool:
    """Report every trainer `abandoned` finds in `epoch` (the coordinator and every verifier do, so a
    silent one stops nothing); False while the epoch still takes commitments (nothing to report yet).
    A report the contract refuses (another member reported first, the trainer left or was removed) is
    said and not retried; an outage propagates, and the caller tries again."""
    if chain.epoch_status(run_id, epoch).phase in (Phase.NOT_STARTED, Phase.COMMITTING):
        return False
    for t, signed in abandoned(chain, store, run_id, epoch).items():
        try:
            tx = (chain.report_abandoned(run_id, epoch, t) if signed is None else
                  chain.report_abandoned(run_id, epoch, t, signed.window, signed.root, signed.signature))
            log("abandon-reported", epoch=epoch, trainer=t, gas=tx.gas_used)
        except (ce.NotAbandoned, ce.NotSignedBy, ce.WrongPhase) as exc:
            log("abandon-report-refused", epoch=epoch, trainer=t, detail=str(exc))
    return True
