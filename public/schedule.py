"""The public rank/H schedule of a run, rebuilt from the chain and the store.

Every participant must agree on epoch e's rank and local-step count H without trusting anyone, so
both come from `dilocox.compress.adapt` over records of epochs already aggregated when e started:
the rank and H each of those epochs used (themselves from this rule) and the energy profiles of the
payloads that epoch accepted. Trainers use it to plan; verifiers use it to check leaf counts and to
replay the final transition.
"""

from __future__ import annotations

from dilocox.compress import EnergyProfile, EpochRecord, payload_profile
from dilocox.delay import public_history_end
from dilocox.round import RoundSpec, plan
from protocol.chain.binding import Chain, Phase
from protocol.formats.payload import PayloadError, unwrap
from protocol.run import RunContext, passing_trainers, revealed_payload
from protocol.store.backends import Store


class Schedule:
    """Caches epoch records; only terminal (finalized or aborted) epochs are ever cached."""

    def __init__(self, chain: Chain, store: Store, ctx: RunContext, spec: RoundSpec) -> None:
        self.chain, self.store, self.ctx, self.spec = chain, store, ctx, spec
        self._records: dict[int, EpochRecord] = {}

    def for_epoch(self, epoch: int) -> tuple[int, int]:
        """(rank, H) of `epoch`."""
        end = public_history_end(self.spec.rule, epoch)
        return plan(self.spec, [self.record(i) for i in range(end)])

    def record(self, epoch: int) -> EpochRecord:
        if epoch not in self._records:
            rank, h = self.for_epoch(epoch)
            self._records[epoch] = EpochRecord(rank, h, self._accepted_profiles(epoch))
        return self._records[epoch]

    def _accepted_profiles(self, epoch: int) -> tuple[EnergyProfile, ...]:
        run = self.ctx.run_id
        status = self.chain.epoch_status(run, epoch)
        if status.phase is not Phase.FINALIZED:
            if status.phase is not Phase.ABORTED:
                raise RuntimeError(f"epoch {epoch} is not terminal yet ({status.phase.name}); its record is not public")
            return ()
        profiles = []
        passing = set(passing_trainers(self.chain, run, epoch, self.ctx.info.params.quorum))
        for ev in sorted(self.chain.revealed(run, epoch), key=lambda e: int(e.args["trainer"], 16)):
            trainer = ev.args["trainer"]
            if trainer not in passing:
                continue
            data = revealed_payload(self.store, ev.args)
            try:
                profiles.append(payload_profile(unwrap(data, run_id=run, epoch=epoch, trainer=trainer).body))
            except PayloadError:
                continue  # a passing payload always decodes; stay total if a verifier erred
        return tuple(profiles)
