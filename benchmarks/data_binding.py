"""Does every challenge bind the run's data? Trainers that train consistently on data of their choice,
caught per epoch and per challenge, with and without the data ends (issue 45).

    nice -n 19 .venv/bin/python benchmarks/data_binding.py --out benchmarks/results/data-binding.json \
        --md docs/results-data-binding.md

A challenge of block b replays it on the opened group of each step of its segment; a middle block
takes its input and output gradient from its neighbours' commitments, so only blocks 0 (token ids in)
and B − 1 (targets in) read the data. Since issue 45 each draw also replays those two data ends over
the same segment and groups (protocol.shard_audit.data_ends). Two parts:

- **The protocol's own draw** (protocol.chain.audit.challenged_steps, shard_challenges, drawn_group)
  at examples/small.toml's shape (H = 8, s = 4, r = 1, M = 4, B = 14) and a 26-block model, over many
  seeds: per epoch, is a challenge opening a substituted group at a block that reads the data? With the
  ends, every opened step is checked against the data; without them (the draw as it was: the drawn
  block only), only draws of block 0 (rows) or B − 1 (targets) can see it. Closed forms beside.
- **Real answers** on the tiny model (M = 2 and 4): the trainer's own engine and answer builder
  (trainer.shard_response) judged by the verifier's checks (verifier.shard.audit_findings) on the run's
  data, for each cheat and an honest trainer. Per challenge: failed or passed, by whether it opened a
  substituted group and whether its block is a middle one or a data end. The honest trainer's checks
  are counted (at least 1,000).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from dilocox.compress import CompressionConfig
from dilocox.delay import StartRule
from dilocox.inner import InnerConfig, configure_determinism
from dilocox.round import RoundSpec, compress_seed, epoch_batch
from protocol import merkle
from protocol.chain.audit import RATE_ONE, challenged_steps
from protocol.data import Corpus
from protocol.digest import keccak
from protocol.formats.codec import load_state
from protocol.formats.payload import wrap
from protocol.leaf import block_count
from protocol.model import init_params, preset
from protocol.shard_audit import decode_manifest, drawn_group, encode_manifest, shard_challenges
from protocol.store.backends import LocalStore
from protocol.types import Address
from trainer.checkpoints import EpochDir
from trainer.engine import LocalEngine
from trainer.shard_response import shard_response
from verifier.shard import Chained, audit_findings

TRAINER = Address("0x" + "ab" * 20)
WINDOW = 256  # steps of a trainer's work over which the per-step policy is priced (docs/security.md §1)
Batch = tuple[torch.Tensor, torch.Tensor]

# ---------------------------------------------------------------- the protocol's own draw


def drawn(seed: bytes, h: int, s: int, r: int, blocks: int, micro: int) -> list[tuple[int, int, int]]:
    """(step, block, opened group) of every replayed block-step of one trainer-epoch."""
    chals = shard_challenges(seed, TRAINER, challenged_steps(seed, TRAINER, s, h + 1), h + 1, r, blocks)
    return [(k, b, drawn_group(seed, TRAINER, k, micro)) for lo, hi, b in chals for k in range(lo, hi)]


# cheat: (the groups it substitutes, what it substitutes: rows (and so their targets too), or targets)
CHEATS: dict[str, tuple[Callable[[int], set[int]], str]] = {
    "copy group 0 into the others (rows)": (lambda m: set(range(1, m)), "rows"),
    "one group's targets replaced": (lambda m: {1}, "targets"),
    "whole batch on own labels": (lambda m: set(range(m)), "targets"),
}


def sampled(h: int, s: int, r: int, blocks: int, micro: int, seeds: int) -> dict[str, dict[str, float]]:
    """Per epoch: caught with the data ends (any opened step opens a substituted group) and as the draw
    was before (the drawn block alone: caught only when it is the end that reads the substituted data)."""
    rng = random.Random(f"data-binding-{h}-{s}-{r}-{blocks}-{micro}")
    out: dict[str, dict[str, float]] = {}
    for name, (forged, reads) in CHEATS.items():
        ends = {0, blocks - 1} if reads == "rows" else {blocks - 1}  # copied rows bring their targets along
        now = before = 0
        for _ in range(seeds):
            seed = rng.randbytes(32)
            chals = shard_challenges(seed, TRAINER, challenged_steps(seed, TRAINER, s, h + 1), h + 1, r, blocks)
            opened = {k: drawn_group(seed, TRAINER, k, micro) for lo, hi, _ in chals for k in range(lo, hi)}
            now += any(m in forged(micro) for m in opened.values())
            # before issue 45: only the drawn blocks ran, so the end must itself be a draw
            own = {(lo, hi, b) for j, kk in enumerate(challenged_steps(seed, TRAINER, s, h + 1))
                   for lo, hi, b in [_segment_and_block(seed, j, kk, h + 1, r, blocks)]}
            before += any(b in ends and any(opened[k] in forged(micro) for k in range(lo, hi)) for lo, hi, b in own)
        out[name] = {"with_data_ends": now / seeds, "drawn_block_only": before / seeds}
    return out


def _segment_and_block(seed: bytes, j: int, k: int, leaves: int, r: int, blocks: int) -> tuple[int, int, int]:
    from protocol.shard_audit import drawn_block, segment_of

    lo, hi = segment_of(k, r, leaves)
    return lo, hi, drawn_block(seed, TRAINER, "shard", j, blocks)


def closed(h: int, s: int, r: int, micro: int) -> dict[str, str]:
    """The formulas of docs/security.md §1 for these rows (n = H / r segments, d distinct ones drawn)."""
    return {
        "copy group 0 into the others (rows)": f"1 − E[(1/M)^(d·r)], M = {micro}",
        "one group's targets replaced": f"1 − E[(1 − 1/M)^(d·r)], M = {micro}",
        "whole batch on own labels": "1",
    }


def expected(h: int, s: int, r: int, micro: int) -> dict[str, float]:
    """The closed forms' values: E over d, the number of distinct segments among s uniform draws."""
    n = h // r

    def p_distinct(d: int) -> float:
        stirling = sum((-1) ** i * math.comb(d, i) * (d - i) ** s for i in range(d + 1)) // math.factorial(d)
        return math.comb(n, d) * stirling * math.factorial(d) / n**s

    def miss(f: float) -> float:
        return sum(p_distinct(d) * (1 - f) ** (d * r) for d in range(1, min(n, s) + 1))

    return {"copy group 0 into the others (rows)": 1 - miss((micro - 1) / micro),
            "one group's targets replaced": 1 - miss(1 / micro), "whole batch on own labels": 1.0}


def sampled_rate(h: int, rate_ppm: int, cap: int, blocks: int, micro: int, seeds: int,
                 window: int) -> dict[str, dict[str, float]]:
    """The shipped per-step draw (audit.rate, issue 47): each transition challenged on its own, every
    draw replaying the data ends on its step's opened group. Per epoch, and per ``window`` steps of work
    (window / H independent epochs), is some drawn step's opened group a substituted one?"""
    rng = random.Random(f"data-binding-rate-{h}-{rate_ppm}-{cap}-{blocks}-{micro}")
    epochs = window // h
    opened_runs = []  # per seed: per epoch, the opened groups of the drawn steps
    for _ in range(seeds):
        run = []
        for _ in range(epochs):
            seed = rng.randbytes(32)
            chals = shard_challenges(seed, TRAINER, challenged_steps(seed, TRAINER, cap, h + 1, rate_ppm), h + 1, 1, blocks)
            run.append({drawn_group(seed, TRAINER, k, micro) for lo, hi, _ in chals for k in range(lo, hi)})
        opened_runs.append(run)
    out = {}
    for name, (forged, _) in CHEATS.items():
        bad = forged(micro)
        hits = [[bool(groups & bad) for groups in run] for run in opened_runs]
        out[name] = {"per_epoch": sum(run[0] for run in hits) / seeds, f"per_{window}_steps": sum(any(run) for run in hits) / seeds}
    return out


def expected_rate(h: int, rate_ppm: int, micro: int, window: int) -> dict[str, dict[str, float]]:
    """Closed forms: a step is drawn with probability rho and opens a substituted group with f = |forged| / M,
    so the miss is (1 − rho·f)^n over n steps (the cap on an epoch's draws binds with p < 1e-6)."""
    rho = rate_ppm / RATE_ONE
    return {name: {"per_epoch": 1 - (1 - rho * len(forged(micro)) / micro) ** h,
                   f"per_{window}_steps": 1 - (1 - rho * len(forged(micro)) / micro) ** window}
            for name, (forged, _) in CHEATS.items()}


# ---------------------------------------------------------------- real answers

TINY = preset("tiny")
CORPUS = Corpus(bytes((i * 7 + i // 13) % 251 for i in range(4096 * 24)))
G0 = init_params(TINY, 0)
H_TINY, SLOT, RANK = 6, 0, 4


def _spec(micro: int) -> RoundSpec:
    return RoundSpec(TINY, InnerConfig(lr=3e-3, warmup_steps=2, total_steps=50), CompressionConfig(),
                     StartRule.DELAYED, run_seed=1, batch_size=8, seq_len=16, microbatches=micro, shard=True, segment=2)


def data_of(cheat: str, spec: RoundSpec) -> Callable[[int], Batch]:
    """The batch a trainer trains and answers on at step k (epoch 0): the run's, or its own."""
    rows = spec.batch_size // spec.microbatches

    def batch(k: int) -> Batch:
        x, y = epoch_batch(spec, CORPUS, 0, SLOT, k)
        if cheat == "copy group 0 into the others (rows)":
            return x[:rows].repeat(spec.microbatches, 1), y[:rows].repeat(spec.microbatches, 1)
        if cheat == "one group's targets replaced":
            y = y.clone()
            y[rows:2 * rows] = (y[rows:2 * rows] + 1) % TINY.vocab_size
        elif cheat == "whole batch on own labels":
            y = (y * 7 + 3) % TINY.vocab_size
        return x, y

    return batch


def real(root: Path, micro: int, seeds: int, cheat: str) -> dict[str, Any]:
    """One real epoch trained on ``cheat``'s data ("honest": the run's), answered and judged per seed."""
    configure_determinism(1)
    spec = _spec(micro)
    blocks = block_count(TINY)
    batch = data_of(cheat, spec)
    eng, store = LocalEngine(spec, every=2), LocalStore(root / "store")
    d = EpochDir(root / "node", 0)
    leaves = [eng.begin(d, H_TINY, G0, None)]
    for k in range(H_TINY):
        leaves.append(eng.step(d, k, batch(k))[1])
    payload, _ = eng.finish(d, RANK, compress_seed(spec.run_seed, 0, SLOT))
    pub, pre = wrap(1, 0, TRAINER, payload), [lf.encode() for lf in leaves]
    trace = merkle.root([keccak(p) for p in pre])
    forged = CHEATS[cheat][0](micro) if cheat in CHEATS else set()
    tally = {"checks": 0, "failed_checks": 0, "epochs": seeds, "epochs_caught": 0,
             "block_0_opening_forged": [0, 0], "middle_opening_forged": [0, 0], "head_opening_forged": [0, 0],
             "opening_honest_groups_only": [0, 0]}
    for i in range(seeds):
        seed = keccak(f"data-binding-{cheat}-{micro}-{i}".encode())
        steps = challenged_steps(seed, TRAINER, 3, H_TINY + 1)
        m = shard_response(engine=eng, spec=spec, run_id=1, epoch=0, trainer=TRAINER, d=d, preimages=pre, seed=seed,
                           steps=steps, final_bps=10_000, batch_of=batch, publish=store.put)
        m = decode_manifest(encode_manifest(m, blocks), blocks, max_bytes=1 << 24)
        findings = audit_findings(m, Chained(trace, H_TINY + 1, seed, tuple(steps), 10_000), lambda c, s: load_state(
            store.get(c), expect=s), spec, CORPUS, G0, pub, run_id=1, epoch=0, slot=SLOT, trainer=TRAINER, rank=RANK,
            prev_rank=RANK)
        tally["checks"] += len(findings)
        tally["failed_checks"] += sum(not f.passed for f in findings)
        tally["epochs_caught"] += any(not f.passed for f in findings)
        by_name = {f.check: f for f in findings}
        for c in m.challenges:
            f = by_name[f"block {c.block} steps {c.start}->{c.end}"]
            hit = any(p in forged for p in c.picks)
            key = ("opening_honest_groups_only" if not hit else "block_0_opening_forged" if c.block == 0 else
                   "head_opening_forged" if c.block == blocks - 1 else "middle_opening_forged")
            tally[key][0] += not f.passed
            tally[key][1] += 1
    return {k: (f"{v[0]}/{v[1]} failed" if isinstance(v, list) else v) for k, v in tally.items()}


# ---------------------------------------------------------------- report


def render(res: dict[str, Any]) -> str:
    lines = [(f"Per epoch, the protocol's own draw under the per-epoch policy (s draws an epoch, whatever H: what shipped "
              f"before audits were priced per step; sampled over {res['draw']['seeds']:,} seeds; closed form beside). "
              f"Command: `{res['command']}`."), "",
             "| shape | cheat | with data ends | closed form | drawn block only (before) |", "|---|---|---:|---:|---:|"]
    for shape, rows in res["draw"]["shapes"].items():
        for cheat, v in rows["sampled"].items():
            lines.append(f"| {shape} | {cheat} | {v['with_data_ends']:.1%} | {rows['closed'][cheat]:.1%} | "
                         f"{v['drawn_block_only']:.1%} |")
    ps = res["per_step"]
    lines += ["", (f"The shipped policy (`{ps['config']}`: each step challenged on its own with probability {ps['rate']}, "
                   f"H = {ps['H']}, M = {ps['M']}, B = {ps['blocks']}; {ps['seeds']:,} runs of {ps['window']} steps of the "
                   "protocol's own draw, closed form 1 − (1 − rate·f)^n beside, f the substituted share of the groups):"), "",
              f"| cheat | caught per epoch | closed form | caught within {ps['window']} steps of work | closed form |",
              "|---|---:|---:|---:|---:|"]
    key = f"per_{ps['window']}_steps"
    for cheat, v in ps["sampled"].items():
        c = ps["closed"][cheat]
        lines.append(f"| {cheat} | {v['per_epoch']:.1%} | {c['per_epoch']:.1%} | {v[key]:.1%} | {c[key]:.1%} |")
    lines += ["", "Real answers on `tiny` (B = 6, H = 6, s = 3, r = 2, 8 rows), judged by the verifier's checks:", "",
              ("Challenges failed / run, by block, among those whose steps open a substituted group, and among those "
               "that open honest groups only."), "",
              ("| M | trainer | epochs caught | block 0 (ids in) | middle blocks | head (targets in) | "
               "honest groups only | checks (failed) |"), "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for micro, rows in res["real"].items():
        for cheat, v in rows.items():
            lines.append(f"| {micro} | {cheat} | {v['epochs_caught']}/{v['epochs']} | {v['block_0_opening_forged']} | "
                         f"{v['middle_opening_forged']} | {v['head_opening_forged']} | {v['opening_honest_groups_only']} | {v['checks']} ({v['failed_checks']}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--draw-seeds", type=int, default=20_000)
    ap.add_argument("--seeds", type=int, default=40, help="seeds per cheat and M for the real answers")
    ap.add_argument("--honest-seeds", type=int, default=100, help="seeds per M for the honest trainer")
    ap.add_argument("--rate-seeds", type=int, default=5_000, help=f"runs of {WINDOW} steps for the per-step draw")
    a = ap.parse_args(argv)
    t0 = time.time()
    shapes = {"small.toml's shape, per-epoch policy (B = 14, H = 8, s = 4, r = 1, M = 4)": (8, 4, 1, 14, 4),
              "26 blocks (gpt2-124m), same policy": (8, 4, 1, 26, 4)}
    draw = {"seeds": a.draw_seeds, "shapes": {}}
    for name, (h, s, r, blocks, micro) in shapes.items():
        draw["shapes"][name] = {"H": h, "s": s, "r": r, "blocks": blocks, "M": micro,
                                "sampled": sampled(h, s, r, blocks, micro, a.draw_seeds),
                                "closed": expected(h, s, r, micro), "formula": closed(h, s, r, micro)}
        print(f"draw {name}: {draw['shapes'][name]['sampled']}", file=sys.stderr, flush=True)
    # the shipped policy, read from examples/small.toml: audits priced per step of work (issue 47)
    from protocol.config import load_toml

    cfg = load_toml(Path(__file__).resolve().parents[1] / "examples" / "small.toml")
    h, micro, blocks = cfg.schedule.h_initial, cfg.inner.microbatches, block_count(cfg.model_config())
    per_step = {"config": "examples/small.toml", "H": h, "rate": cfg.audit.rate, "cap": cfg.audit.challenges, "M": micro,
                "blocks": blocks, "window": WINDOW, "seeds": a.rate_seeds,
                "sampled": sampled_rate(h, cfg.audit.rate_ppm, cfg.audit.challenges, blocks, micro, a.rate_seeds, WINDOW),
                "closed": expected_rate(h, cfg.audit.rate_ppm, micro, WINDOW)}
    print(f"per-step draw: {per_step['sampled']}", file=sys.stderr, flush=True)
    out_real: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for micro in (2, 4):
            out_real[str(micro)] = {}
            for cheat in ("honest", *CHEATS):
                n = a.honest_seeds if cheat == "honest" else a.seeds
                out_real[str(micro)][cheat] = real(Path(tmp) / f"{micro}-{len(out_real[str(micro)])}", micro, n, cheat)
                print(f"M = {micro} {cheat}: {out_real[str(micro)][cheat]}", file=sys.stderr, flush=True)
    res = {"benchmark": "data_binding",
           "command": "benchmarks/data_binding.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "python": platform.python_version(), "torch": torch.__version__, "host": platform.machine(),
           "seconds": round(time.time() - t0, 1), "draw": draw, "per_step": per_step, "real": out_real}
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    md = render(res)
    if a.md:
        a.md.write_text("# Data binding: every challenge checks the run's data (issue 45)\n\n" + md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
