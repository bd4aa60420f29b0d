"""The checks a verifier runs on one trainer's audit answer: pure functions over states and public data.

Each check returns a Finding instead of raising: a trainer's garbage is a failed check, never a
crash of the verifier. That is why the checks catch every Exception: whatever crafted states make
torch or the codec raise, the answer is the same. The node (verifier/node.py) fetches the states, runs these, and posts the
conjunction as its verdict with the findings as evidence.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dilocox.delay import MergeBase, StartRule
from dilocox.inner import STEP, State
from dilocox.round import RoundSpec, final_transition, replay_step, start_state
from protocol.data import Corpus
from protocol.digest import keccak, state_digest
from protocol.formats.payload import open_publication
from protocol.types import Digest


@dataclass(frozen=True)
class Finding:
    """One check's outcome, as recorded in the verdict's evidence."""

    check: str
    passed: bool
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        return {"check": self.check, "passed": self.passed, "detail": self.detail}


def _fail(check: str, exc: BaseException) -> Finding:
    return Finding(check, False, f"{type(exc).__name__}: {exc}")


def max_rel_error(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    """Largest per-tensor ||a − b|| / ||b|| over float tensors; inf when names, shapes or ints differ."""
    if a.keys() != b.keys():
        return math.inf
    worst = 0.0
    for n, tb in b.items():
        ta = a[n]
        if ta.shape != tb.shape or ta.dtype != tb.dtype:
            return math.inf
        if not tb.is_floating_point():
            if not torch.equal(ta, tb):
                return math.inf
            continue
        diff = float((ta.double() - tb.double()).norm())
        scale = float(tb.double().norm())
        rel = diff / scale if scale > 0 else diff
        if not math.isfinite(rel):
            return math.inf
        worst = max(worst, rel)
    return worst


WITNESS_TAG = b"veriloco.witness.v1"
NO_WITNESS = bytes(32)  # tolerant audits: no bitwise replay, so no witness (majority-only accountability)


def gradient_digest(grads: Mapping[str, Tensor]) -> bytes:
    """sha256 over each parameter's gradient as contiguous little-endian fp32, parameters in name
    order: the per-step input of the replay witness (docs/protocol.md §5.2)."""
    h = hashlib.sha256()
    for n in sorted(grads):
        h.update(grads[n].detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4").tobytes())
    return h.digest()


def replay_witness(step_digests: Sequence[bytes]) -> bytes:
    """W = keccak(WITNESS_TAG || gradient_digest of each replayed step, in manifest order).

    Only a bitwise replay produces it (the trainer never publishes gradients), and every honest
    verifier of the same trainer produces the same W, so a verdict that commits to W proves work.
    No replayed step (a failed fetch, a bad manifest) gives NO_WITNESS.
    """
    if not step_digests:
        return NO_WITNESS
    return keccak(WITNESS_TAG + b"".join(step_digests))


def check_step(
    state_k: Mapping[str, Tensor], k: int, end_digest: Digest, spec: RoundSpec, corpus: Corpus,
    epoch: int, slot: int, *, steps: int = 1, mode: str = "exact", tolerance: float = 0.0,
    next_state: Mapping[str, Tensor] | None = None, grad_digests: list[bytes] | None = None,
    merge: MergeBase | None = None,
) -> Finding:
    """Replay inner steps k → k+steps on the trainer's own batches; compare with its committed leaf.

    exact: the replayed digest must equal the leaf. tolerant: the published end state `next_state` (whose digest
    is the leaf) must lie within `tolerance` of the replay, which absorbs float differences between
    machines while a forged state still fails. `grad_digests`, when given, receives the
    gradient_digest of every replayed step (the witness's input; exact mode only). `merge` (G_e and
    the recomputed start) is what the merge rule's step folds in, when the segment covers it.
    """
    name = f"step {k}->{k + steps}"
    on_grads = None if grad_digests is None else (lambda g: grad_digests.append(gradient_digest(g)))
    try:
        replayed = dict(state_k)
        for j in range(k, k + steps):
            replayed, _ = replay_step(replayed, spec, corpus, epoch, slot, j, on_grads, merge)
    except Exception as exc:  # noqa: BLE001 - any failure on a trainer's data is a failed check
        return _fail(name, exc)
    if state_digest(replayed) == end_digest:
        return Finding(name, True, "bitwise match")
    if mode != "tolerant" or next_state is None:
        return Finding(name, False, "replayed state digest differs from the committed leaf")
    if not torch.equal(replayed[STEP], next_state.get(STEP, torch.empty(0))):
        return Finding(name, False, "step counter differs")
    err = max_rel_error(replayed, next_state)
    ok = err <= tolerance
    return Finding(name, ok, f"max relative error {err:.3g} {'within' if ok else 'beyond'} tolerance {tolerance:.3g}")


def check_final(
    start: Mapping[str, Tensor], end: Mapping[str, Tensor], revealed_digest: Digest, spec: RoundSpec,
    run_id: int, epoch: int, slot: int, trainer: str, rank: int, merged: Mapping[str, Tensor] | None = None,
) -> Finding:
    """Replay end state → payload: the re-encoded publication must hash to the revealed payload digest
    (under the merge rule Δ = G_e − end, ``merged`` = G_e)."""
    try:
        pub = final_transition(start, end, spec, run_id, epoch, slot, trainer, rank, merged).publication
    except Exception as exc:  # noqa: BLE001 - any failure on a trainer's data is a failed check
        return _fail("final", exc)
    if keccak(pub) == revealed_digest:
        return Finding("final", True, "payload re-encoded bit for bit")
    return Finding("final", False, "re-encoding the end state does not give the revealed payload")


def check_start(
    start_digest: Digest, spec: RoundSpec, latest_global: Mapping[str, Tensor],
    prev_start: Mapping[str, Tensor] | None, prev_end: Mapping[str, Tensor] | None,
    run_id: int, epoch: int, slot: int, trainer: str, prev_rank: int,
) -> Finding:
    """Leaf 0 must be the start rule's state (docs/protocol.md §8): ``check_start_state`` without the state."""
    return check_start_state(start_digest, spec, latest_global, prev_start, prev_end, run_id, epoch, slot, trainer,
                             prev_rank)[0]


def check_start_state(
    start_digest: Digest, spec: RoundSpec, latest_global: Mapping[str, Tensor],
    prev_start: Mapping[str, Tensor] | None, prev_end: Mapping[str, Tensor] | None,
    run_id: int, epoch: int, slot: int, trainer: str, prev_rank: int,
) -> tuple[Finding, State | None]:
    """Leaf 0 must be the start rule's state (docs/protocol.md §8), recomputed from public G and the
    trainer's proven previous-epoch states, or the fresh start from G when those are None.

    Compared by state digest, so every component counts (parameters, both moments, error buffer,
    step, rng word), and a fresh start needs no state file at all: it is a function of G alone.
    Also returns the recomputed start (None when the trainer's states break it): the merge rule's
    step folds in G_e − S_e, so a replay of that step needs it.
    """
    fresh = prev_start is None or prev_end is None
    try:
        carried = None
        if prev_start is not None and prev_end is not None:
            # under the merge rule epoch e-1 merged G_{e-1}, the model epoch e starts from
            merged = latest_global if spec.rule is StartRule.MERGE else None
            carried = final_transition(prev_start, prev_end, spec, run_id, epoch - 1, slot, trainer, prev_rank,
                                       merged).carried
        expected = start_state(spec, latest_global, prev_start, carried)
    except Exception as exc:  # noqa: BLE001 - any failure on a trainer's data is a failed check
        return _fail("start", exc), None
    rule = "the fresh start from the global model" if fresh else "the start rule from the global model and epoch e-1"
    if state_digest(expected) == start_digest:
        return Finding("start", True, f"leaf 0 is {rule}"), expected
    return Finding("start", False, f"leaf 0 is not {rule} (parameters, moments, error buffer, step or rng differ)"), expected


def check_payload(
    publication: bytes, run_id: int, epoch: int, trainer: str, shapes: Mapping[str, tuple[int, ...]]
) -> Finding:
    """Always run: the payload must be bound to this (run, epoch, trainer) and decode to finite, well-shaped tensors."""
    try:
        open_publication(publication, shapes, run_id=run_id, epoch=epoch, trainer=trainer)
    except Exception as exc:  # noqa: BLE001 - any failure on a trainer's data is a failed check
        return _fail("payload", exc)
    return Finding("payload", True, "bound to this run, epoch and trainer; decodes to finite tensors")


def check_leaf_count(leaf_count: int, steps: int) -> Finding:
    """The trace must cover exactly the H steps the public schedule prescribes (d_0..d_H)."""
    ok = leaf_count == steps + 1
    return Finding("leaf-count", ok, f"{leaf_count} leaves for H={steps}" + ("" if ok else f", expected {steps + 1}"))
