"""The GPT: presets have the intended sizes, init is a pure function of (config, seed), forward is causal."""

import pytest
import torch

from protocol.model import (
    PRESETS,
    GPTConfig,
    ModelError,
    check_params,
    forward,
    init_params,
    loss_fn,
    n_params,
    param_shapes,
    preset,
)

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]


def test_preset_sizes() -> None:
    assert n_params(TINY) < 500_000
    assert 8e6 < n_params(PRESETS["small"]) < 13e6
    assert 80e6 < n_params(PRESETS["gpt2-124m"]) < 130e6


def test_unknown_preset_and_bad_shape_are_clear_errors() -> None:
    with pytest.raises(ModelError, match="choose one of"):
        preset("huge")
    with pytest.raises(ModelError, match="divisible"):
        GPTConfig(n_layer=1, n_head=3, d_model=64, seq_len=8)


def test_init_is_deterministic_and_seed_dependent() -> None:
    a, b, c = init_params(TINY, 1), init_params(TINY, 1), init_params(TINY, 2)
    assert list(a) == list(param_shapes(TINY))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["wte.weight"], c["wte.weight"])
    torch.manual_seed(123)  # global RNG must not matter
    assert torch.equal(init_params(TINY, 1)["blocks.0.mlp_fc.weight"], a["blocks.0.mlp_fc.weight"])


def test_initial_loss_is_near_uniform_and_forward_is_causal() -> None:
    p = init_params(TINY, 0)
    x = torch.randint(0, 256, (2, TINY.seq_len), generator=torch.Generator().manual_seed(0))
    loss = float(loss_fn(TINY, p, x, x))
    assert abs(loss - torch.log(torch.tensor(256.0)).item()) < 0.2
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 256  # changing the last token must not change earlier logits
    la, lb = forward(TINY, p, x), forward(TINY, p, y)
    assert torch.equal(la[:, :-1], lb[:, :-1])
    assert not torch.equal(la[:, -1], lb[:, -1])


def test_check_params_rejects_foreign_dicts() -> None:
    p = init_params(TINY, 0)
    check_params(TINY, p)
    with pytest.raises(ModelError, match="another preset"):
        check_params(PRESETS["small"], p)
    p["wte.weight"] = p["wte.weight"].double()
    with pytest.raises(ModelError, match="float32"):
        check_params(TINY, p)


def test_context_overflow_is_an_error() -> None:
    p = init_params(TINY, 0)
    with pytest.raises(ModelError, match="exceeds"):
        forward(TINY, p, torch.zeros(1, TINY.seq_len + 1, dtype=torch.long))
