"""A trainer's inner steps run as S pipeline stages, one process per stage (gloo on loopback).

`veriloco trainer --stages S` uses this. The node process is rank 0 and holds the whole training
state; for each step it hands every other rank its stage's part (`trainer.pipeline.stage_state`),
all ranks run `pipeline_train_step` together, and the new parts come back to be merged, so the
trace digest after every step covers the full state exactly as in a single-process trainer.
Workers keep nothing between steps, so the node can replay any step from a checkpoint the same way.

The result equals a single-process step only within fp32 tolerance (micro-batching and the split
gradient norm change summation order), so a run with pipelined trainers must audit in tolerant
mode; the calibrated bound covers these splits (docs/results-verification.md).
"""

from __future__ import annotations

import socket
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from trainer.inner import State, TrainerError, configure_determinism
from trainer.pipeline import PipelineConfig, merge_states, pipeline_train_step, stage_state
from trainer.round import RoundSpec

Batch = tuple[Tensor, Tensor]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
