"""What the protocol costs on top of training: a real network run, measured from the nodes' own logs.

    nice -n 19 .venv/bin/python benchmarks/protocol.py --out benchmarks/results/protocol.json
    .venv/bin/python benchmarks/protocol.py --quick --out /tmp/protocol-quick.json   # a smoke test

Runs `veriloco demo` (a py-evm devnet, a LocalStore, K trainer, 3 verifier and one coordinator
processes; quorum 3) once per scenario: shard audits and full-state audits, at H = 64 and H = 256
on the `small` preset, both under the same deterrence policy (s = 4 audited steps, segments of
r = 4 steps as the examples ship, `--segment`: 16 replayed steps per challenge set). Per scenario, from the nodes' logs:

- `traffic_reduction_vs_allreduce`: ring AllReduce of fp32 gradients for the steps trained
  (2 (K-1)/K x 4 bytes x parameters x H) over every store byte a trainer moves: what it publishes
  (payloads, audit responses: each byte once, since content-addressed data can be fetched from any
  holder) plus what it downloads. `traffic_reduction_vs_allreduce_per_fetch` counts the audit
  response once per judging verifier instead.
- `verifier_compute_fraction`: CPU seconds the q verifiers judging a trainer spend on it (fetching,
  parsing, replaying, chain reads) over that trainer's CPU seconds of inner steps; all summed.
  `verifier_cpu_seconds_per_verification` is one verification's, `verifier_rpc_cpu_share` and
  `verifier_store_cpu_share` the parts of it spent in chain reads and store fetches (thread CPU at the
  node's edges, protocol/cpumeter.py), `verifier_rpc_calls_per_verification` and
  `verifier_fetched_bytes_per_verification` what they did.
- `trainer_stall_fraction`: the share of a trainer's wall time outside its inner steps (chain
  transactions, store traffic, building the global model, answering audits, waiting for peers) in
  its last epoch's cycle, from the end of the previous epoch's training to the end of its own: a
  steady-state cycle, holding the previous epoch's commit, reveal and audit answer once. Steps'
  wall time is the trainer's `step_wall_s` (trainer/node.py); median over trainers. Every process
  shares this machine's cores, so a step's wall time includes contention from verifiers' replays
  and from the trainer's own answer worker. Also reported: `trainer_stall_fraction_from_first_step`
  (from its first step to the end of its last epoch's training: two epochs hold one answer, so it
  reads low; the figure of the runs before this field) and `trainer_stall_fraction_whole_run` (the
  final drain added).
- `audit_answer_compute_fraction`: CPU seconds a trainer spends to answer its audits over its CPU
  seconds of inner steps: building the answers (the `responded` events' `answer_cpu_s`: one block
  replayed from the boundary log, or whole steps without it) plus writing every step's boundary
  tensors to that log (the `trained` events' `log_s`, also alone as `boundary_log_fraction`;
  trainer/boundaries.py). Trainers build answers on a worker thread beside the next epoch's steps
  (trainer/answering.py, `audit_answers_beside_training`), so this work is not stall; it is extra
  compute, counted here. `audit_answer_seconds_per_trainer_per_epoch` is its wall time, and
  `boundary_log_bytes_per_trainer_per_epoch` what the log holds until the answer is sent
  (`boundary_log_ram_bytes_per_trainer_per_epoch` of it in memory, the rest on disk).
  `checkpoint_write_fraction` is the CPU of writing the checkpoints that answers replay from (the
  `trained` events' `checkpoint_s`), reported apart: a restart needs them too.
- `commitment_fraction_of_training`: CPU seconds of leaf commitments over CPU seconds of steps.
- `audit_bytes_per_payload_byte`: bytes a trainer publishes to answer audits over its payload bytes.
- `state_bytes_largest_process_fraction`: the training state (parameters, moments, error buffer)
  held by the trainer's largest process over the whole state; see `state_fraction`.

`--merge-steps 0 1` runs each scenario under the one-step delay and under the merge rule at step 1
(docs/protocol.md §8) side by side; `merge_wait_seconds_per_trainer_per_epoch` is how long a trainer
waited at its merge step for the previous epoch's model, which the stall fraction includes.

Which blocks the audits draw follows the run's seeds, and a large block costs more bytes and
replay than a small one, so one run is one sample. `--merge` of several runs of one scenario reports
the mean of each figure, with every run's value under `runs`.
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

from protocol.numerics import pin_environment

pin_environment()  # the run is created in this process: its fingerprint is the nodes' class's (protocol/numerics.py)

import torch

from protocol.config import RunConfig
from protocol.model import n_params, preset
from veriloco.argtypes import non_negative
from veriloco.netdemo import DemoOptions, run_demo
from veriloco.traffic import allreduce_bytes, compare, trainer_traffic

AUDIT_STEPS = 4  # the deterrence policy (docs/results-protocol.md): 4 segments, of the demo's length by default
MODES = {"shard": "shard", "full_state": "state"}  # audit_mode -> the run config's audit.unit


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


def state_fraction(trainer_logs: list[list[dict[str, Any]]], stages: int) -> float | None:
    """State bytes held by a trainer's largest process over its whole state, from the processes' own
    tensor accounting.

    A single-process trainer holds everything: 1.0. Hook for staged engines (trainer/stages.py): when
    `trained` events carry `state_bytes_largest_process` and `state_bytes_total` (the engine's own
    count of parameter, moment and error-buffer bytes per process), the largest ratio over the run
    is reported; a staged run that logs neither reports None rather than a guess.
    """
    ratios = [ev["state_bytes_largest_process"] / ev["state_bytes_total"]
              for evs in trainer_logs for ev in evs
              if ev["event"] == "trained" and ev.get("state_bytes_total")]
    if ratios:
        return round(max(ratios), 4)
    return 1.0 if stages == 1 else None


def config_of(opts: DemoOptions, audit_mode: str) -> RunConfig:
    return opts.config().replace(audit={"challenges": AUDIT_STEPS, "segment": opts.segment, "unit": MODES[audit_mode]})


def measure(opts: DemoOptions, audit_mode: str) -> dict[str, Any]:
    t0 = time.time()
    with open(os.devnull, "w") as quiet:
        summary = run_demo(opts, out=quiet, config=config_of(opts, audit_mode))
    (opts.workdir / "bench-summary.json").write_text(json.dumps(summary, default=str))  # to analyze again
    return {**analyze(opts, audit_mode, summary), "wall_seconds": round(time.time() - t0, 1)}


def challenge_bytes(opts: DemoOptions, audit_mode: str, trainer_logs: list[list[dict[str, Any]]]) -> int | None:
    """The mean size of the challenge files the trainers' shard answers named (from the run's store)."""
    from protocol.leaf import block_count
    from protocol.shard_audit import decode_manifest
    from protocol.store.backends import LocalStore

    store = LocalStore(opts.workdir / "devnet" / "store")
    n = block_count(preset(opts.preset))
    sizes = []
    for evs in trainer_logs:
        for ev in evs:
            if ev["event"] == "responded" and ev.get("manifest"):
                if audit_mode != "shard":  # a whole-state answer has no challenge files
                    continue
                m = decode_manifest(store.get(ev["manifest"]), n, max_bytes=1 << 26)
                sizes += [store.path_of(c.cid).stat().st_size for c in m.challenges]
    return round(statistics.mean(sizes)) if sizes else None


def analyze(opts: DemoOptions, audit_mode: str, summary: dict[str, Any], config: RunConfig | None = None) -> dict[str, Any]:
    """The scenario's figures from the logs under opts.workdir and the demo's summary; ``config`` is the
    run config the network ran (default: the scenario's, ``config_of``)."""
    config = config or config_of(opts, audit_mode)
    logs = {p.stem: _events(p) for p in (opts.workdir / "logs").glob("*.jsonl")}
    trainer_logs = [evs for name, evs in logs.items() if name.startswith("trainer")]
    stalls, stalls_first, stalls_whole, traffic = [], [], [], []
    compute = digest = audit = payload = answer_wall = answer_cpu = log_cpu = ckpt_cpu = log_bytes = log_ram = 0.0
    per_epoch_compute: dict[int, list[float]] = {}
    kinds: set[Any] = set()
    for evs in trainer_logs:
        steps = [ev for ev in evs if ev["event"] == "step"]
        trained = [ev for ev in evs if ev["event"] == "trained"]
        if not steps or not trained:
            continue
        step_wall = sum(ev["step_wall_s"] for ev in trained)
        first = steps[0]["t"] - trained[0]["step_wall_s"] / max(1, trained[0]["steps"])  # the first step's start
        stalls_first.append(1.0 - step_wall / (trained[-1]["t"] - first))
        if len(trained) > 1:  # the last epoch's cycle: from the end of the one before (its answer falls inside)
            stalls.append(1.0 - trained[-1]["step_wall_s"] / (trained[-1]["t"] - trained[-2]["t"]))
        end = max(ev["t"] for ev in evs if ev["event"] in ("trained", "responded", "finished"))
        stalls_whole.append(1.0 - step_wall / (end - first))
        for ev in trained:
            compute += ev["compute_s"]
            digest += ev["digest_s"]
            log_cpu += ev.get("log_s", 0.0)
            ckpt_cpu += ev.get("checkpoint_s", 0.0)
            log_bytes += ev.get("boundary_log_bytes", 0)
            log_ram += ev.get("boundary_log_ram_bytes", 0)
            kinds.add(ev.get("answer_log"))
            payload += ev["payload_bytes"]
            per_epoch_compute.setdefault(ev["epoch"], []).append(ev["compute_s"])
        audit += sum(ev["audit_bytes"] for ev in evs if ev["event"] == "responded")
        answer_wall += sum(ev.get("answer_s", 0.0) for ev in evs if ev["event"] == "responded")
        answer_cpu += sum(ev.get("answer_cpu_s", 0.0) for ev in evs if ev["event"] == "responded")
        traffic.append(trainer_traffic(evs))
    verified = [ev for name, evs in logs.items() if name.startswith("verifier") for ev in evs if ev["event"] == "verified"]
    verifier_s = sum(ev["cpu_s"] for ev in verified)
    metered = [ev for ev in verified if "rpc_cpu_s" in ev]  # logged since the edges are metered (protocol/cpumeter.py)
    finalized = {ev["epoch"]: ev["t"] for name, evs in logs.items() if name.startswith("coordinator")
                 for ev in evs if ev["event"] == "finalized"}
    ends = [finalized[e] for e in sorted(finalized)]
    cycle = statistics.median(b - a for a, b in itertools.pairwise(ends)) if len(ends) > 1 else None
    cfg = preset(opts.preset)
    k, q = opts.trainers, config.audit.quorum
    moved = compare(traffic, k, n_params(cfg))
    n = max(1, len(traffic))
    epochs = max(1.0, moved["epochs_per_trainer"])
    baseline = allreduce_bytes(k, n_params(cfg), moved["steps_per_trainer"])
    per_fetch = moved["bytes_per_trainer"] + (q - 1) * audit / n  # each judging verifier fetches the audit answer
    return {
        "preset": opts.preset,
        "H": opts.steps,
        "quorum": q,
        "audit_mode": audit_mode,
        "traffic_reduction_vs_allreduce": moved["reduction_vs_allreduce"],
        "traffic_reduction_vs_allreduce_per_fetch": round(baseline / per_fetch, 2),
        "verifier_compute_fraction": round(verifier_s / compute, 4),
        # one verification's CPU, and the share of it in chain reads and store fetches (the rest: parsing,
        # hashing and replaying what it fetched)
        "verifier_cpu_seconds_per_verification": round(verifier_s / len(verified), 4) if verified else None,
        "verifier_rpc_calls_per_verification": round(statistics.mean(ev["rpc_calls"] for ev in metered), 1) if metered else None,
        "verifier_rpc_cpu_share": round(sum(ev["rpc_cpu_s"] for ev in metered) / sum(ev["cpu_s"] for ev in metered), 3) if metered else None,
        "verifier_store_cpu_share": round(sum(ev["store_cpu_s"] for ev in metered) / sum(ev["cpu_s"] for ev in metered), 3) if metered else None,
        "verifier_fetched_bytes_per_verification": round(statistics.mean(ev["fetched_bytes"] for ev in metered)) if metered else None,
        "trainer_stall_fraction": round(statistics.median(stalls or stalls_first), 4),
        "commitment_fraction_of_training": round(digest / compute, 4),
        "audit_bytes_per_payload_byte": round(audit / payload, 3),
        "state_bytes_largest_process_fraction": state_fraction(trainer_logs, opts.stages),
        "stages": opts.stages,
        "merge_step": opts.merge_step,
        "first_merge_step": config.schedule.first_merge_step,
        "rank": config.compression.rank_initial if config.compression.rank_min == config.compression.rank_max else None,
        "error_feedback": config.compression.error_feedback,
        # under the merge rule: wall seconds a trainer waits at its merge step for the previous epoch's model
        "merge_wait_seconds_per_trainer_per_epoch": round(sum(
            ev["seconds"] for evs in trainer_logs for ev in evs
            if ev["event"] == "waited" and "merges its model" in ev.get("what", "")) / n / epochs, 2),
        "trainers": k,
        "K": k,
        "tokens_per_step": config.data.batch_size * config.data.seq_len,
        "batch_size": config.data.batch_size,
        "groups": config.inner.microbatches,
        "audit_bytes_per_challenge": challenge_bytes(opts, audit_mode, trainer_logs),
        # what a trainer keeps to answer its audit (the boundary log) over its training state (parameters, moments)
        "answer_memory_fraction_of_state": round(log_bytes / n / epochs / (12 * n_params(cfg)), 3),
        # the most any trainer kept at once to answer (checkpoints past the first and the log), in states:
        # a windowed run drops each window once answered (docs/protocol.md §5.4)
        "answer_memory_states_peak": round(max([ev.get("answer_held_peak_bytes", 0) for evs in trainer_logs for ev in evs
                                                if ev["event"] == "trained"] or [0]) / (12 * n_params(cfg)), 2),
        "challenge_randomness": "window" if config.audit.window else "epoch",
        "window": config.audit.window,
        # what that log held: every step's boundaries or, where those outgrow the model and do not fit the
        # budgets, every step's total gradients (trainer/boundaries.py); absent from events before it was logged
        "answer_log": "+".join(sorted(str(k) for k in kinds if k)) or None,
        # the trainers' --boundary-log-ram and --boundary-log-disk in GiB (None: the node's defaults)
        "log_budgets_gib": None if opts.log_ram_gib is None else [opts.log_ram_gib, opts.log_disk_gib],
        "verifiers": opts.verifiers,
        "epochs": opts.epochs,
        "audit_steps": config.audit.challenges,
        "audit_rate": config.audit.rate,
        "audit_segment": config.audit.segment,
        "trainer_compute_seconds_per_epoch": {str(e): [round(x, 2) for x in v] for e, v in sorted(per_epoch_compute.items())},
        "trainer_compute_per_epoch_seconds": round(compute / n / epochs, 2),
        "trainer_stall_fraction_by_trainer": [round(x, 4) for x in stalls or stalls_first],
        "trainer_stall_fraction_from_first_step": round(statistics.median(stalls_first), 4),
        "trainer_stall_fraction_whole_run": round(statistics.median(stalls_whole), 4),
        # answering the shard audits: wall seconds of the builds, and CPU (builds and boundary log) over the steps' CPU
        "audit_answer_seconds_per_trainer_per_epoch": round(answer_wall / n / epochs, 2),
        "audit_answer_compute_fraction": round((answer_cpu + log_cpu) / compute, 4),
        "audit_answer_build_fraction": round(answer_cpu / compute, 4),
        "boundary_log_fraction": round(log_cpu / compute, 4),
        # writing the checkpoints answers replay from (every max(4, r) steps); runs before this field have none
        "checkpoint_write_fraction": round(ckpt_cpu / compute, 4),
        "boundary_log_bytes_per_trainer_per_epoch": round(log_bytes / n / epochs),
        "boundary_log_ram_bytes_per_trainer_per_epoch": round(log_ram / n / epochs),
        "audit_answers_beside_training": all(ev.get("beside_training", False) for evs in trainer_logs for ev in evs
                                             if ev["event"] == "responded"),
        "trainer_compute_seconds": round(compute, 2),
        "commitment_seconds": round(digest, 2),
        "verifier_compute_seconds": round(verifier_s, 2),
        "audit_bytes_per_trainer_per_epoch": round(audit / n / epochs),
        "payload_bytes_per_trainer_per_epoch": round(payload / n / epochs),
        "bytes_per_trainer_per_epoch": round(moved["bytes_per_trainer"] / epochs),
        "bytes_sent_per_trainer_per_epoch": round(moved["bytes_sent_per_trainer"] / epochs),
        "bytes_received_per_trainer_per_epoch": round(moved["bytes_received_per_trainer"] / epochs),
        "bytes_per_fetch_per_trainer_per_epoch": round(per_fetch / epochs),
        "steps_per_trainer_per_epoch": round(moved["steps_per_trainer"] / epochs, 1),
        "allreduce_bytes_per_trainer_per_epoch": round(baseline / epochs),
        "epoch_cycle_seconds": round(cycle, 1) if cycle is not None else None,
        "epochs_finalized": summary["epochs_finalized"],
        "initial_eval_loss": summary["initial_eval_loss"],
        "final_eval_loss": summary["final_eval_loss"],
        "gas_used": summary["gas_used"],
    }


SAMPLED = ("traffic_reduction_vs_allreduce", "traffic_reduction_vs_allreduce_per_fetch", "verifier_compute_fraction",
           "trainer_stall_fraction", "commitment_fraction_of_training", "audit_bytes_per_payload_byte",
           "audit_answer_compute_fraction",
           "trainer_compute_per_epoch_seconds", "audit_bytes_per_trainer_per_epoch", "payload_bytes_per_trainer_per_epoch",
           "answer_memory_states_peak")


def combine(scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of the same scenario as one: what fixes the scenario, the mean of each figure in
    ``SAMPLED``, and every run whole under ``runs`` (its bytes, seconds, draws)."""
    fixed = ("preset", "H", "tokens_per_step", "audit_mode", "audit_steps", "audit_segment", "stages", "quorum", "trainers",
             "verifiers", "epochs", "state_bytes_largest_process_fraction", "merge_step", "error_feedback", "log_budgets_gib",
             "rank", "first_merge_step", "window", "challenge_randomness")
    groups: dict[str, list[dict[str, Any]]] = {}  # in first-seen order, wherever a scenario's repeats stand
    for sc in scenarios:
        groups.setdefault(json.dumps([sc.get(k, 0) for k in fixed]), []).append(sc)
    out = []
    for runs in groups.values():
        if len(runs) == 1:
            out.append(runs[0])
            continue
        mean = {k: round(statistics.fmean(r[k] for r in runs), 4) for k in SAMPLED if all(k in r for r in runs)}
        out.append({**{k: runs[0].get(k, 0) for k in fixed}, **mean, "runs": runs})
    return out


def _opt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _rule(r: dict[str, Any]) -> str:
    m = r.get("merge_step", 0)
    if not m:
        return "one-step delay"
    return f"merge at step {m}" + (", error feedback in the parameters" if r.get("error_feedback") == "params" else "")


def markdown(runs: list[dict[str, Any]]) -> str:
    rows = [
        "| preset | H | start rule | audits (s x r) | quorum | AllReduce bytes / trainer bytes: each byte once (per verifier fetch) | verifier / trainer compute | answer / trainer compute | trainer stall | commitments / training | audit bytes / payload byte | largest process's state | compute / trainer / epoch | answer log: kept / training state | answer memory at its peak (states) |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in runs:
        frac = r["state_bytes_largest_process_fraction"]
        runs_note = f" (mean of {len(r['runs'])} runs)" if "runs" in r else ""
        rows.append(
            f"| {r['preset']}{runs_note} | {r['H']} | {_rule(r)} | {r['audit_mode'].replace('_', '-')} "
            f"({_draws(r)} x {r['audit_segment']}) | "
            f"{r['quorum']} | "
            f"{r['traffic_reduction_vs_allreduce']:.2f} ({r['traffic_reduction_vs_allreduce_per_fetch']:.2f}) | "
            f"{r['verifier_compute_fraction']:.3f} | {_opt(r.get('audit_answer_compute_fraction'))} | {r['trainer_stall_fraction']:.3f} | "
            f"{r['commitment_fraction_of_training']:.3f} | {r['audit_bytes_per_payload_byte']:,.1f} | "
            f"{'n/a' if frac is None else f'{frac:g}'} | {r['trainer_compute_per_epoch_seconds']:.1f} s | "
            f"{r.get('answer_log') or 'n/a'}: {_opt(r.get('answer_memory_fraction_of_state'))} | "
            f"{_opt(r.get('answer_memory_states_peak'))} |"
        )
    return "\n".join(rows)


def _draws(r: dict[str, Any]) -> str:
    """How a scenario's challenges were drawn: s an epoch, or per window (W) at the per-step rate."""
    if r.get("challenge_randomness") == "window":
        return f"window {r['window']}, {r['audit_rate']} a step"
    return str(r["audit_steps"])


def log_budget(text: str) -> tuple[float, float] | None:
    """``--log-budgets`` values: "node" (None) or "RAM:DISK" in GiB."""
    if text == "node":
        return None
    try:
        ram, disk = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give 'node' or RAM:DISK in GiB, e.g. 0.05:0") from None
    if not (ram >= 0 and disk >= 0):
        raise argparse.ArgumentTypeError(f"{text!r}: budgets are GiB, 0 or more")
    return ram, disk


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="a smoke test: tiny preset, H = 8 and 16")
    ap.add_argument("--preset", default=None, help="default: small (tiny with --quick)")
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--verifiers", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, nargs="+", default=None, help="the H values; default 64 256 (8 16 with --quick)")
    ap.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["shard", "full_state"])
    ap.add_argument("--stages", type=int, default=1)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[8], metavar="ROWS",
                    help="rows per trainer and step, side by side (--seq-len tokens each); default 8")
    ap.add_argument("--seq-len", type=int, default=64, metavar="TOKENS",
                    help="tokens per row, at most the preset's context; default 64 (the demo's and "
                         "examples/small.toml's, 128 rows of them; `small`'s context is 128)")
    ap.add_argument("--group-rows", type=non_negative, default=0, metavar="ROWS",
                    help="rows per group (micro-batch): a shard challenge opens one group per step; 0 (default): the whole batch")
    ap.add_argument("--segment", type=int, default=DemoOptions.segment,
                    help=f"steps per shard challenge (audit.segment); default {DemoOptions.segment}, the demo's")
    ap.add_argument("--merge-steps", type=non_negative, nargs="+", default=[0], metavar="M",
                    help="start rules to run side by side: 0 is the one-step delay, M > 0 the merge rule at step M")
    ap.add_argument("--error-feedback", nargs="+", choices=["buffer", "params"], default=["params"],
                    help="with the merge rule: where the compression residual waits (compression.error_feedback), side "
                         "by side; \"buffer\" ships a start file every continued epoch, \"params\" none")
    ap.add_argument("--rank", type=int, default=None,
                    help="hold the compression rank at this (rank_initial = rank_min = rank_max, as examples/small.toml "
                         "ships 128); default the demo's adaptive rule from rank 8")
    ap.add_argument("--first-merge-step", type=int, default=-1, metavar="M",
                    help="with the merge rule: epoch 1's merge step (examples/small.toml ships 0); -1 (default): as the others")
    ap.add_argument("--log-budgets", type=log_budget, nargs="+", default=[None], metavar="RAM:DISK",
                    help="the trainers' --boundary-log-ram and --boundary-log-disk in GiB, one scenario each; 'node': "
                         "the node's defaults (the default). Budgets an epoch of boundaries does not fit make a trainer "
                         "keep each step's total gradients instead where those are smaller (trainer/boundaries.py)")
    ap.add_argument("--windows", type=non_negative, nargs="+", default=[0], metavar="W",
                    help="audit.window values, run side by side: each window of W steps drawn from a block after its "
                         "post (0: after the epoch)")
    ap.add_argument("--audit-rate", type=float, default=0.25, help="audit.rate of a windowed run (per step)")
    ap.add_argument("--block-time", type=float, default=0.0, metavar="S",
                    help="mine a block every S seconds (a windowed run's seeds need blocks while trainers train)")
    ap.add_argument("--keep", type=Path, default=None, help="keep each scenario's demo directory (logs) under this folder")
    ap.add_argument("--analyze", type=Path, default=None,
                    help="analyze a kept scenario directory (--keep) again, one --steps and --modes; without its "
                         "bench-summary.json (a run stopped once its nodes were done) eval loss and gas come from the logs")
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="write --out from these results files' scenarios (runs split across processes) and exit")
    args = ap.parse_args()
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        order = {"shard": 0, "full_state": 1}
        merged = combine(sorted((sc for part in parts for sc in part["scenarios"]),
                                key=lambda sc: (sc["H"], order[sc["audit_mode"]], sc.get("merge_step", 0))))
        out: dict[str, Any] = {"scenarios": merged, "commands": [part["command"] for part in parts],
                               "machines": [part["machine"] for part in parts]}  # one per command
        args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        print(markdown(merged))
        return 0
    name = args.preset or ("tiny" if args.quick else "small")
    hs = args.steps or ([8, 16] if args.quick else [64, 256])
    if args.analyze:
        opts = DemoOptions(trainers=args.trainers, verifiers=args.verifiers, epochs=args.epochs, preset=name,
                           steps=hs[0], workdir=args.analyze, stages=args.stages, audit=MODES[args.modes[0]],
                           merge_step=args.merge_steps[0], batch_size=args.batch_sizes[0], group_rows=args.group_rows,
                           segment=args.segment, error_feedback=args.error_feedback[0], seq_len=args.seq_len,
                           rank=args.rank, first_merge_step=args.first_merge_step)
        saved = args.analyze / "bench-summary.json"
        if saved.exists():
            summary = json.loads(saved.read_text())
        else:
            fin = [ev for ev in _events(args.analyze / "logs" / "coordinator0.jsonl") if ev["event"] == "finalized"]
            summary = {"epochs_finalized": len(fin), "initial_eval_loss": None,
                       "final_eval_loss": fin[-1].get("eval_loss") if fin else None, "gas_used": None}
        r = analyze(opts, args.modes[0], summary)
        args.out.write_text(json.dumps({"scenarios": [r], "command": " ".join(["benchmarks/protocol.py", *sys.argv[1:]]),
                                        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg()}},
                                       indent=1, sort_keys=True) + "\n")
        print(markdown([r]))
        return 0
    runs: list[dict[str, Any]] = []
    combos = [(h, mode, m, rows, ef, budget, w) for h, mode, m, rows, ef, budget, w in
              itertools.product(hs, args.modes, args.merge_steps, args.batch_sizes, args.error_feedback, args.log_budgets,
                                args.windows)
              if m or ef == args.error_feedback[0]]  # without the merge rule there is only the buffer
    for h, mode, m, rows, ef, budget, w in combos:
        with tempfile.TemporaryDirectory(prefix="veriloco-bench-") as tmp:
            # windows long enough for an epoch of steps; the contract advances as soon as everyone has acted
            tag = f"{name}-h{h}-{mode}" + (f"-w{w}" if w else "") + (f"-merge{m}" if m else "") + (f"-b{rows}" if rows != 8 else "") + (
                f"-t{args.seq_len}" if args.seq_len != 64 else "") + (
                f"-g{args.group_rows}" if args.group_rows else "") + ("-efbuffer" if m and ef == "buffer" else "") + (
                f"-log{budget[0]}-{budget[1]}" if budget else "")
            opts = DemoOptions(trainers=args.trainers, verifiers=args.verifiers, epochs=args.epochs, preset=name,
                               steps=h, workdir=(args.keep / tag) if args.keep else Path(tmp),
                               stages=args.stages, audit=MODES[mode], windows_s=3600, timeout_s=6 * 3600,
                               merge_step=m, batch_size=rows, group_rows=args.group_rows,
                               segment=args.segment, error_feedback=ef, seq_len=args.seq_len,
                               rank=args.rank, first_merge_step=args.first_merge_step, log_ram_gib=budget[0] if budget else None, log_disk_gib=budget[1] if budget else None,
                               window=w, audit_rate=args.audit_rate, block_time_s=args.block_time)
            r = measure(opts, mode)
        runs.append(r)
        print(f"{tag}: done in {r['wall_seconds']} s", file=sys.stderr, flush=True)
        out = {"scenarios": runs, "command": " ".join(["benchmarks/protocol.py", *sys.argv[1:]]),
               "machine": {"platform": platform.platform(), "python": platform.python_version(),
                           "torch": torch.__version__, "cpus": os.cpu_count(), "load_average": os.getloadavg()}}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")  # after each scenario: a partial run still reports
    print(markdown(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
