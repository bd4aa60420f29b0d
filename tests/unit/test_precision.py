"""bf16 autocast as a run's precision: it computes something else, reproducibly, and the config says it.

(Block replay in bf16 is tested with the fp32 one: tests/unit/test_blockstep.py.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dilocox.inner import (
    PARAM,
    InnerConfig,
    configure_determinism,
    init_state,
    section,
    train_step,
)
from protocol.config import ConfigError, RunConfig, from_dict, to_dict
from protocol.errors import VerilocoError
from protocol.model import loss_fn, preset

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
