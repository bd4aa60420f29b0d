"""Staged engine: S stage processes own their blocks and give LocalEngine's bits, leaves and payload."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dilocox.compress import CompressionConfig
from dilocox.delay import StartRule
from dilocox.inner import InnerConfig, TrainerError, configure_determinism
from dilocox.round import RoundSpec
from protocol.leaf import block_count
from protocol.model import init_params, preset
from trainer.checkpoints import EpochDir
from trainer.engine import LocalEngine
from trainer.stages import StagedEngine, tensor_bytes

pytestmark = pytest.mark.integration

CFG = preset("tiny")
SPEC = RoundSpec(CFG, InnerConfig(lr=3e-3, warmup_steps=2, total_steps=50), CompressionConfig(), StartRule.DELAYED,
                 run_seed=1, batch_size=4, seq_len=16, microbatches=2, shard=True, segment=2)
STEPS = 3


def _batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + k)
    x = torch.randint(0, CFG.vocab_size, (4, 16), generator=g)
    return x, torch.roll(x, -1, 1)


def _epochs(eng, root: Path, g: dict, count: int = 2) -> list:
    """Leaves, losses and payloads of ``count`` epochs, each continuing the previous one."""
    out, prev = [], None
    for e in range(count):
        d = EpochDir(root, e)
        leaves = [eng.begin(d, STEPS, g, prev).digest]
        losses = []
        for k in range(STEPS):
            loss, leaf = eng.step(d, k, _batch(10 * e + k))
            leaves.append(leaf.digest)
            losses.append(loss)
        payload, stats = eng.finish(d, 4, 7 + e)
        out.append((leaves, losses, payload, (stats.payload_bytes, stats.dense_bytes, stats.rel_error)))
        prev = d
    return out


def _audit(eng, root: Path, b: int, logged: bool = True):
    batch_of = lambda j: _batch(10 + j)  # epoch 1's batches
    shard, bounds = eng.audit_block(EpochDir(root, 1), 1, 3, b, [1, 0], batch_of, logged=logged)
    ends = [eng.block_state(EpochDir(root, 1), k, b, ("param/", "ef/")) for k in (0, STEPS)]
    return shard, bounds, ends


B = block_count(CFG) - 2  # the last transformer block's MLP half: stage 1's of 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    configure_determinism(1)
    g = init_params(CFG, 0)
    local_root, staged_root = tmp_path_factory.mktemp("local"), tmp_path_factory.mktemp("staged")
    local = LocalEngine(SPEC, every=2)
    want = _epochs(local, local_root, g)
    whole = tensor_bytes(local.state)
    eng = StagedEngine(SPEC, every=1, every_logged=2, stages=2)  # logged: checkpoints 0, 2, 3 as the local engine's
    try:
        with pytest.raises(TrainerError, match="stage 0: the engine has no epoch begun"):
            eng.step(EpochDir(staged_root, 0), 0, _batch(0))  # every stage refuses alike; none is left waiting
        got = _epochs(eng, staged_root, g)
        checkpoints = [EpochDir(staged_root, e).checkpoints() for e in (0, 1)]
        held = eng.held_bytes()
        timings = dict(eng.timings)
        owner = eng.owner[B]
        log = {"kind": eng.log_kind(EpochDir(staged_root, 1)), "bytes": eng.boundary_log_bytes(EpochDir(staged_root, 1)),
               "unlogged": eng.unlogged_steps(EpochDir(staged_root, 1))}
        audits = _audit(local, local_root, B), _audit(eng, staged_root, B)
        log["error"], log["answer_cpu_s"] = eng.log_error, eng.timings["answer_cpu_s"]
        whole_steps = _audit(eng, staged_root, B, logged=False)
        # a stage's log file garbled: every stage learns it before the pipeline runs, and the answer is whole steps
        (staged_root / "epoch-000001" / "bounds.stage0" / "grad-000002.safetensors").write_bytes(b"not a log")
        torn = _audit(eng, staged_root, B)
        log["torn_error"] = eng.log_error
        eng.forget_boundaries(EpochDir(staged_root, 1))
        log["forgotten"] = eng.boundary_log_bytes(EpochDir(staged_root, 1))
        # stage 1 cannot write its part of epoch 1's d_2 (a directory in its way, refused as a full disk would)
        full_root = tmp_path_factory.mktemp("full")
        (full_root / "epoch-000001" / "state-000002.stage1.safetensors").mkdir(parents=True)
        refused = {"got": _epochs(eng, full_root, g), "error": eng.checkpoints.error}
        (full_root / "epoch-000001" / "state-000002.stage1.safetensors").rmdir()  # as a refused write leaves it
        refused["parts"] = sorted(p.name for p in (full_root / "epoch-000001").glob("state-*.safetensors"))
        late = [eng.audit_block(EpochDir(root, 1), 2, STEPS, B, [1], lambda j: _batch(10 + j))  # from d_2 where kept
                for root in (staged_root, full_root)]
        refused["audits"] = [(shard, bounds, []) for shard, bounds in late]
    finally:
        eng.close()
    return {"refused": refused, "timings": timings, "want": want, "got": got, "whole": whole, "held": held, "owner": owner, "audits": audits,
            "root": staged_root, "log": log, "whole_steps": whole_steps, "torn": torn, "checkpoints": checkpoints}


def test_two_stages_give_the_local_leaves_and_payload_bytes_for_two_epochs(runs) -> None:
    for (wl, wloss, wp, ws), (gl, gloss, gp, gs) in zip(runs["want"], runs["got"], strict=True):
        assert gl == wl
        assert gloss == wloss
        assert gp == wp
        assert gs == ws
    assert runs["timings"]["compute_s"] > 0 and runs["timings"]["commit_s"] > 0
    assert runs["checkpoints"] == [[0, 2, 3], [0, 2, 3]]  # every 2 while every stage logs, not every step


def test_no_process_holds_the_whole_state(runs) -> None:
    whole, (node, *stages) = runs["whole"], runs["held"]
    assert node == 0
    assert len(stages) == 2 and all(0 < h < whole for h in stages)
    assert sum(stages) == whole + 16 * (len(stages) - 1)  # each stage keeps its own step and rng words
    assert max(stages) < 0.75 * whole


def _same_answer(want, got) -> None:
    """Two audit answers (shard, opened steps, block end states) with the same bits and group leaves."""
    (want_shard, want_bounds, want_ends), (got_shard, got_bounds, got_ends) = want, got
    assert want_shard.keys() == got_shard.keys()
    assert all(torch.equal(want_shard[k], got_shard[k]) for k in want_shard)
    assert len(want_bounds) == len(got_bounds) > 0
    for w, g in zip(want_bounds, got_bounds, strict=True):
        want_t, got_t = w.flat(), g.flat()
        assert want_t.keys() == got_t.keys() and all(torch.equal(want_t[k], got_t[k]) for k in want_t)
        assert w.groups.keys() == g.groups.keys() and all(w.groups[c] == g.groups[c] for c in w.groups)
    for want_end, got_end in zip(want_ends, got_ends, strict=True):
        assert want_end.keys() == got_end.keys() and all(torch.equal(want_end[n], got_end[n]) for n in want_end)


def test_an_audit_of_a_block_owned_by_stage_one_equals_the_local_one(runs) -> None:
    assert runs["owner"] == 1
    _same_answer(*runs["audits"])


def test_stages_answer_from_their_gradient_logs_with_the_bits_of_whole_steps(runs) -> None:
    """Each stage logs its blocks' total gradients (batch-free) and the answer runs AdamW plus groups
    0..m through the pipeline: the same shard, boundaries, sums and group leaves as replaying whole
    steps, and as one process answering from its boundary log."""
    log = runs["log"]
    assert log["kind"] == "gradients" and log["unlogged"] == 0 and log["error"] is None
    assert log["answer_cpu_s"] > 0  # the stages' answer CPU, which the node's clock cannot see, is counted
    assert sum(log["bytes"]) >= STEPS * 4 * sum(t.numel() for t in init_params(CFG, 0).values())
    _same_answer(runs["whole_steps"], runs["audits"][1])


def test_a_checkpoint_a_stage_cannot_write_costs_replay_distance_not_the_epoch(runs) -> None:
    """The stages keep states at the same steps; one stage failing to write its part of a mid-epoch
    state ends nothing: the epoch trains to the same leaves and payload, the engine says which state
    it lost, and answers start from a state every stage holds, with the same bits."""
    refused = runs["refused"]
    assert refused["got"] == runs["got"]
    assert refused["error"] is not None and "step 2" in refused["error"] and "stage 1" in refused["error"]
    assert refused["parts"] == ["state-000000.stage0.safetensors", "state-000000.stage1.safetensors",
                                "state-000002.stage0.safetensors",
                                "state-000003.stage0.safetensors", "state-000003.stage1.safetensors"]
    _same_answer(*refused["audits"])  # from d_2 (the run that kept it) and from d_0 (the one that could not)


def test_a_stage_missing_a_log_file_answers_with_whole_steps(runs) -> None:
    _same_answer(runs["whole_steps"], runs["torn"])
    assert "gradient log" in runs["log"]["torn_error"] and "stage 0" in runs["log"]["torn_error"]
    assert runs["log"]["forgotten"] == (0, 0)


def test_log_budgets_are_shared_by_parameters() -> None:
    """A stage's log is its blocks' totals, so its share of a log budget follows its parameters (uneven
    stages of a Llama: an even split would starve the largest), and no share overspends the budget."""
    from protocol.leaf import block_names
    from trainer.stages import log_shares, stage_blocks

    spec, budget = replace(SPEC, model=preset("llama-tiny")), 10**9
    g, names = init_params(spec.model, 0), block_names(spec.model)
    sizes = [sum(g[n].numel() for b in r for n in names[b]) for r in stage_blocks(len(names), 4)]
    assert len(set(sizes)) > 1
    assert log_shares(spec, 4, budget) == [budget * x // sum(sizes) for x in sizes]
    assert sum(log_shares(spec, 4, budget)) <= budget and log_shares(SPEC, 1, budget) == [budget]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_stages_started_by_torchrun_resume_a_crashed_epoch_to_the_same_leaves(runs) -> None:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), "-m", "trainer.stages", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        eng = StagedEngine(SPEC, every=2, stages=2, launch=False, port=port)
        try:
            d = EpochDir(runs["root"], 1)
            eng.resume(d, STEPS, 2)  # the checkpoint at step 2 (every = 2)
            loss, leaf = eng.step(d, 2, _batch(12))
            payload, _ = eng.finish(d, 4, 8)
        finally:
            eng.close()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out.decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    leaves, losses, want_payload, _ = runs["got"][1]
    assert leaf.digest == leaves[3] and loss == losses[2]
    assert payload == want_payload


def test_four_uneven_stages_of_a_llama_give_the_local_leaves(tmp_path: Path) -> None:
    configure_determinism(1)  # the stages run one thread each; so must the local engine's compression
    cfg = preset("llama-tiny")
    spec = replace(SPEC, model=cfg, microbatches=1)
    g = init_params(cfg, 3)

    def run(eng) -> list:
        d = EpochDir(tmp_path / type(eng).__name__, 0)
        x = torch.randint(0, cfg.vocab_size, (4, 16), generator=torch.Generator().manual_seed(5))
        out = [eng.begin(d, 2, g, None).digest]
        out += [eng.step(d, k, (x, torch.roll(x, -k - 1, 1)))[1].digest for k in range(2)]
        return [*out, eng.finish(d, 2, 3)[0]]

    want = run(LocalEngine(spec, every=1))
    eng = StagedEngine(spec, every=1, every_logged=2, stages=4, keep_boundaries=False)
    try:
        # embeddings + attention 0 | MLP 0 + attention 1 | MLP 1 | head: a transformer block split across stages
        assert [len(r) for r in eng.ranges] == [2, 2, 1, 1]
        got = run(eng)
    finally:
        eng.close()
    assert got == want
    assert EpochDir(tmp_path / "StagedEngine", 0).checkpoints() == [0, 1, 2]  # no log: the dense spacing


def test_two_stages_merge_like_the_local_engine(tmp_path: Path) -> None:
    """The merge rule (docs/protocol.md §8): each stage folds in its blocks' share of G_e at step m, and
    an audit replaying across that step repeats it; leaves, payloads and the audit match one process,
    and so do the drop of answered steps (`drop_before`) and an answer after it."""
    configure_determinism(1)
    spec = replace(SPEC, rule=StartRule.MERGE, merge_step=1)
    g0 = init_params(CFG, 0)
    g1 = {n: t + 1e-3 for n, t in g0.items()}

    def run(eng) -> list:
        root, out, prev = tmp_path / type(eng).__name__, [], None
        for e, g_e in enumerate((g0, g1)):
            d = EpochDir(root, e)
            out.append(eng.begin(d, STEPS, g0, prev).digest)
            for k in range(STEPS):
                if spec.merges_at(k, e):
                    eng.merge(d, g_e)
                out.append(eng.step(d, k, _batch(10 * e + k))[1].digest)
            out.append(eng.finish(d, 4, 7 + e)[0])
            prev = d
        for logged in (False, True):  # whole steps, then (staged) the gradient logs: both cross the merge
            shard, bounds = eng.audit_block(EpochDir(root, 1), 1, 3, B, [0, 1], lambda j: _batch(10 + j), logged=logged)
            out += [sorted((k, v.tolist()) for k, v in shard.items()),
                    [sorted((k, t.tolist()) for k, t in o.flat().items()) for o in bounds]]
        # a windowed run's retention: what answers before step 2 needed goes (each stage its own log), and
        # an answer from 2 on is the bits it was
        d1 = EpochDir(root, 1)
        out += [eng.drop_before(d1, 2) > 0, d1.checkpoints()]
        shard, bounds = eng.audit_block(d1, 2, 3, B, [1], lambda j: _batch(10 + j))
        out += [sorted((k, v.tolist()) for k, v in shard.items()),
                [sorted((k, t.tolist()) for k, t in o.flat().items()) for o in bounds], eng.log_error]
        return out

    want = run(LocalEngine(spec, every=2))
    eng = StagedEngine(spec, every=2, stages=2)
    try:
        got = run(eng)
    finally:
        eng.close()
    assert got == want
    assert want != run(LocalEngine(replace(spec, merge_step=2), every=2))  # the merge step is in what they computed
