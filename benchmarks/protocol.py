"""What the protocol costs on top of training: a real network run, measured from the nodes' own logs.

    .venv/bin/python benchmarks/protocol.py --out benchmarks/results/protocol.json

Runs `veriloco demo` (a py-evm devnet, a LocalStore, N trainer, M verifier and one coordinator
processes) and reports, side by side with AllReduce:

- `overhead_fraction`: the share of a trainer's epoch wall time not spent in training compute
  (inner steps): chain transactions, store traffic, state digests, audits, waiting for peers.
  Measured per trainer from its first inner step to its last epoch's end; median over trainers.
- `verifier_compute_fraction`: CPU seconds verifiers spend judging (fetching, parsing, replaying,
  re-encoding, chain reads) over the CPU seconds trainers spend in inner steps, all nodes summed.
- `bytes_per_trainer_per_epoch`: every store byte a trainer sends and receives per epoch (payloads,
  audit states and manifests up; config, corpus, models and peers' payloads down), against the bytes
  a ring AllReduce of fp32 gradients would send per worker for the same steps: the definition
  `veriloco demo`'s summary uses (veriloco/traffic.py).

All processes share this machine's cores: wall-clock fractions include that contention, which is
why compute is counted in CPU seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from protocol.model import n_params, preset
from veriloco.netdemo import DemoOptions, run_demo
from veriloco.traffic import compare, trainer_traffic


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict):
            out.append(ev)
    return out


def measure(opts: DemoOptions, segment: int = 1) -> dict[str, Any]:
    t0 = time.time()
    with open(os.devnull, "w") as quiet:
        summary = run_demo(opts, out=quiet, config=opts.config().replace(audit={"segment": segment}))
    logs = {p.stem: _events(p) for p in (opts.workdir / "logs").glob("*.jsonl")}
    overheads, compute_total, digest_total, traffic = [], 0.0, 0.0, []
    for name, evs in logs.items():
        if not name.startswith("trainer"):
            continue
        steps = [ev for ev in evs if ev["event"] == "step"]
        trained = [ev for ev in evs if ev["event"] == "trained"]
        if not steps or not trained:
            continue
        compute = sum(ev["compute_s"] for ev in trained)
        digest = sum(ev["digest_s"] for ev in trained)
        # wall time covers every epoch's cycle: from the first step to the end of the last audit it answered
        end = max(ev["t"] for ev in evs if ev["event"] in ("trained", "responded", "finished"))
        wall = end - steps[0]["t"] + trained[0]["seconds"] / max(1, trained[0]["steps"])
        overheads.append(1.0 - compute / wall)
        compute_total += compute
        digest_total += digest
        traffic.append(trainer_traffic(evs))
    verifier_s = sum(ev["cpu_s"] for name, evs in logs.items() if name.startswith("verifier")
                     for ev in evs if ev["event"] == "verified")
    finalized = {ev["epoch"]: ev["t"] for name, evs in logs.items() if name.startswith("coordinator")
                 for ev in evs if ev["event"] == "finalized"}
    last_reveal: dict[int, float] = {}
    for name, evs in logs.items():
        for ev in evs:
            if name.startswith("trainer") and ev["event"] == "revealed":
                last_reveal[ev["epoch"]] = max(last_reveal.get(ev["epoch"], 0.0), ev["t"])
    # what the one-step delay has to hide: from an epoch's last reveal to its finalization
    audit_latency = statistics.median(finalized[e] - last_reveal[e] for e in finalized if e in last_reveal)
    ends = [finalized[e] for e in sorted(finalized)]
    cycle = statistics.median(b - a for a, b in itertools.pairwise(ends)) if len(ends) > 1 else float("nan")
    cfg = preset(opts.preset)
    k, h = opts.trainers, opts.steps
    moved = compare(traffic, k, n_params(cfg))
    epochs = max(1.0, moved["epochs_per_trainer"])
    bytes_per_epoch = moved["bytes_per_trainer"] / epochs
    allreduce = (moved["allreduce_bytes_equivalent"] or 0) / epochs
    return {
        "preset": opts.preset,
        "trainers": k,
        "verifiers": opts.verifiers,
        "epochs": opts.epochs,
        "h_initial": h,
        "audit_steps": opts.config().audit.steps,
        "audit_segment": segment,
        "wall_seconds": round(time.time() - t0, 1),
        "epochs_finalized": summary["epochs_finalized"],
        "final_eval_loss": summary["final_eval_loss"],
        "initial_eval_loss": summary["initial_eval_loss"],
        "overhead_fraction": round(statistics.median(overheads), 4),
        "epoch_cycle_seconds": round(cycle, 2),
        "audit_latency_seconds": round(audit_latency, 2),
        "trainer_compute_per_epoch_seconds": round(compute_total / max(1, k) / opts.epochs, 3),
        "overhead_fraction_by_trainer": [round(x, 4) for x in overheads],
        "digest_fraction_of_compute": round(digest_total / compute_total, 4),
        "verifier_compute_fraction": round(verifier_s / compute_total, 4),
        "trainer_compute_seconds": round(compute_total, 2),
        "verifier_compute_seconds": round(verifier_s, 2),
        "bytes_per_trainer_per_epoch": round(bytes_per_epoch),
        "bytes_sent_per_trainer_per_epoch": round(moved["bytes_sent_per_trainer"] / epochs),
        "bytes_received_per_trainer_per_epoch": round(moved["bytes_received_per_trainer"] / epochs),
        "steps_per_trainer_per_epoch": round(moved["steps_per_trainer"] / epochs, 1),
        "allreduce_bytes_per_trainer_per_epoch": round(allreduce),
        "traffic_reduction_vs_allreduce": moved["reduction_vs_allreduce"],
        "gas_used": summary["gas_used"],
    }


def markdown(runs: list[dict[str, Any]]) -> str:
    rows = [
        "| scenario | H | audit s x r | bytes/trainer/epoch | AllReduce bytes | reduction | compute/epoch | epoch cycle | audit latency | overhead | verifier/trainer compute | digests/compute | eval loss |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        rows.append(
            f"| {r['scenario']} | {r['h_initial']} | {r['audit_steps']} x {r['audit_segment']} | "
            f"{r['bytes_per_trainer_per_epoch']:,} | {r['allreduce_bytes_per_trainer_per_epoch']:,} | "
            f"{r['traffic_reduction_vs_allreduce']}x | {r['trainer_compute_per_epoch_seconds']:.2f} s | "
            f"{r['epoch_cycle_seconds']:.1f} s | {r['audit_latency_seconds']:.1f} s | "
            f"{r['overhead_fraction']:.1%} | {r['verifier_compute_fraction']:.1%} | "
            f"{r['digest_fraction_of_compute']:.1%} | {r['initial_eval_loss']} -> {r['final_eval_loss']} |"
        )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--trainers", type=int, default=4)
    ap.add_argument("--verifiers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    scenarios = [("demo", args.steps, 1), ("long rounds", args.steps * 4, 4)]
    runs = []
    for name, h, segment in scenarios:
        with tempfile.TemporaryDirectory(prefix="veriloco-bench-") as tmp:
            r = measure(DemoOptions(trainers=args.trainers, verifiers=args.verifiers, epochs=args.epochs,
                                    preset=args.preset, steps=h, workdir=Path(tmp)), segment=segment)
        runs.append({"scenario": name, **r})
        print(f"{name}: done in {r['wall_seconds']} s", file=sys.stderr)
    out = {**runs[0], "scenarios": runs,
           "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                       "cpus": os.cpu_count(), "load_average": os.getloadavg()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(markdown(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
