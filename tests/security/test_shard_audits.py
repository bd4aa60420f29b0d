"""Shard audits end to end on real epochs: an honest answer passes every check; a forged shard, a
forged boundary tensor, a skipped block step or a wrong start is caught by the check that reads it."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dilocox.blockstep import Capture, block_update, blockwise_step
from dilocox.compress import CompressionConfig
from dilocox.delay import StartRule
from dilocox.inner import EF, MOM1, MOM2, PARAM, STEP, InnerConfig, configure_determinism
from dilocox.round import RoundSpec, compress_seed, epoch_batch
from protocol.chain.audit import challenged_steps
from protocol.data import Corpus
from protocol.formats.codec import load_state, save_state
from protocol.formats.payload import wrap
from protocol.leaf import StepLeaf, block_count, block_names
from protocol.model import init_params, preset
from protocol.shard_audit import (
    ShardChallenge,
    decode_manifest,
    drawn_block,
    drawn_group,
    encode_manifest,
)
from protocol.store.backends import LocalStore
from protocol.types import Address, Cid
from trainer.adversaries import plant_error_buffer
from trainer.checkpoints import EpochDir
from trainer.engine import LocalEngine
from trainer.shard_response import challenge_file, shard_response
from verifier.shard import Chained, audit_findings, check_segment

CFG = preset("tiny")
SPEC = RoundSpec(CFG, InnerConfig(lr=3e-3, warmup_steps=2, total_steps=50), CompressionConfig(), StartRule.DELAYED,
                 run_seed=1, batch_size=4, seq_len=16, microbatches=2, shard=True, segment=2)
CORPUS = Corpus(bytes((i * 7 + i // 13) % 251 for i in range(4096 * 24)))
ME = Address("0x" + "ab" * 20)
H, RANK, SLOT = 5, 4, 0
G0 = init_params(CFG, 0)
Data = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


class Run:
    """Two real epochs of one trainer with the local engine, and the store its answers go to."""

    def __init__(self, root: Path, engine: LocalEngine | None = None, data: Data | None = None) -> None:
        """``data``: the batch the trainer trains and answers on (a cheater's own); the verifier reads the run's."""
        configure_determinism(1)
        self.store = LocalStore(root / "store")
        self.engine = engine or LocalEngine(SPEC, every=2)
        self.data: Data = data or (lambda e, k: epoch_batch(SPEC, CORPUS, e, SLOT, k))
        self.dirs, self.preimages, self.pubs = [], [], []
        for e in range(2):
            d = EpochDir(root / "node", e)
            leaves = [self.engine.begin(d, H, G0, self.dirs[-1] if e else None)]
            for k in range(H):
                leaves.append(self.engine.step(d, k, self.data(e, k))[1])
            payload, _ = self.engine.finish(d, RANK, compress_seed(SPEC.run_seed, e, SLOT))
            self.dirs.append(d)
            self.preimages.append([lf.encode() for lf in leaves])
            self.pubs.append(wrap(1, e, ME, payload))

    def answer(self, e: int, seed: bytes, publish=None, rate: int = 0, final_bps: int = 10_000):
        """``rate``: the per-step draw (audit.rate in ppm, at most 3 an epoch); 0 draws 3 an epoch."""
        steps = challenged_steps(seed, ME, 3, H + 1, rate)
        m = shard_response(
            engine=self.engine, spec=SPEC, run_id=1, epoch=e, trainer=ME, d=self.dirs[e], preimages=self.preimages[e],
            seed=seed, steps=steps, final_bps=final_bps, batch_of=lambda k: self.data(e, k),
            publish=publish or self.store.put, prev=self.dirs[e - 1] if e else None,
            prev_preimages=self.preimages[e - 1] if e else (),
        )
        return m, steps

    def judge(self, e: int, seed: bytes, m, steps, fetch=None, final_bps: int = 10_000) -> list:
        from protocol import merkle
        from protocol.digest import keccak

        root = merkle.root([keccak(p) for p in self.preimages[e]])
        prev_root = merkle.root([keccak(p) for p in self.preimages[e - 1]]) if e else bytes(32)
        chained = Chained(root, H + 1, seed, tuple(steps), final_bps, prev_revealed=e > 0, prev_root=prev_root,
                          prev_leaf_count=H + 1 if e else 0)
        m = decode_manifest(encode_manifest(m, block_count(CFG)), block_count(CFG), max_bytes=1 << 24)
        fetch = fetch or (lambda cid, spec: load_state(self.store.get(cid), expect=spec))
        grads: list[bytes] = []
        return audit_findings(m, chained, fetch, SPEC, CORPUS, G0, self.pubs[e], run_id=1, epoch=e, slot=SLOT,
                              trainer=ME, rank=RANK, prev_rank=RANK, grad_digests=grads)


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return Run(tmp_path_factory.mktemp("honest"))


SEEDS = [bytes([i]) * 32 for i in range(1, 4)]


def _failed(findings) -> list[str]:
    return [f"{f.check}: {f.detail}" for f in findings if not f.passed]


@pytest.mark.parametrize("seed", SEEDS)
def test_an_honest_trainer_passes_every_shard_check(honest: Run, seed: bytes) -> None:
    for e in (0, 1):
        m, steps = honest.answer(e, seed)
        findings = honest.judge(e, seed, m, steps)
        assert not _failed(findings), _failed(findings)
        assert any(f.check.startswith("block ") for f in findings) and any(f.check == "start" for f in findings)
        assert any(f.check.startswith("final block") for f in findings)


def test_audit_bytes_are_a_block_not_a_state(honest: Run) -> None:
    """Challenge and final files hold one block; the start file of a continued start holds e-1's
    transition of every block, 12 of a state's 16 bytes per parameter (docs/security.md §11)."""
    sizes: dict[str, int] = {}

    def publish(data: bytes):
        cid = honest.store.put(data)
        sizes[cid] = len(data)
        return cid

    m, _ = honest.answer(1, SEEDS[0], publish)
    n_params = sum(t.numel() for t in G0.values())
    state_bytes = 16 * n_params
    assert max(v for c, v in sizes.items() if c != m.start_cid) < state_bytes / 2
    assert 12 * n_params < sizes[m.start_cid] < 12 * n_params * 1.1


def test_a_tampered_shard_file_fails_the_segment(honest: Run) -> None:
    seed = SEEDS[0]
    m, steps = honest.answer(1, seed)

    def fetch(cid: str, spec: Mapping) -> dict[str, torch.Tensor]:
        st = load_state(honest.store.get(cid), expect=spec)
        if cid == m.challenges[0].cid:
            k = next(n for n in st if n.startswith(PARAM))
            st[k] = st[k] + 1e-3
        return st

    bad = _failed(honest.judge(1, seed, m, steps, fetch))
    assert any(b.startswith(f"block {m.challenges[0].block} ") and "not block" in b for b in bad), bad


def test_a_forged_boundary_tensor_fails_both_neighbours(honest: Run) -> None:
    """A revealed input that is not what the previous block committed is refused outright."""
    seed = next(s for s in (bytes([i]) * 32 for i in range(1, 60))
                if any(c.block > 0 for c in honest.answer(1, s)[0].challenges))
    m, steps = honest.answer(1, seed)
    target = next(c for c in m.challenges if c.block > 0)

    def fetch(cid: str, spec: Mapping) -> dict[str, torch.Tensor]:
        st = load_state(honest.store.get(cid), expect=spec)
        if cid == target.cid:
            k = next(n for n in st if n.startswith("in/"))
            st[k] = st[k] * 1.001
        return st

    bad = _failed(honest.judge(1, seed, m, steps, fetch))
    assert any("is not what block" in b and "revealed input" in b for b in bad), bad


class LazyBlock(LocalEngine):
    """Skips the update of transformer block 0 (audit blocks 1 and 2) in every step; its leaves hash the stale tensors."""

    def _step(self, state, batch, on_partial=None):
        new, loss, ios = blockwise_step(state, batch, self.spec.model, self.spec.inner, self.spec.microbatches, on_partial)
        for k in new:
            if k.startswith(("param/blocks.0.", "adam.m/blocks.0.", "adam.v/blocks.0.")):
                new[k] = state[k]
        return new, loss, ios


class ForgedAct(LocalEngine):
    """Commits (and so later reveals) block 1's output activations scaled by 1.01."""

    def _step(self, state, batch, on_partial=None):
        new, loss, ios = blockwise_step(state, batch, self.spec.model, self.spec.inner, self.spec.microbatches, on_partial)
        ios[1] = replace(ios[1], act=ios[1].act * 1.01)
        return new, loss, ios


class ForgedGroup(LocalEngine):
    """Commits block 1's output activations on group 1 alone scaled by 1.01 (group 0's rows are honest)."""

    def _step(self, state, batch, on_partial=None):
        new, loss, ios = blockwise_step(state, batch, self.spec.model, self.spec.inner, self.spec.microbatches, on_partial)
        rows = ios[1].act.shape[0] // self.spec.microbatches
        act = ios[1].act.clone()
        act[rows:2 * rows] *= 1.01
        ios[1] = replace(ios[1], act=act)
        return new, loss, ios


SUM_BLOCK = 3


class ForgedSum(LocalEngine):
    """Computes every group of block 3 honestly and commits the honest running sums, then steps with
    a total that is not their sum (+1e-3 on every coordinate), commits its norm and reveals it as the
    total: consistent with every state leaf; only the last group's link can see it (limit 2a of
    docs/audit-scaling.md). Answers replay whole steps (its boundary log would replay honestly)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, keep_boundaries=False, **kw)

    def _step(self, state, batch, on_partial=None):
        keep = Capture(SUM_BLOCK, -1, self.spec.microbatches, on_partial)
        new, loss, ios = blockwise_step(state, batch, self.spec.model, self.spec.inner, self.spec.microbatches, keep)
        names = block_names(self.spec.model)[SUM_BLOCK]
        forged = {n: t + 1e-3 for n, t in keep.total.items()}
        block = {k: v for k, v in state.items() if k.startswith((PARAM, MOM1, MOM2)) and k.split("/", 1)[1] in names}
        block[STEP] = state[STEP]
        updated, sq = block_update(block, SUM_BLOCK, forged, self.spec.inner, [io.sq for io in ios])
        new.update({k: v for k, v in updated.items() if k != STEP and k.split("/", 1)[1] in names})
        ios[SUM_BLOCK] = replace(ios[SUM_BLOCK], sq=sq)
        if on_partial is not None:
            on_partial(SUM_BLOCK, self.spec.microbatches - 1, forged)  # an answer reveals this total
        return new, loss, ios


def _seed_with_block(run: Run, e: int, b: int) -> bytes:
    for i in range(1, 200):
        s = os.urandom(32) if i > 150 else bytes([i]) * 32
        if any(c.block == b for c in run.answer(e, s)[0].challenges):
            return s
    raise AssertionError(f"no seed draws block {b}")


# A lazy block fails at the segment's end, or sooner where a stale update changes its outputs.
LAZY = ("does not reach its state", "output activations on group")


@pytest.mark.parametrize("cheat,block,expect", [(LazyBlock, 1, LAZY), (LazyBlock, 2, LAZY),
                                                (ForgedAct, 1, ("output activations on group",)),
                                                (ForgedAct, 2, ("output activations on group",))])
def test_cheats_are_caught_when_their_block_is_drawn(tmp_path: Path, cheat, block: int, expect: tuple[str, ...]) -> None:
    run = Run(tmp_path, cheat(SPEC, every=2))
    seed = _seed_with_block(run, 0, block)
    m, steps = run.answer(0, seed)
    bad = _failed(run.judge(0, seed, m, steps))
    assert any(e in b for b in bad for e in expect), bad


def _seed_where(run: Run, e: int, block: int, opens) -> tuple[bytes, object]:
    """A seed whose challenge of ``block`` opens groups satisfying ``opens(picks)``, and that challenge."""
    for i in range(1, 400):
        s = bytes([i % 256]) * 31 + bytes([i // 256])
        c = next((c for c in run.answer(e, s)[0].challenges if c.block == block), None)
        if c is not None and opens(c.picks):
            return s, c
    raise AssertionError(f"no seed opens such groups of block {block}")


def test_a_forged_group_is_caught_when_that_group_is_opened(tmp_path: Path) -> None:
    run = Run(tmp_path, ForgedGroup(SPEC, every=2))
    seed, c = _seed_where(run, 0, 1, lambda picks: 1 in picks)
    m, steps = run.answer(0, seed)
    bad = _failed(run.judge(0, seed, m, steps))
    assert any(b.startswith(f"block 1 steps {c.start}->") and "output activations on group 1 differ" in b for b in bad), bad


def test_a_forged_sum_is_caught_by_the_last_groups_link_and_only_by_it(tmp_path: Path) -> None:
    """The 1/G limit in numbers: the challenge that opens group M−1 at some step fails on the link to
    the revealed total; one that opens only group 0 passes (docs/security.md §1, the sum row)."""
    run = Run(tmp_path, ForgedSum(SPEC, every=2))
    last = SPEC.microbatches - 1
    seed, c = _seed_where(run, 0, SUM_BLOCK, lambda picks: last in picks)
    m, steps = run.answer(0, seed)
    bad = _failed(run.judge(0, seed, m, steps))
    assert any(b.startswith(f"block {SUM_BLOCK} steps {c.start}->") and "the step's revealed total" in b for b in bad), bad
    seed, c = _seed_where(run, 0, SUM_BLOCK, lambda picks: last not in picks)
    m, steps = run.answer(0, seed)
    mine = [f for f in run.judge(0, seed, m, steps) if f.check.startswith(f"block {SUM_BLOCK} steps {c.start}->")]
    assert mine and all(f.passed for f in mine), mine


def test_a_wrong_start_is_caught_by_digest_alone(tmp_path: Path) -> None:
    class BadStart(LocalEngine):
        def begin(self, d, steps, g, prev):
            return super().begin(d, steps, {n: t * (1.0 + 1e-6) for n, t in g.items()}, prev)

    run = Run(tmp_path, BadStart(SPEC, every=2))
    m, steps = run.answer(0, SEEDS[0])
    bad = _failed(run.judge(0, SEEDS[0], m, steps))
    assert any(b.startswith("start:") for b in bad), bad
    assert isinstance(StepLeaf.decode(run.preimages[0][0], block_count(CFG)), StepLeaf)


def test_an_epoch_that_draws_no_challenge_still_checks_its_start(honest: Run, tmp_path: Path) -> None:
    """audit.rate (issue 47): at small H most epochs draw no step and no final check. Such an answer opens
    no segment, yet the manifest is bound to the chain and leaf 0 to the start rule: an honest trainer
    passes, and a wrong start fails with nothing drawn."""
    seed = SEEDS[0]
    assert challenged_steps(seed, ME, 3, H + 1, 1) == []  # one in a million a step: none of 5
    for e in (0, 1):
        m, steps = honest.answer(e, seed, rate=1, final_bps=0)
        findings = honest.judge(e, seed, m, steps, final_bps=0)
        assert not m.challenges and not _failed(findings), _failed(findings)
        assert [f.check for f in findings if f.check.startswith(("block ", "final"))] == []
        assert any(f.check == "start" for f in findings)

    class BadStart(LocalEngine):
        def begin(self, d, steps, g, prev):
            return super().begin(d, steps, {n: t * (1.0 + 1e-6) for n, t in g.items()}, prev)

    run = Run(tmp_path, BadStart(SPEC, every=2))
    m, steps = run.answer(0, seed, rate=1, final_bps=0)
    assert _failed(run.judge(0, seed, m, steps, final_bps=0)) == ["start: leaf 0 is not the fresh start from the global model"]


def _plant_block(state, block: int):
    """``state`` with the error buffer of audit block ``block`` alone planted (trainer.adversaries)."""
    names = {EF + n for n in block_names(CFG)[block]}
    planted = plant_error_buffer(state)
    return {k: planted[k] if k in names else v for k, v in state.items()}


class PlantedBlock(LocalEngine):
    """Issue 30: continues epoch 0 into epoch 1 with one block's carried error buffer planted, then
    trains, encodes and answers honestly from that state. Every segment and the final check replay
    from the planted state, and the buffer carries into every later epoch."""

    def __init__(self, block: int, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.block = block

    def start(self, d, g, prev):
        s = super().start(d, g, prev)
        return _plant_block(s, self.block) if d.epoch == 1 else s


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_a_buffer_planted_at_a_continued_start_fails_that_epochs_start_check(tmp_path: Path, seed: bytes) -> None:
    """The plant is in a block the former one-block start check (label "start-shard") would not have
    drawn: the start check now recomputes every block, so epoch 1 fails on it and on nothing else."""
    n = block_count(CFG)
    block = (drawn_block(seed, ME, "start-shard", 0, n) + 1) % n
    run = Run(tmp_path, PlantedBlock(block, SPEC, every=2))
    m0, steps0 = run.answer(0, seed)
    assert not _failed(run.judge(0, seed, m0, steps0))  # epoch 0 is honest
    m, steps = run.answer(1, seed)
    bad = _failed(run.judge(1, seed, m, steps))
    assert bad == [f"start: block(s) [{block}] of leaf 0 are not the start rule's (parameters or error buffer)"], bad


class MidEpochPlant(LocalEngine):
    """Plants block 3's error buffer after step 2 of epoch 0 and commits it from there on (a cheater's
    committer hashes the buffer it holds); encodes epoch 0 and continues into epoch 1 from it."""

    def step(self, d, k, batch):
        if d.epoch == 0 and k == 2:
            self.state = _plant_block(self.state, 3)
            self.committer._ef = {}  # type: ignore[union-attr]
        return super().step(d, k, batch)


def test_a_buffer_changed_inside_an_epoch_fails_its_final_check_and_the_next_start(tmp_path: Path) -> None:
    """Leaves 0 and L-1 must carry the same buffer digests for every block, whatever segments are drawn."""
    run = Run(tmp_path, MidEpochPlant(SPEC, every=2))
    seed = SEEDS[0]
    m, steps = run.answer(0, seed)
    assert any(b.startswith("final block") and "changed inside the epoch" in b for b in _failed(run.judge(0, seed, m, steps)))
    m, steps = run.answer(1, seed)
    assert any(b.startswith("start:") and "inside epoch e-1" in b for b in _failed(run.judge(1, seed, m, steps)))


def test_a_trainer_answers_two_batch_sizes_with_the_same_audit_bytes(tmp_path: Path) -> None:
    """4 rows in 2 groups and 16 rows in 8 groups (2 rows of 16 tokens each): every challenge file of
    the larger batch has exactly the smaller one's bytes, and both pass the verifier's check."""
    sizes = {}
    for rows, micro in ((4, 2), (16, 8)):
        spec = replace(SPEC, batch_size=rows, microbatches=micro)
        eng, d = LocalEngine(spec, every=2), EpochDir(tmp_path / str(rows), 0)
        leaves = [eng.begin(d, 2, G0, None)]
        for k in range(2):
            leaves.append(eng.step(d, k, epoch_batch(spec, CORPUS, 0, SLOT, k))[1])
        for b in (0, 3, block_count(CFG) - 1):
            picks = [micro - 1, 0]
            file, openings = challenge_file(eng, d, 0, 2, b, picks, lambda k, s=spec: epoch_batch(s, CORPUS, 0, SLOT, k),
                                            dict(enumerate(leaves)), spec)
            sizes.setdefault(b, []).append(len(save_state(file)))
            c = ShardChallenge(0, 2, b, Cid(""), openings)
            f = check_segment(dict(enumerate(leaves)), c, file, spec, CORPUS, 0, SLOT)
            assert f.passed, f
    assert all(a == b for a, b in sizes.values()), sizes


# ---- issue 45: every challenge binds the data, whatever block is drawn --------------------------

ROWS = SPEC.batch_size // SPEC.microbatches  # rows per group


def _copy_group_0(e: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every group trains on group 0's rows: 1/M of the work, consistent at every block boundary."""
    x, y = epoch_batch(SPEC, CORPUS, e, SLOT, k)
    return x[:ROWS].repeat(SPEC.microbatches, 1), y[:ROWS].repeat(SPEC.microbatches, 1)


def _poison_group_1(e: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Group 1's targets replaced (a backdoor target on a quarter to a half of the batch)."""
    x, y = epoch_batch(SPEC, CORPUS, e, SLOT, k)
    y = y.clone()
    y[ROWS:2 * ROWS] = (y[ROWS:2 * ROWS] + 1) % CFG.vocab_size
    return x, y


def _own_labels(e: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch trained on the trainer's own labels."""
    x, y = epoch_batch(SPEC, CORPUS, e, SLOT, k)
    return x, (y * 7 + 3) % CFG.vocab_size


def _middle_only_seed(run: Run, opens: Callable[[list[int]], bool]) -> tuple[bytes, list[int]]:
    """A seed whose every drawn block is a middle one (neither data end) and whose challenged steps
    open groups satisfying ``opens``; with the draws' blocks."""
    n = block_count(CFG)
    for i in range(1, 600):
        s = bytes([i % 256]) * 31 + bytes([i // 256])
        steps = challenged_steps(s, ME, 3, H + 1)
        blocks = [drawn_block(s, ME, "shard", j, n) for j in range(len(steps))]
        picks = [drawn_group(s, ME, k, SPEC.microbatches) for k in steps]
        if all(0 < b < n - 1 for b in blocks) and opens(picks):
            return s, blocks
    raise AssertionError("no seed draws only middle blocks")


@pytest.mark.parametrize("data,end,opens", [
    (_copy_group_0, 0, lambda picks: any(m != 0 for m in picks)),
    (_poison_group_1, block_count(CFG) - 1, lambda picks: 1 in picks),
    (_own_labels, block_count(CFG) - 1, lambda picks: True),
], ids=["copy-group-0", "poison-group-1", "own-labels"])
def test_training_on_other_data_is_caught_on_a_challenge_of_a_middle_block(
        tmp_path: Path, data: Data, end: int, opens: Callable[[list[int]], bool]) -> None:
    """Consistent substitution: every block boundary agrees with the trainer's own rows or targets, so
    the drawn middle block's replay alone passes; the data end its challenge replays beside it (block
    0 for rows, the head for targets) on the same opened group does not."""
    run = Run(tmp_path, data=data)
    seed, blocks = _middle_only_seed(run, opens)
    m, steps = run.answer(0, seed)
    findings = run.judge(0, seed, m, steps)
    middle = [f for f in findings if f.check.startswith("block ") and int(f.check.split()[1]) in blocks]
    assert middle and all(f.passed for f in middle), middle  # what the audit saw before issue 45
    bad = _failed(findings)
    assert any(b.startswith(f"block {end} steps ") for b in bad), bad


def test_one_poisoned_group_passes_only_where_no_challenge_opens_it(tmp_path: Path) -> None:
    """The 1/M limit of a part of the batch: a poisoned group is caught by every challenge that opens
    it and by none that does not (docs/security.md §16)."""
    run = Run(tmp_path, data=_poison_group_1)
    seed, _ = _middle_only_seed(run, lambda picks: 1 not in picks)
    m, steps = run.answer(0, seed)
    assert not _failed(run.judge(0, seed, m, steps))


def test_a_windowed_answer_names_its_window_roots_and_is_judged_by_each_steps_window_seed(honest: Run) -> None:
    """audit.window (docs/protocol.md §5.4): the draws come from each window's seed (block and group keyed
    by the step), the manifest names the window roots, which must rebuild the trace root. A verifier
    that drew from other seeds, or expects another W, does not take the answer; roots that do not
    rebuild the trace are refused on decoding."""
    from dataclasses import replace as dc_replace

    from protocol import merkle, windows
    from protocol.digest import keccak
    from protocol.shard_audit import ShardAuditError

    W, e = 2, 1
    seeds = {w: keccak(b"window seed %d" % w) for w in range(windows.window_count(H + 1, W))}

    def seed_of(k: int) -> bytes:
        return seeds[windows.transition_window(k, W)]

    steps = [1, 4]
    m = shard_response(engine=honest.engine, spec=SPEC, run_id=1, epoch=e, trainer=ME, d=honest.dirs[e],
                       preimages=honest.preimages[e], seed=SEEDS[0], steps=steps, final_bps=10_000,
                       batch_of=lambda k: honest.data(e, k), publish=honest.store.put, prev=honest.dirs[0],
                       prev_preimages=honest.preimages[0], window=W, seed_of=seed_of)
    assert m.window_width == W and len(m.window_roots) == 3
    root = merkle.root([keccak(p) for p in honest.preimages[e]])
    n = block_count(CFG)
    m = decode_manifest(encode_manifest(m, n), n, max_bytes=1 << 24)

    def judge(chained: Chained) -> list:
        return audit_findings(m, chained, lambda cid, spec: load_state(honest.store.get(cid), expect=spec), SPEC,
                              CORPUS, G0, honest.pubs[e], run_id=1, epoch=e, slot=SLOT, trainer=ME, rank=RANK,
                              prev_rank=RANK)

    base = Chained(root, H + 1, SEEDS[0], tuple(steps), 10_000, prev_revealed=True,
                   prev_root=merkle.root([keccak(p) for p in honest.preimages[0]]), prev_leaf_count=H + 1,
                   window=W, seed_of=seed_of)
    assert not _failed(judge(base)), _failed(judge(base))
    other = {w: keccak(b"other %d" % w) for w in seeds}
    for wrong in (dc_replace(base, seed_of=lambda k: other[windows.transition_window(k, W)]),
                  dc_replace(base, seed_of=None, window=0), dc_replace(base, window=4)):
        assert _failed(judge(wrong)) == [("manifest: manifest does not match the on-chain trace or the drawn segments, "
                                          "blocks and groups")]
    for bad in (dc_replace(m, window_roots=m.window_roots[:2] + (keccak(b"x"),)), dc_replace(m, window_width=0)):
        with pytest.raises(ShardAuditError, match="window"):
            encode_manifest(bad, n)
