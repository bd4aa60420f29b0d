"""Build an epoch's new global model from the chain and the store, as the coordinator and verifiers do.

Deterministic: the passing trainers are read from the contract, their payloads are decoded in
ascending address order (the order `finalize` lists them), and `coordinator.aggregate` sums in that
order. The previous global state is the newest finalized one (G_0 with zero momentum at first).
"""

from __future__ import annotations

from coordinator.aggregate import aggregate
from coordinator.outer import MOM, GlobalState, OuterConfig, global_params, init_global
from protocol.chain import Chain
from protocol.digest import state_digest
from protocol.payload import PayloadError, decode, unwrap
from protocol.run import RunContext, latest_model, load_model, passing_trainers, revealed_payload
from protocol.store import Store
from protocol.types import Address, Digest


def previous_global(chain: Chain, store: Store, ctx: RunContext, epoch: int) -> GlobalState:
    """G_epoch: the newest model finalized before `epoch`, with its outer momentum."""
    cid, digest, _ = latest_model(chain, ctx, epoch)
    state = load_model(store, cid, digest, ctx.param_shapes)
    if not any(k.startswith(MOM) for k in state):  # G_0 is published as parameters only
        state = init_global(global_params(state))
    return state


def build_global(chain: Chain, store: Store, ctx: RunContext, epoch: int) -> tuple[GlobalState, list[Address], Digest]:
    """(new global state, included trainers, its digest) for `epoch`; unchanged if nobody passed."""
    g = previous_global(chain, store, ctx, epoch)
    included = passing_trainers(chain, ctx.run_id, epoch, ctx.info.params.quorum)
    deltas = []
    for t in included:
        ev = chain.revealed(ctx.run_id, epoch, t)[0].args
        data = revealed_payload(store, ev)
        try:
            deltas.append(decode(unwrap(data, run_id=ctx.run_id, epoch=epoch, trainer=t).body, ctx.param_shapes))
        except PayloadError:
            continue  # verifiers decode every payload before passing it; skip rather than poison the model
    if deltas:
        o = ctx.config.outer
        g = aggregate(g, deltas, OuterConfig(lr=o.lr, momentum=o.momentum, clip=o.clip))
    return g, included, state_digest(g)
