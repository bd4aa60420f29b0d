"""The dashboard and the nodes' metrics, on a real network (the demo's processes on a py-evm devnet).

While the run goes on, every node's `/metrics` and the demo's live dashboard are read once the first
epoch is final; after the nodes stop (the devnet still up), `veriloco dashboard` is started on the
run as a user types it, and its JSON, its page, a CID it links to and a headless Chromium
screenshot of the page are checked against what the demo's own summary (from the nodes' logs) says.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from protocol.chain.binding import Chain, Phase
from tests.fixtures.network import run_network
from veriloco.netdemo import DemoOptions, metrics_offset

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]

METRIC = re.compile(r"^(veriloco_[a-z_]+)(\{[^}]*\})? (\S+)$", re.MULTILINE)


def free_ports(n: int) -> int:
    """A first port p with p..p+n-1 free on 127.0.0.1 now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def get(url: str, timeout: float = 60) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return bytes(r.read())


def metrics(text: str) -> dict[str, float]:
    """`name{labels}` -> value of the veriloco_* samples of a scrape."""
    return {m[1] + (m[2] or ""): float(m[3]) for m in METRIC.finditer(text)}


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def screenshot(url: str, out: Path) -> None:
    """A headless Chromium's picture of `url` (no sandbox: the tests may run as root)."""
    exe = chromium()
    assert exe is not None
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={out}", "--window-size=1280,900", url],
                   check=True, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_dashboard_and_metrics_of_a_live_run(tmp_path: Path) -> None:
    # the one-step delay: epoch 1 is open (committing) while epoch 0 is final, which is the state the
    # mid-run assertions read (under the merge rule epoch 1 opens only when its trainers commit)
    opts = DemoOptions(trainers=2, verifiers=1, quorum=1, epochs=2, steps=8, workdir=tmp_path / "demo",
                       timeout_s=300, metrics_port=free_ports(4), dashboard_port=free_ports(1), merge_step=0)
    scrapes: dict[str, dict[str, float]] = {}
    seen: dict[str, Any] = {}

    def on_tick(c: Any) -> None:
        if scrapes or c.chain.epoch_status(c.run_id, 0).phase is not Phase.FINALIZED:
            return
        for n in c.nodes:
            port = opts.metrics_port + metrics_offset(opts, n.role, n.index)
            scrapes[n.role + str(n.index)] = metrics(get(f"http://127.0.0.1:{port}/metrics").decode())
        seen["live"] = json.loads(get(f"http://127.0.0.1:{opts.dashboard_port}/api/run.json"))  # the demo's --dashboard

    def inspect(chain: Chain, store: Any, run_id: int) -> None:
        """`veriloco dashboard` as a user starts it, on the finished run (the devnet is still up)."""
        port = free_ports(1)
        cmd = [sys.executable, "-m", "veriloco.cli", "dashboard", "--run", str(run_id), "--rpc-url", chain.where,
               "--contract", chain.address, "--store", "local", "--store-dir", str(store.root), "--port", str(port)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
        try:
            seen["banner"] = proc.stdout.readline() if proc.stdout else ""
            url = f"http://127.0.0.1:{port}"
            seen["json"] = json.loads(get(url + "/api/run.json"))
            waited = time.monotonic() + 120  # the figures that need torch come from a thread beside the page
            while seen["json"]["evaluating"] and time.monotonic() < waited:
                time.sleep(1)
                seen["json"] = json.loads(get(url + "/api/run.json"))
            seen["html"] = get(url + "/").decode()
            seen["config"] = get(url + "/cid/" + seen["json"]["run"]["config_cid"])
            try:
                get(url + "/cid/QmNotOfThisRun")
                seen["foreign"] = 200
            except urllib.error.HTTPError as exc:
                seen["foreign"] = exc.code
            if chromium():
                screenshot(url + "/", tmp_path / "dashboard.png")
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    summary, _ = run_network(opts, inspect=inspect, on_tick=on_tick)
    assert summary["epochs_finalized"] == 2
    live = seen["live"]  # mid-run: epoch 0 final, epoch 1 not yet
    assert live["state"] == "running" and live["epochs"][0]["phase"] == "finalized" and live["epochs_finalized"] == 1
    assert seen["banner"].startswith("dashboard of run ")

    # --- the dashboard: the run as the chain and the store show it, agreeing with the nodes' own logs
    d = seen["json"]
    assert d["state"] == "finished" and d["epochs_total"] == 2 and d["epochs_finalized"] == 2
    assert [r["epoch"] for r in d["epochs"]] == [0, 1] and all(r["phase"] == "finalized" for r in d["epochs"])
    trainers = sorted(t["address"] for t in d["epochs"][0]["trainers"])
    assert len(trainers) == 2 and d["trainers"] == trainers
    for r in d["epochs"]:
        for t in r["trainers"]:
            assert t["outcome"] == "passed" and t["payload_cid"] and t["manifest_cid"] and len(t["trace_root"]) == 66
            assert t["steps"] > 0 and t["published_bytes"] > 0 and t["allreduce_bytes"] > 0
            assert all(c in d["cids"] for c in (t["payload_cid"], t["manifest_cid"], *t["state_cids"]))
        assert r["gas_used"] > 0 and r["model_cid"] in d["cids"]
    assert d["totals"]["verdicts_pass"] == summary["verdicts"]["pass"] and d["totals"]["verdicts_fail"] == 0
    assert d["totals"]["slashes"] == 0 and d["slashes"] == []
    assert d["totals"]["gas_used"] >= summary["gas_used"]  # the nodes' transactions, and the demo's joins too
    # the loss curve is recomputed from the store: it equals what the coordinator logged when it finalized
    assert not d["evaluating"]  # what needs torch, computed beside the page, is all in
    assert [p["epoch"] for p in d["loss_curve"]] == [-1, 0, 1]
    assert d["loss_curve"][0]["eval_loss"] == summary["initial_eval_loss"]
    logged = {p["epoch"]: p["eval_loss"] for p in summary["eval_curve"]}
    assert all(p["eval_loss"] == logged[p["epoch"]] for p in d["loss_curve"][1:])
    # every byte a trainer put into the store is a payload, a manifest or an audit state the manifest names
    assert abs(d["totals"]["published_bytes"] - 2 * summary["bytes_sent_per_trainer"]) <= 1
    # and the AllReduce baseline is the summary's: one trace leaf per inner step after the start state
    assert abs(d["totals"]["allreduce_bytes"] - 2 * summary["allreduce_bytes_equivalent"]) <= 1
    page = seen["html"]
    assert "epoch 0" in page and "epoch 1" in page and 'http-equiv="refresh"' in page
    assert all(t[:8] in page for t in trainers) and f'/cid/{d["run"]["config_cid"]}' in page
    assert "<script" not in page and "http://" not in page.replace("http://127.0.0.1", "")  # no external assets
    assert json.loads(seen["config"])  # the run's config, served from the store
    assert seen["foreign"] == 404

    # --- the metrics of every node moved while the run went on
    t0, v0, c0 = scrapes["trainer0"], scrapes["verifier0"], scrapes["coordinator0"]
    assert t0["veriloco_steps_trained_total"] >= 8 and t0["veriloco_loss"] > 0
    assert t0["veriloco_transactions_total"] >= 3 and t0["veriloco_gas_used_total"] > 0
    assert t0["veriloco_store_sent_bytes_total"] > 0 and t0["veriloco_store_received_bytes_total"] > 0
    assert t0["veriloco_epoch"] >= 0 and t0['veriloco_slashes_observed_total{kind="trainer"}'] == 0
    assert v0['veriloco_verdicts_total{passed="true"}'] >= 2 and v0["veriloco_gas_used_total"] > 0
    assert v0["veriloco_store_received_bytes_total"] > 0
    assert c0["veriloco_transactions_total"] >= 1 and c0["veriloco_eval_loss"] == logged[0]
    assert c0['veriloco_events_total{event="finalized"}'] >= 1

    # --- a real browser renders the page
    if chromium() is None:
        pytest.skip("no chromium binary (Debian: apt-get install chromium; `make test` installs it): "
                    "the page was checked over HTTP only")
    png = (tmp_path / "dashboard.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert int.from_bytes(png[16:20], "big") == 1280 and int.from_bytes(png[20:24], "big") == 900
