"""The nodes' metrics mapping and endpoint, and the dashboard's page, without a network.

The whole path (a devnet run, scrapes of live nodes, the page in Chromium) is tests/e2e/test_dashboard.py.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from protocol.store.backends import LocalStore, Metered
from veriloco.dashboard import cids_of
from veriloco.dashweb import View, loss_svg, render
from veriloco.metrics import MetricsError, NodeMetrics

pytestmark = pytest.mark.unit


def value(m: NodeMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_log_events_move_the_metrics_they_tell_about() -> None:
    m = NodeMetrics("trainer", 1, "0xabc")
    logged: list[tuple[str, dict[str, Any]]] = []
    log = m.wrap(lambda event, **f: logged.append((event, f)))
    for k in range(1, 4):
        log("step", epoch=2, step=k, of=3, loss=3.0 - k / 10)
    log("committed", epoch=2, payload_cid="Qm", gas=120_000, sent_bytes=10)
    log("revealed", epoch=1, gas=60_000)
    log("verified", epoch=2, trainer="0x1", passed=False)
    log("verified", epoch=2, trainer="0x2", passed=True)
    log("finalized", epoch=2, included=3, gas=1, eval_loss=2.5)
    log("skipped", epoch=7, reason="closed", gas=True)  # a bool is not gas
    assert [e for e, _ in logged][:3] == ["step"] * 3 and logged[3][1]["gas"] == 120_000  # the node's log is unchanged
    assert value(m, "veriloco_steps_trained_total") == 3
    assert value(m, "veriloco_loss") == pytest.approx(2.7)
    assert value(m, "veriloco_epoch") == 7  # the highest epoch acted in, not the latest event's
    assert value(m, "veriloco_transactions_total") == 3 and value(m, "veriloco_gas_used_total") == 180_001
    assert value(m, "veriloco_verdicts_total", passed="false") == 1 and value(m, "veriloco_verdicts_total", passed="true") == 1
    assert value(m, "veriloco_eval_loss") == 2.5
    assert value(m, "veriloco_events_total", event="step") == 3
    assert value(m, "veriloco_node_info", role="trainer", run="1", address="0xabc") == 1


def test_the_endpoint_serves_store_bytes_and_refuses_a_taken_port(tmp_path: Any) -> None:
    store = Metered(LocalStore(tmp_path))
    cid = store.put(b"x" * 1000)
    store.get(cid)
    m = NodeMetrics("verifier", 3)
    m.watch_store(store)
    server = m.serve(0)
    try:
        port = server.server_address[1]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "veriloco_store_sent_bytes_total 1000.0" in text and "veriloco_store_received_bytes_total 1000.0" in text
        with pytest.raises(MetricsError, match="pick another --metrics-port"):
            NodeMetrics("verifier", 3).serve(port)
        assert server.server_address[0] == "127.0.0.1"  # loopback only
    finally:
        server.shutdown()
        server.server_close()


def test_the_endpoint_listens_where_it_is_told_and_a_bad_host_is_refused() -> None:
    """`--metrics-host`: 0.0.0.0 is every interface (the node warns, veriloco/nodes.py); the flag takes
    IP literals and localhost only, and only loopback counts as this machine alone."""
    import argparse

    from veriloco.argtypes import host, is_loopback

    server = NodeMetrics("trainer", 1).serve(0, "0.0.0.0")
    try:
        assert server.server_address[0] == "0.0.0.0"
        port = server.server_address[1]
        assert "veriloco_node_info" in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert [host(x) for x in ("127.0.0.1", "0.0.0.0", "[::1]", "localhost")] == ["127.0.0.1", "0.0.0.0", "::1", "localhost"]
    assert [is_loopback(x) for x in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "192.168.1.5")] == [True] * 3 + [False] * 2
    with pytest.raises(argparse.ArgumentTypeError, match="not an IP address to listen on"):
        host("metrics.example.org")


def _data() -> dict[str, Any]:
    trainer = {"address": "0x" + "ab" * 20, "slot": 0, "state": "responded", "steps": 8, "trace_root": "0x" + "11" * 32,
               "payload_cid": "QmPayload<script>", "manifest_cid": "QmManifest", "state_cids": ["QmState"],
               "verdicts": [{"verifier": "0x" + "cd" * 20, "passed": True}], "outcome": "passed",
               "published_bytes": 1234, "allreduce_bytes": 5678}
    epoch = {"epoch": 0, "phase": "finalized", "committed": 1, "expected": 1, "revealed": 1, "responded": 1, "passed": 1,
             "failed": 0, "model_cid": "QmModel", "eval_loss": 2.5, "transactions": 9, "gas_used": 1_000_000,
             "deadlines": {"opened_at": 1, "done_at": 2}, "trainers": [trainer],
             "events": [{"name": "VerdictsRevealed", "block": 5, "tx": "0x1", "args": {"evidenceCid": "QmEvidence"}}]}
    return {"run_id": 1, "summary": "finished: 1 of 1 epochs finalized, 0 aborted", "contract": "0x" + "ee" * 20,
            "chain_id": 1337, "rpc_url": "http://127.0.0.1:8545", "store": "local store /x", "generated_at": 0,
            "state": "finished", "epochs_total": 1, "epochs_finalized": 1, "eval_rows": 64,
            "run": {"config_cid": "QmConfig", "init_model_cid": "QmInit", "coordinator": "0x" + "ff" * 20,
                    "active_trainers": 1, "max_trainers": 4, "verifiers": 1, "quorum": 1, "audit_steps": 2},
            "loss_curve": [{"epoch": -1, "eval_loss": 5.5}, {"epoch": 0, "eval_loss": 2.5}],
            "totals": {"transactions": 9, "gas_used": 1_000_000, "verdicts_pass": 1, "verdicts_fail": 0, "slashes": 0, "slashed_wei": 0,
                       "published_bytes": 1234, "allreduce_bytes": 5678, "allreduce_over_published": 4.6},
            "slashes": [], "epochs": [epoch]}


def test_the_page_links_every_cid_locally_and_escapes_what_the_chain_says() -> None:
    d = _data()
    d["cids"] = sorted(cids_of(d))
    assert d["cids"] == sorted(["QmConfig", "QmInit", "QmModel", "QmPayload<script>", "QmManifest", "QmState", "QmEvidence"])
    page = render(d, refresh_s=7)
    assert '<meta http-equiv="refresh" content="7">' in page
    for cid in ("QmConfig", "QmInit", "QmModel", "QmManifest", "QmState"):
        assert f'href="/cid/{cid}"' in page
    assert "<script" not in page and "QmPayload&lt;script&gt;" in page  # content from the chain is escaped
    assert "1,000,000" in page and "4.6x" in page and "<polyline" in page


def test_the_loss_chart_and_the_view_cache() -> None:
    assert "no finalized model" in loss_svg([])
    assert loss_svg([{"epoch": 0, "eval_loss": 3.0}]).count("<circle") == 1  # one point: no division by zero
    calls: list[int] = []
    view = View(lambda: {"n": len(calls) + (calls.append(1) or 0)}, max_age=3600)
    assert view.get() == view.get() == {"n": 0} and len(calls) == 1


def test_the_page_is_served_at_once_and_fills_in_when_the_run_is_read() -> None:
    """Issue 46 item 9: the dashboard gathered the whole run before it opened its port (minutes of
    silence on a long run). The page now answers from the first request and shows the run once read;
    a gather that fails leaves the page saying why; the JSON API still waits for data."""
    from protocol.errors import VerilocoError
    from veriloco.dashweb import serve

    release, calls = threading.Event(), []

    def slow() -> dict[str, Any]:
        calls.append(1)
        release.wait(30)
        if len(calls) == 1:
            raise VerilocoError("chain unreachable at 127.0.0.1:1")
        return {"n": len(calls)}

    view = View(slow, max_age=3600)
    server = serve(view, store=None, refresh_s=3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        page = urllib.request.urlopen(url, timeout=5).read().decode()  # at once, the first gather still running
        assert "Reading the run" in page and 'content="3"' in page and len(calls) == 1
        release.set()
        deadline = time.monotonic() + 10
        while view._busy and time.monotonic() < deadline:  # the failed gather ends
            time.sleep(0.05)
        with pytest.raises(urllib.error.HTTPError) as e:  # it failed: the page says why (and tries again)
            urllib.request.urlopen(url, timeout=5)
        assert e.value.code == 503 and "chain unreachable" in e.value.read().decode()
        assert json.loads(urllib.request.urlopen(url + "api/run.json", timeout=30).read()) == {"n": 2}
    finally:
        release.set()
        server.shutdown()
        server.server_close()
