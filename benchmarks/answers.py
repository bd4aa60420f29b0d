"""What answering its audits costs one trainer, on its own code path: the answer log, the checkpoints,
and building the answer (issue 31's "answer compute at most 3% of training at H = 256").

The network benchmark (`benchmarks/protocol.py`) measures the same work with four trainers, three
verifiers and a chain sharing two cores and one disk, where the logs of all four compete for the
page cache and the disk's free space. This runs one ``LocalEngine`` alone, at the settings that ship:
the merge rule at step 1 with error feedback in the parameters, segments of ``r`` steps, checkpoints
every 16 steps where the log holds the steps and every ``max(4, r)`` where it does not
(`trainer.checkpoints.CheckpointRule`; beside it, every 4 throughout, as trainers kept them before), the log on disk within 4 GiB (what the 8x network run gave
its trainers: at 8,192 tokens they keep total gradients, not 21 GB of boundaries an epoch). It trains ``--steps`` steps,
then builds the shard answer of ``--challenges`` drawn transitions plus the final check, as the node
does (`trainer.shard_response.shard_response`), for several draws. Per step, the log and checkpoint
writes are measured; the answer, paid once an epoch, is divided by H steps of the measured step:

    .venv/bin/python -m benchmarks.answers --out benchmarks/results/answers.json

CPU seconds of this thread throughout (the engine's own clocks, ``trainer.engine.own_cpu``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.report import write_settings
from dilocox.compress import CompressionConfig
from dilocox.delay import StartRule
from dilocox.inner import InnerConfig, configure_determinism
from dilocox.round import RoundSpec
from protocol.data import batch, default_corpus
from protocol.model import init_params, preset
from protocol.types import Address
from trainer.answering import FileSink
from trainer.checkpoints import EpochDir
from trainer.engine import LocalEngine
from trainer.shard_response import shard_response

TRAINER = Address("0x70997970C51812dc3A010C7d01b50e0d17dc79C8")
# (preset, rows, tokens per row, groups M, segment r, log disk budget in GiB, checkpoint every, and while
# logged): the two batches of the network benchmark (benchmarks/results/protocol-small-k4.json), 8 x 128
# as examples/run.toml's policy ships it, and examples/small.toml's 128 x 64 in groups of 32 rows with the
# 4 GiB log budget that run gave its trainers (so they keep total gradients, not 21 GB of boundaries an
# epoch); each with the shipped checkpoints (every 16 steps while logged: fewer state writes, more
# block-steps replayed to a segment) and with every 4 throughout.
SETTINGS = [("small", 8, 128, 1, 4, 4.0, 4, 16), ("small", 8, 128, 1, 4, 4.0, 4, 4),
            ("small", 128, 64, 4, 1, 4.0, 4, 16), ("small", 128, 64, 4, 1, 4.0, 4, 4)]


def measure(name: str, rows: int, seq: int, micro: int, segment: int, disk_gib: float, every: int, logged: int,
            steps: int, H: int, challenges: int, draws: int) -> dict[str, Any]:
    cfg = preset(name)
    spec = RoundSpec(cfg, InnerConfig(lr=5e-4, warmup_steps=8, total_steps=H), CompressionConfig(error_feedback=False),
                     StartRule.MERGE, run_seed=1, batch_size=rows, seq_len=seq, microbatches=micro, shard=True,
                     segment=segment, merge_step=1, first_merge_step=0)
    corpus = default_corpus(max(400_000, 2 * rows * seq * steps))

    def batch_of(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return batch(corpus, 1, 0, 0, k, rows, seq)

    eng = LocalEngine(spec, every=max(every, segment), every_logged=logged, log_disk_bytes=int(disk_gib * 2**30))
    with tempfile.TemporaryDirectory(dir=".", prefix=".answers-") as tmp:
        d = EpochDir(Path(tmp), 0)
        g = init_params(cfg, 0)
        leaves = [eng.begin(d, steps, g, None).encode()]
        for k in range(steps):
            if spec.merges_at(k, 0):
                eng.merge(d, g, {n: torch.zeros_like(t) for n, t in g.items()})
            leaves.append(eng.step(d, k, batch_of(k))[1].encode())
        t = dict(eng.timings)
        kind, kept = eng.log_kind(d), d.checkpoints()
        rng = random.Random(0)
        cpu, files = [], 0
        for _ in range(draws):
            drawn = [rng.randrange(steps) for _ in range(challenges)]
            sink = FileSink(Path(tmp))
            c = time.thread_time()
            shard_response(engine=eng, spec=spec, run_id=1, epoch=0, trainer=TRAINER, d=d, preimages=leaves,
                           seed=rng.randbytes(32), steps=drawn, final_bps=10_000, batch_of=batch_of, publish=sink)
            cpu.append(time.thread_time() - c)
            files = sum(p.stat().st_size for p, _ in sink.files)
            for p, _ in sink.files:
                p.unlink()
        unbound = eng.log_error
        eng.close()
    step = t["compute_s"] / steps
    answer = statistics.median(cpu)
    return {
        "preset": name, "rows": rows, "seq_len": seq, "tokens_per_step": rows * seq, "groups": micro, "segment": segment,
        "checkpoint_every": eng.checkpoints.rule.every, "checkpoint_every_logged": eng.checkpoints.rule.logged, "checkpoints": kept, "log_kind": kind, "steps_trained": steps, "H": H, "challenges": challenges,
        "compute_s_per_step": round(step, 4),
        "log_s_per_step": round(t["log_s"] / steps, 4), "checkpoint_s_per_step": round(t["checkpoint_s"] / steps, 4),
        "answer_cpu_s_per_epoch": round(answer, 3), "answer_cpu_s_runs": [round(x, 3) for x in cpu],
        "answer_bytes_per_epoch": files, "log_fell_back": unbound,
        "answer_build_fraction": round(answer / (H * step), 4),
        "answer_log_fraction": round(t["log_s"] / t["compute_s"], 4),
        "checkpoint_write_fraction": round(t["checkpoint_s"] / t["compute_s"], 4),
        "answer_compute_fraction": round(answer / (H * step) + t["log_s"] / t["compute_s"], 4),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| setting | log | compute s / step | answer build / training at H (CPU s an epoch) | log writes | answers (build + log) | checkpoint writes |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['preset']} {r['rows']} x {r['seq_len']} (M = {r['groups']}, r = {r['segment']}, checkpoints every "
                     f"{r['checkpoint_every_logged']} logged, {r['checkpoint_every']} not) | {r['log_kind']} | "
                     f"{r['compute_s_per_step']:.3f} | {r['answer_build_fraction']:.4f} at {r['H']} ({r['answer_cpu_s_per_epoch']:.2f}) | "
                     f"{r['answer_log_fraction']:.4f} | **{r['answer_compute_fraction']:.4f}** | {r['checkpoint_write_fraction']:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=32, help="steps trained per setting (default 32; the answers draw from them)")
    ap.add_argument("--H", type=int, default=256, help="steps an epoch pays one answer over (default 256)")
    ap.add_argument("--challenges", type=int, default=4, help="drawn transitions per answer (default 4, audit.challenges)")
    ap.add_argument("--draws", type=int, default=3, help="answers built per setting, each a fresh draw (default 3; the median counts)")
    ap.add_argument("--only", default="", help="comma-separated ROWSxSEQ settings to run (e.g. 8x128)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if min(a.H, a.challenges, a.draws) < 1 or a.steps < 2 * max(x[-1] for x in SETTINGS):
        ap.error(f"--steps needs at least {2 * max(x[-1] for x in SETTINGS)} (two logged checkpoint intervals), and --H, "
                 "--challenges and --draws at least 1")
    configure_determinism(1)
    wanted = {x for x in a.only.split(",") if x}
    load = [os.getloadavg()[0]]
    t0 = time.perf_counter()
    rows = []
    for name, r, s, m, seg, gib, every, logged in SETTINGS:
        if wanted and f"{r}x{s}" not in wanted:
            continue
        rows.append(measure(name, r, s, m, seg, gib, every, logged, a.steps, a.H, a.challenges, a.draws))
        print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    load.append(os.getloadavg()[0])
    return write_settings("answers", argv, {"threads": 1, "load_average_1m": {"start": load[0], "end": load[1]}},
                          rows, t0, markdown(rows), a.out)


if __name__ == "__main__":
    raise SystemExit(main())
