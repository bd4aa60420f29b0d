"""A trainer's state sharded over S pipeline stage processes, each the owner of its audit blocks.

``StagedEngine`` is the ``trainer.engine.Engine`` of a trainer with ``--stages S``. The audit blocks
(``protocol.leaf.block_names``: embeddings, two halves per transformer block, head) are split into S
contiguous ranges (``stage_blocks``); stage s is one process that alone holds its blocks'
parameters, Adam moments and error buffer. The node process (the engine object) holds no training
tensor: it sends commands, each step's batch, and at ``begin`` each stage's part of the global model
G; it gets back per-block leaf entries (digests), the loss, payload parts and, for an audit, the
one block's tensors. ``held_bytes`` reports, from each process's own live tensors, what it holds.

A step runs the same ``BlockRun``s as ``dilocox.blockstep.blockwise_step``, GPipe-ordered: every
micro-batch forward (activations ``dist.send`` to the next stage), then backwards m = 0..M-1
(gradients back), so each block accumulates its micro-batch gradients in the same order; the
per-block squared norms are all-gathered so every stage clips with ``global_norm`` over all blocks
in block order. Leaves and payloads are therefore bitwise equal to ``LocalEngine``'s (S = 1): the
split changes where a block runs, never what it computes. Each stage digests its blocks and
compresses its tensors itself, in parallel; the node merges the payload parts into the one payload
``compress`` gives on the whole state (``dilocox.compress.merge_compressed``).

Files, in the epoch's ``EpochDir``: ``state-<k>.stage<s>.safetensors`` (checkpoint parts),
``carried.stage<s>.safetensors`` and ``bounds.stage<s>/`` (the stage's gradient log, where kept);
``EpochDir.checkpoints`` lists the steps of either layout.

Processes and rendezvous: torch.distributed, world S + 1, the node rank 0 (it hosts the store),
stage s rank s + 1; commands go over gloo, stage-to-stage tensors over a stage group (gloo on CPU,
NCCL when the state lives on CUDA; stage s then uses GPU ``LOCAL_RANK`` or s). By default the engine
spawns the stages itself (torch.multiprocessing). The stage entry point reads torch's launcher
environment (RANK = stage index, WORLD_SIZE = S, MASTER_ADDR, LOCAL_RANK), so stages can be started
on other hosts with torchrun, pointing at the node's port (torchrun keeps MASTER_PORT for its own
store)::

    # node:   StagedEngine(spec, every, stages=2, launch=False, addr="10.0.0.1", port=29611)
    torchrun --nnodes 1 --nproc-per-node 2 --master-addr 10.0.0.1 -m trainer.stages --port 29611

A process has one default torch.distributed group, so it drives one ``StagedEngine`` at a time.

``PipelineSteps`` (end of the file) is the legacy state-mode ``--stages``: the node holds the full
state and ships parts to ``dilocox.pipeline`` workers every step, tolerant-equal to one process.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from dilocox.blockstep import (
    Batch,
    BlockIO,
    BlockRun,
    Capture,
    OnPartial,
    Totals,
    accumulate,
    block_leaves,
    block_module,
    global_norm,
    microbatches,
    step_update,
)
from dilocox.compress import CompressionStats, compress, merge_compressed
from dilocox.delay import carry
from dilocox.inner import (
    EF,
    MOM1,
    MOM2,
    PARAM,
    RNG,
    STEP,
    Params,
    State,
    TrainerError,
    apply_update,
    configure_determinism,
    section,
    squared_norm,
)
from dilocox.pipeline import (
    PipelineConfig,
    merge_states,
    pipeline_train_step,
    split_layers,
    stage_state,
)
from dilocox.round import RoundSpec, start_state
from protocol.errors import VerilocoError
from protocol.leaf import BlockEntry, LeafCommitter, PartialSums, StepLeaf, block_names
from protocol.model import param_shapes
from trainer.boundaries import GRADIENTS, BoundaryLog, ByteBudget, LogHeadroom
from trainer.checkpoints import Checkpointer, CheckpointRule, EpochDir
from trainer.engine import (
    MERGED,
    OFFSET,
    BatchOf,
    Opened,
    epoch_delta,
    group_rows,
    merge_step_of,
    merged_before,
    neighbours,
    restrict,
    save_merged,
    tensor_bytes,
)

Bound = tuple[Tensor | None, Tensor | None]
Budgets = tuple[int, int | None]  # a stage's share of the node's log budgets: memory, disk (None: no limit)
PORT_ENV = "VERILOCO_STAGE_PORT"  # the node's port, when not passed as --port
TIMEOUT = timedelta(minutes=30)


def stage_blocks(n_blocks: int, stages: int) -> list[range]:
    """Contiguous audit-block ranges per stage, the first stages taking one more when uneven."""
    return split_layers(n_blocks, stages, "audit blocks")


def log_shares(spec: RoundSpec, stages: int, budget: int) -> list[int]:
    """Each stage's share of a log budget, by its blocks' parameters: a stage's log is their totals,
    so an even split would leave the stage holding the embeddings short while others have room."""
    shapes, names = param_shapes(spec.model), block_names(spec.model)
    sizes = [sum(math.prod(shapes[n]) for b in r for n in names[b]) for r in stage_blocks(len(names), stages)]
    return [budget * size // sum(sizes) for size in sizes]


def part(name: str, s: int) -> str:
    """Stage s's file of checkpoint ``name`` (``state-<k>`` or ``carried``)."""
    return f"{name}.stage{s}"


def _cat(ts: Sequence[Tensor]) -> Tensor | None:
    return torch.cat(list(ts)) if ts else None


def _cpu(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.cpu()


def _meta(state: Mapping[str, Tensor]) -> tuple[int, int]:
    return int(state[STEP].item()), int(state[RNG].item())


class _Stage:
    """What one stage process holds and does: its blocks' state, steps, digests, payload part."""

    def __init__(self, spec: RoundSpec, s: int, stages: int, group: Any, device: torch.device,
                 budgets: Budgets | None = None, headroom: LogHeadroom = (None, None)) -> None:
        self.spec, self.s, self.S = spec, s, stages
        self.groups = block_names(spec.model)
        ranges = stage_blocks(len(self.groups), stages)
        self.blocks = ranges[s]
        self.owner = [j for j, r in enumerate(ranges) for _ in r]
        self.mods = {b: block_module(spec.model, b) for b in self.blocks}
        self.group, self.device = group, device
        self.state: State | None = None
        self.steps = 0
        self.committer = LeafCommitter(spec.model, spec.segment, 2, self.blocks, spec.microbatches)
        # the gradient log of this stage's blocks (None: keep none); shared by the epochs' logs, as in LocalEngine
        self.budgets = None if budgets is None else (ByteBudget(budgets[0], headroom[0]), ByteBudget(budgets[1], headroom[1]))
        self.logs: dict[Path, BoundaryLog] = {}

    # -- files

    def _load(self, d: EpochDir, name: str) -> State:
        return {k: v.to(self.device) for k, v in d.load(part(name, self.s)).items()}

    def _save(self, d: EpochDir, name: str, state: State) -> None:
        d.save(part(name, self.s), state)

    # -- the epoch

    def begin(self, d: EpochDir, steps: int, g: Params, prev: EpochDir | None) -> tuple[list[BlockEntry], tuple[int, int]]:
        g = {n: t.to(self.device) for n, t in g.items()}
        if prev is not None:
            state = start_state(self.spec, g, self._load(prev, "state-000000"), self._load(prev, "carried"))
        else:
            state = start_state(self.spec, g, None, None)
        self.state, self.steps = state, steps
        self._save(d, "state-000000", state)
        self.committer = LeafCommitter(self.spec.model, self.spec.segment, steps + 1, self.blocks, self.spec.microbatches)
        return self.committer.entries(0, state, None), _meta(state)

    def resume(self, d: EpochDir, steps: int, k: int) -> None:
        self.state, self.steps = self._load(d, f"state-{k:06d}"), steps
        self.committer = LeafCommitter(self.spec.model, self.spec.segment, steps + 1, self.blocks, self.spec.microbatches)
        self.committer.state_parts(self._load(d, "state-000000"))  # the error buffer's digests, fixed since leaf 0

    def step(self, d: EpochDir, k: int, batch: Batch) -> tuple[float, tuple[float, float, float], list[BlockEntry], tuple[int, int],
                                                               str | None, bool]:
        """Step k of this stage's blocks: (loss, CPU seconds, leaf entries, step and rng, a log write's
        failure, whether its log holds the step); the node says when to checkpoint (``checkpoint``)."""
        if self.state is None:
            raise TrainerError("the engine has no epoch begun or resumed")
        t = time.process_time()
        sums = PartialSums(self.spec.microbatches)
        totals = Totals(self.spec.microbatches, sums)
        self.state, loss, ios, _, sqs = self._pipe(self.state, batch, None, totals)
        t_step = time.process_time()
        groups = self.committer.group_leaves(ios, sums.digests)
        entries = self.committer.entries(k + 1, self.state, ios, groups)
        t_leaf = time.process_time()
        error, logged = None, False
        if self.budgets is not None:
            try:
                logged = self._log(d).put(k, [BlockIO(None, None, q) for q in sqs], groups, totals.totals)
            except OSError as exc:  # a full disk costs the cheap answer for this step, never the step
                error = f"stage {self.s}, step {k}: {exc}"
        spent = (t_step - t - sums.seconds, t_leaf - t_step + sums.seconds, time.process_time() - t_leaf)
        return loss, spent, entries, _meta(self.state), error, logged

    def checkpoint(self, d: EpochDir, k: int) -> None:
        """Keep this stage's part of d_k (every stage at the same steps: the node decides)."""
        if self.state is None:
            raise TrainerError("the stage has no epoch begun or resumed")
        self._save(d, f"state-{k:06d}", self.state)

    # -- the gradient log

    def _log(self, d: EpochDir) -> BoundaryLog:
        if d.path not in self.logs:
            ram, disk = self.budgets or (None, None)
            self.logs[d.path] = BoundaryLog(d.path, ram, disk, self.steps, name=part("bounds", self.s), kind=GRADIENTS)
        return self.logs[d.path]

    def logged(self, d: EpochDir, steps: range) -> bool:
        """Whether this stage's gradient log holds every one of ``steps``."""
        return self.budgets is not None and self._log(d).kind == GRADIENTS and self._log(d).has(steps)

    def log_bytes(self, d: EpochDir) -> tuple[int, int, list[int]]:
        """(memory, disk) bytes this stage's log of the epoch holds, and the steps it could not keep."""
        log = self.logs.get(d.path) or BoundaryLog(d.path, name=part("bounds", self.s))  # asking opens no log
        return log.ram_bytes, log.disk_bytes(), list(log.unlogged)

    def forget(self, d: EpochDir) -> None:
        self.logs.pop(d.path, BoundaryLog(d.path, name=part("bounds", self.s))).drop()

    def forget_before(self, d: EpochDir, k: int) -> int:
        """Drop this stage's logged steps before k (a windowed run's answered windows); bytes freed."""
        log = self.logs.get(d.path)
        return 0 if log is None else log.drop_before(k)

    def _agree(self, ok: bool, what: str) -> None:
        """All stages learn whether every one of them could go on (one collective): a stage that cannot
        read its log must not leave the others waiting on a pipeline it will not join."""
        flag = torch.tensor([1.0 if ok else 0.0], dtype=torch.float64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        if flag.item() < 1.0:
            raise TrainerError(what if not ok else f"another stage could not read its log ({what})")

    def audit_gradients(self, d: EpochDir, base: int, start: int, end: int, b: int, picks: Sequence[int],
                        batches: Sequence[Batch]) -> tuple[State | None, list[Opened], float]:
        """``audit`` from the gradient log: every stage advances its blocks from checkpoint ``base`` by
        AdamW alone on its logged totals; per step of the segment, groups 0..m run through the pipeline
        for group m's boundaries and the sum before it ((m + 1) / M of a step, whatever the batch)."""
        t0 = time.process_time()
        log, micro, mine = self._log(d), self.spec.microbatches, b in self.blocks
        state = self._load(d, f"state-{base:06d}")
        shard: State | None = None
        out: list[Opened] = []
        for j in range(base, end):
            if j == start and mine:
                shard = {k: v.cpu() for k, v in restrict(state, self.groups[b], (PARAM, MOM1, MOM2)).items()}
            state = self._merged(d, state, j)
            try:
                totals, sqs = log.totals(j)
                groups = neighbours(log.groups(j), b) if j >= start else {}
                error = ""
            except Exception as exc:  # noqa: BLE001 - the log is a cache: any failure means whole steps
                error = f"stage {self.s}: gradient log of step {j} unreadable ({type(exc).__name__}: {exc})"
            self._agree(not error, error or f"step {j}")
            if j >= start:
                m = picks[j - start]
                cap = Capture(b, m, micro) if mine else None
                inp, g_out = self._pipe(state, batches[j - base], b if mine else None, cap, upto=m)[3]
                total = {n: totals[n] for n in self.groups[b]} if mine and micro > 1 else None
                out.append(Opened(_cpu(inp), _cpu(g_out), None if cap is None else cap.before, total, groups))
            state = step_update(state, {n: t.to(self.device) for n, t in totals.items()}, self.spec.inner,
                                [q.to(self.device) for q in sqs])
        return shard, out, time.process_time() - t0

    def _merged(self, d: EpochDir, state: State, k: int) -> State:
        """Under the merge rule, ``state`` with this stage's share of G_e folded in before step k."""
        return merged_before(self.spec, state, k, d.epoch, lambda name, keys: {
            key: t.to(self.device) for key, t in d.load_part(part(name, self.s), keys).items()})

    def merge(self, d: EpochDir, g: Params, offset: Params | None = None) -> None:
        if self.state is None:
            raise TrainerError("the engine has no epoch begun or resumed")
        save_merged(d, g, part(MERGED, self.s))
        if offset is not None:
            save_merged(d, offset, part(OFFSET, self.s))
        self.state = self._merged(d, self.state, merge_step_of(self.spec, d.epoch))

    def finish(self, d: EpochDir, rank: int, seed: int) -> tuple[bytes, CompressionStats]:
        if self.state is None:
            raise TrainerError("the engine has no epoch to finish")
        start, end = self._load(d, "state-000000"), self.state
        c = compress(epoch_delta(self.spec, start, end, lambda: self._load(d, MERGED)), section(end, EF), rank, seed,
                     self.spec.compression)
        self._save(d, "carried", carry(end, c.new_ef))
        return c.payload, c.stats

    def has(self, d: EpochDir) -> bool:
        return d.has(part("state-000000", self.s)) and d.has(part("carried", self.s))

    def checkpoints(self, d: EpochDir) -> list[int]:
        return [k for k in d.checkpoints() if d.has(part(f"state-{k:06d}", self.s))]

    def block_state(self, d: EpochDir, k: int, b: int, prefixes: tuple[str, ...]) -> State:
        return restrict(d.load(part(f"state-{k:06d}", self.s)), self.groups[b], prefixes)

    def audit(self, d: EpochDir, base: int, start: int, end: int, b: int, picks: Sequence[int],
              batches: Sequence[Batch]) -> tuple[State | None, list[Opened], float]:
        """Whole steps from checkpoint ``base``; per step of the segment, this stage's part of the answer:
        block b's boundaries and sums if it owns b, and the group leaves of its blocks among b−1..b+1."""
        t0 = time.process_time()
        state = self._load(d, f"state-{base:06d}")
        for j in range(base, start):
            state = self._pipe(self._merged(d, state, j), batches[j - base], None)[0]
        mine = b in self.blocks
        shard = {k: v.cpu() for k, v in restrict(state, self.groups[b], (PARAM, MOM1, MOM2)).items()} if mine else None
        out: list[Opened] = []
        micro = self.spec.microbatches
        for j, m in zip(range(start, end), picks, strict=True):
            cap = Capture(b, m, micro, sums := PartialSums(micro))
            state, _, ios, (inp, g_out), _ = self._pipe(self._merged(d, state, j), batches[j - base], b if mine else None, cap)
            groups = neighbours(self.committer.group_leaves(ios, sums.digests), b)
            before = None if cap.before is None else {n: t.cpu() for n, t in cap.before.items()}
            total = None if cap.total is None or micro == 1 else {n: t.cpu() for n, t in cap.total.items()}
            out.append(Opened(_cpu(group_rows(inp, micro, m)), _cpu(group_rows(g_out, micro, m)), before, total, groups))
        return shard, out, time.process_time() - t0

    def held(self) -> int:
        return tensor_bytes(self.state)

    # -- one step of this stage

    def _pipe(self, state: State, batch: Batch, watch: int | None, on_partial: OnPartial | None = None,
              upto: int | None = None) -> tuple[State, float, dict[int, BlockIO], Bound, list[Tensor]]:
        """This stage's share of one block-wise step (collective over the stages): the new state, the loss,
        its blocks' boundaries, block ``watch``'s boundaries if it is one of them, every block's squared
        norm. ``on_partial``: as in ``dilocox.blockstep.blockwise_step``, for its blocks. ``upto`` m: only
        groups 0..m and no update (``dilocox.blockstep.group_pass``): the state comes back unchanged,
        the watched boundaries are group m's rows, and there are no boundaries or norms."""
        cfg, micro, grp = self.spec.model, self.spec.microbatches, self.group
        nb, first, last = len(self.groups), self.s == 0, self.s == self.S - 1
        prev_rank, next_rank = self.s, self.s + 2  # global ranks of the neighbouring stages
        dev = state[STEP].device
        leaves = {b: block_leaves(state, self.groups[b]) for b in self.blocks}
        acts: dict[int, list[Tensor]] = {b: [] for b in self.blocks}
        gins: dict[int, list[Tensor]] = {b: [] for b in self.blocks}
        ins: list[Tensor] = []
        gouts: list[Tensor] = []
        chains: list[list[BlockRun]] = []
        for x, y in microbatches(batch, micro)[: micro if upto is None else upto + 1]:
            x, y = x.to(dev), y.to(dev)
            h = x
            if not first:
                h = torch.empty((x.shape[0], x.shape[1], cfg.d_model), dtype=torch.float32, device=dev)
                dist.recv(h, src=prev_rank, group=grp)
                ins.append(h)
            chain = []
            for b in self.blocks:
                run = BlockRun(cfg, b, leaves[b], self.mods[b], h, micro, y if b == nb - 1 else None)
                chain.append(run)
                h = run.out.detach()
                if not run.last:
                    acts[b].append(h)
            if not last:
                dist.send(h.contiguous(), dst=next_rank, group=grp)
            chains.append(chain)
        losses = [float(c[-1].loss.detach()) for c in chains] if last else []
        acc: dict[int, Params | None] = {b: None for b in self.blocks}
        for m, chain in enumerate(chains):
            g: Tensor | None = None
            if not last:
                g = torch.empty_like(acts[self.blocks[-1]][m])
                dist.recv(g, src=next_rank, group=grp)
                gouts.append(g)
            for run in reversed(chain):
                grads, g = run.backward(g)
                acc[run.b] = accumulate(acc[run.b], grads)
                if on_partial is not None:
                    on_partial(run.b, m, acc[run.b])  # type: ignore[arg-type]
                if g is not None:
                    gins[run.b].append(g)
            if not first:
                assert g is not None
                dist.send(g.contiguous(), dst=prev_rank, group=grp)
        if upto is not None:
            if watch is None:
                return state, math.nan, {}, (None, None), []
            b = watch
            inp = None if b == 0 else ins[upto] if b == self.blocks[0] else acts[b - 1][upto]
            g_out = None if b == nb - 1 else gouts[upto] if b == self.blocks[-1] else gins[b + 1][upto]
            return state, math.nan, {}, (inp, g_out), []
        own = {b: a if a is not None else {} for b, a in acc.items()}
        sq_own = {b: squared_norm(a) for b, a in own.items()}
        # every block's squared norm (fp32, exact in fp64) and the loss (a Python float), from their owners
        vec = torch.zeros(nb + 1, dtype=torch.float64, device=dev)
        for b, sq in sq_own.items():
            vec[b] = sq.to(torch.float64)
        if last:
            vec[nb] = sum(losses) / len(losses)
        got = [torch.empty_like(vec) for _ in range(self.S)]
        dist.all_gather(got, vec, group=grp)
        loss = float(got[self.S - 1][nb])
        if not math.isfinite(loss):
            raise TrainerError(f"loss is {loss} at step {int(state[STEP].item())}; lower the learning rate or check the data")
        sqs = [sq_own[b] if b in sq_own else got[self.owner[b]][b].to(torch.float32) for b in range(nb)]
        merged: Params = {n: t for a in own.values() for n, t in a.items()}
        new = apply_update(state, merged, self.spec.inner, norm=global_norm(sqs))
        ios = {b: BlockIO(_cat(acts[b]), _cat(gins[b]), sq_own[b]) for b in self.blocks}
        bound: Bound = (None, None)
        if watch is not None:
            b = watch
            inp = None if b == 0 else _cat(ins) if b == self.blocks[0] else _cat(acts[b - 1])
            g_out = None if b == nb - 1 else _cat(gouts) if b == self.blocks[-1] else _cat(gins[b + 1])
            bound = (inp, g_out)
        return new, loss, ios, bound, sqs


def _stage_device(device: str, s: int) -> torch.device:
    if device.startswith("cuda"):
        local = int(os.environ.get("LOCAL_RANK", s))
        dev = torch.device("cuda", local % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def serve(stage: int, stages: int, addr: str, port: int) -> None:
    """Run stage ``stage`` of ``stages``: join the node at addr:port, obey its commands until told to close."""
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # torchrun's store is not the node's
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=stage + 1, world_size=stages + 1,
                            timeout=TIMEOUT)
    try:
        msg: list[Any] = [None]
        dist.recv_object_list(msg, src=0)
        spec, threads, device, budgets, headroom = msg[0]
        configure_determinism(threads, device)
        dev = _stage_device(device, stage)
        group = dist.new_group(list(range(1, stages + 1)), backend="nccl" if dev.type == "cuda" else "gloo")
        st = _Stage(spec, stage, stages, group, dev, budgets, headroom)
        while True:
            dist.recv_object_list(msg, src=0)
            op, args = msg[0]
            if op == "close":
                return
            try:
                reply: tuple[str, Any] = ("ok", getattr(st, op)(*args))
            except VerilocoError as exc:
                reply = ("error", f"stage {stage}: {exc}")
            except Exception as exc:  # noqa: BLE001 -- reported to the node, which raises; the stage keeps serving
                reply = ("error", f"stage {stage}: {type(exc).__name__}: {exc}")
            dist.send_object_list([reply], dst=0)
    finally:
        dist.destroy_process_group()


def _spawned(stage: int, stages: int, addr: str, port: int) -> None:
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(stage), WORLD_SIZE=str(stages))
    main([])


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m trainer.stages [--port P]``: one stage, from torch's launcher environment (torchrun's)."""
    ap = argparse.ArgumentParser(prog="python -m trainer.stages", description=main.__doc__)
    ap.add_argument("--port", type=int, default=None, help=f"the node's port (default: ${PORT_ENV}, else $MASTER_PORT)")
    a = ap.parse_args(argv)
    env = os.environ
    try:
        stage, stages, addr = int(env["RANK"]), int(env["WORLD_SIZE"]), env.get("MASTER_ADDR", "127.0.0.1")
        port = a.port if a.port is not None else int(env.get(PORT_ENV) or env["MASTER_PORT"])
    except KeyError as exc:
        raise TrainerError(f"{exc.args[0]} is not set: start stages with torchrun or set RANK, WORLD_SIZE, MASTER_PORT") from exc
    serve(stage, stages, addr, port)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StagedEngine:
    """The node's side of S stage processes: commands out, digests, payload parts and audit blocks back.

    ``launch=False`` waits for stages started elsewhere (torchrun; see the module docstring) on
    ``addr:port``. ``device`` ("cpu" or "cuda") is where the stages keep their state.

    With ``keep_boundaries`` each stage keeps a gradient log of its blocks (``trainer.boundaries``,
    in ``bounds.stage<s>/``), within its share of the memory and disk budgets (by its parameters), and an audit answer
    advances the state by AdamW alone and runs groups 0..m of each challenged step through the
    pipeline, as ``LocalEngine`` does from its gradient log. A stage keeps the totals, not the
    boundaries: the tensors crossing its borders live in its neighbours, and the totals are the log
    that does not grow with the batch, the only one a model big enough to need stages can keep.
    """

    concurrent_audits = False  # the stages serve one command at a time: audits wait between steps

    def __init__(self, spec: RoundSpec, every: int, stages: int = 2, threads: int = 1, device: str = "cpu",
                 launch: bool = True, addr: str = "127.0.0.1", port: int = 0, *, every_logged: int | None = None,
                 keep_boundaries: bool = True,
                 log_ram_bytes: int = 0, log_disk_bytes: int | None = None,
                 log_headroom: LogHeadroom = (None, None)) -> None:
        if spec.batch_size % spec.microbatches:
            raise TrainerError(f"batch size {spec.batch_size} is not divisible by {spec.microbatches} micro-batches")
        self.spec, self.checkpoints, self.S = spec, Checkpointer(CheckpointRule.of(every, every_logged)), stages
        self.groups = block_names(spec.model)
        self.ranges = stage_blocks(len(self.groups), stages)
        self.owner = [s for s, r in enumerate(self.ranges) for _ in r]
        self.steps = 0
        self._timings = {"compute_s": 0.0, "commit_s": 0.0, "log_s": 0.0, "answer_cpu_s": 0.0}
        self.keep_boundaries = keep_boundaries
        self.log_error: str | None = None  # the last log write or read that failed (answers then replay whole steps)
        self.procs: list[Any] = []
        if launch and device.startswith("cuda") and torch.cuda.device_count() < stages:
            raise TrainerError(f"{stages} stages on CUDA need a GPU each (NCCL), this host has {torch.cuda.device_count()}; "
                               f"use at most {torch.cuda.device_count()} stages or device cpu")
        port = port or _free_port()
        if launch:
            ctx = mp.get_context("spawn")
            self.procs = [ctx.Process(target=_spawned, args=(s, stages, addr, port), daemon=True) for s in range(stages)]
            for p in self.procs:
                p.start()
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=0, world_size=stages + 1,
                                timeout=TIMEOUT)
        ram = log_shares(spec, stages, log_ram_bytes)
        disk = None if log_disk_bytes is None else log_shares(spec, stages, log_disk_bytes)
        for s in range(stages):
            budgets = (ram[s], None if disk is None else disk[s]) if keep_boundaries else None
            dist.send_object_list([(spec, threads, device, budgets, log_headroom)], dst=s + 1)
        dist.new_group(list(range(1, stages + 1)), backend="nccl" if device.startswith("cuda") else "gloo")
        self.open = True

    # -- the command channel

    def _ask(self, calls: Mapping[int, tuple[str, tuple[Any, ...]]]) -> dict[int, Any]:
        """Send each listed stage its (op, args), then collect every reply; raise if any stage failed."""
        if not self.open:
            raise TrainerError("the staged engine is closed")
        for s, call in calls.items():
            dist.send_object_list([call], dst=s + 1)
        out, errors = {}, []
        for s in calls:
            msg: list[Any] = [None]
            dist.recv_object_list(msg, src=s + 1)
            status, value = msg[0]
            if status == "ok":
                out[s] = value
            else:
                errors.append(value)
        if errors:
            raise TrainerError("; ".join(errors))
        return out

    def _all(self, op: str, *args: Any) -> dict[int, Any]:
        return self._ask({s: (op, args) for s in range(self.S)})

    def _leaf(self, parts: Mapping[int, tuple[list[BlockEntry], tuple[int, int]]]) -> StepLeaf:
        entries = [e for s in range(self.S) for e in parts[s][0]]
        metas = {parts[s][1] for s in range(self.S)}
        if len(metas) != 1:
            raise TrainerError(f"stages disagree on the step counter and rng: {sorted(metas)}")
        step, rng = metas.pop()
        return StepLeaf(step, rng, tuple(entries))

    # -- Engine

    def begin(self, d: EpochDir, steps: int, g: Params, prev: EpochDir | None) -> StepLeaf:
        use = prev if prev is not None and self.has_states(prev) else None
        self.steps = steps
        self.checkpoints.begin(steps)
        calls = {s: ("begin", (d, steps, {n: g[n].detach().cpu() for b in self.ranges[s] for n in self.groups[b]}, use))
                 for s in range(self.S)}
        return self._leaf(self._ask(calls))

    def resume(self, d: EpochDir, steps: int, k: int) -> None:
        self.steps = steps
        self.checkpoints.begin(steps, k)
        self._all("resume", d, steps, k)

    def merge(self, d: EpochDir, g: Params, offset: Params | None = None) -> None:
        """Each stage folds in its blocks' share of G_e (the merge is elementwise)."""
        def share(x: Params, s: int) -> Params:
            return {n: x[n].detach().cpu() for b in self.ranges[s] for n in self.groups[b]}

        self._ask({s: ("merge", (d, share(g, s), None if offset is None else share(offset, s))) for s in range(self.S)})

    def step(self, d: EpochDir, k: int, batch: Batch) -> tuple[float, StepLeaf]:
        got = self._all("step", d, k, batch)
        for s in range(self.S):  # CPU seconds summed over the stages, which run in parallel
            for key, spent in zip(("compute_s", "commit_s", "log_s"), got[s][1], strict=True):
                self._timings[key] += spent
            self.log_error = got[s][4] or self.log_error
        # one decision for all stages, so that none holds a state the others lack (a stage that fails
        # to write its part leaves a state that answers, which use the stages' common ones, skip)
        self.checkpoints.after_step(k, all(got[s][5] for s in got), lambda: self._all("checkpoint", d, k + 1), TrainerError)
        return got[0][0], self._leaf({s: got[s][2:4] for s in got})

    @property
    def timings(self) -> dict[str, float]:
        """Cumulative CPU seconds of all stages together: ``compute_s`` (the steps), ``commit_s`` (their
        leaf digests), ``log_s`` (their gradient logs), ``answer_cpu_s`` (their audit answers, which the
        node's own clock does not see)."""
        return self._timings

    def finish(self, d: EpochDir, rank: int, seed: int) -> tuple[bytes, CompressionStats]:
        got = self._all("finish", d, rank, seed)
        return merge_compressed([got[s] for s in range(self.S)])

    def has_states(self, d: EpochDir) -> bool:
        return all(self._all("has", d).values())

    def block_state(self, d: EpochDir, k: int, b: int, prefixes: tuple[str, ...]) -> State:
        s = self._owner(b)
        return self._ask({s: ("block_state", (d, k, b, prefixes))})[s]

    def audit_block(self, d: EpochDir, start: int, end: int, b: int, picks: Sequence[int], batch_of: BatchOf, *,
                    logged: bool = True) -> tuple[State, list[Opened]]:
        """From the stages' gradient logs where every stage holds the steps from the checkpoint on,
        else (or if a stage cannot read its log) whole steps across the stages; the owner of b gives
        its tensors, every stage its blocks' group leaves."""
        s = self._owner(b)
        common = set.intersection(*(set(c) for c in self._all("checkpoints", d).values()))
        base = max((c for c in common if c <= start), default=None)
        if base is None:
            raise TrainerError(f"no checkpoint at or before step {start} of epoch {d.epoch}")
        batches = [batch_of(j) for j in range(base, end)]
        got = None
        if logged and self.keep_boundaries and all(self._all("logged", d, range(base, end)).values()):
            try:
                got = self._all("audit_gradients", d, base, start, end, b, list(picks), batches)
            except TrainerError as exc:
                self.log_error = f"epoch {d.epoch} gradient log unreadable ({exc}); replaying whole steps"
        if got is None:
            got = self._all("audit", d, base, start, end, b, list(picks), batches)
        self._timings["answer_cpu_s"] += sum(g[2] for g in got.values())
        shard, steps, _ = got[s]
        assert shard is not None
        for i, o in enumerate(steps):
            for j in range(self.S):
                o.groups.update(got[j][1][i].groups)
        return shard, steps

    def boundary_log_bytes(self, d: EpochDir) -> tuple[int, int]:
        got = self._all("log_bytes", d).values()
        return sum(g[0] for g in got), sum(g[1] for g in got)

    def log_kind(self, d: EpochDir) -> str | None:
        return GRADIENTS if any(self.boundary_log_bytes(d)) else None  # None: it kept nothing

    def forget_boundaries(self, d: EpochDir) -> None:
        self._all("forget", d)

    def drop_before(self, d: EpochDir, k: int) -> int:
        """As the local engine's: keep the latest checkpoint every stage holds at or before k (and the
        first), each stage its log from there. The node deletes the stages' checkpoint parts (one folder on
        this machine); each stage drops its own log, whose budget it keeps."""
        held = [set(c) for c in self._all("checkpoints", d).values()]
        base = max((c for c in set.intersection(*held) if c <= k), default=0)
        return d.drop_before(base) + sum(self._all("forget_before", d, base).values())

    def unlogged_steps(self, d: EpochDir) -> int:
        """Steps some stage could not keep (their challenges replay whole steps)."""
        return len({k for g in self._all("log_bytes", d).values() for k in g[2]})

    def held_bytes(self) -> list[int]:
        """Training-state bytes per process, from each one's own live tensors: [this node, stage 0, ...]."""
        got = self._all("held")
        return [tensor_bytes(vars(self))] + [got[s] for s in range(self.S)]

    def _owner(self, b: int) -> int:
        if not 0 <= b < len(self.groups):
            raise TrainerError(f"audit block {b} does not exist; the model has {len(self.groups)}")
        return self.owner[b]

    def close(self) -> None:
        if not self.open:
            return
        self.open = False
        try:
            for s in range(self.S):
                dist.send_object_list([("close", ())], dst=s + 1)
        except RuntimeError:  # a stage already gone: stop the ones this engine started
            for p in self.procs:
                p.terminate()
        for p in self.procs:
            p.join(timeout=30)
        dist.destroy_process_group()


# ---- legacy state-mode pipeline (the node holds the full state) ---------------------------------


def _worker(rank: int, world: int, port: int, spec: RoundSpec, micro: int, threads: int) -> None:
    configure_determinism(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        pcfg = PipelineConfig(stage=rank, n_stages=world, n_microbatches=micro)
        while True:
            msg: list[Any] = [None]
            dist.recv_object_list(msg, src=0)
            if msg[0] is None:
                return
            part, batch = msg[0]
            new, _ = pipeline_train_step(part, batch, spec.model, spec.inner, pcfg)
            dist.send_object_list([new], dst=0)
    finally:
        dist.destroy_process_group()


class PipelineSteps:
    """Rank 0 of an S-stage pipeline; `step(state, batch)` is a drop-in for `train_step`."""

    def __init__(self, spec: RoundSpec, stages: int, microbatches: int = 2, threads: int = 1) -> None:
        if stages < 2:
            raise TrainerError(f"a pipeline needs at least 2 stages, got {stages}")
        if spec.batch_size % microbatches:
            raise TrainerError(f"batch size {spec.batch_size} is not divisible by {microbatches} micro-batches")
        self.spec, self.stages, self.micro = spec, stages, microbatches
        port = _free_port()
        ctx = mp.get_context("spawn")
        self.procs = [
            ctx.Process(target=_worker, args=(r, stages, port, spec, microbatches, threads), daemon=True)
            for r in range(1, stages)
        ]
        for p in self.procs:
            p.start()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=stages)
        self.pcfg = PipelineConfig(stage=0, n_stages=stages, n_microbatches=microbatches)

    def step(self, state: State, batch: Batch) -> tuple[State, float]:
        cfg = self.spec.model
        parts = [stage_state(state, cfg, s, self.stages) for s in range(self.stages)]
        for r in range(1, self.stages):
            dist.send_object_list([(parts[r], batch)], dst=r)
        new0, loss = pipeline_train_step(parts[0], batch, cfg, self.spec.inner, self.pcfg)
        outs = [new0]
        for r in range(1, self.stages):
            got: list[Any] = [None]
            dist.recv_object_list(got, src=r)
            outs.append(got[0])
        return merge_states(outs), loss

    def close(self) -> None:
        for r in range(1, self.stages):
            dist.send_object_list([None], dst=r)
        for p in self.procs:
            p.join(timeout=30)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
