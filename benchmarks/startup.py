"""How long an operator waits before a command answers (issue 32: start fast).

    .venv/bin/python benchmarks/startup.py --out benchmarks/results/startup.json --md docs/results-startup.md

Each command runs as a user runs it, through the installed `veriloco` script (else `python -m
veriloco.cli`) in a fresh interpreter, against a devnet this script starts (py-evm, a local store, the
contract deployed, one run created). Timed from the process's start: `--version`, `--help`, a
command's `--help`, `status` and `runs` until they exit; the dashboard until its first page answers
HTTP 200; a trainer node until its first line (it then imports torch and the chain client, and is
stopped). `import torch` alone is timed the same way, for scale: it is what the commands avoid.
Every figure is the median of `--repeat` runs, with the min and max; the machine's load average is
recorded before and after, since a loaded box stretches every figure (the budget, 2 s, is for an
idle one).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUDGET_S = 2.0  # issue 32: --version, --help, status, runs and the dashboard's first response, idle machine
RUN_TOML = ("[data]\ncorpus_bytes = 200000\n[schedule]\nepochs = 2\n[audit]\nquorum = 1\ntest_run = true\n"
            "[stakes]\nmin_trainers = 1\n")


def veriloco() -> list[str]:
    """The command a user types: the console script next to this interpreter, else the module."""
    script = shutil.which("veriloco", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "veriloco.cli"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def until_exit(argv: Sequence[str], cwd: Path) -> float:
    """Seconds from start to exit; a failing command is an error, not a figure."""
    t0 = time.perf_counter()
    p = subprocess.run(list(argv), cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip()[-400:]}")
    return took


def _stop(p: subprocess.Popen[str], grace_s: float) -> None:
    """SIGTERM, then SIGKILL if the process has not ended within ``grace_s``."""
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def until_first_line(argv: Sequence[str], cwd: Path) -> float:
    """Seconds from start to the process's first stdout line; then it is stopped (SIGTERM)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(list(argv), cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline() if p.stdout else ""
        took = time.perf_counter() - t0
        if not line:
            raise RuntimeError(f"{' '.join(argv)} printed nothing (exit {p.wait(timeout=60)})")
        return took
    finally:
        _stop(p, 120)


def until_http_ok(argv: Sequence[str], cwd: Path, port: int) -> float:
    """Seconds from start until http://127.0.0.1:port/ answers 200; then the server is stopped."""
    t0 = time.perf_counter()
    p = subprocess.Popen(list(argv), cwd=cwd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while True:
            if p.poll() is not None:
                raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {(p.stderr.read() if p.stderr else '')[-400:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                time.sleep(0.02)
            if time.perf_counter() - t0 > 300:
                raise RuntimeError(f"{' '.join(argv)}: no page within 300 s")
    finally:
        _stop(p, 60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(f: Callable[[], float], repeat: int) -> dict[str, Any]:
    xs = [f() for _ in range(repeat)]
    return {"median_s": round(statistics.median(xs), 3), "min_s": round(min(xs), 3), "max_s": round(max(xs), 3),
            "runs_s": [round(x, 3) for x in xs]}


def measure(repeat: int, only: set[str] | None = None) -> list[dict[str, Any]]:
    """Every figure, in the order of the table (``only``: a subset by name, e.g. in tests)."""
    cli = veriloco()
    rows: list[dict[str, Any]] = []

    def row(name: str, what: str, budget: float | None, f: Callable[[], float]) -> None:
        if only is None or name in only:
            print(f"timing {name} ...", file=sys.stderr)
            rows.append({"name": name, "what": what, "budget_s": budget, **timed(f, repeat)})

    with tempfile.TemporaryDirectory(prefix="veriloco-startup-") as tmp:
        here = Path(tmp)
        row("import torch", "python -c 'import torch' (for scale: what the commands avoid)", None,
            lambda: until_exit([sys.executable, "-c", "import torch"], here))
        row("--version", "veriloco --version", BUDGET_S, lambda: until_exit([*cli, "--version"], here))
        row("--help", "veriloco --help", BUDGET_S, lambda: until_exit([*cli, "--help"], here))
        row("trainer --help", "veriloco trainer --help", BUDGET_S, lambda: until_exit([*cli, "trainer", "--help"], here))
        chain_rows = {"status", "runs", "dashboard", "trainer first line"}
        if only is not None and not chain_rows & only:
            return rows
        from devnet.launch import start_devnet

        with start_devnet(state_dir=here / ".veriloco", accounts=3):
            (here / "run.toml").write_text(RUN_TOML)
            p = subprocess.run([*cli, "run", "create", "--config", "run.toml", "--account", "0", "--json"], cwd=here,
                               env=_env(), capture_output=True, text=True, timeout=600, check=False)
            if p.returncode != 0:
                raise RuntimeError(f"run create failed: {p.stderr.strip()[-400:]}")
            rid = str(json.loads(p.stdout)["run_id"])
            row("status", "veriloco status --run R (devnet: py-evm over JSON-RPC, a local store)", BUDGET_S,
                lambda: until_exit([*cli, "status", "--run", rid], here))
            row("runs", "veriloco runs", BUDGET_S, lambda: until_exit([*cli, "runs"], here))
            row("dashboard", "veriloco dashboard --run R: until its first page answers 200", BUDGET_S,
                lambda: until_http_ok([*cli, "dashboard", "--run", rid, "--port", str(port := free_port())], here, port))
            row("trainer first line", "veriloco trainer --run R: until its first line (it loads torch after)", BUDGET_S,
                lambda: until_first_line([*cli, "trainer", "--run", rid, "--account", "1",
                                          "--workdir", str(here / "nodes")], here))
    return rows


def render(doc: dict[str, Any]) -> str:
    lines = ["# Start times: how long a command keeps an operator waiting", "",
             "Generated by `benchmarks/startup.py` (do not edit by hand; rerun the command):", "", "```", doc["command"], "```", "",
             (f"{doc['machine']['cpus']} CPUs, load average {doc['load_before']} before and {doc['load_after']} after; "
              f"median of {doc['repeat']} runs each (min to max)."), "",
             "| command | median | min to max | budget (idle machine) |", "|---|---:|---:|---:|"]
    for r in doc["rows"]:
        budget = f"{r['budget_s']:.0f} s" if r["budget_s"] else "—"
        lines.append(f"| {r['what']} | {r['median_s']:.2f} s | {r['min_s']:.2f} to {r['max_s']:.2f} s | {budget} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, help="results JSON to write")
    ap.add_argument("--md", type=Path, help="write the Markdown table here too")
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure (default 5)")
    ap.add_argument("--only", help="comma-separated figure names (default: all)")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    only = {x.strip() for x in a.only.split(",")} if a.only else None
    load_before = [round(x, 2) for x in os.getloadavg()]
    rows = measure(a.repeat, only)
    doc = {"benchmark": "startup", "command": " ".join(["benchmarks/startup.py", *(argv if argv is not None else sys.argv[1:])]),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
           "repeat": a.repeat, "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()], "rows": rows}
    if a.out is not None:
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    md = render(doc)
    if a.md is not None:
        a.md.write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
