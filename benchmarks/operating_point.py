"""The shipped config end to end: `examples/small.toml` as a network and as the engine benchmark, one
config and seed, every byte and second counted (issue 47).

    nice -n 19 .venv/bin/python benchmarks/operating_point.py --out benchmarks/results/operating-point.json \
        --md docs/results-operating-point.md
    make headline H=operating-point

Two runs of one config:

- **The network**: `veriloco demo`'s devnet, store and node processes (K trainers, V verifiers, one
  coordinator, quorum as the config says) running the config as it ships but for its windows, which are
  this machine's (the contract moves on early when everyone has acted, so long windows cost nothing).
  From the nodes' logs (`benchmarks/protocol.py`'s `analyze`): every store byte each trainer sends and
  receives, each byte once, against ring AllReduce of fp32 gradients for the steps it trained; the same
  with the audit answer counted per judging verifier; without any verification byte (payload only);
  against an AllReduce worker's sends and receives both (like for like: the headline counts only what it
  sends) and for the busier direction of the trainer's link;
  the answers' and the verifiers' CPU over the trainers' step CPU; the trainer's stall; the
  commitments. Its final global model is evaluated on the run's rows (`protocol.run.eval_model`).
- **The engine**: `veriloco.simulate.run_local` on the same config (`from_run_config`: its model,
  seeds, batches, optimizers, schedule, compression, start rule, aggregation and block-wise step), the
  convergence benchmark's DiLoCoX path, run after the network on its corpus and evaluated on the same
  rows. Every finalized G_e of the network is compared with the engine's digest by digest.

Detection: the config's audit.rate within 256 steps of work, closed form and, where present, sampled
(`benchmarks/results/audit-rate.json`). The engine's held-out gaps against AllReduce and DiLoCo are
read from `benchmarks/results/convergence-small-heldout.json` (seeds 3 to 5, the method closest to the
config: `convergence.py`'s plain step and corpus, on no seed a choice was made on) and named as such.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocol.numerics import pin_environment

pin_environment()  # the nodes' numerics class, before torch computes (docs/protocol.md §11)

import torch

from benchmarks.protocol import analyze
from dilocox.aggregate import aggregate
from dilocox.inner import configure_determinism
from protocol.config import RunConfig, load_toml
from protocol.digest import state_digest
from protocol.run import eval_model, latest_model, load_model, open_run, params_of
from verifier.calibrate import rate_detection
from veriloco.netdemo import DemoOptions, run_demo
from veriloco.simulate import from_run_config, run_local

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = "benchmarks/results/convergence-small-heldout.json"
HELDOUT_METHOD = "fixed_rank_merge_b1_inparams_trimmed_r128"
AUDIT_RATE = "benchmarks/results/audit-rate.json"


def network_config(cfg: RunConfig, windows_s: int) -> RunConfig:
    """The config as it ships with this machine's windows (every phase ``windows_s``; unbonding as is)."""
    w = windows_s
    return cfg.replace(windows={"commit_s": w, "reveal_s": w, "response_s": w, "verdict_s": w, "finalize_s": w})


def demo_options(cfg: RunConfig, trainers: int, verifiers: int, workdir: Path, windows_s: int, timeout_s: float) -> DemoOptions:
    """What `run_demo` needs besides the config: the node counts and where the logs go."""
    s = cfg.schedule
    return DemoOptions(trainers=trainers, verifiers=verifiers, epochs=s.epochs, preset=cfg.model.preset, steps=s.h_initial,
                       workdir=workdir, timeout_s=timeout_s, windows_s=windows_s, quorum=cfg.audit.quorum,
                       merge_step=s.merge_step, batch_size=cfg.data.batch_size, seq_len=cfg.data.seq_len,
                       segment=cfg.audit.segment, error_feedback=cfg.compression.error_feedback,
                       first_merge_step=s.first_merge_step)


def kept_network(workdir: Path, cfg: RunConfig, eval_rows: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the demo's summary fields `analyze` reads, what `inspect` records) of a kept network folder, from its
    nodes' logs and store alone (the devnet is gone): the finalized epochs and models the coordinator
    logged, the final model evaluated on the run's rows, digests for the engine to compare with."""
    from types import SimpleNamespace

    from protocol.formats.codec import load_state
    from protocol.run import corpus_for, initial_model
    from protocol.store.backends import LocalStore

    logs = {p.stem: [json.loads(x) for x in p.read_text().splitlines() if x.startswith("{")]
            for p in sorted((workdir / "logs").glob("*.jsonl"))}
    finalized = {ev["epoch"]: ev["model"] for ev in logs.get("coordinator0", []) if ev.get("event") == "finalized"}
    if not finalized:
        raise SystemExit(f"{workdir}: the coordinator's log names no finalized epoch")
    store = LocalStore(workdir / "devnet" / "store")
    ctx = SimpleNamespace(config=cfg, corpus=corpus_for(cfg, store))
    models = [load_state(store.get(finalized[e])) for e in sorted(finalized)]
    summary = {"epochs_finalized": len(finalized),
               "initial_eval_loss": eval_model(ctx, params_of(initial_model(cfg)), rows=eval_rows),  # type: ignore[arg-type]
               "final_eval_loss": eval_model(ctx, params_of(models[-1]), rows=eval_rows),  # type: ignore[arg-type]
               "gas_used": sum(int(ev.get("gas", 0)) for evs in logs.values() for ev in evs),
               "slashed": sorted({name for name, evs in logs.items() for ev in evs if ev.get("event") == "slashed"})}
    times = [float(ev["t"]) for evs in logs.values() for ev in evs if "t" in ev]
    seen = {"ctx": ctx, "final_epoch": max(finalized), "final_eval": summary["final_eval_loss"],
            "models": [state_digest(m) for m in models],
            "ran_s": max(times) - min(times) if times else None}  # the kept network's own wall time, from its logs
    return summary, seen


def heldout_gaps(path: Path) -> dict[str, Any] | None:
    """The committed held-out gaps of the method closest to the config (None where the file is missing)."""
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    vs_ar = d["paired_gap_vs_allreduce"].get(HELDOUT_METHOD)
    vs_dl = d["paired_gap_vs_diloco"].get(HELDOUT_METHOD)
    if vs_ar is None or vs_dl is None:
        return None
    # the gaps' seeds; of them, only those no choice was made on are held out (issue 49: 5 of 3-5)
    return {"file": HELDOUT, "method": HELDOUT_METHOD, "seeds": d["seeds"], "held_out_seeds": d["held_out_seeds"],
            "gap_vs_allreduce": {k: vs_ar[k] for k in ("mean", "ci95", "per_seed")},
            "gap_vs_diloco_points": {k: vs_dl[k] for k in ("mean", "ci95", "per_seed")}}


def sampled_detection(path: Path, H: int, segment: int, rate: float) -> float | None:
    """The clustered 10% skipper caught within 256 steps, sampled at this H and segment (audit_rate.py)."""
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    if d.get("rate") != rate:
        return None
    rows = [r for r in d["rows"] if r["H"] == H and r["segment"] == segment]
    return rows[0]["detection_per_256_steps"]["clustered"]["rate_sampled"] if rows else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=Path("examples/small.toml"), help="the run config (default: the shipped one)")
    ap.add_argument("--out", type=Path, required=True, help="results JSON to write")
    ap.add_argument("--md", type=Path, help="write the Markdown table here too")
    ap.add_argument("--trainers", type=int, default=4, help="K (the issue's operating point: 4)")
    ap.add_argument("--verifiers", type=int, default=4, help="V (default 4: the quorum of 3 and a spare, as the demo runs)")
    ap.add_argument("--epochs", type=int, default=0, help="run this many epochs instead of the config's (a smoke test)")
    ap.add_argument("--windows-s", type=int, default=900, help="every chain window, seconds (this machine's)")
    ap.add_argument("--timeout-s", type=float, default=6 * 3600.0)
    ap.add_argument("--eval-rows", type=int, default=512)
    ap.add_argument("--keep", type=Path, help="keep the network's folder (logs, store) here")
    ap.add_argument("--from-kept", type=Path, metavar="DIR",
                    help="measure a network kept with --keep (same --config, --trainers, --verifiers) instead of running one")
    ap.add_argument("--no-engine", action="store_true", help="leave the engine's run of the config out")
    a = ap.parse_args(argv)
    t0 = time.time()
    shipped = load_toml(a.config)
    cfg = shipped.replace(schedule={"epochs": a.epochs}) if a.epochs else shipped
    net_cfg = network_config(cfg, a.windows_s)
    seen: dict[str, Any] = {}

    def inspect(chain: Any, store: Any, run_id: int) -> None:
        ctx = open_run(chain, store, run_id)
        epochs = ctx.config.schedule.epochs
        cid, digest, last = latest_model(chain, ctx, epochs)
        seen.update(ctx=ctx, final_epoch=last,
                    final_eval=eval_model(ctx, params_of(load_model(store, cid, digest)), rows=a.eval_rows),
                    models=[bytes(chain.epoch_times(run_id, e).model_digest) for e in range(last + 1)])

    if a.from_kept:
        opts = demo_options(cfg, a.trainers, a.verifiers, a.from_kept, a.windows_s, a.timeout_s)
        summary, kept = kept_network(a.from_kept, net_cfg, a.eval_rows)
        seen.update(kept)
        measured = analyze(opts, "shard", summary, config=net_cfg)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            opts = demo_options(cfg, a.trainers, a.verifiers, a.keep or Path(tmp) / "network", a.windows_s, a.timeout_s)
            print(f"network: {a.config} ({cfg.schedule.epochs} epochs), {a.trainers} trainers, {a.verifiers} verifiers",
                  file=sys.stderr, flush=True)
            summary = run_demo(opts, out=sys.stderr, config=net_cfg, inspect=inspect)
            measured = analyze(opts, "shard", summary, config=net_cfg)
    t_net = time.time() - t0
    engine_models: list[bytes] = []
    engine = None
    t1 = time.time()
    if not a.no_engine:
        print("engine: the same config through veriloco.simulate.run_local", file=sys.stderr, flush=True)
        sim, method = from_run_config(cfg, a.trainers, eval_rows=a.eval_rows)
        configure_determinism(cfg.audit.threads)

        def record(epoch: int, g: Any, deltas: Any, outer: Any) -> Any:
            out = aggregate(g, deltas, outer)
            engine_models.append(state_digest(out))
            return out

        engine = run_local(method, sim, seen["ctx"].corpus, lambda msg: print(msg, file=sys.stderr, flush=True),
                           aggregator=record)
    t_engine = time.time() - t1
    bytes_all = measured["bytes_per_trainer_per_epoch"]
    audit = measured["audit_bytes_per_trainer_per_epoch"]
    allreduce = measured["allreduce_bytes_per_trainer_per_epoch"]
    rate = cfg.audit.rate
    H = cfg.schedule.h_initial
    res = {
        "benchmark": "operating_point",
        "command": "benchmarks/operating_point.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": str(a.config), "config_digest": "0x" + shipped.digest().hex(),
        "epochs": cfg.schedule.epochs, "windows_s": a.windows_s, "H": H,
        "tokens_per_step": cfg.data.batch_size * cfg.data.seq_len, "K": a.trainers, "verifiers": a.verifiers,
        "quorum": cfg.audit.quorum, "audit_rate": rate, "final_check_bps": cfg.audit.final_check_bps,
        "seeds": {"init_seed": cfg.model.init_seed, "run_seed": cfg.data.run_seed},
        "eval_rows": a.eval_rows,
        "network_final_eval_loss": seen["final_eval"], "network_final_model_epoch": seen["final_epoch"],
        # None where the engine was left out (--no-engine): the tiny network test holds the two together
        "engine_final_eval_loss": engine.final_eval_loss if engine else None,
        "network_over_engine_loss": seen["final_eval"] / engine.final_eval_loss - 1 if engine else None,
        "models_bit_identical": seen["models"] == engine_models if engine else None,
        # the committed held-out runs are of `small` at 128 rows: they speak for that config alone
        "engine_heldout": heldout_gaps(ROOT / HELDOUT) if (cfg.model.preset, cfg.data.batch_size) == ("small", 128) else None,
        "traffic_reduction_vs_allreduce": measured["traffic_reduction_vs_allreduce"],
        "traffic_reduction_per_verifier_fetch": measured["traffic_reduction_vs_allreduce_per_fetch"],
        "payload_only_traffic_reduction": round(allreduce / (bytes_all - audit), 2),
        # the headline sets a trainer's sends and receives against what an AllReduce worker sends; that worker
        # receives as much again: like for like, and per direction (what a full-duplex link's time follows)
        "traffic_reduction_vs_allreduce_both_directions": round(2 * allreduce / bytes_all, 2),
        "traffic_reduction_busiest_direction": round(allreduce / max(measured["bytes_sent_per_trainer_per_epoch"],
                                                                     measured["bytes_received_per_trainer_per_epoch"]), 2),
        "verification_share_of_bytes": round(audit / bytes_all, 4),
        "answer_compute_fraction": measured["audit_answer_compute_fraction"],
        "verifier_compute_fraction": measured["verifier_compute_fraction"],
        "stall_fraction": measured["trainer_stall_fraction"],
        "commitment_fraction": measured["commitment_fraction_of_training"],
        "skip10_detection_within_256_steps": rate_detection(26, rate) if rate else None,
        "skip10_detection_within_256_steps_sampled": sampled_detection(ROOT / AUDIT_RATE, H, cfg.audit.segment, rate),
        "slashed_honest": len(summary["slashed"]),
        "epochs_finalized": summary["epochs_finalized"],
        "network": measured,
        "network_seconds": round(seen["ran_s"] if a.from_kept and seen.get("ran_s") else t_net, 1),
        "engine_seconds": round(t_engine, 1),
        "python": platform.python_version(), "torch": torch.__version__, "host": platform.machine(),
        "seconds": round(time.time() - t0, 1),
    }
    a.out.write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = render(res)
    if a.md:
        a.md.write_text("# The shipped config end to end (issue 47)\n\n" + md)
    print(md)
    return 0


def render(r: dict[str, Any]) -> str:
    h = r.get("engine_heldout")
    held = (f"{h['gap_vs_allreduce']['mean']:+.2%} vs AllReduce, {h['gap_vs_diloco_points']['mean'] * 100:+.2f} points vs DiLoCo "
            f"(seeds {', '.join(map(str, h['seeds']))}, held out {', '.join(map(str, h['held_out_seeds'])) or 'none'}, "
            f"`{h['file']}`)") if h else "none benchmarked"
    det = r["skip10_detection_within_256_steps"]
    rows = [
        ("traffic vs AllReduce, every byte each byte once", f"{r['traffic_reduction_vs_allreduce']:.1f}x"),
        ("traffic per verifier fetch", f"{r['traffic_reduction_per_verifier_fetch']:.1f}x"),
        ("the same run without a verification byte", f"{r['payload_only_traffic_reduction']:.1f}x"),
        ("like for like: AllReduce's receives counted too; the busier direction of a trainer's link",
         f"{r['traffic_reduction_vs_allreduce_both_directions']:.1f}x; {r['traffic_reduction_busiest_direction']:.1f}x"),
        ("verification's share of a trainer's bytes", f"{r['verification_share_of_bytes']:.1%}"),
        ("answers (build + log) / training compute", f"{r['answer_compute_fraction']:.4f}"),
        ("verifier compute / trainer compute", f"{r['verifier_compute_fraction']:.4f}"),
        ("trainer stall, commitments", f"{r['stall_fraction']:.3f}, {r['commitment_fraction']:.4f}"),
        ("10% skipped in whole segments, caught within 256 steps", "-" if det is None else
         f"{det:.1%} (closed form)" + ("" if r["skip10_detection_within_256_steps_sampled"] is None
                                      else f", {r['skip10_detection_within_256_steps_sampled']:.1%} sampled")),
        ("final eval loss: network, engine (same config and seed)",
         (f"{r['network_final_eval_loss']:.6f}, not run" if r["engine_final_eval_loss"] is None else
          f"{r['network_final_eval_loss']:.6f}, {r['engine_final_eval_loss']:.6f} "
          f"({'every model bit for bit' if r['models_bit_identical'] else 'models differ'})")),
        ("the engine's gaps for the closest benchmarked method", held),
        ("honest parties slashed", str(r["slashed_honest"])),
    ]
    return "\n".join([
        (f"`{r['config']}` (digest {r['config_digest'][:10]}…): H = {r['H']}, {r['tokens_per_step']:,} tokens a step, "
         f"K = {r['K']}, quorum {r['quorum']}, {r['verifiers']} verifiers, {r['epochs']} epochs ({r['epochs_finalized']} "
         f"finalized), audit rate {r['audit_rate']}, final check {r['final_check_bps'] / 100:g}%, windows {r['windows_s']} s. "
         f"Command: `{r['command']}`; {r['seconds'] / 60:.0f} min on {r['host']}"
         + (f", the network itself {r['network_seconds'] / 60:.0f} min." if r.get("network_seconds") else ".")), "",
        "| figure | measured |", "|---|---:|", *[f"| {a} | {b} |" for a, b in rows]]) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
