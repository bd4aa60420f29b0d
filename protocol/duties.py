"""What a node still owes its run on chain, and by when (issue 46): a stopping node names it.

A trainer stopped between its commit and its answer is slashed if it is not back in time, and an
operator who reads only "stopped" cannot know that. So a node's `stopped` line lists each duty still
open with its chain-time deadline: a trainer's reveal (committed, not revealed) and audit answer
(revealed, challenged, not answered), a verifier's verdicts while an epoch it may judge is auditing.
Read from the contract alone, for the last few epochs (those that can still be open).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from protocol.chain.binding import Chain

OPEN_EPOCHS = 3  # an epoch trains, another is audited, a third may wait for its finalize


def _when(deadline: int, now: int) -> str:
    return f"{time.strftime('%H:%M:%S', time.gmtime(deadline))} UTC, in {deadline - now} s of chain time"


def _judges(chain: Chain, run_id: int, epoch: int, address: str) -> bool:
    """Whether ``address`` is on the epoch's frozen verifier list (every one of them commits verdicts)."""
    return address.lower() in {v.lower() for v in chain.frozen_verifiers(run_id, epoch)}


def _revealed(chain: Chain, run_id: int, epoch: int, address: str) -> bool:
    """Whether ``address`` has revealed its verdicts for the epoch: then it owes the epoch nothing more."""
    return any(str(ev.args["verifier"]).lower() == address.lower()
               for ev in chain.events(["VerdictsRevealed"], run_id=run_id, epoch=epoch))


def pending(chain: Chain, run_id: int, address: str, role: str) -> list[str]:
    """Each open duty of ``address`` in ``run_id`` as ``"epoch E: what by HH:MM:SS UTC, in N s"``,
    soonest first; empty when it owes nothing (or is a coordinator, whose stand-ins take over)."""
    from protocol.chain.binding import Phase, Sub

    if role not in ("trainer", "verifier"):
        return []
    now = chain.now()
    last = chain.run_info(run_id).next_epoch
    due: list[tuple[int, str]] = []
    for e in range(max(0, last - OPEN_EPOCHS), last + 1):
        phase = chain.epoch_status(run_id, e).phase
        if phase in (Phase.NOT_STARTED, Phase.FINALIZED, Phase.ABORTED, Phase.CONFIRMING):
            continue
        t = chain.epoch_times(run_id, e)
        if role == "verifier":
            if (phase is Phase.AUDITING and t.seeded and now < t.verdict_deadline
                    and _judges(chain, run_id, e, address) and not _revealed(chain, run_id, e, address)):
                due.append((t.verdict_deadline, f"epoch {e}: verdicts on its assigned trainers by {_when(t.verdict_deadline, now)}"))
            continue
        state = chain.submission(run_id, e, address).state
        if state == Sub.COMMITTED and now < t.reveals_close:
            due.append((t.reveals_close, f"epoch {e}: reveal by {_when(t.reveals_close, now)}"))
        elif state == Sub.REVEALED and t.seeded and now < t.response_deadline:
            due.append((t.response_deadline, f"epoch {e}: audit answer by {_when(t.response_deadline, now)}"))
    return [text for _, text in sorted(due)]


__all__ = ["pending"]
