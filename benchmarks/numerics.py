"""What the CPU numerics pin costs in step time, and what it buys: one class of bits on any host level.

    nice -n 19 .venv/bin/python benchmarks/numerics.py --out benchmarks/results/numerics.json \
        --md docs/results-numerics.md

Each setting runs in a fresh process (the kernels are chosen once per process), interleaved over
``--rounds`` rounds so drift in the machine's load falls on all of them alike: the host's own
kernels (whatever torch picks here, with oneDNN on, as before issue 51), the same with oneDNN off,
and the pinned class `x86-64-v3-cnr` (ATen AVX2, oneMKL COMPATIBLE, oneDNN off). Per setting: the
median seconds of an inner step of `small` at 32 rows of 64 tokens in 2 groups (the block-wise step
a trainer runs), and the canary digest (dilocox/numerics.py) under each host capability level it
can request, pinned and not: pinned, every level must give one digest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protocol.numerics import CPU_CLASS, settings

PROBE = """
import json, sys, time
pin = sys.argv[1] == "pinned"
if pin:
    from protocol.numerics import pin_environment; pin_environment()
import torch
from dilocox.inner import InnerConfig, configure_determinism, init_state
from dilocox.blockstep import blockwise_step
from dilocox.numerics import canary
from protocol.model import preset
configure_determinism(1)
if sys.argv[2] == "onednn":
    torch.backends.mkldnn.enabled = True
cfg = preset("small")
digest = canary(cfg) if sys.argv[2] != "onednn" else None
st = init_state(cfg, 0)
x = (torch.arange(32 * 64).reshape(32, 64) * 7 + 3) % 256
y = (x * 5 + 1) % 256
inner = InnerConfig(lr=5e-4, warmup_steps=8, total_steps=64)
times = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter()
    st, _, _ = blockwise_step(st, (x, y), cfg, inner, 2)
    times.append(time.perf_counter() - t)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "steps": times[1:], "canary": digest}))
"""

SETTINGS = {  # name: (pinned?, oneDNN as before?)
    "host kernels, oneDNN on (before issue 51)": ("host", "onednn"),
    "host kernels, oneDNN off": ("host", "off"),
    f"pinned class {CPU_CLASS}": ("pinned", "off"),
}
LEVELS = ["default", "avx2", "avx512"]


def probe(mode: str, dnn: str, steps: int, level: str | None = None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in settings(CPU_CLASS)}
    if level:
        env["ATEN_CPU_CAPABILITY"] = level
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", PROBE, mode, dnn, str(steps)], env=env, check=True,
                         capture_output=True, text=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="steps per process (the first is a warm-up, dropped)")
    a = ap.parse_args(argv)
    t0, load0 = time.time(), os.getloadavg()[0]
    steps: dict[str, list[float]] = {name: [] for name in SETTINGS}
    caps: dict[str, str] = {}
    for r in range(a.rounds):
        for name, (mode, dnn) in SETTINGS.items():
            res = probe(mode, dnn, a.steps)
            steps[name] += res["steps"]
            caps[name] = res["capability"]
            print(f"round {r} {name}: {statistics.median(res['steps']):.3f} s/step ({res['capability']})",
                  file=sys.stderr, flush=True)
    canaries = {f"{'pinned' if mode == 'pinned' else 'unpinned'}, host asks {level}":
                probe(mode, "off", 1, level)["canary"] for mode in ("host", "pinned") for level in LEVELS}
    base = statistics.median(steps[next(iter(SETTINGS))])
    rows = [{"setting": name, "kernels": caps[name], "median_step_s": round(statistics.median(v), 4),
             "vs_before": round(statistics.median(v) / base, 3), "steps_timed": len(v)} for name, v in steps.items()]
    pinned = {v for k, v in canaries.items() if k.startswith("pinned")}
    res = {"benchmark": "numerics", "command": "benchmarks/numerics.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "host": {"machine": platform.machine(), "cpu": _cpu(), "python": platform.python_version()},
           "load_avg_1m_start_end": [round(load0, 2), round(os.getloadavg()[0], 2)], "seconds": round(time.time() - t0, 1),
           "rows": rows, "canaries": canaries, "pinned_levels_agree": len(pinned) == 1,
           "unpinned_distinct": len({v for k, v in canaries.items() if k.startswith("unpinned")})}
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    md = render(res)
    if a.md:
        a.md.write_text("# The CPU numerics pin (issue 51)\n\n" + md)
    print(md)
    return 0


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def render(res: dict[str, Any]) -> str:
    lines = [(f"`{res['command']}` on {res['host']['cpu']} ({res['host']['machine']}). Inner step of `small`, "
              "32 rows x 64 tokens in 2 groups, one thread, median over fresh processes:"), "",
             "| setting | kernels | s / step | vs before |", "|---|---|---:|---:|"]
    lines += [f"| {r['setting']} | {r['kernels']} | {r['median_step_s']:.3f} | {r['vs_before']:.2f}x |" for r in res["rows"]]
    lines += ["", "Canary digest (dilocox/numerics.py, `small`) by the capability level the host environment asks for:", "",
              "| process | canary |", "|---|---|"]
    lines += [f"| {k} | `{v[:18]}…` |" for k, v in res["canaries"].items()]
    lines += ["", (f"Pinned, every level gives one digest: {res['pinned_levels_agree']}; unpinned, "
                   f"{res['unpinned_distinct']} distinct digests.")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
