"""Issue 49, Stage B: the compression frontier at a budget that can decide it, prepared for a GPU.

The 64-step budget (0.19 tokens per parameter, 8 outer rounds) is too short for outer momentum or an
adaptive rank to matter. This plan trains `small` for 2,048 inner steps per worker (K = 4, 128 rows
of 64 tokens: 67M tokens, about 6 per parameter) on a corpus large enough not to repeat much: at
least 70 MB, built here from sources on the machine (the interpreter's standard library and the
installed torch package's Python sources, every file, in a fixed order: ``--build-corpus``), with
its digest in ``corpus.json``, checked by every run. Nothing is downloaded. The corpus differs
between machines with other Python or torch versions, so a file records the digest it ran on, and
runs join only on one digest (``benchmarks/convergence.py`` refuses others).

Arms (``ARMS``), each one ``benchmarks/convergence.py`` run per seed, joined by ``--merge``:
AllReduce; DiLoCo at H = 32; the shipped DiLoCoX (``fixed_rank_merge_b1_inparams_trimmed``) at about
400x at H = 32 (rank 84) and at H = 64 (rank 163); and Stage A's first-ranked arm at its own settings
(``benchmarks/headline.py``'s ``STAGE_A_BEST``, H = 8, rank 20). One seed of every arm is one device
run (``--seeds 0 --jobs 5``, all five at once on the one GPU); every run is a resumable piece, so a
later device run with ``--seeds 0,1`` runs seed 1 alone and merges both.

    .venv/bin/python benchmarks/long_budget.py --build-corpus          # .veriloco/corpus-long, ~1 min
    .venv/bin/python benchmarks/long_budget.py --device cuda --seeds 0  # one seed of every arm, then the merge
    .venv/bin/python benchmarks/long_budget.py --dry-run               # the same plan at toy size, on the CPU

``--dry-run`` runs the same pieces and merge with the toy model (``ci`` preset), 2 trainers, 16 steps,
every H divided by 16 and a 1 MiB corpus built the same way, into a scratch folder (``--work``): it checks the
plan end to end in about a minute (tests/unit/test_long_budget.py), not the science.
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.headline import (
    CONVERGENCE,
    RANK_400X,
    ROOT,
    SHIPPED,
    STAGE_A_BEST,
    Headline,
    Piece,
    _rel,
    _show,
    run,
)

CORPUS_DIR = ".veriloco/corpus-long"  # relative to ROOT: ignored by git, carried to a device run
CORPUS_BYTES = 72_000_000  # at least 70 MB (issue 49): 67M training tokens see each byte about once
STEPS = 2048
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Arm:
    method: str
    h: int
    rank: int


# The base arm's H and rank (the first two) name the others apart when merged (`_r<rank>_h<H>`).
ARMS = (
    Arm("allreduce", 32, 84),
    Arm("diloco", 32, 84),
    Arm(SHIPPED, 32, 84),  # 399x at K = 4
    Arm(SHIPPED, 64, 163),  # 401x
    Arm(STAGE_A_BEST, 8, int(RANK_400X)),  # Stage A's first-ranked arm at its own settings
)


def corpus_sources() -> list[tuple[str, Path]]:
    """(name, file) of every Python source of the interpreter's standard library (tests included,
    installed packages not) and of the installed torch package, named by their root and relative
    path, sorted by name: what ``build_tokens`` orders by keccak and cuts at the cap."""
    import torch

    std = Path(sysconfig.get_paths()["stdlib"])
    roots = (("python", std, ("site-packages", "dist-packages", "__pycache__")),
             ("torch", Path(torch.__file__).parent, ("__pycache__",)))
    out = []
    for tag, root, skip in roots:
        out += [(f"{tag}/{p.relative_to(root).as_posix()}", p) for p in root.rglob("*.py")
                if p.is_file() and not any(part in skip for part in p.relative_to(root).parts)]
    return sorted(out)


def build_corpus(out_dir: Path, max_bytes: int = CORPUS_BYTES) -> dict[str, object]:
    """Write the long corpus (``tokens.bin``, ``corpus.json`` with its digest) into ``out_dir``."""
    import platform

    import torch

    from protocol.data import Corpus, DataError, build_tokens, write_corpus

    sources = corpus_sources()
    tokens, used = build_tokens(((name, path.read_bytes()) for name, path in sources), max_bytes)
    if len(tokens) < max_bytes:
        raise DataError(f"the sources on this machine hold {len(tokens):,} bytes, fewer than the {max_bytes:,} asked; "
                        "ask for fewer with --corpus-bytes (a run records the size it had)")
    corpus = Corpus(tokens)
    meta: dict[str, object] = {
        "format": "veriloco.corpus.v1", "digest": "0x" + corpus.digest.hex(), "n_tokens": len(tokens),
        "n_train": int(corpus.train.numel()), "n_val": int(corpus.val.numel()),
        "source": "python-stdlib+torch", "python": platform.python_version(), "torch": torch.__version__,
        "documents": len(used), "documents_available": len(sources),
    }
    write_corpus(corpus, meta, out_dir)
    return meta


def pieces(seeds: Iterable[int], corpus: str, device: str, dry: bool) -> tuple[Piece, ...]:
    """One piece per seed and arm, seed by seed with AllReduce first (the others pair against it)."""
    size = (("--preset", "ci", "--trainers", "2", "--steps", "16", "--eval-rows", "8") if dry else
            ("--preset", "small", "--batch-size", "128", "--inner-lr", "5e-4", "--steps", str(STEPS), "--eval-rows", "512"))
    out = []
    for s in seeds:
        for arm in ARMS:
            h = max(1, arm.h // 16) if dry else arm.h
            flags = (*size, "--merge-step", "1", "--h", str(h), "--rank", str(arm.rank), "--corpus", corpus,
                     "--device", device)
            out.append(Piece(f"s{s}-{arm.method}-h{arm.h}-r{arm.rank}", (s,), (arm.method,), flags))
    return tuple(out)


def plan(seeds: Sequence[int], corpus: str, device: str, dry: bool) -> Headline:
    base = ARMS[0]
    main_arm = next(a for a in ARMS if a.method == SHIPPED)
    suffix = "" if (main_arm.h, main_arm.rank) == (base.h, base.rank) else f"_r{main_arm.rank}_h{main_arm.h}"
    return Headline("convergence-small-long", pieces(seeds, corpus, device, dry), dilocox=SHIPPED + suffix)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-corpus", action="store_true", help=f"build the corpus into --corpus (default {CORPUS_DIR}) and stop")
    ap.add_argument("--corpus", default=CORPUS_DIR, help="the corpus folder (built when missing)")
    ap.add_argument("--corpus-bytes", type=int, default=CORPUS_BYTES, help="the corpus size when building it")
    ap.add_argument("--device", default="cuda", help="where the runs train (default cuda)")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="seeds to run now (each a resumable piece)")
    ap.add_argument("--jobs", type=int, default=len(ARMS), help="pieces at once (default: every arm of a seed)")
    ap.add_argument("--work", type=Path, help="pieces' folder (default .veriloco/headline/convergence-small-long)")
    ap.add_argument("--out", type=Path, help="the merged file (default benchmarks/results/convergence-small-long.json)")
    ap.add_argument("--dry-run", action="store_true", help="the whole plan at toy size on the CPU, into a scratch folder")
    a = ap.parse_args(argv)
    try:
        seeds = sorted({int(x) for x in a.seeds.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--seeds takes comma-separated integers, got {a.seeds!r}")
    if not seeds or a.jobs < 1:
        ap.error("give at least one seed and a positive --jobs")
    # a dry run keeps its corpus, pieces and merged file in one scratch folder (--work, or a new one)
    scratch = (a.work or Path(tempfile.mkdtemp(prefix="long-budget-"))) if a.dry_run else None
    corpus = scratch / "corpus" if scratch else Path(a.corpus)
    if a.build_corpus or not (corpus / "corpus.json").is_file():
        meta = build_corpus(corpus, (1 << 20) if scratch else a.corpus_bytes)
        print(f"long_budget: corpus {_rel(corpus)}: {meta['n_tokens']:,} bytes of {meta['documents']} files, "
              f"digest {meta['digest']}", file=sys.stderr)
        if a.build_corpus:
            return 0
    device = "cpu" if scratch else a.device
    h = plan(seeds, _rel(corpus), device, scratch is not None)
    work = scratch / "work" if scratch else a.work or ROOT / ".veriloco" / "headline" / h.name
    out = a.out or (scratch / f"{h.name}.json" if scratch else ROOT / "benchmarks" / "results" / f"{h.name}.json")
    print(f"long_budget: {len(h.pieces)} runs of {CONVERGENCE} into {_rel(work)}, merged into {_rel(out)}",
          file=sys.stderr)
    return run(h, work, out, range(len(h.pieces)), a.jobs,
               lambda i: _show(["benchmarks/long_budget.py", "--seeds", a.seeds, "--device", device]))


if __name__ == "__main__":
    sys.exit(main())
