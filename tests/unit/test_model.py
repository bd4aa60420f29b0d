"""The models (GPT-2 and Llama-style): presets have the intended sizes, init is a pure function of
(config, seed), forward is causal, and the Llama pieces compute what their definitions say."""

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
LLAMA = PRESETS["llama-tiny"]
ARCHS = pytest.mark.parametrize("cfg", [TINY, LLAMA], ids=["gpt2", "llama"])


def test_preset_sizes() -> None:
    assert n_params(TINY) < 500_000 and n_params(LLAMA) < 500_000
    assert 8e6 < n_params(PRESETS["small"]) < 13e6
    assert 8e6 < n_params(PRESETS["llama-small"]) < 13e6
    assert 80e6 < n_params(PRESETS["gpt2-124m"]) < 130e6
    assert 0.9e9 < n_params(PRESETS["llama-1b"]) < 1.1e9


def test_llama_has_no_biases_or_position_table_and_uses_gqa() -> None:
    shapes = param_shapes(PRESETS["llama-1b"])  # meta device: no memory
    assert not any(n.endswith("bias") for n in shapes) and "wpe.weight" not in shapes
    assert shapes["blocks.0.attn_q.weight"] == (2048, 2048)
    assert shapes["blocks.0.attn_k.weight"] == (512, 2048)  # 8 kv heads of 64
    assert shapes["blocks.0.mlp_gate.weight"] == (8192, 2048)
    assert shapes["blocks.0.ln_1.weight"] == (2048,)
    with pytest.raises(ModelError, match="multiple of n_kv_head"):
        GPTConfig(n_layer=1, n_head=4, d_model=64, seq_len=8, arch="llama", n_kv_head=3)
    with pytest.raises(ModelError, match="unknown architecture"):
        GPTConfig(n_layer=1, n_head=4, d_model=64, seq_len=8, arch="mamba")


def test_llama_pieces_match_their_definitions() -> None:
    """RMSNorm is x / sqrt(mean x^2 + eps) * w; rotary keeps norms and makes q.k depend on offsets only."""
    from protocol.model import RMSNorm, apply_rotary, rotary

    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    norm = RMSNorm(16, 1e-5)
    want = x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    torch.testing.assert_close(norm(x), want)
    cos, sin = rotary(12, 8, 10000.0, torch.device("cpu"))
    q = torch.randn(1, 1, 1, 8, generator=torch.Generator().manual_seed(1)).expand(1, 1, 12, 8)
    k = torch.randn(1, 1, 1, 8, generator=torch.Generator().manual_seed(2)).expand(1, 1, 12, 8)
    rq, rk = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    dots = (rq[0, 0, 3:] * rk[0, 0, :-3]).sum(-1)  # every pair 3 positions apart
    torch.testing.assert_close(dots, dots[:1].expand_as(dots), rtol=1e-5, atol=1e-5)
    assert torch.equal(rq[0, 0, 0], q[0, 0, 0])  # position 0 is not rotated


def test_unknown_preset_and_bad_shape_are_clear_errors() -> None:
    with pytest.raises(ModelError, match="choose one of"):
        preset("huge")
    with pytest.raises(ModelError, match="divisible"):
        GPTConfig(n_layer=1, n_head=3, d_model=64, seq_len=8)


@ARCHS
def test_init_is_deterministic_and_seed_dependent(cfg: GPTConfig) -> None:
    a, b, c = init_params(cfg, 1), init_params(cfg, 1), init_params(cfg, 2)
    assert list(a) == list(param_shapes(cfg))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["wte.weight"], c["wte.weight"])
    assert torch.equal(a["blocks.0.ln_1.weight"], torch.ones(cfg.d_model))
    torch.manual_seed(123)  # global RNG must not matter
    assert torch.equal(init_params(cfg, 1)["blocks.0.mlp_proj.weight"], a["blocks.0.mlp_proj.weight"])


@ARCHS
def test_initial_loss_is_near_uniform_and_forward_is_causal(cfg: GPTConfig) -> None:
    p = init_params(cfg, 0)
    x = torch.randint(0, 256, (2, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    loss = float(loss_fn(cfg, p, x, x))
    assert abs(loss - torch.log(torch.tensor(256.0)).item()) < 0.2
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 256  # changing the last token must not change earlier logits
    la, lb = forward(cfg, p, x), forward(cfg, p, y)
    assert torch.equal(la[:, :-1], lb[:, :-1])
    assert not torch.equal(la[:, -1], lb[:, -1])


def test_architectures_are_not_interchangeable() -> None:
    with pytest.raises(ModelError, match="another preset"):
        check_params(LLAMA, init_params(TINY, 0))


@ARCHS
def test_check_params_rejects_foreign_dicts(cfg: GPTConfig) -> None:
    p = init_params(cfg, 0)
    check_params(cfg, p)
    with pytest.raises(ModelError, match="another preset"):
        check_params(PRESETS["small"], p)
    p["wte.weight"] = p["wte.weight"].double()
    with pytest.raises(ModelError, match="float32"):
        check_params(cfg, p)


@ARCHS
def test_context_overflow_is_an_error(cfg: GPTConfig) -> None:
    p = init_params(cfg, 0)
    with pytest.raises(ModelError, match="exceeds"):
        forward(cfg, p, torch.zeros(1, cfg.seq_len + 1, dtype=torch.long))
