"""Codec benchmark: veriloco's compressor against torch's PowerSGD hook at equal bytes.

Pseudo-gradients are real: the GPT from protocol/model.py trains on the built-in corpus for
`--rounds` rounds of `--h` AdamW steps, and each round's start - end is one pseudo-gradient. Each
compressor sees the same sequence and keeps its own error feedback (PowerSGD also its warm start),
as it would in training. PowerSGD runs as torch ships it: `powerSGD_hook` registered on a
DistributedDataParallel model in a one-process gloo group, with the gradient set to the
pseudo-gradient. For each PowerSGD rank, veriloco gets the largest rank whose payload is no bigger.

    .venv/bin/python -m benchmarks.codec --preset small --out benchmarks/results/codec.json

Prints a Markdown table and writes JSON (machine, versions, settings, per-method numbers, ratios).
Throughput is dense float32 MB per CPU-second of the process (all threads), the fastest of the
rounds; PowerSGD's encode and decode run fused inside its hook, so it has one round-trip figure,
which includes a trivial backward pass.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from dilocox.compress import CompressionConfig, EpochRecord, adapt, compress
from dilocox.inner import PARAM, InnerConfig, init_state, section, train_step
from protocol.data import batch, default_corpus
from protocol.formats.payload import decode
from protocol.model import preset
from veriloco.sparsecodec import (
    BASELINE_CHUNK,
    DCT_BLOCK,
    SparseCodec,
    baseline_decode,
    baseline_encode,
    largest_k,
)

Deltas = list[dict[str, Tensor]]

# Codec timings use the process's CPU time (all its threads): on a shared machine, wall time
# measures the neighbours as much as the codec. With one torch thread the two agree when idle.
_clock = time.process_time


def pseudo_gradients(preset_name: str, rounds: int, h: int, batch_size: int, seed: int) -> tuple[Deltas, float]:
    """`rounds` consecutive pseudo-gradients of one trainer (start - end params), and seconds per step."""
    cfg = preset(preset_name)
    inner = InnerConfig(lr=1e-3, warmup_steps=min(20, rounds * h // 4), total_steps=max(1, rounds * h))
    corpus = default_corpus()
    state = init_state(cfg, seed)
    deltas: Deltas = []
    t0 = time.perf_counter()
    for r in range(rounds):
        start = {k: v.clone() for k, v in section(state, PARAM).items()}
        for k in range(h):
            state, _ = train_step(state, batch(corpus, seed, r, 0, k, batch_size, cfg.seq_len), cfg, inner)
        end = section(state, PARAM)
        deltas.append({n: start[n] - end[n] for n in start})
    return deltas, (time.perf_counter() - t0) / (rounds * h)


@dataclass
class Outcome:
    bytes_per_round: int
    rel_errors: list[float]  # per round, ||x - c(x)|| / ||x|| with x = delta + own error buffer
    cumulative_error: float  # ||sum delta - sum decoded|| / ||sum delta||
    encode_s: float  # fastest round: the machine is shared, the minimum is the least disturbed
    decode_s: float


def _norm2(d: dict[str, Tensor]) -> float:
    return sum(float(v.double().square().sum()) for v in d.values())


def _evaluate(deltas: Deltas, step: Callable[[dict[str, Tensor]], tuple[dict[str, Tensor], int, float, float]]) -> Outcome:
    """Run a compressor with error feedback over the sequence: step(x) -> (decoded, bytes, enc_s, dec_s)."""
    ef = {k: torch.zeros_like(v) for k, v in deltas[0].items()}
    sum_delta = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in ef.items()}
    sum_dec = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in ef.items()}
    errors: list[float] = []
    enc, dec = math.inf, math.inf
    size = 0
    for d in deltas:
        x = {k: d[k] + ef[k] for k in d}
        out, size, e_s, d_s = step(x)
        enc, dec = min(enc, e_s), min(dec, d_s)
        ef = {k: x[k] - out[k] for k in x}
        errors.append(math.sqrt(_norm2(ef) / _norm2(x)))
        for k in d:
            sum_delta[k] += d[k].double()
            sum_dec[k] += out[k].double()
    cum = math.sqrt(_norm2({k: sum_delta[k] - sum_dec[k] for k in d}) / _norm2(sum_delta))
    return Outcome(size, errors, cum, enc, dec)


def run_ours(deltas: Deltas, rank: int, cfg: CompressionConfig, seed: int) -> Outcome:
    shapes = {k: tuple(v.shape) for k, v in deltas[0].items()}
    counter = iter(range(10**9))

    def step(x: dict[str, Tensor]) -> tuple[dict[str, Tensor], int, float, float]:
        t0 = _clock()
        # error feedback is applied by _evaluate, identically for both codecs: pass an empty buffer
        c = compress(x, {}, rank, seed + next(counter), cfg)
        t1 = _clock()
        out = decode(c.payload, shapes)
        t2 = _clock()
        return out, len(c.payload), t1 - t0, t2 - t1

    return _evaluate(deltas, step)


def run_adaptive(deltas: Deltas, cfg: CompressionConfig, seed: int) -> list[dict[str, object]]:
    """The adaptive rule over the sequence (one trainer, history lag 1): rank, H and error per round."""
    history: list[EpochRecord] = []
    ef: dict[str, Tensor] = {}
    out: list[dict[str, object]] = []
    for i, d in enumerate(deltas):
        rank, h = adapt(history, cfg)
        c = compress(d, ef, rank, seed + i, cfg)
        ef = c.new_ef
        need = c.stats.profile.needed_rank(cfg.energy_target)
        out.append({"round": i + 1, "rank": rank, "h": h, "bytes": c.stats.payload_bytes,
                    "needed_rank": need, "rel_error": c.stats.rel_error})
        history.append(EpochRecord(rank, h, (c.stats.profile,)))
    return out


def payload_size(deltas: Deltas, rank: int, cfg: CompressionConfig) -> int:
    return len(compress(deltas[0], {}, rank, 0, cfg).payload)


def rank_for_budget(deltas: Deltas, budget: int, cfg: CompressionConfig, hi: int) -> int:
    """The largest rank whose payload fits in `budget` bytes (payload size grows with rank)."""
    lo, best = 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if payload_size(deltas, mid, cfg) <= budget:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


class _Holder(nn.Module):
    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        super().__init__()
        self.names = sorted(shapes)
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(shapes[n])) for n in self.names])

    def forward(self, g: dict[str, Tensor]) -> Tensor:
        """A loss whose gradient with respect to each parameter is exactly g[name]."""
        return torch.stack([(p * g[n]).sum() for n, p in zip(self.names, self.ps, strict=True)]).sum()


def psgd_bytes(shapes: dict[str, tuple[int, ...]], rank: int, min_rate: float) -> int:
    """What the hook sends per round: P and Q (float32) for compressed matrices, other tensors as float32."""
    total = 0
    for s in shapes.values():
        numel = math.prod(s)
        if len(s) > 1:
            n, m = s[0], numel // s[0]
            r = min(n, m, rank)
            ok, _, _ = psgd._should_compress(n, m, r, min_rate)
            if ok:
                total += 4 * r * (n + m)
                continue
        total += 4 * numel
    return total


def run_powersgd(deltas: Deltas, rank: int, seed: int) -> Outcome:
    """torch's powerSGD_hook on DDP, one gloo process; the hook keeps its own error feedback and warm start."""
    shapes = {k: tuple(v.shape) for k, v in deltas[0].items()}
    holder = _Holder(shapes)
    # One bucket: the hook's callbacks block on nested gloo allreduces, and two buckets in flight
    # at once can deadlock gloo's worker threads on a loaded machine.
    ddp = nn.parallel.DistributedDataParallel(holder, bucket_cap_mb=4096)
    state = psgd.PowerSGDState(
        process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2,
        use_error_feedback=True, warm_start=True, random_seed=seed,
    )
    ddp.register_comm_hook(state, psgd.powerSGD_hook)

    def grads_of(g: dict[str, Tensor]) -> tuple[dict[str, Tensor], float]:
        for p in holder.ps:
            p.grad = None
        t0 = _clock()
        ddp(g).backward()  # DDP arms its reducer in forward; backward then runs the hook per bucket
        dt = _clock() - t0
        return {n: p.grad.detach().clone() for n, p in zip(holder.names, holder.ps, strict=True)}, dt  # type: ignore[union-attr]

    zeros = {k: torch.zeros(s) for k, s in shapes.items()}
    for _ in range(2):  # the hook allreduces uncompressed until start_powerSGD_iter
        grads_of(zeros)
    # the hook applies error feedback itself: feed plain deltas, and account for its buffer below
    own_ef = {k: torch.zeros_like(v) for k, v in zeros.items()}
    size = psgd_bytes(shapes, rank, state.min_compression_rate)

    def step(x: dict[str, Tensor]) -> tuple[dict[str, Tensor], int, float, float]:
        # _evaluate hands x = delta + its buffer; the hook adds its own buffer, which equals ours,
        # so pass x - own_ef (= delta) and keep the two in lockstep.
        delta = {k: x[k] - own_ef[k] for k in x}
        out, dt = grads_of(delta)
        for k, v in x.items():
            own_ef[k] = v - out[k]
        return out, size, dt, 0.0

    return _evaluate(deltas, step)


# --- Baselines at equal bytes (issue 33): SparseLoCo-style top-k and DeMo-style chunked-DCT top-k ---
# The codec itself (payload layout, encoder, decoder) is veriloco/sparsecodec.py, shared with the
# convergence benchmark's sparseloco_merge / demo_merge methods; here it is measured at equal bytes.


@dataclass
class BaselineOutcome:
    outcome: Outcome
    sizes: list[int]  # payload bytes of each round (entropy-coded indices: they vary a little)


def run_baseline(deltas: Deltas, codec: SparseCodec) -> BaselineOutcome:
    shapes = {k: tuple(v.shape) for k, v in deltas[0].items()}
    sizes: list[int] = []

    def step(x: dict[str, Tensor]) -> tuple[dict[str, Tensor], int, float, float]:
        t0 = _clock()
        payload, nbytes = baseline_encode(x, codec)
        t1 = _clock()
        out = baseline_decode(payload, shapes, codec)
        t2 = _clock()
        assert nbytes == len(payload)
        sizes.append(nbytes)
        return out, nbytes, t1 - t0, t2 - t1

    return BaselineOutcome(_evaluate(deltas, step), sizes)


def fit_baseline(deltas: Deltas, budget: int, transform: str, values: str) -> tuple[SparseCodec, BaselineOutcome] | None:
    """The largest k whose payload fits `budget` in every round (searched on round 1, then lowered
    while any round with error feedback overflows), and its outcome over the rounds."""
    best = largest_k(deltas[0], budget, transform, values)
    while best >= 1:
        codec = SparseCodec(transform, best, values)
        res = run_baseline(deltas, codec)
        if max(res.sizes) <= budget:
            return codec, res
        best -= max(1, best // 200)
    return None


BASELINES = {  # name -> (transform, values)
    "sparseloco top-k 2-bit": ("topk", "2bit"),
    "demo dct top-k int8": ("dct", "int8"),
    "demo dct top-k int4": ("dct", "int4"),
    "demo dct top-k 2-bit": ("dct", "2bit"),
}


def _baseline_summary(o: Outcome, setting: Mapping[str, object], sizes: list[int], dense_mb: float) -> dict[str, object]:
    out = _summary(o, 0, dense_mb)
    del out["rank"]
    out.update(setting)
    out["bytes"] = max(sizes)
    out["bytes_per_round"] = sizes
    out["compression_x"] = dense_mb * 1e6 / max(sizes)
    return out


def run_baselines(args: argparse.Namespace, deltas: Deltas, step_s: float, load0: float) -> dict[str, object]:
    """Every codec at the shipped codec's payload sizes for `--budget-ranks` (rank 128: what small.toml sends)."""
    shapes = {k: tuple(v.shape) for k, v in deltas[0].items()}
    dense_mb = 4 * sum(math.prod(s) for s in shapes.values()) / 1e6
    shipped = CompressionConfig(bits=4)
    names = [n.strip() for n in args.baselines.split(",")] if args.baselines != "all" else list(BASELINES)
    budgets: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        _init_group(tmp)
        try:
            for brank in (int(r) for r in args.budget_ranks.split(",")):
                budget = payload_size(deltas, brank, shipped)
                methods: dict[str, dict[str, Any]] = {
                    "veriloco int4 (shipped)": _summary(run_ours(deltas, brank, shipped, args.seed), brank, dense_mb)
                }
                prank = max((r for r in range(1, 257) if psgd_bytes(shapes, r, 2.0) <= budget), default=0)
                if prank:
                    methods["powersgd"] = _summary(run_powersgd(deltas, prank, args.seed), prank, dense_mb)
                for name in names:
                    transform, values = BASELINES[name]
                    fit = fit_baseline(deltas, budget, transform, values)
                    if fit is None:
                        continue
                    codec, res = fit
                    setting = {"k_per_chunk": codec.k, "chunk": codec.full,
                               "density": codec.k / codec.full, "value_bits": codec.value_bits}
                    methods[name] = _baseline_summary(res.outcome, setting, res.sizes, dense_mb)
                    print(f"budget rank {brank}: {name} k={codec.k} done", file=sys.stderr, flush=True)
                ship = methods["veriloco int4 (shipped)"]
                for v in methods.values():
                    v["error_vs_shipped"] = v["rel_error_mean"] / ship["rel_error_mean"]
                    v["cumulative_error_vs_shipped"] = v["cumulative_error"] / ship["cumulative_error"]
                budgets.append({
                    "budget_rank": brank, "budget_bytes": budget, "methods": methods,
                    "best_rel_error_mean": min(methods, key=lambda m: methods[m]["rel_error_mean"]),
                    "best_cumulative_error": min(methods, key=lambda m: methods[m]["cumulative_error"]),
                })
                print(f"budget rank {brank} ({budget:,} bytes) done", file=sys.stderr, flush=True)
        finally:
            dist.destroy_process_group()
    return {
        "benchmark": "codec-baselines",
        "command": " ".join(["python -m benchmarks.codec", *(sys.argv[1:])]),
        "machine": {"platform": platform.platform(), "cpu": _cpu_model(), "cpus": os.cpu_count(),
                    "threads": args.threads, "load_average_1m": {"start": load0, "end": os.getloadavg()[0]}},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "settings": {"preset": args.preset, "rounds": args.rounds, "h": args.h, "batch_size": args.batch_size,
                     "seed": args.seed, "dense_mb": dense_mb, "inner_step_s": step_s,
                     "topk_chunk": BASELINE_CHUNK, "dct_block": DCT_BLOCK, "error_feedback": "plain (beta = 1), the same for every codec"},
        "budgets": budgets,
    }


def baselines_markdown(result: dict[str, object]) -> str:
    s = result["settings"]
    assert isinstance(s, dict)
    lines = [
        f"Codecs at equal bytes on `{s['preset']}` pseudo-gradients ({s['dense_mb']:.1f} MB fp32, {s['rounds']} rounds x H={s['h']})",
        "",
        ("| budget (shipped rank) | bytes/round (max) | method | setting | compression | rel. error (mean) "
         "| rel. error (round 1) | cumulative error | error vs shipped | cumulative vs shipped |"),
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for b in result["budgets"]:  # type: ignore[attr-defined]
        for name, v in b["methods"].items():
            if "k_per_chunk" in v:
                setting = f"k={v['k_per_chunk']}/{v['chunk']} ({100 * v['density']:.1f}%), {v['value_bits']}-bit"
            else:
                setting = f"rank {v['rank']}"
            best = name == b["best_rel_error_mean"]
            err = f"**{v['rel_error_mean']:.3f}**" if best else f"{v['rel_error_mean']:.3f}"
            cum = f"**{v['cumulative_error']:.3f}**" if name == b["best_cumulative_error"] else f"{v['cumulative_error']:.3f}"
            lines.append(
                f"| {b['budget_rank']} ({b['budget_bytes']:,}) | {v['bytes']:,} | {name} | {setting} | {v['compression_x']:.0f}x "
                f"| {err} | {v['rel_error_first']:.3f} | {cum} | {v['error_vs_shipped']:.2f} | {v['cumulative_error_vs_shipped']:.2f} |"
            )
    return "\n".join(lines)


def _init_group(tmp: str) -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small", choices=["tiny", "small", "gpt2-124m"])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--h", type=int, default=16, help="inner steps per round")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--ranks", default="1,2,4,8", help="PowerSGD ranks to compare at")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cache", type=Path, default=None, help="directory to keep the trained pseudo-gradients in")
    ap.add_argument("--baselines", default=None, metavar="NAMES",
                    help="instead: the SparseLoCo- and DeMo-style baselines at equal bytes ('all' or names, comma-separated)")
    ap.add_argument("--budget-ranks", default="128,64,32,12",
                    help="with --baselines: byte budgets, as the shipped int4 codec's payload at these ranks")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]  # the machine may be shared: timings are only as clean as this

    key = f"{args.preset}-r{args.rounds}-h{args.h}-b{args.batch_size}-s{args.seed}"
    cache = args.cache / f"codec-deltas-{key}.pt" if args.cache else None
    if cache is not None and cache.exists():
        saved = torch.load(cache)
        deltas, step_s = saved["deltas"], saved["inner_step_s"]
    else:
        deltas, step_s = pseudo_gradients(args.preset, args.rounds, args.h, args.batch_size, args.seed)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"deltas": deltas, "inner_step_s": step_s}, cache)
    if args.baselines:
        base = run_baselines(args, deltas, step_s, load0)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(base, indent=2, sort_keys=True) + "\n")
        print(baselines_markdown(base))
        return 0
    shapes = {k: tuple(v.shape) for k, v in deltas[0].items()}
    dense_mb = 4 * sum(math.prod(s) for s in shapes.values()) / 1e6
    variants = {
        "veriloco int4": CompressionConfig(bits=4),
        "veriloco int8": CompressionConfig(bits=8),
        "veriloco fp32": CompressionConfig(bits=32),
    }
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        _init_group(tmp)
        try:
            for prank in (int(r) for r in args.ranks.split(",")):
                ps = run_powersgd(deltas, prank, args.seed)
                row: dict[str, object] = {"powersgd_rank": prank, "budget_bytes": ps.bytes_per_round, "methods": {}}
                methods: dict[str, dict[str, object]] = {"powersgd": _summary(ps, prank, dense_mb)}
                for name, cfg in variants.items():
                    r = rank_for_budget(deltas, ps.bytes_per_round, cfg, hi=64 * prank)
                    if r == 0:
                        continue
                    methods[name] = _summary(run_ours(deltas, r, cfg, args.seed), r, dense_mb)
                row["methods"] = methods
                rows.append(row)
                print(f"PowerSGD rank {prank} done", file=sys.stderr, flush=True)
        finally:
            dist.destroy_process_group()

    # the sketch's accuracy/cost dials, at the largest compared budget's int4 rank
    sketch: list[dict[str, object]] = []
    if rows:
        last = rows[-1]["methods"]
        assert isinstance(last, dict)
        r = int(last["veriloco int4"]["rank"])
        for pi, ov in ((0, 0), (1, 0), (1, 4), (2, 8)):
            o = run_ours(deltas, r, CompressionConfig(power_iters=pi, oversample=ov), args.seed)
            sketch.append({"power_iters": pi, "oversample": ov, **_summary(o, r, dense_mb)})

    adaptive = run_adaptive(deltas, CompressionConfig(), args.seed)

    result: dict[str, object] = {
        "benchmark": "codec",
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"platform": platform.platform(), "cpu": _cpu_model(), "cpus": os.cpu_count(),
                    "threads": args.threads, "load_average_1m": {"start": load0, "end": os.getloadavg()[0]}},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "settings": {"preset": args.preset, "rounds": args.rounds, "h": args.h, "batch_size": args.batch_size,
                     "seed": args.seed, "dense_mb": dense_mb, "inner_step_s": step_s},
        "rows": rows,
        "ratios": _ratios(rows),
        "sketch_settings": sketch,
        "adaptive": adaptive,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(markdown(result))
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _summary(o: Outcome, rank: int, dense_mb: float) -> dict[str, object]:
    return {
        "rank": rank,
        "bytes": o.bytes_per_round,
        "compression_x": dense_mb * 1e6 / o.bytes_per_round,
        "rel_error_first": o.rel_errors[0],
        "rel_error_mean": sum(o.rel_errors) / len(o.rel_errors),
        "rel_errors": o.rel_errors,
        "cumulative_error": o.cumulative_error,
        "encode_mb_s": dense_mb / o.encode_s if o.encode_s > 0 else None,
        "decode_mb_s": dense_mb / o.decode_s if o.decode_s > 0 else None,
        "roundtrip_mb_s": dense_mb / (o.encode_s + o.decode_s),
    }


def _ratios(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    out = []
    for row in rows:
        m = row["methods"]
        assert isinstance(m, dict)
        base = m["powersgd"]
        for name, v in m.items():
            if name == "powersgd":
                continue
            out.append({
                "powersgd_rank": row["powersgd_rank"], "method": name,
                "bytes_vs_powersgd": v["bytes"] / base["bytes"],
                "error_vs_powersgd": v["rel_error_mean"] / base["rel_error_mean"],
                "cumulative_error_vs_powersgd": v["cumulative_error"] / base["cumulative_error"],
                "roundtrip_speed_vs_powersgd": v["roundtrip_mb_s"] / base["roundtrip_mb_s"],
            })
    return out


def markdown(result: dict[str, object]) -> str:
    s = result["settings"]
    assert isinstance(s, dict)
    title = (
        f"Codec on `{s['preset']}` pseudo-gradients ({s['dense_mb']:.1f} MB fp32, {s['rounds']} rounds x "
        f"H={s['h']}), {result['machine']['threads']} thread(s), torch {result['versions']['torch']}, "  # type: ignore[index]
        f"load average {result['machine']['load_average_1m']['start']:.1f} on {result['machine']['cpus']} CPUs"  # type: ignore[index]
    )
    head = (
        "| PowerSGD rank | method | rank | bytes/round | compression | rel. error (mean) | rel. error (round 1) "
        "| cumulative error | encode MB/s | decode MB/s | round trip MB/s | error vs PowerSGD |"
    )
    lines = [title, "", head, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:  # type: ignore[attr-defined]
        base = row["methods"]["powersgd"]
        for name, v in row["methods"].items():
            enc = f"{v['encode_mb_s']:.0f}" if v["encode_mb_s"] and name != "powersgd" else "-"
            dec = f"{v['decode_mb_s']:.0f}" if v["decode_mb_s"] else "-"
            lines.append(
                f"| {row['powersgd_rank']} | {name} | {v['rank']} | {v['bytes']:,} | {v['compression_x']:.0f}x "
                f"| {v['rel_error_mean']:.3f} | {v['rel_error_first']:.3f} | {v['cumulative_error']:.3f} "
                f"| {enc} | {dec} | {v['roundtrip_mb_s']:.0f} | {v['rel_error_mean'] / base['rel_error_mean']:.2f} |"
            )
    sketch = result.get("sketch_settings") or []
    if sketch:
        lines += [
            "",
            "Sketch settings (veriloco int4, same rank): power iterations and oversampling",
            "",
            "| power iters | oversample | rank | rel. error (mean) | cumulative error | encode MB/s |",
            "|---|---|---|---|---|---|",
        ]
        for v in sketch:  # type: ignore[attr-defined]
            lines.append(
                f"| {v['power_iters']} | {v['oversample']} | {v['rank']} | {v['rel_error_mean']:.3f} "
                f"| {v['cumulative_error']:.3f} | {v['encode_mb_s']:.0f} |"
            )
    adaptive = result.get("adaptive") or []
    if adaptive:
        lines += [
            "",
            "Adaptive rule over the same rounds (defaults; one trainer, the previous round's profile)",
            "",
            "| round | rank | H | bytes | needed rank (sketch) | rel. error |",
            "|---|---|---|---|---|---|",
        ]
        for v in adaptive:  # type: ignore[attr-defined]
            need = v["needed_rank"] if v["needed_rank"] is not None else f"> {v['rank']}"
            lines.append(f"| {v['round']} | {v['rank']} | {v['h']} | {v['bytes']:,} | {need} | {v['rel_error']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
