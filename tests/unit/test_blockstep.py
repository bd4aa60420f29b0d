"""The block-wise step: one block replayed alone gives the trainer's bits; forged inputs are seen."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dilocox.blockstep import blockwise_step, replay_block, replay_group
from dilocox.inner import (
    MOM1,
    MOM2,
    PARAM,
    RNG,
    STEP,
    InnerConfig,
    configure_determinism,
    init_state,
    train_step,
)
from protocol.leaf import (
    LeafCommitter,
    PartialSums,
    StepLeaf,
    block_names,
    group_root,
    partial_digest,
    tensor_digest,
)
from protocol.model import GPTConfig, preset

CFG = preset("tiny")
INNER = InnerConfig(lr=3e-3, warmup_steps=2, total_steps=50)


def _batch(seed: int, b: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, CFG.vocab_size, (b, 16), generator=g)
    return x, torch.roll(x, -1, 1)


def _block_state(state, names):
    out = {p + n: state[p + n] for p in (PARAM, MOM1, MOM2) for n in names}
    out[STEP], out[RNG] = state[STEP], state[RNG]
    return out


@pytest.fixture(autouse=True)
def _det() -> None:
    configure_determinism(1)


BF16 = [dataclasses.replace(preset(n), precision="bf16") for n in ("tiny", "llama-tiny")]


@pytest.mark.parametrize("cfg,micro", [(CFG, 1), (CFG, 2), (BF16[0], 2), (BF16[1], 2)],
                         ids=["fp32-1", "fp32-2", "bf16-gpt2", "bf16-llama"])
def test_every_block_replayed_alone_matches_the_trainer_bitwise(cfg: GPTConfig, micro: int) -> None:
    state = init_state(cfg, 0)
    state, _, _ = blockwise_step(state, _batch(1), cfg, INNER, micro)  # non-zero moments
    new, loss, ios = blockwise_step(state, _batch(2), cfg, INNER, micro)
    assert all(t.dtype in (torch.float32, torch.int64) for t in new.values()), "the state stays fp32 in bf16"
    assert all(io.act is None or io.act.dtype == torch.float32 for io in ios), "so do the boundaries"
    groups = block_names(cfg)
    sqs = [io.sq for io in ios]
    for b, names in enumerate(groups):
        inp = ios[b - 1].act if b > 0 else None
        g_out = ios[b + 1].grad_in if b < len(groups) - 1 else None
        got, io = replay_block(_block_state(state, names), b, _batch(2), cfg, INNER, micro, inp, g_out, sqs)
        for n in names:
            for p in (PARAM, MOM1, MOM2):
                assert torch.equal(got[p + n], new[p + n]), (b, p + n)
        assert tensor_digest(io.act) == tensor_digest(ios[b].act)
        assert tensor_digest(io.grad_in) == tensor_digest(ios[b].grad_in)
        assert torch.equal(io.sq, ios[b].sq)
    assert loss > 0


def test_blockwise_step_is_the_same_training_within_float_tolerance() -> None:
    state = init_state(CFG, 0)
    a, la, _ = blockwise_step(state, _batch(3), CFG, INNER, 1)
    b, lb = train_step(state, _batch(3), CFG, INNER)
    assert abs(la - lb) < 1e-5
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), rtol=1e-4, atol=1e-6), k


def test_a_forged_input_activation_changes_the_block_output() -> None:
    state = init_state(CFG, 0)
    _, _, ios = blockwise_step(state, _batch(4), CFG, INNER, 1)
    names = block_names(CFG)[2]
    forged = ios[1].act.clone()
    forged[0, 0, 0] += 1e-3
    _, io = replay_block(_block_state(state, names), 2, _batch(4), CFG, INNER, 1, forged, ios[3].grad_in,
                         [io.sq for io in ios])
    assert tensor_digest(io.act) != tensor_digest(ios[2].act)


def test_leaf_preimage_round_trips_and_binds_every_field() -> None:
    state = init_state(CFG, 0)
    new, _, ios = blockwise_step(state, _batch(5), CFG, INNER, 1)
    c = LeafCommitter(CFG, segment=2, leaf_count=3)
    groups = c.group_leaves(ios, {})
    l0, l1, l2 = c.leaf(0, state, None), c.leaf(1, new, ios, groups), c.leaf(2, new, ios, groups)
    assert StepLeaf.decode(l1.encode(), len(block_names(CFG))) == l1
    assert l1.blocks[0].params == bytes(32)  # not a state leaf
    assert l2.blocks[0].params != bytes(32) and l2.blocks[0].ef == l0.blocks[0].ef
    assert len({l0.digest, l1.digest, l2.digest}) == 3


@pytest.mark.parametrize("name", ["tiny", "llama-tiny"])
def test_each_transformer_block_is_two_audit_blocks_whose_chain_is_the_block(name: str) -> None:
    """Attention half then MLP half is the model's own block, bit for bit; each half holds only its names."""
    from dilocox.blockstep import block_module
    from protocol.leaf import block_count
    from protocol.model import half_of, init_params, model_class

    cfg: GPTConfig = preset(name)
    groups = block_names(cfg)
    assert len(groups) == block_count(cfg) == 2 * cfg.n_layer + 2
    for i in range(cfg.n_layer):
        attn, mlp = groups[1 + 2 * i], groups[2 + 2 * i]
        assert attn and all(n.split(".")[2] == "ln_1" or n.split(".")[2].startswith("attn_") for n in attn)
        assert mlp and all(n.split(".")[2] == "ln_2" or n.split(".")[2].startswith("mlp_") for n in mlp)
    g = init_params(cfg, 1)
    block = model_class(cfg).block(cfg)
    block.load_state_dict({n.split(".", 2)[2]: t for n, t in g.items() if n.startswith("blocks.0.")})
    x = torch.randn(2, 8, cfg.d_model, generator=torch.Generator().manual_seed(0))
    h = torch.func.functional_call(block_module(cfg, 1), {n: g[n] for n in groups[1]}, (x,))
    out = torch.func.functional_call(block_module(cfg, 2), {n: g[n] for n in groups[2]}, (h,))
    assert torch.equal(out, block(x))
    with pytest.raises(Exception, match="neither half"):
        half_of("ln_3")



def test_group_leaves_bind_each_groups_boundaries_and_running_sum() -> None:
    """Two groups: group 0's leaf holds g_0's digest, the last group's none (the total is bound by the
    state); replaying one group alone gives that group's rows and the link to the next sum."""
    state = init_state(CFG, 0)
    sums = PartialSums(2)
    _, _, ios = blockwise_step(state, _batch(6), CFG, INNER, 2, sums)
    c = LeafCommitter(CFG, segment=2, leaf_count=3, micro=2)
    groups = c.group_leaves(ios, sums.digests)
    b = 3
    names = block_names(CFG)[b]
    g0, act0, gin0 = replay_group(_block_state(state, names), b, _batch(6), CFG, 2, 0,
                                  ios[b - 1].act.chunk(2)[0], ios[b + 1].grad_in.chunk(2)[0])
    assert (tensor_digest(act0), tensor_digest(gin0), partial_digest(g0)) == (
        groups[b][0].act, groups[b][0].grad, groups[b][0].after)
    assert groups[b][1].after == bytes(32) and groups[0][0].grad == bytes(32) and groups[len(ios) - 1][0].act == bytes(32)
    forged = dict(ios[b].__dict__)
    forged["act"] = ios[b].act.clone()
    forged["act"][-1, 0, 0] += 1e-3  # a row of the last group only
    other = c.group_leaves({**dict(enumerate(ios)), b: type(ios[b])(**forged)}, sums.digests)
    assert other[b][0] == groups[b][0] and other[b][1] != groups[b][1]
    assert group_root(other[b]) != group_root(groups[b])
