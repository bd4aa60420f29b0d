"""The local shard engine: leaves, checkpoints, audit material and the payload of one epoch."""

from __future__ import annotations

from pathlib import Path

import torch

from dilocox.blockstep import accumulate, block_update, replay_group
from dilocox.compress import CompressionConfig
from dilocox.delay import StartRule
from dilocox.inner import InnerConfig, configure_determinism
from dilocox.round import RoundSpec
from protocol.leaf import (
    block_names,
    group_root,
    part_digest,
    partial_digest,
    sq_bytes,
    tensor_digest,
)
from protocol.model import init_params, preset
from trainer.checkpoints import EpochDir
from trainer.engine import LocalEngine

CFG = preset("tiny")
SPEC = RoundSpec(CFG, InnerConfig(lr=3e-3, warmup_steps=2, total_steps=50), CompressionConfig(), StartRule.DELAYED,
                 run_seed=1, batch_size=4, seq_len=16, microbatches=2, shard=True, segment=2)


def _batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + k)
    x = torch.randint(0, CFG.vocab_size, (4, 16), generator=g)
    return x, torch.roll(x, -1, 1)


def test_an_audited_block_replays_to_the_committed_leaves(tmp_path: Path) -> None:
    configure_determinism(1)
    eng, d = LocalEngine(SPEC, every=2), EpochDir(tmp_path, 0)
    leaves = [eng.begin(d, 5, init_params(CFG, 0), None)]
    for k in range(5):
        leaves.append(eng.step(d, k, _batch(k))[1])
    payload, stats = eng.finish(d, 4, 7)
    assert stats.payload_bytes == len(payload) and d.has("carried")
    b = 2
    picks = [1, 0]
    shard, opened = eng.audit_block(d, 2, 4, b, picks, _batch)
    assert leaves[2].blocks[b].params != bytes(32)  # a state leaf (segment 2)
    state = shard
    for j, m, o in zip(range(2, 4), picks, opened):
        assert {bb: group_root(g) for bb, g in o.groups.items()} == {bb: leaves[j + 1].blocks[bb].groups for bb in (1, 2, 3)}
        g_m, act, g_in = replay_group(state, b, _batch(j), CFG, 2, m, o.inp, o.g_out)
        mine = o.groups[b][m]
        assert (tensor_digest(act), tensor_digest(g_in)) == (mine.act, mine.grad)
        assert o.total is not None  # a block's opening carries the step's gradient sums
        after = g_m if m == 0 else accumulate(o.before, g_m)
        assert partial_digest(after) == (mine.after if m == 0 else partial_digest(o.total))
        state, sq = block_update(state, b, o.total, SPEC.inner, leaves[j + 1].sqs)
        assert sq_bytes(sq) == leaves[j + 1].blocks[b].sq
    names = block_names(CFG)[b]

    assert part_digest(state, names, ("param/",)) == leaves[4].blocks[b].params
    assert part_digest(state, names, ("adam.m/", "adam.v/")) == leaves[4].blocks[b].opt
