"""The inner step: explicit AdamW that matches torch's, never mutates its input, replays bit for bit."""

import itertools
import math
import time

import pytest
import torch

from dilocox.inner import (
    EF,
    PARAM,
    STEP,
    InnerConfig,
    TrainerError,
    apply_update,
    check_state,
    clip_grads,
    compute_grads,
    configure_determinism,
    init_state,
    lr_at,
    section,
    train_step,
)
from protocol.data import Corpus, batch, default_corpus
from protocol.digest import state_digest
from protocol.model import PRESETS, init_params, loss_fn

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]
CFG = InnerConfig(lr=3e-3, warmup_steps=3, total_steps=20, grad_clip=1.0)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    configure_determinism(1)
    return default_corpus(200_000)


def _batch(corpus: Corpus, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return batch(corpus, 1, 0, 0, step, batch_size=4, seq_len=TINY.seq_len)


def test_state_layout_is_the_spec_layout() -> None:
    s = init_state(TINY, 0)
    check_state(s, TINY)
    names = {k.split("/")[0] for k in s}
    assert names == {"param", "adam.m", "adam.v", "ef", "meta"}
    assert s[STEP].dtype == torch.int64 and s[STEP].shape == (1,)
    bad = dict(s)
    bad["extra/x"] = torch.zeros(1)
    with pytest.raises(TrainerError, match="unknown keys"):
        check_state(bad, TINY)
    del bad["extra/x"], bad["ef/wte.weight"]
    with pytest.raises(TrainerError, match="ef/wte.weight"):
        check_state(bad, TINY)


def test_lr_schedule_warms_up_then_decays_to_floor() -> None:
    lrs = [lr_at(k, CFG) for k in range(25)]
    assert lrs[0] == pytest.approx(CFG.lr / 3) and lrs[2] == pytest.approx(CFG.lr)
    assert all(a >= b for a, b in itertools.pairwise(lrs[2:]))
    assert lrs[-1] == pytest.approx(CFG.lr * CFG.min_lr_ratio)


def test_clip_scales_to_max_norm() -> None:
    g = {"a": torch.full((3,), 4.0), "b": torch.full((1,), 4.0)}  # norm 8
    clipped, norm = clip_grads(g, 2.0)
    assert norm == pytest.approx(8.0)
    total = math.sqrt(sum(float(t.pow(2).sum()) for t in clipped.values()))
    assert total == pytest.approx(2.0, rel=1e-5)
    small, _ = clip_grads(g, 100.0)
    assert torch.equal(small["a"], g["a"])


def test_update_matches_torch_adamw(corpus: Corpus) -> None:
    """Our written-out AdamW equals torch.optim.AdamW (no clipping, constant lr) to fp32 rounding."""
    cfg = InnerConfig(
        lr=1e-2, warmup_steps=0, total_steps=10, min_lr_ratio=1.0, grad_clip=0.0, weight_decay=0.1
    )
    s = init_state(TINY, 0)
    ref = {n: p.clone().requires_grad_() for n, p in init_params(TINY, 0).items()}
    decay = [p for p in ref.values() if p.dim() >= 2]
    other = [p for p in ref.values() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        foreach=False,
    )
    for k in range(3):
        x, y = _batch(corpus, k)
        s, _ = train_step(s, (x, y), TINY, cfg)
        opt.zero_grad()
        loss_fn(TINY, ref, x, y).backward()
        opt.step()
    for n, p in ref.items():
        torch.testing.assert_close(s[PARAM + n], p.detach(), rtol=1e-5, atol=1e-6)


def test_train_step_is_pure_and_lowers_loss(corpus: Corpus) -> None:
    s0 = init_state(TINY, 0)
    d0 = state_digest(s0)
    s, first = train_step(s0, _batch(corpus, 0), TINY, CFG)
    assert state_digest(s0) == d0  # input untouched
    assert int(s[STEP]) == 1
    assert torch.equal(s[EF + "wte.weight"], s0[EF + "wte.weight"])  # the step leaves ef alone
    for k in range(1, 15):
        s, loss = train_step(s, _batch(corpus, k), TINY, CFG)
    assert loss < first - 0.5


def test_replay_is_bitwise_and_digest_cost_is_reported(corpus: Corpus) -> None:
    s = init_state(TINY, 0)
    for k in range(3):
        s, _ = train_step(s, _batch(corpus, k), TINY, CFG)
    b = _batch(corpus, 3)
    a1, l1 = train_step(s, b, TINY, CFG)
    a2, l2 = train_step(dict(s), b, TINY, CFG)
    assert l1 == l2
    assert state_digest(a1) == state_digest(a2)
    other, _ = train_step(s, _batch(corpus, 4), TINY, CFG)
    assert state_digest(other) != state_digest(a1)
    t0 = time.perf_counter()
    for _ in range(5):
        state_digest(a1)
    digest_ms = (time.perf_counter() - t0) / 5 * 1e3
    t0 = time.perf_counter()
    train_step(s, b, TINY, CFG)
    step_ms = (time.perf_counter() - t0) * 1e3
    print(f"tiny: state digest {digest_ms:.2f} ms, train_step {step_ms:.2f} ms")


def test_bad_batches_and_nan_loss_are_clear_errors(corpus: Corpus) -> None:
    s = init_state(TINY, 0)
    x, y = _batch(corpus, 0)
    with pytest.raises(TrainerError, match="int64"):
        train_step(s, (x.float(), y), TINY, CFG)
    broken = dict(s)
    broken[PARAM + "lm_head.weight"] = torch.full_like(s[PARAM + "lm_head.weight"], float("nan"))
    with pytest.raises(TrainerError, match="loss is nan"):
        train_step(broken, (x, y), TINY, CFG)
    missing = dict(s)
    del missing["adam.v/wte.weight"]
    with pytest.raises(TrainerError, match="adam.v/wte.weight"):
        train_step(missing, (x, y), TINY, CFG)


def test_apply_update_uses_given_grads() -> None:
    s = init_state(TINY, 0)
    zero = {n: torch.zeros_like(p) for n, p in section(s, PARAM).items()}
    cfg = InnerConfig(weight_decay=0.0)
    out = apply_update(s, zero, cfg)
    assert all(torch.equal(out[PARAM + n], s[PARAM + n]) for n in zero)
    grads, _ = compute_grads(section(s, PARAM), (torch.zeros(1, 4, dtype=torch.long),) * 2, TINY)
    assert set(grads) == set(zero)
