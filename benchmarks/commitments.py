"""What committing a sharded trace costs, by model size and tokens per step (docs/protocol.md §3.1).

A trainer in shard mode hashes every step's boundary tensors (two per block edge: activations and
input gradients, B x T x d_model each) and, every ``segment`` steps, every block's parameters and
Adam moments. The first scales with tokens x d_model x layers, like the step; the second with the
parameters, once per segment. So the fraction of training it costs falls as d_model grows (a
step's FLOPs per token grow as d_model^2) and as tokens per step grow (the state leaf is shared by
more tokens). This script measures both on the trainer's own code path (``LocalEngine``: the
block-wise step, then ``LeafCommitter``), one segment of steps per setting, CPU seconds of one
thread:

    nice -n 19 .venv/bin/python -m benchmarks.commitments --out benchmarks/results/commitments.json

Each setting runs ``segment`` steps, so exactly one state leaf falls in the measured steps, as in
a long epoch. ``boundary`` is the median commit time of the steps without a state leaf; ``state`` is
what the state leaf's step spent beyond that. ``boundary_log_*`` is what writing every step's
boundary tensors to the trainer's log costs (trainer/boundaries.py): not a commitment, but the price
of answering an audit by replaying one block instead of whole steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.report import write_settings
from dilocox.compress import CompressionConfig
from dilocox.delay import StartRule
from dilocox.inner import InnerConfig, configure_determinism
from dilocox.round import RoundSpec
from protocol.data import batch, default_corpus
from protocol.leaf import block_count
from protocol.model import init_params, n_params, preset
from trainer.checkpoints import EpochDir
from trainer.engine import LocalEngine

# (preset, batch rows, tokens per row): the protocol benchmark's setting first, then the same model
# at its full context, then GPT-2 small's shape at its context.
SETTINGS = [("small", 8, 64), ("small", 8, 128), ("llama-small", 8, 128), ("gpt2-124m", 1, 1024)]


def measure(name: str, rows: int, seq: int, segment: int, micro: int = 1) -> dict[str, Any]:
    cfg = preset(name)
    spec = RoundSpec(cfg, InnerConfig(lr=3e-4, warmup_steps=2, total_steps=100), CompressionConfig(),
                     StartRule.DELAYED, run_seed=1, batch_size=rows, seq_len=seq, shard=True, segment=segment,
                     microbatches=micro)
    corpus = default_corpus(max(200_000, 4 * rows * seq * segment))
    eng = LocalEngine(spec, every=segment)
    compute, commit, logged = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        d = EpochDir(Path(tmp), 0)
        eng.begin(d, segment, init_params(cfg, 0), None)
        for k in range(segment):
            before = dict(eng.timings)
            eng.step(d, k, batch(corpus, 1, 0, 0, k, rows, seq))
            compute.append(eng.timings["compute_s"] - before["compute_s"])
            commit.append(eng.timings["commit_s"] - before["commit_s"])
            logged.append(eng.timings["log_s"] - before["log_s"])
        log_bytes = sum(eng.boundary_log_bytes(d)) // segment
        eng.close()
    boundary = statistics.median(commit[:-1])
    step = statistics.median(compute)
    return {
        "preset": name, "arch": cfg.arch, "params": n_params(cfg), "d_model": cfg.d_model, "n_layer": cfg.n_layer,
        "rows": rows, "seq_len": seq, "tokens_per_step": rows * seq, "segment": segment, "groups": micro,
        "boundary_tensors_per_step": 2 * (block_count(cfg) - 1),
        "compute_s_per_step": round(step, 4), "commit_s_per_step": round(sum(commit) / segment, 4),
        "boundary_s_per_step": round(boundary, 4), "state_leaf_s": round(commit[-1] - boundary, 4),
        "commitment_fraction_of_training": round(sum(commit) / sum(compute), 4),
        "boundary_fraction": round(boundary / step, 4),
        "state_leaf_fraction": round((commit[-1] - boundary) / segment / step, 4),
        # the trainer's boundary log (trainer/boundaries.py): not a commitment, the price of cheap audit answers
        "boundary_log_s_per_step": round(statistics.median(logged), 4),
        "boundary_log_fraction": round(sum(logged) / sum(compute), 4),
        "boundary_log_bytes_per_step": log_bytes,
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose commitment fraction is the median (the lower one of an even count), with every
    run's fraction beside it."""
    key = "commitment_fraction_of_training"
    ordered = sorted(runs, key=lambda r: r[key])
    return {**ordered[(len(ordered) - 1) // 2], "commitment_fraction_runs": [r[key] for r in runs]}


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| preset | params | d_model | tokens / step (groups, r) | compute s / step | commitments / training | boundaries | state leaves (1 per segment) | boundary log / training | log MB / step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['preset']} | {r['params'] / 1e6:.1f}M | {r['d_model']} | {r['rows']} x {r['seq_len']} "
                     f"({r.get('groups', 1)}, {r['segment']}) | "
                     f"{r['compute_s_per_step']:.3f} | **{r['commitment_fraction_of_training']:.4f}** | "
                     f"{r['boundary_fraction']:.4f} | {r['state_leaf_fraction']:.4f} | "
                     f"{r.get('boundary_log_fraction', float('nan')):.4f} | {r.get('boundary_log_bytes_per_step', 0) / 1e6:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segment", type=int, default=4, help="steps per state leaf (audit.segment; default 4, what the examples ship)")
    ap.add_argument("--only", default="", help="comma-separated presets to run (default: every setting)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="measure each setting this many times and report the run with the median fraction, "
                         "every run's fraction under commitment_fraction_runs (a loaded machine moves it ~10%%)")
    ap.add_argument("--settings", nargs="+", default=[], metavar="PRESET:ROWS:SEQ:GROUPS:SEGMENT",
                    help="measure these instead of the default settings (leaf v4 groups: GROUPS micro-batches per step, "
                         "each adding a running gradient sum per block to hash)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    configure_determinism(1)
    wanted = {x for x in a.only.split(",") if x}
    load = [os.getloadavg()[0]]
    t0 = time.perf_counter()
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    chosen = [(n, int(r), int(s), int(m), int(g)) for n, r, s, m, g in (x.split(":") for x in a.settings)] or [
        (n, r, s, 1, a.segment) for n, r, s in SETTINGS]
    rows = [median_run([measure(n, r, s, g, m) for _ in range(a.repeats)])
            for n, r, s, m, g in chosen if not wanted or n in wanted]
    load.append(os.getloadavg()[0])
    return write_settings("commitments", argv, {"threads": 1, "load_average_1m": {"start": load[0], "end": load[1]}},
                          rows, t0, markdown(rows), a.out, runner="nice -n 19 .venv/bin/python")


if __name__ == "__main__":
    raise SystemExit(main())
