"""Steering: how far one trainer at the norm cap every epoch moves the model along a direction it chose.

docs/security.md T15 / issue 30 item 5: a forged pseudo-gradient that escapes its audit enters the
aggregate, and with ``outer.clip`` it is capped at clip × the lower median norm, not rejected. A
trainer can send such a forgery every epoch. This benchmark runs K simulated workers
(veriloco/simulate.py, the engine the nodes use) twice from the same seed: an honest run and an
attacked run in which worker ``--attacker``, every round, replaces its decoded pseudo-gradient with a
forgery pointing along ``-u`` (pseudo-gradients are start − end, so the outer step moves the model
along ``+u``) for a fixed unit direction ``u``: a Gaussian vector over all parameters, normalised, from
``--direction-seed``, the same for every seed and rule. Attacks (the attacker sees the other workers'
pseudo-gradients of the round: an upper bound on what commit-reveal leaves it):

- ``cap``: norm exactly clip × the lower median of the other workers' norms, which is the
  coordinator's own limit (``dilocox.aggregate.clip_scales``) once the forgery is the largest;
- ``edge``: per coordinate the other workers' most extreme value in the attacker's direction (the
  best forgery against a coordinate-wise rule), clipped by the coordinator like any other.

Per round it records the steering of the aggregate, ``<combine(honest) − combine(attacked), u>``
for that round's pseudo-gradients (before the outer step), and the rule's bound on it: the mean's
``clip × m / K`` plus the replaced honest pseudo-gradient's own component, and for a coordinate-wise
rule ``Σ_i |u_i| (hi_i − lo_i)``, where [lo_i, hi_i] is the range the aggregate can take at coordinate
i over every value the attacker may put there (the rule is monotone in each input). The model's
displacement ``<θ_attacked − θ_honest, u>`` is measured after every round and compared with the bound
carried through the outer Nesterov step (a unit of aggregate at round e moves the parameters by
lr (1 − μ^(T−e+2)) / (1 − μ) by round T, μ the momentum), which ignores the honest workers' reaction.

    nice -n 10 .venv/bin/python benchmarks/steering.py --rounds 24 --seeds 0,1,2 \
        --out benchmarks/results/steering.json --md docs/results-steering.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dilocox.aggregate import aggregate, clip_scales, combine, delta_norm
from dilocox.inner import InnerConfig, Params, configure_determinism
from dilocox.outer import AGGREGATES, GlobalState, OuterConfig, global_params
from protocol.config import OuterSection
from protocol.data import default_corpus
from protocol.model import PRESETS, n_params, param_shapes
from veriloco.simulate import SimConfig, methods, resolve_method, run_local

ATTACKS = ("cap", "edge")
BIG = 1e30  # stands for ±∞ in a coordinate when bounding a coordinate-wise rule (finite: inputs must be)


def direction(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, Tensor]:
    """A unit vector over all parameters (fp64 norm): i.i.d. Gaussian, then normalised."""
    g = torch.Generator().manual_seed(seed)
    raw = {n: torch.randn(shapes[n], generator=g, dtype=torch.float64) for n in sorted(shapes)}
    norm = math.sqrt(math.fsum(float((t**2).sum()) for t in raw.values()))
    return {n: t / norm for n, t in raw.items()}


def dot(a: dict[str, Tensor], u: dict[str, Tensor]) -> float:
    """<a, u> in fp64, tensors in name order."""
    return math.fsum(float((a[n].double() * u[n]).sum()) for n in sorted(u))


def cap_forgery(others: list[Params], u: dict[str, Tensor], clip: float) -> Params:
    """−v u with v = clip × element ⌊(K−1)/2⌋ of the other K−1 workers' sorted norms: the lower median
    of all K norms once the forgery is the largest, so the coordinator's cap is exactly v."""
    k = len(others) + 1
    v = clip * sorted(delta_norm(d) for d in others)[(k - 1) // 2]
    return {n: (-v * u[n]).to(torch.float32) for n in u}


def edge_forgery(others: list[Params], u: dict[str, Tensor]) -> Params:
    """Per coordinate, the other workers' largest value where −u is positive, their smallest elsewhere."""
    out = {}
    for n, un in u.items():
        stack = torch.stack([d[n] for d in others])
        out[n] = torch.where(un < 0, stack.max(0).values, stack.min(0).values)
    return out


def rule_bound(others_clipped: list[Params], u: dict[str, Tensor], outer: OuterConfig, forged_norm: float) -> float:
    """The most one input can change ``<combine(·), u>`` given the others (already clipped): for the mean,
    the capped forgery's ``forged_norm / K``; for a coordinate-wise rule, ``Σ_i |u_i| (hi_i − lo_i)`` with
    hi, lo the aggregate with that input at ±BIG (the rule is monotone in each input)."""
    k = len(others_clipped) + 1
    if outer.aggregate == "mean":
        return forged_norm / k
    shapes = {n: tuple(t.shape) for n, t in others_clipped[0].items()}
    flat = replace(outer, clip=0.0)
    hi = combine([*others_clipped, {n: torch.full(s, BIG) for n, s in shapes.items()}], shapes, flat)
    lo = combine([*others_clipped, {n: torch.full(s, -BIG) for n, s in shapes.items()}], shapes, flat)
    return math.fsum(float((u[n].abs() * (hi[n] - lo[n]).double()).sum()) for n in sorted(u))


class Recorder:
    """The coordinator's step for ``run_local``: records every global model; with ``attack``, worker
    ``attacker``'s pseudo-gradient is replaced first and the round's steering is recorded."""

    def __init__(self, u: dict[str, Tensor], attack: str | None, attacker: int) -> None:
        self.u, self.attack, self.attacker = u, attack, attacker
        self.params: list[dict[str, Tensor]] = []
        self.rounds: list[dict[str, float]] = []

    def __call__(self, epoch: int, g: GlobalState, deltas: list[Params], outer: OuterConfig) -> GlobalState:
        if not self.params:
            self.params.append({n: t.clone() for n, t in global_params(g).items()})
        if self.attack is not None:
            deltas = self._forge(deltas, outer)
        g = aggregate(g, deltas, outer)
        self.params.append({n: t.clone() for n, t in global_params(g).items()})
        return g

    def _forge(self, honest: list[Params], outer: OuterConfig) -> list[Params]:
        a = self.attacker
        others = honest[:a] + honest[a + 1 :]
        forged = cap_forgery(others, self.u, outer.clip) if self.attack == "cap" else edge_forgery(others, self.u)
        attacked = honest[:a] + [forged] + honest[a + 1 :]
        shapes = {n: tuple(t.shape) for n, t in forged.items()}
        scales = clip_scales(attacked, outer.clip)
        norms = [delta_norm(d) for d in attacked]
        # steering of the aggregate along +u (the outer step subtracts the aggregate)
        steer = dot(combine(honest, shapes, outer), self.u) - dot(combine(attacked, shapes, outer), self.u)
        clipped = [{n: t * s for n, t in d.items()} if s != 1.0 else d for d, s in zip(attacked, scales)]
        bound = rule_bound(clipped[:a] + clipped[a + 1 :], self.u, outer, norms[a] * scales[a])
        if outer.aggregate == "mean":
            bound += abs(dot(honest[a], self.u)) / len(honest)  # the replaced honest Δ's own component
        self.rounds.append({
            "steer": steer,
            "bound": bound,
            "forged_norm": norms[a],
            "forged_scale": scales[a],
            "cap": outer.clip * sorted(norms)[(len(norms) - 1) // 2],
            "honest_median_norm": statistics.median(delta_norm(d) for d in honest),
            "honest_component": dot(honest[a], self.u),
        })
        return attacked


def momentum_bound(per_round: list[float], lr: float, mu: float, nesterov: bool = True) -> list[float]:
    """After each round T, Σ_e per_round[e] × (the displacement by T of a unit aggregate at round e):
    lr (1 − μ^(T−e+2)) / (1 − μ) for Nesterov (the momentum buffer decays, its echo keeps moving the
    model), lr (1 − μ^(T−e+1)) / (1 − μ) for heavy ball. Honest workers' reaction is not in it."""
    out = []
    for t in range(len(per_round)):
        s = 0.0
        for e in range(t + 1):
            j = t - e + (2 if nesterov else 1)
            s += per_round[e] * lr * (1 - mu**j) / (1 - mu) if mu > 0 else per_round[e] * lr
        out.append(s)
    return out


def one_run(cfg: SimConfig, method: str, rule: str, attack: str | None, attacker: int, u: dict[str, Tensor],
            corpus: Any) -> tuple[Recorder, float]:
    m = resolve_method(method, methods(cfg.h, cfg.rank, cfg.merge_step))
    assert m is not None
    rec = Recorder(u, attack, attacker)
    res = run_local(replace(m, aggregate=rule), cfg, corpus, lambda _: None, rec)
    return rec, res.final_eval_loss


def measure(cfg: SimConfig, method: str, rules: list[str], attacks: list[str], seeds: list[int], attacker: int,
            direction_seed: int, corpus: Any, say: Any) -> list[dict[str, Any]]:
    u = direction({n: tuple(s) for n, s in param_shapes(cfg.model).items()}, direction_seed)
    rows = []
    for rule in rules:
        for seed in seeds:
            c = replace(cfg, init_seed=seed, run_seed=seed)
            t0 = time.perf_counter()
            honest, honest_loss = one_run(c, method, rule, None, attacker, u, corpus)
            say(f"{rule:8s} seed {seed} honest   eval {honest_loss:.4f}  {time.perf_counter() - t0:.0f} s")
            for attack in attacks:
                t0 = time.perf_counter()
                att, att_loss = one_run(c, method, rule, attack, attacker, u, corpus)
                disp = [{n: a[n].double() - h[n].double() for n in u} for a, h in zip(att.params, honest.params)]
                along = [dot(d, u) for d in disp[1:]]
                norm = [math.sqrt(math.fsum(float((t**2).sum()) for t in d.values())) for d in disp[1:]]
                steer = [r["steer"] for r in att.rounds]
                bound = [r["bound"] for r in att.rounds]
                o = c.outer
                travel = {n: honest.params[-1][n].double() - honest.params[0][n].double() for n in u}
                row: dict[str, Any] = {
                    "rule": rule, "attack": attack, "seed": seed,
                    "honest_travel_norm": math.sqrt(math.fsum(float((t**2).sum()) for t in travel.values())),
                    "honest_travel_along_u": dot(travel, u),
                    "final_eval_loss_honest": honest_loss, "final_eval_loss_attacked": att_loss,
                    "displacement_along_u": along, "displacement_norm": norm,
                    "steer_per_round": steer, "bound_per_round": bound,
                    "steer_through_momentum": momentum_bound(steer, o.lr, o.momentum, o.nesterov),
                    "bound_through_momentum": momentum_bound(bound, o.lr, o.momentum, o.nesterov),
                    "rounds": att.rounds,
                }
                rows.append(row)
                say(f"{rule:8s} seed {seed} {attack:8s} eval {att_loss:.4f}  along u {along[-1]:+.4f} "
                    f"(bound {row['bound_through_momentum'][-1]:.4f})  |disp| {norm[-1]:.4f}  "
                    f"{time.perf_counter() - t0:.0f} s")
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (rule, attack): means over seeds."""
    out = []
    keys = sorted({(r["rule"], r["attack"]) for r in rows}, key=lambda k: (AGGREGATES.index(k[0]), ATTACKS.index(k[1])))
    for rule, attack in keys:
        rs = [r for r in rows if r["rule"] == rule and r["attack"] == attack]

        def mean(f: Any, rs: list[dict[str, Any]] = rs) -> float:
            return statistics.fmean(f(r) for r in rs)

        out.append({
            "rule": rule, "attack": attack, "seeds": [r["seed"] for r in rs], "rounds": len(rs[0]["steer_per_round"]),
            "steer_per_round_mean": mean(lambda r: statistics.fmean(r["steer_per_round"])),
            "steer_per_round_max": max(max(r["steer_per_round"]) for r in rs),
            "bound_per_round_mean": mean(lambda r: statistics.fmean(r["bound_per_round"])),
            "steer_over_bound_max": max(s / b for r in rs for s, b in zip(r["steer_per_round"], r["bound_per_round"])),
            "honest_median_norm_mean": mean(lambda r: statistics.fmean(x["honest_median_norm"] for x in r["rounds"])),
            "displacement_along_u": mean(lambda r: r["displacement_along_u"][-1]),
            "displacement_along_u_per_seed": [r["displacement_along_u"][-1] for r in rs],
            "displacement_norm": mean(lambda r: r["displacement_norm"][-1]),
            "honest_travel_norm": mean(lambda r: r["honest_travel_norm"]),
            "honest_travel_along_u": mean(lambda r: r["honest_travel_along_u"]),
            "steer_through_momentum": mean(lambda r: r["steer_through_momentum"][-1]),
            "bound_through_momentum": mean(lambda r: r["bound_through_momentum"][-1]),
            "within_bound": all(r["displacement_along_u"][-1] <= r["bound_through_momentum"][-1] for r in rs),
            "final_eval_loss_honest": mean(lambda r: r["final_eval_loss_honest"]),
            "final_eval_loss_attacked": mean(lambda r: r["final_eval_loss_attacked"]),
        })
    return out


def render(out: dict[str, Any]) -> str:
    c = out["config"]
    o = c["outer"]
    lines = [
        "# Steering results: one trainer at the cap every epoch",
        "",
        "Generated by `benchmarks/steering.py` (do not edit by hand; rerun the command). Issue 30 item 5:",
        "an escaped forgery is capped, not rejected, so a trainer can send one every epoch. How far does",
        "that move the model along a direction of its choice, under each outer aggregation rule?",
        "",
        "Command:",
        "",
        "```",
        out["command"],
        "```",
        "",
        (f"Setup: {c['trainers']} workers, method `{c['method']}` (veriloco/simulate.py) on the `{c['preset']}` "
        f"model ({c['n_params']:,} parameters), H = {c['h']}, {c['rounds']} rounds, batch {c['batch_size']} × "
        f"{c['seq_len']}, inner lr {c['inner_lr']}; outer lr {o['lr']}, Nesterov momentum {o['momentum']}, "
        f"clip {o['clip']} (the run config defaults); trimmed mean drops {o['trim']} value(s) at each end. "
        f"Seeds {', '.join(map(str, out['seeds']))} (model init and data order); each attacked run is compared "
        f"with the honest run of the same seed and rule. Worker {c['attacker']} attacks every round along `u`, a "
        f"Gaussian unit vector over all parameters (direction seed {c['direction_seed']}), knowing the other "
        "workers' pseudo-gradients of the round. `cap`: a forgery along −u whose norm is the coordinator's "
        "cap (clip × lower median norm); `edge`: per coordinate the other workers' most extreme value in "
        "the attacker's direction (the best forgery against a coordinate-wise rule)."),
        "",
        ("Columns (means over seeds): *steer/round*: `<combine(honest) − combine(attacked), u>`, the round's "
        "aggregate moved along u (before the outer step); *bound/round*: that rule's bound on it "
        "(mean: the capped forgery's norm / K, plus the replaced pseudo-gradient's own component along u; "
        "trimmed / median: `Σ_i |u_i| (hi_i − lo_i)`, the aggregate's range at coordinate i over every "
        "value one trainer can put there, i.e. within the other workers' values); *max steer/bound*: the "
        "largest per-round ratio over all rounds and seeds (≤ 1 is the bound holding); *model along u*: "
        f"`<θ_attacked − θ_honest, u>` after round {c['rounds']}; *bound through momentum*: the per-round bounds "
        "carried through the outer Nesterov step (a unit of aggregate at round e moves θ by "
        "lr (1 − μ^(T−e+2)) / (1 − μ) by round T; the honest workers' reaction to the moved model is not in "
        "it); *‖θ_a − θ_h‖*: the whole displacement; *honest ‖θ_T − θ_0‖*: how far the honest run itself "
        "moved from its initial model, for scale; *honest median norm*: the honest pseudo-gradients' "
        "median norm per round, for scale."),
        "",
        ("| rule | attack | steer/round | bound/round | max steer/bound | model along u | bound through momentum "
        "| model along u per seed | ‖θ_a − θ_h‖ | honest ‖θ_T − θ_0‖ | honest median norm | eval loss honest "
        "| eval loss attacked |"),
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for s in out["summary"]:
        lines.append(
            f"| {s['rule']} | {s['attack']} | {s['steer_per_round_mean']:.4f} | {s['bound_per_round_mean']:.4f} "
            f"| {s['steer_over_bound_max']:.3f} | {s['displacement_along_u']:+.4f} | {s['bound_through_momentum']:.4f} "
            f"| {', '.join(f'{x:+.4f}' for x in s['displacement_along_u_per_seed'])} | {s['displacement_norm']:.4f} "
            f"| {s['honest_travel_norm']:.4f} "
            f"| {s['honest_median_norm_mean']:.4f} | {s['final_eval_loss_honest']:.4f} | {s['final_eval_loss_attacked']:.4f} |"
        )
    lines += ["", "Per round, first seed (model displacement along u):", ""]
    first = out["seeds"][0]
    per = [r for r in out["runs"] if r["seed"] == first]
    lines.append("| round | " + " | ".join(f"{r['rule']} / {r['attack']}" for r in per) + " |")
    lines.append("|---:|" + "---:|" * len(per))
    for i in range(c["rounds"]):
        lines.append(f"| {i + 1} | " + " | ".join(f"{r['displacement_along_u'][i]:+.4f}" for r in per) + " |")
    lines += ["", *reading(out), "", *convergence_cost(out)]
    return "\n".join(lines) + "\n"


def reading(out: dict[str, Any]) -> list[str]:
    """The bound and what the run says about it, every number from ``out``."""
    c, o = out["config"], out["config"]["outer"]
    by = {(s["rule"], s["attack"]): s for s in out["summary"]}
    runs = out["runs"]
    lines = ["## Reading", ""]
    mean_cap = by.get(("mean", "cap"))
    if mean_cap is not None:
        caps = [x["cap"] for r in runs if r["rule"] == "mean" and r["attack"] == "cap" for x in r["rounds"]]
        lines.append(
            f"**Today's rule (clipped mean).** One forgery per round moves the aggregate along u by at most "
            f"cap / K = clip × m / K (m the lower median norm), plus the replaced honest pseudo-gradient's own "
            f"component along u (≈ ‖Δ‖ / √P for a random u), and the model by lr × that before momentum: here "
            f"cap / K = {statistics.fmean(caps):.4f} / {c['trainers']} = {statistics.fmean(caps) / c['trainers']:.4f} "
            f"of aggregate, lr × cap / K = {o['lr'] * statistics.fmean(caps) / c['trainers']:.4f} of model per round "
            f"(mean cap over rounds and seeds). "
            f"Measured: {mean_cap['steer_per_round_mean']:.4f} of aggregate per round against a bound of "
            f"{mean_cap['bound_per_round_mean']:.4f} (largest ratio {mean_cap['steer_over_bound_max']:.3f}): the "
            "forgery at the cap reaches the bound every round. Through Nesterov momentum μ each round's push "
            f"is worth up to lr / (1 − μ) = {o['lr'] / (1 - o['momentum']):.1f}× its size: after {c['rounds']} rounds "
            f"the model sits {mean_cap['displacement_along_u']:+.4f} along u from the honest run (bound through "
            f"momentum {mean_cap['bound_through_momentum']:.4f}; every seed within it: {mean_cap['within_bound']}), "
            f"{mean_cap['displacement_along_u'] / mean_cap['honest_median_norm_mean']:.1f}× an honest pseudo-gradient's "
            f"median norm and {mean_cap['displacement_along_u'] / mean_cap['honest_travel_norm']:.2f}× the whole "
            f"distance the honest run travelled from θ_0 ({mean_cap['honest_travel_norm']:.4f}; along u "
            f"{mean_cap['honest_travel_along_u']:+.4f}).")
    robust = [s for s in out["summary"] if s["rule"] != "mean"]
    if robust:
        lines.append("")
        worst = max(robust, key=lambda s: s["displacement_along_u"])
        lines.append(
            f"**Coordinate-wise rules.** With `outer.aggregate = \"{worst['rule']}\"` one input can move a "
            "coordinate of the aggregate only within the range the rule leaves it given the other K − 1 inputs "
            "(the rule is monotone in each input, so the honest aggregate lies in that range too): per round "
            "`|<Δ_attacked − Δ_honest, u>| ≤ Σ_i |u_i| (hi_i − lo_i) ≤ ‖hi − lo‖₂`, and hi_i − lo_i is at most "
            "the other workers' range at i (half of it for the trimmed mean of 4 dropping 1 at each end, the "
            "mean of the two middle values). The bound no longer grows with the cap: a forgery of any norm "
            "steers no further than one at the other workers' extremes (`edge`). Worst measured: "
            f"`{worst['rule']}` / `{worst['attack']}`, {worst['steer_per_round_mean']:.4f} per round (bound "
            f"{worst['bound_per_round_mean']:.4f}, largest ratio {worst['steer_over_bound_max']:.3f}), "
            f"{worst['displacement_along_u']:+.4f} along u after {c['rounds']} rounds (bound through momentum "
            f"{worst['bound_through_momentum']:.4f}; every seed within it: {worst['within_bound']}).")
        if mean_cap is not None:
            lines.append(
                f"That is {mean_cap['displacement_along_u'] / worst['displacement_along_u']:.1f}× less displacement "
                f"than the clipped mean under the cap forgery ({mean_cap['displacement_along_u']:+.4f}). The honest "
                f"runs' final eval loss: mean {mean_cap['final_eval_loss_honest']:.4f}, {worst['rule']} "
                f"{worst['final_eval_loss_honest']:.4f} (one short run; the convergence cost is to be measured with the "
                "command below). Neither rule stops the accumulation: under the trimmed mean one trainer still "
                f"moves the aggregate by {worst['steer_per_round_mean']:.4f} per round along its u, "
                f"{100 * worst['steer_per_round_mean'] / worst['honest_median_norm_mean']:.0f}% of an honest "
                "pseudo-gradient's median norm, every round; the bound shrinks only with the honest spread "
                "(more trainers, more trimmed).")
    if mean_cap is not None:
        lines += ["", (
            "The eval losses only show what a *random* u does to this model (under the clipped mean the attacked "
            f"runs end at {mean_cap['final_eval_loss_attacked']:.4f} against {mean_cap['final_eval_loss_honest']:.4f} "
            "honest, seed means): they do not measure what a trainer who *chose* u (up the loss, or towards a "
            "planted behaviour) buys with the same displacement, which is what the bound limits.")]
    if c["trainers"] == 4:
        lines += ["", ("At K = 4 the median (mean of the two middle values) is the trimmed mean dropping 1 at each "
                  "end, bit for bit (tests/unit/test_outer.py); the two differ from K = 5 on.")]
    return lines


def convergence_cost(out: dict[str, Any]) -> list[str]:
    """The command that measures the robust rule's convergence cost (not run here: hours on 2 cores)."""
    return [
        "## Convergence cost of the robust rule (to measure before it becomes the default)",
        "",
        ("`outer.aggregate` stays `\"mean\"` by default. The cost of `\"trimmed\"` is measured on the convergence "
        "benchmark's headline configuration, paired over its 3 seeds against the rank-128 runs of "
        "`benchmarks/results/convergence-small.json` (a method name ending in `_trimmed` or `_median` runs that "
        "method with that outer aggregate; the results file names it `fixed_rank_merge_b1_trimmed_r128` once "
        "joined at rank 128):"),
        "",
        "```",
        "for s in 0 1 2; do",
        "  .venv/bin/python benchmarks/convergence.py --preset small --batch-size 128 --inner-lr 5e-4 --merge-step 1 \\",
        "      --eval-rows 512 --methods fixed_rank_merge_b1_trimmed --rank 128 --seeds $s --out trim/s$s.json",
        "done",
        ".venv/bin/python benchmarks/convergence.py --merge benchmarks/results/convergence-small.json \\",
        "    trim/s0.json trim/s1.json trim/s2.json --dilocox fixed_rank_merge_b1_r128 \\",
        "    --out benchmarks/results/convergence-small-trimmed.json",
        "```",
        "",
        ("Its paired gap of `fixed_rank_merge_b1_trimmed_r128` against `fixed_rank_merge_b1_r128` (both vs AllReduce, "
        "per seed) is the cost. Not run yet."),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--preset", choices=["tiny", "small"], default="tiny", help="the model (protocol.model.PRESETS)")
    ap.add_argument("--method", default="fixed_rank_merge_b1", help="a local method of veriloco/simulate.py")
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--h", type=int, default=8, help="inner steps per round")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--attacker", type=int, default=0, help="which worker forges")
    ap.add_argument("--rules", default="mean,trimmed",
                    help=f"outer aggregation rules from {','.join(AGGREGATES)} (median = trimmed at 4 workers)")
    ap.add_argument("--attacks", default=",".join(ATTACKS), help=f"subset of {','.join(ATTACKS)}")
    ap.add_argument("--trim", type=int, default=OuterSection.trim, help="values dropped at each end (trimmed)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--inner-lr", type=float, default=3e-3)
    ap.add_argument("--eval-rows", type=int, default=64)
    ap.add_argument("--direction-seed", type=int, default=1234)
    ap.add_argument("--out", type=Path, help="results JSON to write")
    ap.add_argument("--md", type=Path, help="write the Markdown table here too")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--render", type=Path, metavar="JSON", help="print (and with --md write) the Markdown of a results file")
    a = ap.parse_args(argv)
    if a.render is not None:
        md = render(json.loads(a.render.read_text()))
        if a.md is not None:
            a.md.write_text(md)
        print(md)
        return 0
    if a.out is None:
        ap.error("--out is required (or --render)")
    rules = [r for r in a.rules.split(",") if r]
    attacks = [x for x in a.attacks.split(",") if x]
    seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    if not rules or set(rules) - set(AGGREGATES) or not attacks or set(attacks) - set(ATTACKS):
        ap.error(f"--rules from {AGGREGATES}, --attacks from {ATTACKS}")
    if not seeds or a.rounds < 1 or a.h < 1 or a.workers < 2 or not 0 <= a.attacker < a.workers:
        ap.error("need seeds, rounds >= 1, h >= 1, workers >= 2 and 0 <= attacker < workers")
    m = resolve_method(a.method, methods())
    if m is None or m.kind != "local" or m.aggregate is not None:
        ap.error(f"--method must be a local method without a rule suffix, one of {sorted(methods())}")
    configure_determinism(1)
    say = (lambda s: None) if a.quiet else (lambda s: print(s, flush=True))
    d = OuterSection()  # the run config's defaults
    outer = OuterConfig(lr=d.lr, momentum=d.momentum, clip=d.clip, trim=a.trim)
    steps = a.rounds * a.h
    model = PRESETS[a.preset]
    cfg = SimConfig(model=model, trainers=a.workers, steps=steps, batch_size=a.batch_size, seq_len=a.seq_len, h=a.h,
                    rank=a.rank, inner=InnerConfig(lr=a.inner_lr, warmup_steps=min(16, steps), total_steps=steps),
                    outer=outer, eval_rows=a.eval_rows)
    corpus = default_corpus(1 << 20)
    t0 = time.perf_counter()
    rows = measure(cfg, a.method, rules, attacks, seeds, a.attacker, a.direction_seed, corpus, say)
    out: dict[str, Any] = {
        "benchmark": "steering",
        "command": " ".join(["nice -n 10 .venv/bin/python", Path(sys.argv[0]).as_posix() if argv is None
                             else "benchmarks/steering.py", *(argv if argv is not None else sys.argv[1:])]),
        "seeds": seeds,
        "config": {
            "preset": a.preset, "n_params": n_params(model), "method": a.method, "trainers": a.workers,
            "attacker": a.attacker, "rounds": a.rounds, "h": a.h, "batch_size": a.batch_size, "seq_len": a.seq_len,
            "rank": a.rank, "inner_lr": a.inner_lr, "eval_rows": a.eval_rows, "direction_seed": a.direction_seed,
            "direction": "Gaussian unit vector over all parameters", "outer": asdict(outer),
            "corpus_digest": "0x" + corpus.digest.hex(),
        },
        "summary": summarize(rows),
        "runs": rows,
        "wall_seconds": time.perf_counter() - t0,
        "torch": torch.__version__,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    md = render(out)
    if a.md is not None:
        a.md.parent.mkdir(parents=True, exist_ok=True)
        a.md.write_text(md)
    if not a.quiet:
        print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
