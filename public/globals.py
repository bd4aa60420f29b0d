"""Recompute the global model from the chain and the store: the coordinator proposes it, trainers
build on it and verifiers check it, each from its own recomputation, never from a downloaded model.

Deterministic: the passing trainers are read from the contract's events, their payloads are
decoded in ascending address order (the order `finalize` lists them), and `dilocox.aggregate`
sums in that order (with `outer.aggregate` = "trimmed" or "median": per coordinate, in value order).
The state an epoch aggregates onto is recomputed recursively from G_0 (`VerifiedGlobals`), so a
coordinator that finalized a wrong model changes nobody's base: every honest node keeps building on
the true aggregate, and a mismatch is one log line, not a crash.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dilocox.aggregate import aggregate
from dilocox.outer import MOM, GlobalState, from_section, global_params, init_global
from protocol.chain.binding import Chain, Phase
from protocol.digest import state_digest
from protocol.errors import VerilocoError
from protocol.formats.codec import FormatError, load_state_file, write_state
from protocol.formats.payload import PayloadError, open_publication
from protocol.run import RunContext, initial_model, load_model, passing_trainers, revealed_payload
from protocol.store.backends import Store, StoreError, StoreUnavailable
from protocol.types import Address, Digest

Log = Callable[..., None]


class ModelUnavailable(VerilocoError):
    """A global state nobody can recompute yet: an earlier epoch is still open, or a passing payload is missing."""


class PayloadMissing(ModelUnavailable):
    """A passing trainer's payload cannot be fetched (gone, or not the bytes its CID and digest name).

    Says whose and which epoch's, so the coordinator can report exactly that trainer's payload to
    its availability committee (docs/protocol.md §10.2) once it has stayed missing too long.
    """

    def __init__(self, message: str, *, epoch: int, trainer: Address, cid: str) -> None:
        super().__init__(message)
        self.epoch, self.trainer, self.cid = epoch, trainer, cid


def epoch_update(chain: Chain, store: Store, ctx: RunContext, epoch: int, g: GlobalState) -> tuple[GlobalState, list[Address]]:
    """(`g` stepped with `epoch`'s passing payloads, the passing trainers); `g` itself if none decodes."""
    included = passing_trainers(chain, ctx.run_id, epoch, ctx.info.params.quorum)
    deltas = []
    for t in included:
        ev = chain.revealed(ctx.run_id, epoch, t)[0].args
        try:
            data = revealed_payload(store, ev)
        except StoreUnavailable:
            raise  # our own store is down: wait it out, the content may well be there
        except StoreError as exc:
            raise PayloadMissing(f"epoch {epoch}: passing trainer {t}'s payload {ev['payloadCid']}: {exc}",
                                 epoch=epoch, trainer=t, cid=ev["payloadCid"]) from exc
        try:
            deltas.append(open_publication(data, ctx.param_shapes, run_id=ctx.run_id, epoch=epoch, trainer=t))
        except PayloadError:
            continue  # verifiers decode every payload before passing it; skip rather than poison the model
    if deltas:
        g = aggregate(g, deltas, from_section(ctx.config.outer))
    return g, included


def initial_global(store: Store, ctx: RunContext) -> GlobalState:
    """G_0 with zero momentum: built from the config when it hashes to the run's digest, else fetched."""
    params = ctx.info.params
    g0 = initial_model(ctx.config)
    if state_digest(g0) != params.init_model_digest:
        g0 = load_model(store, params.init_model_cid, params.init_model_digest, ctx.param_shapes)
    if not any(k.startswith(MOM) for k in g0):  # G_0 is published as parameters only
        g0 = init_global(global_params(g0))
    return g0


class VerifiedGlobals:
    """The global state each epoch aggregates onto, recomputed from G_0 and the passing payloads.

    `base(0)` is G_0; `base(e + 1)` is `base(e)` stepped with epoch e's passing payloads if e
    finalized, `base(e)` if it aborted. A finalized digest that differs from the recomputation is
    logged once (`model-mismatch`) and otherwise ignored. With `cache`, each base is kept on disk as
    base-<epoch>-<digest>.safetensors (the newest two) and checked against that digest when read
    back, so a restarted node recomputes only the epochs it has not seen. The newest two bases are
    kept in memory as well: a verifier asks for G_{e-1} (the start model) and G_e (the merge model)
    in turn for every trainer it audits, and rebuilding G_0 or rehashing a model-sized state per
    question is a cost that grows with the model, not with the work audited.
    """

    def __init__(self, chain: Chain, store: Store, ctx: RunContext, cache: Path | None = None,
                 log: Log | None = None) -> None:
        self.chain, self.store, self.ctx, self.cache = chain, store, ctx, cache
        self.log: Log = log or (lambda event, **kv: None)
        self._mem: dict[int, GlobalState] = {}  # the newest two bases computed
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)

    def base(self, epoch: int) -> GlobalState:
        """The verified global state epoch `epoch` aggregates onto; every earlier epoch must be terminal."""
        k, g = self._nearest(epoch)
        for e in range(k, epoch):
            phase = self.chain.epoch_status(self.ctx.run_id, e).phase
            if phase is Phase.FINALIZED:
                g, _ = epoch_update(self.chain, self.store, self.ctx, e, g)
            elif phase is not Phase.ABORTED:
                raise ModelUnavailable(f"epoch {e} is not terminal yet ({phase.name}); the model after it is not known")
            digest = state_digest(g)
            if phase is Phase.FINALIZED:
                posted = bytes(self.chain.epoch_times(self.ctx.run_id, e).model_digest)
                if posted != digest:
                    self.log("model-mismatch", epoch=e, chain_digest="0x" + posted.hex(),
                             recomputed_digest="0x" + digest.hex())
            self._keep(e + 1, g, digest)
        return g

    def _nearest(self, epoch: int) -> tuple[int, GlobalState]:
        """The newest known base at or before `epoch` (memory, then disk, then G_0)."""
        held = [k for k in self._mem if k <= epoch]
        if held and max(held) == epoch:
            return epoch, self._mem[epoch]
        best = (max(held), self._mem[max(held)]) if held else None
        if self.cache is not None:
            for k in range(epoch, best[0] if best else 0, -1):
                g = self._read(k)
                if g is not None:
                    return k, g
        if best is None:
            best = (0, initial_global(self.store, self.ctx))
            if not self._mem:
                self._mem[0] = best[1]
        return best

    def _read(self, k: int) -> GlobalState | None:
        assert self.cache is not None
        for path in self.cache.glob(f"base-{k:06d}-*.safetensors"):
            want = path.stem.rsplit("-", 1)[1]
            try:
                g = load_state_file(path, allow_nonfinite=True)
            except (FormatError, OSError):
                g = None
            if g is not None and state_digest(g).hex() == want:
                return g
            path.unlink(missing_ok=True)  # torn or corrupted: recompute it
        return None

    def _keep(self, k: int, g: GlobalState, digest: Digest) -> None:
        self._mem = {j: v for j, v in self._mem.items() if j != k and j >= k - 1}
        self._mem[k] = g
        if self.cache is None:
            return
        path = self.cache / f"base-{k:06d}-{digest.hex()}.safetensors"
        if not path.exists():
            tmp = path.with_name("." + path.name)
            write_state(g, tmp)
            tmp.replace(path)
        for old in self.cache.glob("base-*.safetensors"):
            if int(old.name.split("-")[1]) < k - 1:  # a node only ever asks for the newest bases again
                old.unlink(missing_ok=True)


def previous_global(chain: Chain, store: Store, ctx: RunContext, epoch: int) -> GlobalState:
    """The verified global state `epoch` aggregates onto (see `VerifiedGlobals`), without a disk cache."""
    return VerifiedGlobals(chain, store, ctx).base(epoch)


def build_global(chain: Chain, store: Store, ctx: RunContext, epoch: int,
                 globals_: VerifiedGlobals | None = None) -> tuple[GlobalState, list[Address], Digest]:
    """(new global state, included trainers, its digest) for `epoch`; unchanged if nobody passed."""
    g = (globals_ or VerifiedGlobals(chain, store, ctx)).base(epoch)
    g, included = epoch_update(chain, store, ctx, epoch, g)
    return g, included, state_digest(g)
