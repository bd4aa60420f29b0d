"""Shard audits of the merge rule (schedule.merge_step, docs/protocol.md §8) on real epochs: an
honest trainer passes every check, its answers built from the boundary log replay the merge like a
verifier does, and a trainer that skips the merge, merges another model or starts from other
parameters fails the check that reads it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dilocox.delay import StartRule, epoch_merge_offset
from dilocox.inner import PARAM, Params, configure_determinism
from dilocox.round import RoundSpec, compress_seed, epoch_batch
from protocol import merkle
from protocol.chain.audit import challenged_steps
from protocol.digest import keccak
from protocol.formats.codec import load_state
from protocol.formats.payload import decode, unwrap, wrap
from protocol.leaf import block_count, block_names
from protocol.model import param_shapes
from protocol.shard_audit import covers_merge, decode_manifest, encode_manifest
from protocol.store.backends import LocalStore
from tests.security.test_shard_audits import CFG, CORPUS, G0, ME, RANK, SLOT, H, PlantedBlock
from tests.security.test_shard_audits import SPEC as DELAYED
from trainer.boundaries import GRADIENTS
from trainer.checkpoints import EpochDir
from trainer.engine import OFFSET, LocalEngine, save_merged
from trainer.shard_response import shard_response
from verifier.shard import Chained, audit_findings

M = 1  # the merge step: segment 0..2 covers it
SPEC = replace(DELAYED, rule=StartRule.MERGE, merge_step=M)
N = block_count(CFG)
# G_1, the model epoch 1 folds in: any public model will do
G1 = {n: t + 1e-3 * torch.randn(t.shape, generator=torch.Generator().manual_seed(7)) for n, t in G0.items()}
GLOBALS = [G0, G1]  # G_e, folded in by epoch e (G_0 − S_0 = 0 in epoch 0)


class Run:
    """Two epochs of one trainer under the merge rule, with the local engine, and its answers' store."""

    def __init__(self, root: Path, engine: LocalEngine, run_spec: RoundSpec | None = None) -> None:
        """``engine.spec`` is what the trainer runs; ``run_spec`` (default the same) what the run's config says."""
        configure_determinism(1)
        self.spec, self.run_spec = engine.spec, run_spec or engine.spec
        self.store, self.engine = LocalStore(root / "store"), engine
        self.dirs: list[EpochDir] = []
        self.preimages: list[list[bytes]] = []
        self.pubs: list[bytes] = []
        for e in range(2):
            d = EpochDir(root / "node", e)
            leaves = [engine.begin(d, H, G0, self.dirs[-1] if e else None)]  # both epochs start from G_0's line
            for k in range(H):
                if self.spec.merges_at(k, e):
                    engine.merge(d, GLOBALS[e], self.offset(e))
                leaves.append(engine.step(d, k, epoch_batch(self.spec, CORPUS, e, SLOT, k))[1])
            payload, _ = engine.finish(d, RANK, compress_seed(self.spec.run_seed, e, SLOT))
            self.dirs.append(d)
            self.preimages.append([lf.encode() for lf in leaves])
            self.pubs.append(wrap(1, e, ME, payload))

    def offset(self, e: int) -> Params | None:
        """With error feedback in the parameters, what epoch e's merge adds (the rule both nodes use,
        with this run's own e-1 payload); None under a carried buffer."""
        if not self.run_spec.ef_in_params:
            return None
        return epoch_merge_offset(e, e > 0, GLOBALS[e], GLOBALS.__getitem__,
                                  lambda: decode(unwrap(self.pubs[e - 1]).body, param_shapes(CFG)))

    def judge(self, e: int, seed: bytes, merged: Params | None = None, fetch=None) -> list[str]:
        """The failed findings of a verifier given G_e = ``merged`` (default: the true one), reading the
        trainer's files through ``fetch`` (default: the store as published)."""
        steps = challenged_steps(seed, ME, 3, H + 1)
        m = shard_response(
            engine=self.engine, spec=self.spec, run_id=1, epoch=e, trainer=ME, d=self.dirs[e], preimages=self.preimages[e],
            seed=seed, steps=steps, final_bps=10_000, batch_of=lambda k: epoch_batch(self.spec, CORPUS, e, SLOT, k),
            publish=self.store.put, prev=self.dirs[e - 1] if e else None, prev_preimages=self.preimages[e - 1] if e else (),
        )
        root = merkle.root([keccak(p) for p in self.preimages[e]])
        prev_root = merkle.root([keccak(p) for p in self.preimages[e - 1]]) if e else bytes(32)
        chained = Chained(root, H + 1, seed, tuple(steps), 10_000, prev_revealed=e > 0, prev_root=prev_root,
                          prev_leaf_count=H + 1 if e else 0)
        m = decode_manifest(encode_manifest(m, N), N, max_bytes=1 << 24)
        self.manifest = m
        self.covered = any(covers_merge(c.start, c.end, self.run_spec.merge_step_in(e)) for c in m.challenges)
        findings = audit_findings(
            m, chained, fetch or (lambda cid, spec: load_state(self.store.get(cid), expect=spec)), self.run_spec, CORPUS, G0,
            self.pubs[e], run_id=1, epoch=e, slot=SLOT, trainer=ME, rank=RANK, prev_rank=RANK,
            merged=GLOBALS[e] if merged is None else merged, offset=lambda: self.offset(e) or {})
        return [f"{f.check}: {f.detail}" for f in findings if not f.passed]


SEEDS = [bytes([i]) * 32 for i in range(1, 9)]


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Run:
    # checkpoints every 4 steps, segments of 2: the answer for segment 2..4 advances from leaf 0 across
    # the merge on the boundary log alone (LocalEngine._logged_block)
    return Run(tmp_path_factory.mktemp("merge-honest"), LocalEngine(SPEC, every=4))


def test_an_honest_merging_trainer_passes_every_shard_check(honest: Run) -> None:
    covered = 0
    for seed in SEEDS:
        for e in (0, 1):
            assert honest.judge(e, seed) == []
            covered += honest.covered
    assert covered  # some drawn segment replayed the merge


def test_answers_from_the_log_and_from_whole_steps_agree_across_the_merge(honest: Run) -> None:
    d, batch_of = honest.dirs[1], (lambda k: epoch_batch(SPEC, CORPUS, 1, SLOT, k))
    for b in (0, 1, N - 1):
        logged = honest.engine.audit_block(d, 2, 4, b, [1, 0], batch_of)
        whole = honest.engine.audit_block(d, 2, 4, b, [1, 0], batch_of, logged=False)
        assert logged[0].keys() == whole[0].keys() and all(torch.equal(logged[0][k], whole[0][k]) for k in whole[0])
        for mine, theirs in zip(logged[1], whole[1], strict=True):
            a, c = mine.flat(), theirs.flat()
            assert a.keys() == c.keys() and all(torch.equal(a[k], c[k]) for k in a)


@pytest.fixture(scope="module")
def honest_gradients(tmp_path_factory: pytest.TempPathFactory) -> Run:
    # 512 tokens a step: a step's total gradients (4 bytes a parameter) are less than half its boundaries,
    # and the disk budget holds both epochs' gradients but not one epoch's boundaries, so the engine
    # keeps the gradient log (trainer/boundaries.py) and answers by AdamW from the logged totals
    spec = replace(SPEC, batch_size=32)
    grad = 4 * sum(t.numel() for t in G0.values())
    bound = 2 * (N - 1) * spec.batch_size * spec.seq_len * CFG.d_model * 4
    budget = 2 * H * grad + H * 4096
    assert budget < H * bound
    return Run(tmp_path_factory.mktemp("merge-gradients"), LocalEngine(spec, every=4, log_disk_bytes=budget))


def test_a_trainer_keeping_the_gradient_log_answers_across_the_merge_and_passes(honest_gradients: Run) -> None:
    run = honest_gradients
    assert {log.kind for log in run.engine._logs.values()} == {GRADIENTS}
    assert not any(log.unlogged for log in run.engine._logs.values())
    covered = 0
    for seed in SEEDS[:4]:
        for e in (0, 1):
            assert run.judge(e, seed) == []
            covered += run.covered
    assert covered and run.engine.log_error is None
    d, batch_of = run.dirs[1], (lambda k: epoch_batch(run.spec, CORPUS, 1, SLOT, k))
    for b in (0, 1, N - 1):
        logged = run.engine.audit_block(d, 0, 2, b, [1, 0], batch_of)  # the segment with the merge step
        whole = run.engine.audit_block(d, 0, 2, b, [1, 0], batch_of, logged=False)
        assert all(torch.equal(logged[0][k], whole[0][k]) for k in whole[0])
        for mine, theirs in zip(logged[1], whole[1], strict=True):
            a, c = mine.flat(), theirs.flat()
            assert a.keys() == c.keys() and all(torch.equal(a[k], c[k]) for k in a)


def _covering_seed(run: Run, e: int) -> bytes:
    for seed in (bytes([i]) * 32 for i in range(1, 120)):
        run.judge(e, seed)
        if run.covered:
            return seed
    raise AssertionError("no seed draws the segment with the merge")


def test_the_merged_model_matters(honest: Run) -> None:
    seed = _covering_seed(honest, 1)
    other = {n: t - 1e-3 for n, t in G1.items()}
    bad = honest.judge(1, seed, merged=other)
    assert any(b.startswith("block ") and "steps 0->2" in b for b in bad), bad  # the segment with the merge
    assert any(b.startswith("final block") for b in bad), bad  # Δ = G_1 − E_1


class SkipMerge(LocalEngine):
    """Keeps G_e for its Δ but never folds it in (trainer.adversaries.SkipMerge in a shard run)."""

    def merge(self, d, g, offset=None) -> None:
        save_merged(d, g)
        if offset is not None:
            save_merged(d, offset, OFFSET)


class OtherStart(LocalEngine):
    """Continues epoch 0 with one block's parameters nudged (under the merge rule they must carry over)."""

    def begin(self, d, steps, g, prev):
        leaf = super().begin(d, steps, g, prev)
        if prev is None:
            return leaf
        assert self.state is not None
        name = PARAM + "blocks.0.attn_qkv.weight" if PARAM + "blocks.0.attn_qkv.weight" in self.state else next(
            k for k in self.state if k.startswith(PARAM + "blocks.0."))
        self.state[name] = self.state[name] * (1 + 1e-4)
        d.save_step(0, self.state)
        assert self.committer is not None
        return self.committer.leaf(0, self.state, None)


def test_skipping_the_merge_fails_the_segment_that_covers_it(tmp_path: Path) -> None:
    run = Run(tmp_path, SkipMerge(SPEC, every=2))
    assert all(run.judge(0, s) == [] for s in SEEDS[:3])  # epoch 0: the merge adds G_0 − S_0 = 0
    bad = run.judge(1, _covering_seed(run, 1))
    assert any("steps 0->2" in b for b in bad) and not any(b.startswith("start") for b in bad), bad


def test_other_start_parameters_fail_the_start_check_whichever_block_is_drawn(tmp_path: Path) -> None:
    run = Run(tmp_path, OtherStart(SPEC, every=2))
    for seed in SEEDS[:3]:
        bad = run.judge(1, seed)
        assert any("parameters are not the ones e-1 ended with" in b for b in bad), bad


def test_a_first_merge_before_step_zero_is_audited_like_any_merge(tmp_path: Path) -> None:
    """schedule.first_merge_step = 0: epoch 1 folds G_1 in before its first step (leaf 0 stays S_1),
    later epochs at m. An honest trainer passes; one that merges epoch 1 at m anyway fails the
    segment with step 0, and its start check still passes."""
    first0 = replace(SPEC, first_merge_step=0)
    assert [first0.merge_step_in(e) for e in range(3)] == [M, 0, M]
    honest = Run(tmp_path / "honest", LocalEngine(first0, every=2))
    assert all(honest.judge(e, s) == [] for s in SEEDS[:3] for e in (0, 1))
    late = Run(tmp_path / "late", LocalEngine(SPEC, every=2), run_spec=first0)
    bad = late.judge(1, _covering_seed(late, 1))
    assert any("steps 0->2" in b for b in bad) and not any(b.startswith("start") for b in bad), bad


def test_a_buffer_planted_at_a_continued_start_fails_the_start_check_under_merge(tmp_path: Path) -> None:
    """Issue 30 under the merge rule (its start file has no first-leaf parameters): a buffer planted
    in any one block at epoch 1's start fails epoch 1's start check, for every seed."""
    block = N - 2
    run = Run(tmp_path, PlantedBlock(block, SPEC, every=2))
    for seed in SEEDS[:3]:
        bad = run.judge(1, seed)
        assert bad == [f"start: block(s) [{block}] of leaf 0 are not the start rule's (parameters or error buffer)"], bad


# --- compression.error_feedback = "params": no buffer, the merge adds a public offset -----------------

PARAMS = replace(SPEC, compression=replace(SPEC.compression, error_feedback=False))


@pytest.fixture(scope="module")
def in_params(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return Run(tmp_path_factory.mktemp("merge-params"), LocalEngine(PARAMS, every=2))


def test_with_error_feedback_in_the_parameters_an_honest_trainer_passes_with_no_start_file(in_params: Run) -> None:
    """The start carries over by digest (no file at all), the merge replays from public data, and the
    next payload carries the residual the last one left out (its Δ is G_1 − E_1 with E_1 offset by it)."""
    covered = 0
    for seed in SEEDS[:4]:
        for e in (0, 1):
            assert in_params.judge(e, seed) == []
            covered += in_params.covered and e == 1
    assert covered
    assert PARAMS.ef_in_params and not SPEC.ef_in_params
    end = in_params.dirs[0].load("carried")
    assert all(not t.any() for k, t in end.items() if k.startswith("ef/"))  # nothing is carried beside the params


def test_with_error_feedback_in_the_parameters_every_wrong_merge_or_start_fails(tmp_path: Path) -> None:
    """Skipping the merge, merging the buffer rule's offset instead, or nudging a start parameter each
    fail the check that reads it; a verifier that credits the payload of another epoch fails the honest
    segment (the offset is bound to the trainer's own revealed e-1 payload)."""
    seed = _covering_seed(Run(tmp_path / "probe", LocalEngine(PARAMS, every=2)), 1)
    skip = Run(tmp_path / "skip", SkipMerge(PARAMS, every=2))
    assert any("steps 0->2" in b for b in skip.judge(1, seed))
    buffer_rule = Run(tmp_path / "buffer", LocalEngine(SPEC, every=2), run_spec=PARAMS)
    bad = buffer_rule.judge(1, seed)
    assert any("steps 0->2" in b for b in bad), bad
    nudged = Run(tmp_path / "nudged", OtherStart(PARAMS, every=2))
    assert any("parameters are not the ones e-1 ended with" in b for b in nudged.judge(1, seed))
    honest = Run(tmp_path / "honest", LocalEngine(PARAMS, every=2))
    wrong = honest.offset(1)
    assert wrong is not None
    honest.offset = lambda e: {n: t + 1e-6 for n, t in wrong.items()}  # type: ignore[method-assign]
    assert any("steps 0->2" in b for b in honest.judge(1, seed))


def test_with_error_feedback_in_the_parameters_a_planted_buffer_fails_the_start_check(tmp_path: Path) -> None:
    """The run keeps no buffer: one planted in any block at a continued start fails epoch 1's start check
    by digest, whatever the draw."""
    block = N - 2
    run = Run(tmp_path, PlantedBlock(block, PARAMS, every=2))
    for seed in SEEDS[:2]:
        bad = run.judge(1, seed)
        assert f"start: block(s) [{block}] of leaf 0 carry an error buffer (the run keeps none)" in bad, bad


def test_with_error_feedback_in_the_parameters_the_final_check_ships_the_last_parameters_alone(in_params: Run) -> None:
    """Issue 47: the merge rule's Δ = G_e − E_e reads no first leaf and the buffer is zero, so the final
    check's file holds block b's parameters at L − 1 only (a third of v4's bytes); the verifier hashes a
    zero buffer against the leaf itself. Parameters other than the committed ones still fail."""
    assert in_params.judge(0, SEEDS[0]) == []
    m = in_params.manifest
    names = block_names(CFG)[m.final.block]
    assert set(load_state(in_params.store.get(m.final.cid))) == {PARAM + n for n in names}

    def nudged(cid: str, spec: dict) -> dict:
        st = load_state(in_params.store.get(cid), expect=spec)
        if cid == m.final.cid:
            st[PARAM + names[0]] = st[PARAM + names[0]] + 1e-6
        return st

    bad = in_params.judge(0, SEEDS[0], fetch=nudged)
    assert bad == [f"final block {m.final.block}: the revealed tensors are not block {m.final.block} of leaves 0 and L-1"], bad

