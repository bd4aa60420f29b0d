"""bf16 autocast as a run's precision: replay stays bitwise, the state stays fp32, the config says it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from protocol.config import ConfigError, RunConfig, from_dict, to_dict
from protocol.errors import VerilocoError
from protocol.leaf import block_names, tensor_digest
from protocol.model import loss_fn, preset
from trainer.blockstep import blockwise_step, replay_block
from trainer.inner import (
    MOM1,
    MOM2,
    PARAM,
    RNG,
    STEP,
    InnerConfig,
    configure_determinism,
    init_state,
    section,
    train_step,
)

INNER = InnerConfig(lr=3e-3, warmup_steps=2, total_steps=50)


def _bf16(name: str):
    return dataclasses.replace(preset(name), precision="bf16")


def _batch(seed: int, vocab: int, b: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (b, 16), generator=g)
    return x, torch.roll(x, -1, 1)


@pytest.fixture(autouse=True)
def _det() -> None:
    configure_determinism(1)


@pytest.mark.parametrize("name", ["tiny", "llama-tiny"])
def test_bf16_every_block_replayed_alone_matches_the_trainer_bitwise(name: str) -> None:
    cfg = _bf16(name)
    state = init_state(cfg, 0)
    state, _, _ = blockwise_step(state, _batch(1, cfg.vocab_size), cfg, INNER, 2)
    new, _, ios = blockwise_step(state, _batch(2, cfg.vocab_size), cfg, INNER, 2)
    assert all(t.dtype in (torch.float32, torch.int64) for t in new.values()), "master state stays fp32"
    assert all(io.act is None or io.act.dtype == torch.float32 for io in ios), "boundaries stay fp32"
    groups, sqs = block_names(cfg), [io.sq for io in ios]
    for b, names in enumerate(groups):
        blk = {p + n: state[p + n] for p in (PARAM, MOM1, MOM2) for n in names}
        blk[STEP], blk[RNG] = state[STEP], state[RNG]
        inp = ios[b - 1].act if b > 0 else None
        g_out = ios[b + 1].grad_in if b < len(groups) - 1 else None
        got, io = replay_block(blk, b, _batch(2, cfg.vocab_size), cfg, INNER, 2, inp, g_out, sqs)
        for n in names:
            for p in (PARAM, MOM1, MOM2):
                assert torch.equal(got[p + n], new[p + n]), (b, p + n)
        assert tensor_digest(io.act) == tensor_digest(ios[b].act)


def test_bf16_computes_something_else_than_fp32_but_close() -> None:
    fp32, bf16 = preset("tiny"), _bf16("tiny")
    params = section(init_state(fp32, 0), PARAM)
    x, y = _batch(3, fp32.vocab_size)
    a, b = loss_fn(fp32, params, x, y), loss_fn(bf16, params, x, y)
    assert a.dtype == b.dtype == torch.float32
    assert not torch.equal(a, b), "autocast did not take effect"
    assert abs(a.item() - b.item()) / a.item() < 1e-2
    s1, _ = train_step(init_state(bf16, 0), (x, y), bf16, INNER)
    s2, _ = train_step(init_state(bf16, 0), (x, y), bf16, INNER)
    assert all(torch.equal(s1[k], s2[k]) for k in s1), "the plain step in bf16 is reproducible too"


def test_precision_is_a_run_setting_and_fp32_keeps_old_digests() -> None:
    base = RunConfig()
    assert "precision" not in to_dict(base)["model"], "the default is left out, so old configs keep their digest"
    cfg = base.replace(model={"precision": "bf16"})
    assert cfg.model_config().precision == "bf16"
    assert cfg.digest() != base.digest()
    assert from_dict(to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match="model.precision"):
        base.replace(model={"precision": "fp8"})
    with pytest.raises(VerilocoError, match="precision"):
        dataclasses.replace(preset("tiny"), precision="fp16")
