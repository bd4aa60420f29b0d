"""What a trainer's write-once files cost to write, past the page cache and through it (trainer/direct_io.py).

A trainer in shard mode writes every step's answer log (trainer/boundaries.py) where memory cannot
hold it, and a checkpoint every ``max(4, r)`` steps; audits read back a few of them. This writes the
very tensors the trainer's own code path makes (one ``LocalEngine`` step per setting: its log entry
and its whole state) to this machine's disk both ways, as a trainer does: a stream of files kept on
disk with a step's worth of CPU between two (a file deleted at once never waits for writeback, and
reads cheaper than it is). It reports the median CPU seconds of the writing thread and the wall
seconds per file (mean over the streams, median and 90th percentile beside), with their ratio:

    .venv/bin/python -m benchmarks.diskwrite --out benchmarks/results/diskwrite.json

Buffered writes depend on the page cache's state (free memory, dirty pages waiting for writeback),
so the machine's load and available memory are recorded beside the numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.report import write_settings
from dilocox.compress import CompressionConfig
from dilocox.delay import StartRule
from dilocox.inner import InnerConfig, configure_determinism
from dilocox.round import RoundSpec
from protocol.data import batch, default_corpus
from protocol.formats.codec import iter_state, load_state_file
from protocol.model import init_params, preset
from trainer.checkpoints import EpochDir
from trainer.direct_io import write_file
from trainer.engine import LocalEngine

# (preset, rows, tokens per row): the protocol benchmark's 8 x 128 setting, its 8 x 64 one, and GPT-2
# small's shape at its context (a 1.5 GB checkpoint).
SETTINGS = [("small", 8, 128), ("small", 8, 64), ("gpt2-124m", 1, 1024)]


def available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def step_files(name: str, rows: int, seq: int) -> dict[str, dict[str, torch.Tensor]]:
    """One step's log entry and the state after it, as the trainer would write them."""
    cfg = preset(name)
    spec = RoundSpec(cfg, InnerConfig(lr=3e-4, warmup_steps=2, total_steps=100), CompressionConfig(), StartRule.DELAYED,
                     run_seed=1, batch_size=rows, seq_len=seq, shard=True, segment=4)
    eng = LocalEngine(spec, every=4)  # the log on disk: its one file read back below
    with tempfile.TemporaryDirectory() as tmp:
        d = EpochDir(Path(tmp), 0)
        eng.begin(d, 4, init_params(cfg, 0), None)
        eng.step(d, 0, batch(default_corpus(max(200_000, 4 * rows * seq)), 1, 0, 0, 0, rows, seq))
        kind = eng.log_kind(d)
        (logged,) = (d.path / "bounds").glob("*.safetensors")
        entry = load_state_file(logged, allow_nonfinite=True)
        state = {k: v.cpu() for k, v in (eng.state or {}).items()}
        eng.close()
    return {f"log step ({kind})": entry, "checkpoint": state}


def measure(tensors: dict[str, torch.Tensor], folder: Path, repeats: int, gap_s: float, stream_bytes: int) -> dict[str, Any]:
    """Per file, median over a stream of files kept on disk as a trainer keeps its log (about
    ``stream_bytes`` of them, ``gap_s`` of busy CPU between two, as a step would take), each way,
    ``repeats`` streams each, alternating which goes first."""
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    used, size = False, 0
    for i in range(repeats):
        for direct in ((True, False) if i % 2 == 0 else (False, True)):
            stream = folder / f"stream-{i}-{int(direct)}"
            stream.mkdir()
            n = max(4, min(30, stream_bytes // max(1, sum(t.numel() * t.element_size() for t in tensors.values()))))
            for j in range(n):
                c, w = time.thread_time(), time.perf_counter()
                size, was = write_file(iter_state(tensors), stream / f"{j}", direct=direct)
                runs[direct].append((time.thread_time() - c, time.perf_counter() - w))
                used |= was
                busy = time.perf_counter()
                while time.perf_counter() - busy < gap_s:
                    pass
            for f in stream.iterdir():
                f.unlink()
            stream.rmdir()
            os.sync()  # the next stream starts with no dirty pages of this one
    # the mean is what a trainer pays over an epoch; buffered writes swing between a plain copy and a wait
    # for writeback, so the median and the 90th percentile are kept beside it
    out: dict[str, Any] = {"bytes": size, "direct_used": used, "files_per_mode": len(runs[True])}
    for direct, mode in ((False, "buffered"), (True, "direct")):
        for i, what in ((0, "cpu"), (1, "wall")):
            xs = sorted(r[i] for r in runs[direct])
            out[f"{mode}_{what}_s"] = round(statistics.fmean(xs), 4)
            out[f"{mode}_{what}_s_median"] = round(statistics.median(xs), 4)
            out[f"{mode}_{what}_s_p90"] = round(xs[int(0.9 * (len(xs) - 1))], 4)
    for what in ("cpu", "wall"):
        out[f"{what}_ratio_buffered_over_direct"] = round(out[f"buffered_{what}_s"] / max(out[f"direct_{what}_s"], 1e-9), 2)
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| setting | file | MB | CPU s per file, mean: buffered / direct (ratio) | wall s, mean: buffered / direct (ratio) | buffered CPU s: median, 90th percentile |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['preset']} {r['rows']} x {r['seq_len']} | {r['file']} | {r['bytes'] / 1e6:.1f} | "
                     f"{r['buffered_cpu_s']:.3f} / {r['direct_cpu_s']:.3f} ({r['cpu_ratio_buffered_over_direct']:.1f}x) | "
                     f"{r['buffered_wall_s']:.3f} / {r['direct_wall_s']:.3f} ({r['wall_ratio_buffered_over_direct']:.1f}x) | "
                     f"{r['buffered_cpu_s_median']:.3f}, {r['buffered_cpu_s_p90']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=4, help="streams of files each way (default 4), alternating")
    ap.add_argument("--gap", type=float, default=0.3, help="busy CPU seconds between two files of a stream (default 0.3)")
    ap.add_argument("--stream-gb", type=float, default=1.2, help="about this much kept on disk per stream (default 1.2)")
    ap.add_argument("--only", default="", help="comma-separated presets to run (default: every setting)")
    ap.add_argument("--dir", type=Path, default=Path("."), help="a folder on the disk to measure (default: here)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    configure_determinism(1)
    wanted = {x for x in a.only.split(",") if x}
    before = {"load_average_1m": os.getloadavg()[0], "available_bytes": available_bytes()}
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(dir=a.dir, prefix=".diskwrite-") as tmp:
        for name, r, s in SETTINGS:
            if wanted and name not in wanted:
                continue
            for file, tensors in step_files(name, r, s).items():
                rows.append({"preset": name, "rows": r, "seq_len": s, "file": file, **measure(tensors, Path(tmp), a.repeats, a.gap, int(a.stream_gb * 1e9))})
                print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    after = {"load_average_1m": os.getloadavg()[0], "available_bytes": available_bytes()}
    return write_settings("diskwrite", argv, {"before": before, "after": after}, rows, t0, markdown(rows), a.out)


if __name__ == "__main__":
    raise SystemExit(main())
