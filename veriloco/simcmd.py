"""`veriloco simulate`: K simulated trainers in one process, no chain, and the comparison table.

The engine's local simulation (veriloco/simulate.py) without the protocol around it (`veriloco
demo` runs the whole network): on the built-in corpus (Python standard-library sources) it prints
AllReduce vs DiLoCo vs DiLoCoX: final eval loss, bytes sent per worker and simulated time over a
1 Gbps link. ``--report DIR`` also
writes ``demo.json`` and ``demo.md`` there.

    veriloco simulate --trainers 4 --epochs 8 --preset tiny
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dilocox.inner import InnerConfig, configure_determinism
from dilocox.outer import OuterConfig
from protocol.data import default_corpus
from protocol.model import preset
from veriloco.argtypes import non_negative, positive
from veriloco.simulate import (
    SimConfig,
    SimulationError,
    markdown_table,
    methods,
    normalise_times,
    run_method,
)

# dilocox_merge is the start rule the protocol's shipped configs run (merge_step = 1); dilocox is
# the paper's one-step delay and dilocox_blocking what both overlap against
DEFAULT_METHODS = "allreduce,diloco,dilocox_merge,dilocox,dilocox_blocking"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "simulate", help="simulate K trainers in one process (no chain) and compare AllReduce, DiLoCo and DiLoCoX"
    )
    p.add_argument("--trainers", type=positive, default=4, help="simulated trainers K (default 4)")
    p.add_argument(
        "--epochs", type=positive, default=8, help="outer rounds at the initial H (default 8)"
    )
    p.add_argument("--h", type=positive, default=16, help="initial inner steps per round (default 16)")
    p.add_argument(
        "--preset", default="tiny", help="model preset: tiny, small, gpt2-124m (default tiny)"
    )
    p.add_argument("--batch-size", type=positive, default=8)
    p.add_argument(
        "--methods", default=DEFAULT_METHODS, help=f"comma-separated, from {','.join(methods())}"
    )
    p.add_argument("--merge-step", type=non_negative, default=1,
                   help="the *_merge methods: steps into a round before the previous round's global model is folded in "
                        "(default 1; 0 is blocking, H the one-step delay)")
    p.add_argument("--outer-lr", type=float, default=1.0, help="outer lr (default 1.0)")
    p.add_argument(
        "--outer-momentum",
        type=float,
        default=0.0,
        help="outer Nesterov momentum (default 0: plain averaging, best in few rounds)",
    )
    p.add_argument(
        "--threads", type=positive, default=1, help="torch threads (fixed for reproducibility)"
    )
    p.add_argument("--report", type=Path, help="directory for demo.json and demo.md")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = [n for n in args.methods.split(",") if n]
    unknown = sorted(set(names) - set(methods()))
    if unknown or not names:
        raise SimulationError(f"unknown methods {unknown}; choose from {','.join(methods())}")
    if args.epochs < 1 or args.h < 1:
        raise SimulationError("--epochs and --h must be at least 1")
    configure_determinism(args.threads)
    model = preset(args.preset)
    steps = args.epochs * args.h
    cfg = SimConfig(
        model=model,
        trainers=args.trainers,
        steps=steps,
        batch_size=args.batch_size,
        h=args.h,
        merge_step=args.merge_step,
        inner=InnerConfig(lr=3e-3, warmup_steps=max(1, steps // 16), total_steps=steps),
        outer=OuterConfig(lr=args.outer_lr, momentum=args.outer_momentum),
    )
    print("building the corpus (Python standard library sources) ...", flush=True)
    corpus = default_corpus(1 << 20)
    print(
        f"{len(names)} methods, K={args.trainers} trainers, preset {args.preset}, {steps} inner steps per "
        f"trainer of {args.batch_size}x{model.seq_len} tokens",
        flush=True,
    )
    t0 = time.perf_counter()
    results = {}
    for n in names:
        results[n] = run_method(n, cfg, corpus, lambda s: print("  " + s, flush=True))
    normalise_times(results)
    table = markdown_table(results, baseline="allreduce" if "allreduce" in results else names[0])
    print()
    print(table)
    print(f"\n(done in {time.perf_counter() - t0:.0f} s; simulated time assumes a 1 Gbps link)")
    if args.report:
        args.report.mkdir(parents=True, exist_ok=True)
        (args.report / "demo.md").write_text(table + "\n")
        data = {n: r.to_json() for n, r in results.items()}
        (args.report / "demo.json").write_text(json.dumps(data, indent=1) + "\n")
        print(f"report written to {args.report}/demo.md and demo.json")
    return 0
