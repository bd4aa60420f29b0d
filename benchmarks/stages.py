"""Sharded state benchmark: a trainer's epoch in one process (LocalEngine) vs S stage processes (StagedEngine).

Both run the same block-wise steps on the same batches; the run checks that their leaves and
payloads are bitwise equal, and reports the wall time per step (min and median over the steps after
the first), the time to finish (compress), the CPU seconds of the steps and of their leaf digests
(``Engine.timings``, summed over the stages) and the bytes of training state (params, Adam moments,
error buffer, meta) each process holds, from that process's own tensor accounting (``held_bytes``).

    nice -n 19 .venv/bin/python -m benchmarks.stages --preset small --stages 2 --out benchmarks/results/stages.json

Each process uses ``--threads`` threads (S stages use S times as many cores as one process). On a
shared machine wall times are only as clean as the load average the JSON records.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dilocox.compress import CompressionConfig
from dilocox.delay import StartRule
from dilocox.inner import InnerConfig, configure_determinism
from dilocox.round import RoundSpec
from protocol.data import batch, default_corpus
from protocol.model import init_params, preset
from trainer.checkpoints import EpochDir
from trainer.engine import Engine, LocalEngine
from trainer.stages import StagedEngine


def _epoch(eng: Engine, root: Path, spec: RoundSpec, steps: int, batches: list) -> dict[str, Any]:
    d = EpochDir(root, 0)
    t0 = time.perf_counter()
    leaves = [eng.begin(d, steps, init_params(spec.model, 0), None).digest.hex()]
    begin_s = time.perf_counter() - t0
    times, losses = [], []
    for k in range(steps):
        t0 = time.perf_counter()
        loss, leaf = eng.step(d, k, batches[k])
        times.append(time.perf_counter() - t0)
        leaves.append(leaf.digest.hex())
        losses.append(loss)
    held = eng.held_bytes()
    cpu = {k: round(v, 3) for k, v in eng.timings.items()}  # CPU seconds, all stages together
    t0 = time.perf_counter()
    payload, stats = eng.finish(d, spec.compression.rank_initial, 7)
    finish_s = time.perf_counter() - t0
    warm = times[1:] or times
    return {
        "begin_s": round(begin_s, 3), "step_s_min": round(min(warm), 3), "step_s_median": round(statistics.median(warm), 3),
        "finish_s": round(finish_s, 3), "cpu_s": cpu,
        "commit_over_compute": round(cpu["commit_s"] / cpu["compute_s"], 4), "held_bytes": held, "largest_process_bytes": max(held),
        "payload_bytes": stats.payload_bytes, "losses": losses, "_leaves": leaves, "_payload": payload,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    configure_determinism(a.threads)
    cfg = preset(a.preset)
    spec = RoundSpec(cfg, InnerConfig(lr=3e-4, warmup_steps=2, total_steps=100), CompressionConfig(), StartRule.DELAYED,
                     run_seed=1, batch_size=a.batch, seq_len=cfg.seq_len, microbatches=a.micro, shard=True, segment=2)
    corpus = default_corpus(200_000)
    batches = [batch(corpus, 1, 0, 0, k, a.batch, cfg.seq_len) for k in range(a.steps)]
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        local = _epoch(LocalEngine(spec, every=2), Path(tmp) / "local", spec, a.steps, batches)
        eng = StagedEngine(spec, every=2, stages=a.stages, threads=a.threads)
        try:
            staged = _epoch(eng, Path(tmp) / "staged", spec, a.steps, batches)
        finally:
            eng.close()
    load.append(os.getloadavg()[0])
    whole = local["held_bytes"][0]
    result = {
        "command": f"nice -n 19 .venv/bin/python -m benchmarks.stages --preset {a.preset} --stages {a.stages} "
                   f"--steps {a.steps} --batch {a.batch} --micro {a.micro} --threads {a.threads}",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads_per_process": a.threads,
                    "load_average_1m": {"start": load[0], "end": load[1]}},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "settings": {"preset": a.preset, "params": sum(t.numel() for t in init_params(cfg, 0).values()),
                     "stages": a.stages, "steps": a.steps, "batch": a.batch, "seq_len": cfg.seq_len, "microbatches": a.micro},
        "bitwise_equal": {"leaves": local["_leaves"] == staged["_leaves"], "payload": local["_payload"] == staged["_payload"]},
        "local": {k: v for k, v in local.items() if not k.startswith("_")},
        "staged": {k: v for k, v in staged.items() if not k.startswith("_")},
        "whole_state_bytes": whole,
        "largest_process_fraction": round(staged["largest_process_bytes"] / whole, 4),
        "node_process_bytes": staged["held_bytes"][0],
        "step_time_ratio_staged_over_local": round(staged["step_s_median"] / local["step_s_median"], 3),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
