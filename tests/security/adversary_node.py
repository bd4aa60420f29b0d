"""Adversarial node programs for the security e2e test, with the command line of `veriloco trainer|coordinator`.

    python -m tests.security.adversary_node trainer --run ID --devnet FILE --account N --workdir DIR --behaviour forge-final
    python -m tests.security.adversary_node coordinator --run ID --devnet FILE --account N --workdir DIR [--scale 1e30]
    python -m tests.security.adversary_node verifier --run ID --devnet FILE --account N --workdir DIR --behaviour lazy

`trainer` runs the ordinary TrainerNode with a Behaviour from trainer/adversaries.py; for
`planted-start` the node subclass `NODE_ADVERSARIES` names (docs/security.md T16), and for
`withhold` a trainer that deletes its payload from the shared LocalStore as soon as it has passed
its audit (T17). `coordinator` runs a coordinator that finalizes exactly the passing trainers (so
the contract accepts it) but a model nudged away from the true aggregate, or with --scale the true
aggregate times a factor (1e30: finite, but nobody can train on it) (docs/security.md C1).
`verifier --behaviour lazy` passes every trainer assigned to it without fetching or replaying
anything, so it can only commit a made-up (zero) replay witness (docs/security.md V3).
`verifier --behaviour forgetful` judges honestly but keeps no copy of what it passes, so a payload
its trainer withholds can only be judged by the availability committee (docs/security.md T17).
`verifier --behaviour false-report` judges honestly, then reports every passing trainer as
unavailable and votes "unavailable" on any committee it sits on: the one-verifier takeover of
issue 30 (docs/security.md §14.1).
`trainer --refuse-checkpoint K` is an honest trainer that keeps a checkpoint every K steps and whose
disk refuses epoch 0's d_K (ENOSPC), as a full disk would mid-epoch: it must warn, answer its audits
from the checkpoint before, and pass (trainer/checkpoints.py `Checkpointer`).
The demo's CLI only knows the cheats of trainer/cheats.py, so the test swaps these commands in.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import torch

from coordinator.node import CoordinatorNode
from dilocox.outer import PARAM
from protocol.chain.binding import ChainError, Phase
from protocol.digest import state_digest
from protocol.formats.codec import save_state
from protocol.run import passing_trainers
from protocol.store.backends import LocalStore
from protocol.types import Cid
from public.globals import build_global
from tests.fixtures.fulldisk import full_at
from trainer.adversaries import ADVERSARIES, NODE_ADVERSARIES
from trainer.checkpoints import EpochDir
from trainer.node import TrainerNode
from verifier.keeper import Keeper
from verifier.node import VerifierNode
from verifier.replay import Finding
from veriloco.logs import add_log_args
from veriloco.nodes import json_logger, open_chain
from veriloco.settings import add_connection_args, open_store, resolve

TERMINAL = (Phase.FINALIZED, Phase.ABORTED)
SKEW = 1e-3  # added to every global parameter: small enough to keep training, never the true mean


class SkewedCoordinator(CoordinatorNode):
    """Finalizes the right trainers with a wrong model: every parameter + SKEW, or times `scale`."""

    scale: float | None = None

    def _wrong(self, p: torch.Tensor) -> torch.Tensor:
        return p + SKEW if self.scale is None else p * self.scale

    def _try_finalize(self, e: int) -> bool:
        if self.chain.epoch_status(self.run_id, e).phase in TERMINAL:
            return True
        if not self._ready(e):
            return False
        state, included, _ = build_global(self.chain, self.store, self.ctx, e)
        skewed = {k: self._wrong(v) if k.startswith(PARAM) else v for k, v in state.items()}
        cid = self.store.put(save_state(skewed))
        self.store.pin(cid)
        try:
            self.chain.finalize(self.run_id, e, cid, state_digest(skewed), included)
        except ChainError as exc:
            self.log("finalize-failed", epoch=e, error=str(exc))
            return False
        self.log("finalized", epoch=e, included=len(included), model=cid, skewed=SKEW if self.scale is None else None,
                 scaled=self.scale)
        return True


class WithholdingTrainer(TrainerNode):
    """Honest work; deletes its payload from the store once it has passed, while the epoch is still open."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.withheld: set[int] = set()
        self._checked = 0.0

    def service(self, force: bool = False) -> None:
        super().service(force)
        if time.monotonic() - self._checked >= self.poll_s:
            self._checked = time.monotonic()
            self._withhold()

    def _withhold(self) -> None:
        store = getattr(self.store, "inner", self.store)  # the trainer meters its store (protocol.store.backends.Metered)
        if not isinstance(store, LocalStore):
            raise TypeError("withhold deletes from a shared LocalStore; this node uses another store")
        for e in self._pending():
            if e in self.withheld or self._phase(e) is not Phase.AUDITING:
                continue
            if self.me.lower() not in {t.lower() for t in passing_trainers(self.chain, self.run_id, e)}:
                continue
            cid = self._dir(e).meta["payload_cid"]
            with contextlib.suppress(FileNotFoundError):
                store.path_of(cid).unlink()
            self.withheld.add(e)
            self.log("withholding", epoch=e, payload=cid)


class LazyVerifier(VerifierNode):
    """Passes everyone it is assigned without fetching or replaying: no gradients, no witness."""

    def verify(self, e: int, trainer: str, manifest_cid: str, steps: list[bytes] | None = None) -> list[Finding]:
        return [Finding("lazy", True, "not replayed")]


class NoCopies(Keeper):
    """Vouches for payloads without keeping them: nothing is held, so nothing is ever put back."""

    def hold(self, epoch: int, cid: Cid, data: bytes) -> None:
        return None


class ForgetfulVerifier(VerifierNode):
    """Honest audits and votes; keeps no copy of the payloads it passes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keeper = NoCopies(self.keeper.root, self.store)


class FalseReporter(VerifierNode):
    """Reports every passing trainer as unavailable (where it did not judge one, it used to be its whole
    committee at V = q + 1), and lies on committees."""

    def _judge_availability(self, e: int) -> None:
        if self.chain.epoch_status(self.run_id, e).phase is Phase.AUDITING:
            for t in passing_trainers(self.chain, self.run_id, e):
                key = f"lie:{e}:{t}"
                if key in self._said:
                    continue
                self._said.add(key)
                try:
                    self.chain.report_unavailable(self.run_id, e, t)
                except ChainError as exc:
                    self.log("false-report-refused", epoch=e, trainer=t, error=type(exc).__name__)
                else:
                    self.log("false-report", epoch=e, trainer=t)
        super()._judge_availability(e)

    def _fetch_reported(self, e: int, t: str) -> tuple[bool, str]:
        return False, "lying"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="adversary_node", description=__doc__)
    p.add_argument("role", choices=["trainer", "coordinator", "verifier"])
    p.add_argument("--run", type=int, required=True)
    add_connection_args(p, workdir=True)
    add_log_args(p)  # accepts the demo's --log-format json; this program always writes JSON lines
    p.add_argument("--behaviour", choices=sorted({*ADVERSARIES, *NODE_ADVERSARIES, "withhold", "lazy", "forgetful", "false-report"}),
                   default="forge-final")
    p.add_argument("--scale", type=float, help="coordinator: finalize the true aggregate times this factor")
    p.add_argument("--refuse-checkpoint", type=int, metavar="K", help="trainer: honest, but its disk refuses epoch 0's d_K")
    p.add_argument("--allow-test-run", action="store_true", help="the demo's, for its own runs: this program joins any")
    args = p.parse_args(argv)
    s = resolve(args)
    chain = open_chain(s)
    if args.role == "verifier":
        kinds = {"lazy": LazyVerifier, "forgetful": ForgetfulVerifier, "false-report": FalseReporter}
        if args.behaviour not in kinds:
            p.error(f"verifier behaviour must be one of {sorted(kinds)}, got {args.behaviour}")
        verifier = kinds[args.behaviour]
        verifier(chain, open_store(s), args.run, s.workdir / f"verifier-{chain.sender}", log=json_logger("verifier")).run()
    elif args.role == "trainer" and args.refuse_checkpoint is not None:
        EpochDir.save = full_at(args.refuse_checkpoint, epoch=0)  # type: ignore[method-assign,assignment]
        TrainerNode(chain, open_store(s), args.run, s.workdir / f"trainer-{chain.sender}", log=json_logger("trainer"),
                    checkpoint_every=args.refuse_checkpoint, checkpoint_every_logged=args.refuse_checkpoint).run()
    elif args.role == "trainer" and args.behaviour in NODE_ADVERSARIES:
        NODE_ADVERSARIES[args.behaviour](chain, open_store(s), args.run, s.workdir / f"trainer-{chain.sender}",
                                         log=json_logger("trainer")).run()
    elif args.role == "trainer" and args.behaviour == "withhold":
        WithholdingTrainer(chain, open_store(s), args.run, s.workdir / f"trainer-{chain.sender}",
                           log=json_logger("trainer")).run()
    elif args.role == "trainer":
        TrainerNode(chain, open_store(s), args.run, s.workdir / f"trainer-{chain.sender}",
                    behaviour=ADVERSARIES[args.behaviour](), log=json_logger("trainer")).run()
    else:
        node = SkewedCoordinator(chain, open_store(s), args.run, log=json_logger("coordinator"), evaluate=False)
        node.scale = args.scale
        node.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
