"""Store benchmark: put/get throughput of LocalStore and IpfsStore, and the state digest's cost.

    .venv/bin/python -m benchmarks.store --out benchmarks/results/store.json

For 1 MiB and 64 MiB of random bytes, each backend's `put` and verified `get` (and `get_to_file`)
are timed against baselines doing the same transfer without veriloco's checks: a plain file
write/read for LocalStore, and ipfshttpclient's own `add_bytes`/`cat` on the same js-ipfs node for
IpfsStore. The ratio column is veriloco / baseline. The digest part trains the `tiny` and `small`
presets with dilocox.inner.train_step and times protocol.digest.state_digest of the full state
(params, both moments, error buffer, counters), the hash a trainer takes after every inner step;
`digest_fraction_of_step` is digest time / step time. Timings are the median of the repetitions.

Prints a Markdown table and writes JSON (machine, versions, settings, numbers, ratios, targets).
"""

# ruff: noqa: B023  (the timed closures run inside the loop iteration that made them)
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from protocol.digest import state_digest
from protocol.store.backends import IpfsStore, LocalStore, Store
from protocol.store.unixfs import cid_of

MB = 1e6
SIZES = {"1MiB": 1 << 20, "64MiB": 64 << 20}


def _median_time(fn: Callable[[], Any], reps: int, setup: Callable[[], Any] | None = None) -> float:
    times = []
    for _ in range(reps):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _reps(size: int) -> int:
    return 9 if size <= 1 << 20 else 3


def bench_backend(store: Store, label: str) -> dict[str, Any]:
    """put / get / get_to_file MB/s per size, each rep on fresh random bytes."""
    out: dict[str, Any] = {"put_mb_s": {}, "get_mb_s": {}, "get_file_mb_s": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for key, size in SIZES.items():
            reps = _reps(size)
            blobs = [os.urandom(size) for _ in range(reps)]
            cids: list[str] = []
            it = iter(blobs)
            t_put = _median_time(lambda: cids.append(store.put(next(it))), reps)
            assert cids == [cid_of(b) for b in blobs], f"{label}: put returned a wrong CID"
            it2 = iter(cids)
            t_get = _median_time(lambda: store.get(next(it2), max_size=size), reps)
            it3 = iter(cids)
            target = Path(tmp) / "out.bin"
            t_file = _median_time(lambda: store.get_to_file(next(it3), target, max_size=size), reps)
            out["put_mb_s"][key] = size / t_put / MB
            out["get_mb_s"][key] = size / t_get / MB
            out["get_file_mb_s"][key] = size / t_file / MB
    return out


def bench_raw_files() -> dict[str, Any]:
    """Baseline for LocalStore: write a temp file + rename, read it back; no hashing."""
    out: dict[str, Any] = {"put_mb_s": {}, "get_mb_s": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for key, size in SIZES.items():
            reps = _reps(size)
            blobs = [os.urandom(size) for _ in range(reps)]
            paths = [Path(tmp) / f"{key}-{i}" for i in range(reps)]

            def write(i: list[int] = [0]) -> None:  # noqa: B006 - a counter
                p = paths[i[0] % reps]
                tmp_p = p.with_suffix(".part")
                tmp_p.write_bytes(blobs[i[0] % reps])
                os.replace(tmp_p, p)
                i[0] += 1

            def read(i: list[int] = [0]) -> None:  # noqa: B006 - a counter
                paths[i[0] % reps].read_bytes()
                i[0] += 1

            out["put_mb_s"][key] = size / _median_time(write, reps) / MB
            out["get_mb_s"][key] = size / _median_time(read, reps) / MB
    return out


def bench_raw_ipfs(api: str) -> dict[str, Any]:
    """Baseline for IpfsStore: ipfshttpclient add_bytes / cat on the same node, no verification."""
    import ipfshttpclient

    client = ipfshttpclient.Client(api, timeout=120)
    out: dict[str, Any] = {"put_mb_s": {}, "get_mb_s": {}}
    for key, size in SIZES.items():
        reps = _reps(size)
        blobs = [os.urandom(size) for _ in range(reps)]
        cids: list[str] = []
        it = iter(blobs)
        t_put = _median_time(lambda: cids.append(client.add_bytes(next(it))), reps)
        it2 = iter(cids)
        t_get = _median_time(lambda: client.cat(next(it2)), reps)
        out["put_mb_s"][key] = size / t_put / MB
        out["get_mb_s"][key] = size / t_get / MB
    client.close()
    return out


def bench_hashing() -> dict[str, float]:
    import hashlib

    data = os.urandom(64 << 20)
    t_sha = _median_time(lambda: hashlib.sha256(data).digest(), 3)
    t_cid = _median_time(lambda: cid_of(data), 3)
    return {"sha256_mb_s": len(data) / t_sha / MB, "cid_mb_s": len(data) / t_cid / MB}


def bench_digest(preset_name: str, steps: int, batch_size: int) -> dict[str, Any]:
    """Median inner-step time and median state_digest time for one preset's full training state."""
    from dilocox.inner import InnerConfig, init_state, train_step
    from protocol.data import batch, default_corpus
    from protocol.model import n_params, preset

    cfg = preset(preset_name)
    inner = InnerConfig(warmup_steps=2, total_steps=1000)
    corpus = default_corpus()
    state = init_state(cfg, seed=0)
    step_times, digest_times = [], []
    for k in range(steps + 1):
        b = batch(corpus, 1, 0, 0, k, batch_size, cfg.seq_len)
        t0 = time.perf_counter()
        state, _ = train_step(state, b, cfg, inner)
        t1 = time.perf_counter()
        state_digest(state)
        t2 = time.perf_counter()
        if k:  # the first step warms up allocators and kernels
            step_times.append(t1 - t0)
            digest_times.append(t2 - t1)
    step, dig = statistics.median(step_times), statistics.median(digest_times)
    state_bytes = sum(t.numel() * t.element_size() for t in state.values())
    return {
        "params": n_params(cfg),
        "state_bytes": state_bytes,
        "batch_size": batch_size,
        "seq_len": cfg.seq_len,
        "steps_timed": steps,
        "step_ms": step * 1e3,
        "digest_ms": dig * 1e3,
        "digest_mb_s": state_bytes / dig / MB,
        "fraction": dig / step,
    }


def machine() -> dict[str, Any]:
    import ipfshttpclient
    import numpy

    node = shutil.which("node")
    node_v = subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout.strip() if node else None
    ipfs_v = None
    pkg = Path(__file__).resolve().parents[1] / "node_modules" / "ipfs" / "package.json"
    if pkg.exists():
        ipfs_v = json.loads(pkg.read_text()).get("version")
    cpu = ""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return {
        "machine": {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
                    "torch_threads": torch.get_num_threads()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "numpy": numpy.__version__, "ipfshttpclient": ipfshttpclient.__version__,
                     "node": node_v, "js-ipfs": ipfs_v},
    }


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def table(res: dict[str, Any]) -> str:
    rows = ["| backend | op | size | veriloco MB/s | baseline | baseline MB/s | ratio |",
            "|---|---|---|---:|---|---:|---:|"]
    for backend, base_name in (("local", "plain file write/read"), ("ipfs", "ipfshttpclient add/cat")):
        b = res["backends"].get(backend)
        base = res["baselines"].get(backend)
        if not b:
            rows.append(f"| {backend} | – | – | skipped: {res.get('skipped', {}).get(backend, '')} | | | |")
            continue
        for op, base_op in (("put", "put"), ("get", "get"), ("get_file", "get")):
            for key in SIZES:
                v = b[f"{op}_mb_s"][key]
                bv = base[f"{base_op}_mb_s"][key] if base else None
                ratio = f"{v / bv:.2f}" if bv else "–"
                rows.append(f"| {backend} | {op} | {key} | {_fmt(v)} | {base_name} | {_fmt(bv)} | {ratio} |")
    rows += ["", "| preset | params | state MB | inner step ms | state digest ms | digest MB/s | digest / step |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, d in res["digest"].items():
        rows.append(
            f"| {name} | {d['params']:,} | {d['state_bytes'] / MB:.1f} | {d['step_ms']:.1f} | "
            f"{d['digest_ms']:.2f} | {_fmt(d['digest_mb_s'])} | {100 * d['fraction']:.2f}% |"
        )
    h = res["hashing"]
    rows += ["", (f"Hashing alone on 64 MiB: sha256 {_fmt(h['sha256_mb_s'])} MB/s, "
                  f"UnixFS CID {_fmt(h['cid_mb_s'])} MB/s (ratio {h['cid_mb_s'] / h['sha256_mb_s']:.2f}).")]
    rows += ["", "Targets: " + ", ".join(f"{k} {'met' if v['met'] else 'MISSED'} ({v['value']:.3g} vs {v['target']})"
                                     for k, v in res["targets"].items())]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON results file")
    ap.add_argument("--steps", type=int, default=8, help="inner steps timed per preset")
    ap.add_argument("--batch-size", type=int, default=8, help="rows per inner-step batch (run config default)")
    ap.add_argument("--no-ipfs", action="store_true", help="skip the js-ipfs backend")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*strict.*")

    res: dict[str, Any] = {**machine(), "settings": {"sizes": SIZES, "steps": args.steps,
                                                    "batch_size": args.batch_size, "mb": "1e6 bytes"},
                           "backends": {}, "baselines": {}, "skipped": {}}
    with tempfile.TemporaryDirectory() as tmp:
        res["backends"]["local"] = bench_backend(LocalStore(Path(tmp) / "store"), "local")
    res["baselines"]["local"] = bench_raw_files()
    if args.no_ipfs:
        res["skipped"]["ipfs"] = "--no-ipfs"
    else:
        from devnet.ipfsnode import IpfsNode, IpfsNodeError

        try:
            with IpfsNode() as node:
                res["backends"]["ipfs"] = bench_backend(IpfsStore(node.api, timeout=120), "ipfs")
                res["baselines"]["ipfs"] = bench_raw_ipfs(node.api)
        except IpfsNodeError as exc:
            res["skipped"]["ipfs"] = str(exc)
    res["hashing"] = bench_hashing()
    res["digest"] = {p: bench_digest(p, args.steps, args.batch_size) for p in ("tiny", "small")}
    res["digest_fraction_of_step"] = {p: d["fraction"] for p, d in res["digest"].items()}
    res["ratios"] = {
        backend: {f"{op}_{k}": res["backends"][backend][f"{op}_mb_s"][k] / res["baselines"][backend][f"{op}_mb_s"][k]
                  for op in ("put", "get") for k in SIZES}
        for backend in res["backends"] if backend in res["baselines"]
    }
    local = res["backends"]["local"]
    res["targets"] = {
        "local put 64MiB >= 200 MB/s": {"value": local["put_mb_s"]["64MiB"], "target": 200,
                                        "met": local["put_mb_s"]["64MiB"] >= 200},
        "local get 64MiB >= 200 MB/s": {"value": local["get_mb_s"]["64MiB"], "target": 200,
                                        "met": local["get_mb_s"]["64MiB"] >= 200},
        "small digest <= 5% of step": {"value": res["digest_fraction_of_step"]["small"], "target": 0.05,
                                       "met": res["digest_fraction_of_step"]["small"] <= 0.05},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
