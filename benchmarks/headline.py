"""One command per headline results file: its ``benchmarks/convergence.py`` runs, then their ``--merge``.

A headline such as ``benchmarks/results/convergence-small.json`` took many runs (one per method and
seed, at 30 to 45 minutes each on the project's 2-core box) and a merge; the plan below holds them as
data, so the file can be remade from scratch without reading its ``command`` list, and the plan is
checked against the committed file (tests/unit/test_headline_bench.py). Runs ("pieces") write into a
work folder and are resumable: a piece whose JSON is there and complete (its seeds, methods and
settings) is skipped, so an interrupted or partial run (``--only``, ``--piece``) picks up where it
stopped; a piece another plan already ran (the same run, in a sibling work folder) is copied, not run
again. The merge runs once every piece is done; it takes seconds.

    .venv/bin/python benchmarks/headline.py convergence-small --dry-run   # the plan, what is done
    .venv/bin/python benchmarks/headline.py convergence-small --jobs 2    # the runs, then the merge
    make headline H=convergence-small
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONVERGENCE = "benchmarks/convergence.py"  # relative to ROOT, so results record it as the committed files do
# Flags that do not change a run's results: a piece recorded with other values is still the same piece.
NOT_RESULTS = frozenset({"--out", "--jobs", "--quiet"})
NOT_RUN = "not run"


@dataclass(frozen=True)
class Piece:
    """One ``benchmarks/convergence.py`` run: ``methods`` on ``seeds`` at the settings ``flags``,
    written to ``<work>/<name>.json``."""

    name: str
    seeds: tuple[int, ...]
    methods: tuple[str, ...]
    flags: tuple[str, ...]

    def args(self, out: str) -> list[str]:
        return [CONVERGENCE, *self.flags, "--seeds", ",".join(map(str, self.seeds)),
                "--methods", ",".join(self.methods), "--out", out]


@dataclass(frozen=True)
class Headline:
    """A results file ``benchmarks/results/<name>.json``: its pieces, then one ``--merge`` of them in
    this order (the first piece of each seed must have AllReduce: the others pair against it). A plan
    that adds methods to a committed headline's seeds names that file as its ``base``: the merge starts
    from it, so its runs are neither repeated nor needed in a work folder."""

    name: str
    pieces: tuple[Piece, ...]
    dilocox: str | None = None  # --dilocox: the method the targets and the projection read
    keep: tuple[str, ...] = ()  # --keep: the methods the merged file keeps (empty: all)
    selection: str | None = None  # --selection: the selection file a held-out file reports beside its own
    base: str | None = None  # a committed merged file (relative to ROOT) the merge joins the pieces onto

    def merge_args(self, inputs: Sequence[str], out: str) -> list[str]:
        return [CONVERGENCE, "--merge", *([self.base] if self.base else []), *inputs,
                *(["--dilocox", self.dilocox] if self.dilocox else []),
                *(["--selection", self.selection] if self.selection else []),
                *(["--keep", ",".join(self.keep)] if self.keep else []), "--out", out]


def with_flag(flags: tuple[str, ...], flag: str, value: str) -> tuple[str, ...]:
    """``flags`` with ``flag``'s value replaced (appended when absent)."""
    if flag not in flags:
        return (*flags, flag, value)
    i = flags.index(flag)
    return (*flags[: i + 1], value, *flags[i + 2:])


def flag_values(args: Sequence[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command line ("" for a flag without a value), the script dropped."""
    out: dict[str, str] = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else "--"
            out[a] = "" if nxt.startswith("--") else nxt
    return out


def result_flags(args: Sequence[str]) -> dict[str, str]:
    return {k: v for k, v in flag_values(args).items() if k not in NOT_RESULTS}


def per_run(seeds: Iterable[int], runs: Sequence[tuple[str, tuple[str, ...]]]) -> tuple[Piece, ...]:
    """One piece per method and seed (seed by seed, AllReduce first), named ``s<seed>-<method>``
    plus ``-r<rank>`` where a run overrides the first run's rank: each fits one core for one run."""
    base = flag_values(runs[0][1]).get("--rank")
    out = []
    for s in seeds:
        for method, flags in runs:
            rank = flag_values(flags).get("--rank")
            out.append(Piece(f"s{s}-{method}" + (f"-r{rank}" if rank != base else ""), (s,), (method,), flags))
    return tuple(out)


# convergence-small.json (README "Training"): batch 128, AdamW 5e-4, rank 64, merge step 1, 512 eval rows;
# the shipped DiLoCoX (examples/small.toml) is fixed_rank_merge_b1 at rank 128 under the trimmed mean with
# the error feedback in the parameters, joined as ..._inparams_trimmed_r128, beside the same under the
# plain mean (..._r128) and with a carried buffer (..._trimmed_r128).
SMALL = ("--preset", "small", "--batch-size", "128", "--inner-lr", "5e-4", "--rank", "64",
         "--merge-step", "1", "--eval-rows", "512")
SHIPPED = "fixed_rank_merge_b1_inparams_trimmed"  # at rank 128
# convergence-small-heldout.json (issue 33): the shipped method against AllReduce and DiLoCo on seeds no
# choice was made on (3, 4, 5; every setting above was picked on 0, 1, 2) and on the eval rows between
# the selection rows (--eval-split heldout). Not run yet: its pieces resume under .veriloco/headline/.
HELDOUT = (*SMALL, "--eval-split", "heldout")
HELDOUT_SEEDS = (3, 4, 5)
SELECTION = "benchmarks/results/convergence-small.json"  # the held-out files report its seeds beside theirs
# convergence-small-baselines.json (issue 33): the field's compressors as training methods at the shipped
# payload's bytes (rank 128), SparseLoCo-style and DeMo-style top-k with 2-bit values, on the held-out
# seeds and rows beside the held-out plan's runs, which it reuses (the same pieces: nothing runs twice).
BASELINES = ("sparseloco_merge_trimmed", "demo_merge_trimmed")
# convergence-small-adaptive.json (issue 33): DiLoCoX's adaptive rank and H rule (dilocox_merge_b1: the
# shipped start rule, error feedback and aggregate, the rank starting at the shipped 128 and free to fall)
# on the held-out seeds and rows, joined onto the committed baselines file (AllReduce, DiLoCo, the shipped
# fixed rank and the field's compressors), whose runs it pairs against.
ADAPTIVE = "dilocox_merge_b1_inparams_trimmed"
# convergence-small-tuning.json (issue 33): every method gets the same small inner lr grid at the operating
# point, on the selection seeds: 2.5e-4 and 1e-3 beside convergence-small.json's 5e-4 (which was picked for
# all at 8 rows, not at 128). Joined onto that file as its inner lr sweep, each method is then read at its
# own best lr (AllReduce too: an untuned AllReduce would flatter the local methods). Seed by seed, so a
# partial plan already pairs every method at every lr on the seeds it has.
# The local methods also run at the DiLoCo paper's outer setting (lr 0.7, Nesterov momentum 0.9) beside
# plain averaging, joined as the file's outer sweep.
TUNING_LRS = ("2.5e-4", "1e-3")
TUNING = ("allreduce", "diloco", SHIPPED)
TUNING_OUTER = ("0.7", "0.9")
# convergence-small-400x-selection.json (issue 49, Stage A): about 400x at the 64-step budget, on the
# selection seeds and rows, joined onto convergence-small.json (its AllReduce and DiLoCo runs, the same
# code path): the shipped method at rank 20 (its payload 413x smaller than AllReduce's traffic at K = 4),
# DeMo-style top-k at that payload's bytes, and SparseLoCo-style at its own operating point (1.56% of
# each chunk, 2-bit values, its decayed accumulator), the field's two under the plain mean they use.
RANK_400X = "20"
STAGE_A = (SHIPPED, "demo_merge", "sparseloco_paper_merge")
# convergence-small-400x.json (issue 49, Stage A): the arm the selection file ranks first, confirmed on
# seeds no choice was ever made on (6, 7, 8: 3 to 5 served the merge rule and the held-out file) and on
# the held-out rows, against AllReduce and DiLoCo run on those seeds.
STAGE_A_SEEDS = (6, 7, 8)
STAGE_A_BEST = SHIPPED
# convergence-tiny.json (`make bench`): the tiny preset at outer 0.7 / 0.5, the outer sweep beside it.
TINY = ("--preset", "tiny", "--eval-rows", "512", "--outer-lr", "0.7", "--outer-momentum", "0.5",
        "--sweep-outer", "1.0:0.0,1.0:0.3,1.2:0.0")

HEADLINES: dict[str, Headline] = {
    h.name: h
    for h in (
        Headline(
            "convergence-small",
            per_run((0, 1, 2), [(m, SMALL) for m in ("allreduce", "diloco", "fixed_rank_merge", "fixed_rank_merge_b1")]
                    + [(m, with_flag(SMALL, "--rank", "128"))
                       for m in ("fixed_rank_merge_b1", "fixed_rank_merge_b1_trimmed", SHIPPED)]),
            dilocox=f"{SHIPPED}_r128",
        ),
        Headline(
            "convergence-small-heldout",
            per_run(HELDOUT_SEEDS, [("allreduce", HELDOUT), ("diloco", HELDOUT),
                                    (SHIPPED, with_flag(HELDOUT, "--rank", "128"))]),
            dilocox=f"{SHIPPED}_r128", selection=SELECTION,
        ),
        Headline(
            "convergence-small-baselines",
            per_run(HELDOUT_SEEDS, [("allreduce", HELDOUT), ("diloco", HELDOUT),
                                    *((m, with_flag(HELDOUT, "--rank", "128")) for m in (SHIPPED, *BASELINES))]),
            dilocox=f"{SHIPPED}_r128", selection=SELECTION,
        ),
        Headline(
            "convergence-small-adaptive",
            per_run(HELDOUT_SEEDS, [(ADAPTIVE, with_flag(HELDOUT, "--rank", "128"))]),
            dilocox=f"{SHIPPED}_r128", selection=SELECTION, base="benchmarks/results/convergence-small-baselines.json",
        ),
        Headline(
            "convergence-small-tuning",
            tuple(Piece(f"s{s}-{m}{'-r128' if m == SHIPPED else ''}-lr{lr}", (s,), (m,),
                        with_flag(with_flag(SMALL, "--inner-lr", lr), "--rank", "128" if m == SHIPPED else "64"))
                  for s in (0, 1, 2) for lr in TUNING_LRS[::-1] for m in TUNING)
            + tuple(Piece(f"s{s}-{m}{'-r128' if m == SHIPPED else ''}-outer{TUNING_OUTER[0]}m{TUNING_OUTER[1]}", (s,), (m,),
                          (*with_flag(SMALL, "--rank", "128" if m == SHIPPED else "64"),
                           "--outer-lr", TUNING_OUTER[0], "--outer-momentum", TUNING_OUTER[1]))
                    for s in (0, 1, 2) for m in TUNING[1:]),
            dilocox=f"{SHIPPED}_r128", keep=("allreduce", "diloco", f"{SHIPPED}_r128"), base=SELECTION,
        ),
        Headline(
            "convergence-small-400x-selection",
            per_run((0, 1, 2), [(m, with_flag(SMALL, "--rank", RANK_400X)) for m in STAGE_A]),
            dilocox=f"{SHIPPED}_r{RANK_400X}", base=SELECTION,
            keep=("allreduce", "diloco", f"{SHIPPED}_r128", *(f"{m}_r{RANK_400X}" for m in STAGE_A)),
        ),
        Headline(
            "convergence-small-400x",
            per_run(STAGE_A_SEEDS, [("allreduce", HELDOUT), ("diloco", HELDOUT),
                                    (STAGE_A_BEST, with_flag(HELDOUT, "--rank", RANK_400X))]),
            dilocox=f"{STAGE_A_BEST}_r{RANK_400X}", selection="benchmarks/results/convergence-small-400x-selection.json",
        ),
        # the outer sweep pairs against AllReduce within a run: one piece per seed, every method in it
        Headline("convergence-tiny",
                 tuple(Piece(f"s{s}", (s,), ("allreduce", "diloco", "dilocox"), TINY) for s in (0, 1, 2))),
    )
}


def incomplete(piece: Piece, data: Any) -> str | None:
    """Why ``data`` (a piece's JSON) is not the piece's finished output; None when it is."""
    if not isinstance(data, dict) or data.get("benchmark") != "convergence" or "per_seed" not in data:
        return "not a convergence run"
    cmd = data.get("command")
    if not isinstance(cmd, str):
        return "a merged file, not one run"
    ours, theirs = result_flags(piece.args("")), result_flags(cmd.split()[1:])
    diff = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    if diff:
        return "ran with other settings: " + ", ".join(f"{k} {theirs.get(k)!r} (plan: {ours.get(k)!r})" for k in diff)
    seeds = [s.get("seed") for s in data["per_seed"]]
    if seeds != list(piece.seeds):
        return f"has seeds {seeds}, not {list(piece.seeds)}"
    for s in data["per_seed"]:
        if set(s.get("methods", {})) != set(piece.methods):
            return f"seed {s['seed']} has methods {sorted(s.get('methods', {}))}"
    return None


def piece_state(piece: Piece, path: Path) -> str | None:
    """None when ``path`` holds the piece's finished output, else why not."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return NOT_RUN
    except (OSError, ValueError) as exc:
        return f"unreadable ({exc})"
    return incomplete(piece, data)


def sibling(piece: Piece, path: Path) -> Path | None:
    """Where another plan's work folder (a sibling of ``path``'s) holds this very piece finished."""
    return next((o for o in sorted(path.parent.parent.glob(f"*/{path.name}"))
                 if o.parent != path.parent and piece_state(piece, o) is None), None)


def reuse(piece: Piece, path: Path) -> Path | None:
    """Copy another plan's finished output of this piece (``sibling``) to ``path``, with its log."""
    other = sibling(piece, path)
    if other is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(other.read_bytes())
        if other.with_suffix(".log").exists():
            path.with_suffix(".log").write_bytes(other.with_suffix(".log").read_bytes())
    return other


def _rel(p: Path) -> str:
    """``p`` relative to the repository root where it lies under it (the commands run from there)."""
    p = p.resolve() if p.is_absolute() else (Path.cwd() / p).resolve()
    return p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else str(p)


def _show(args: Sequence[str]) -> str:
    exe = Path(sys.executable)
    shown = os.path.relpath(exe, ROOT) if exe.is_relative_to(ROOT) else str(exe)
    return shlex.join([shown, *args])


def _say(msg: str) -> None:
    print(f"headline: {msg}", file=sys.stderr, flush=True)


def _launch(args: Sequence[str], log: Path) -> int:
    """Run ``args`` with this Python from the repository root, its output into ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as f:
        proc = subprocess.run([sys.executable, *args], check=False, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    return proc.returncode


def _tail(log: Path, n: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def run(h: Headline, work: Path, out: Path, selected: Sequence[int], jobs: int, rerun_hint: Callable[[int], str],
        launch: Callable[[Sequence[str], Path], int] | None = None) -> int:
    """Run the ``selected`` pieces (indexes into ``h.pieces``) not yet done, up to ``jobs`` at once, then
    the merge if every piece is done. A failed piece stops new starts; the others keep their outputs."""
    launch = launch or _launch
    paths = [work / f"{p.name}.json" for p in h.pieces]
    n = len(h.pieces)
    todo, why_run = [], {}
    for i in selected:
        why = piece_state(h.pieces[i], paths[i])
        if why is not None and (other := reuse(h.pieces[i], paths[i])) is not None:
            _say(f"piece {i + 1}/{n} ({h.pieces[i].name}): done under {other.parent.name}, copied")
            why = None
        if why is None:
            _say(f"piece {i + 1}/{n} ({h.pieces[i].name}): done, skipped")
        else:
            todo.append(i)
            why_run[i] = "" if why == NOT_RUN else f" again ({why})"
    stop = threading.Event()
    failed: list[tuple[int, int]] = []

    def one(i: int) -> None:
        if stop.is_set():
            return
        p, log = h.pieces[i], paths[i].with_suffix(".log")
        _say(f"piece {i + 1}/{n} ({p.name}): running{why_run[i]}, log {_rel(log)}")
        t0 = time.monotonic()
        rc = launch(p.args(_rel(paths[i])), log)
        why = None if rc else piece_state(p, paths[i])
        if rc or why:
            stop.set()
            failed.append((i, rc))
            _say(f"piece {i + 1}/{n} ({p.name}) FAILED (exit {rc}{', ' + why if why else ''}); "
                 f"last lines of {_rel(log)}:\n{_tail(log)}")
        else:
            _say(f"piece {i + 1}/{n} ({p.name}): done in {(time.monotonic() - t0) / 60:.1f} min")

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, todo))
    if failed:
        for i, _ in sorted(failed):
            _say(f"rerun piece {i + 1} alone: {rerun_hint(i + 1)}")
        skipped = [i for i in todo if i not in {j for j, _ in failed} and piece_state(h.pieces[i], paths[i])]
        if skipped:
            _say(f"not started after the failure: pieces {', '.join(str(i + 1) for i in skipped)}")
        return 1
    left = [i + 1 for i in range(n) if piece_state(h.pieces[i], paths[i])]
    if left:
        _say(f"{len(left)} of {n} pieces still to run ({', '.join(map(str, left))}); the merge waits for them")
        return 0
    if h.base and not (ROOT / h.base).is_file():
        _say(f"the merge needs {h.base}, the committed file this plan joins onto; restore it (git checkout -- {h.base})")
        return 1
    args = h.merge_args([_rel(p) for p in paths], _rel(out))
    log = work / "merge.log"
    _say(f"merging {n} pieces into {_rel(out)}")
    if launch(args, log):
        _say(f"the merge FAILED; last lines of {_rel(log)}:\n{_tail(log)}\nrerun it: {_show(args)}")
        return 1
    _say(f"wrote {_rel(out)} (the tables: {_show([CONVERGENCE, '--render', _rel(out)])})")
    return 0


def dry_run(h: Headline, work: Path, out: Path, selected: Sequence[int]) -> str:
    """The plan, one command per line, each with whether its piece is done."""
    paths = [work / f"{p.name}.json" for p in h.pieces]
    states = [piece_state(p, path) for p, path in zip(h.pieces, paths)]
    elsewhere = {i: o.parent.name for i, (p, path) in enumerate(zip(h.pieces, paths))
                 if states[i] is not None and (o := sibling(p, path)) is not None}
    done = sum(s is None for s in states)
    lines = [f"# {h.name}: {len(h.pieces)} pieces ({done} done"
             + (f", {len(elsewhere)} done by another plan" if elsewhere else "") + "), then their merge "
             + (f"onto {h.base} " if h.base else "") + f"into {_rel(out)}; "
             + f"work folder {_rel(work)}"]
    for i in selected:
        lines.append(f"{_show(h.pieces[i].args(_rel(paths[i])))}  # piece {i + 1}: "
                     + ("done" if states[i] is None else f"done under {elsewhere[i]} (copied when run)" if i in elsewhere
                        else "to run" if states[i] == NOT_RUN else f"to run: {states[i]}"))
    lines.append(f"{_show(h.merge_args([_rel(p) for p in paths], _rel(out)))}  # merge: "
                 + ("ready" if all(s is None for s in states) else "once every piece is done"))
    return "\n".join(lines)


def _ints(spec: str) -> set[int]:
    try:
        return {int(x) for x in spec.split(",") if x.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers, got {spec!r}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("headline", help="a results file's name: " + ", ".join(HEADLINES))
    ap.add_argument("--dry-run", action="store_true", help="print the plan and which pieces are done, run nothing")
    ap.add_argument("--jobs", type=int, default=1, help="pieces run at once, one process each (default 1); "
                    "results do not depend on it, measured step times do")
    ap.add_argument("--only", type=_ints, metavar="SEEDS", help="run only the pieces on these seeds (e.g. 0,2)")
    ap.add_argument("--piece", type=_ints, metavar="N", help="run only these pieces (numbers from --dry-run)")
    ap.add_argument("--work", type=Path, help="folder for the pieces' JSON and logs (default .veriloco/headline/NAME)")
    ap.add_argument("--out", type=Path, help="the merged file (default benchmarks/results/NAME.json)")
    a = ap.parse_args(argv)
    name = a.headline.removesuffix(".json").rsplit("/", 1)[-1]
    h = HEADLINES.get(name)
    if h is None:
        ap.error(f"unknown headline {a.headline!r}; known: {', '.join(HEADLINES)}")
    if a.jobs < 1:
        ap.error(f"--jobs must be positive, got {a.jobs}")
    n = len(h.pieces)
    bad = sorted(i for i in a.piece or () if not 1 <= i <= n)
    if bad:
        ap.error(f"--piece {bad}: {name} has pieces 1 to {n} (see --dry-run)")
    selected = [i for i, p in enumerate(h.pieces)
                if (a.piece is None or i + 1 in a.piece) and (a.only is None or set(p.seeds) & a.only)]
    if not selected:
        ap.error(f"no piece of {name} matches --only {sorted(a.only or ())} --piece {sorted(a.piece or ())}")
    work = a.work or ROOT / ".veriloco" / "headline" / name
    out = a.out or ROOT / "benchmarks" / "results" / f"{name}.json"
    if a.dry_run:
        print(dry_run(h, work, out, selected))
        return 0
    extra = [*(["--work", _rel(work)] if a.work else []), *(["--out", _rel(out)] if a.out else [])]
    return run(h, work, out, selected, a.jobs,
               lambda i: _show(["benchmarks/headline.py", name, "--piece", str(i), *extra]))


if __name__ == "__main__":
    sys.exit(main())
