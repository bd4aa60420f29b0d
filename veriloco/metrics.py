"""Prometheus metrics of one node (`--metrics-port P`), derived from the events it logs.

A node loop reports everything through `log(event, **fields)` (veriloco/logs.py); `NodeMetrics.wrap`
puts one function, `observe`, in front of that log, so the mapping from events to metrics lives here
and the nodes stay unchanged:

    step (trainer)             veriloco_steps_trained_total, veriloco_loss
    any event with `epoch`     veriloco_epoch (the highest epoch the node has acted in)
    any event with `gas`       veriloco_transactions_total, veriloco_gas_used_total (one transaction each)
    verified (verifier)        veriloco_verdicts_total{passed}
    finalized                  veriloco_eval_loss (the coordinator evaluates the model it finalizes)
    every event                veriloco_events_total{event}

Two facts are not events: the bytes the node moves through its store are read from a `Metered`
store at scrape time (veriloco_store_sent_bytes_total, veriloco_store_received_bytes_total), and
slashes are observed on the chain (veriloco_slashes_observed_total{kind}: the run's Slashed and
VerifierSlashed events so far, whoever was slashed). The endpoint binds 127.0.0.1 unless the node is
given `--metrics-host` (it has no authentication: veriloco/nodes.py warns when it is reachable from
other machines).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from protocol.errors import VerilocoError

Log = Callable[..., None]


class MetricsError(VerilocoError):
    """The metrics endpoint cannot listen on its port."""


class _StoreBytes(Collector):
    """Bytes sent and received through a `protocol.store.backends.Metered`, read when scraped."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("veriloco_store_sent_bytes", "bytes this node put into the content store",
                                  value=self.store.sent)
        yield CounterMetricFamily("veriloco_store_received_bytes", "bytes this node got from the content store",
                                  value=self.store.received)


class _Slashes(Collector):
    """The run's slashes so far, followed on the chain with an event cursor (an outage keeps the last count)."""

    def __init__(self, chain: Any, run_id: int) -> None:
        self.stream = chain.stream(["Slashed", "VerifierSlashed"], run_id=run_id)
        self.counts = {"trainer": 0, "verifier": 0}
        self._lock = threading.Lock()

    def collect(self) -> Iterator[CounterMetricFamily]:
        with self._lock:
            try:
                while True:
                    for ev in self.stream.poll():
                        self.counts["trainer" if ev.name == "Slashed" else "verifier"] += 1
                    if self.stream.cursor > self.stream.last_seen_head:
                        break
            except VerilocoError:
                pass  # the chain is unreachable: report what was seen, poll again on the next scrape
            fam = CounterMetricFamily("veriloco_slashes_observed", "slashes of this run seen on the chain",
                                      labels=["kind"])
            for kind, n in self.counts.items():
                fam.add_metric([kind], n)
        yield fam


class NodeMetrics:
    """One node's metrics in their own registry (several nodes may share a process in tests)."""

    def __init__(self, role: str, run_id: int, address: str = "", registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        Gauge("veriloco_node_info", "this node's role, run and address", ["role", "run", "address"],
              registry=r).labels(role, str(run_id), address).set(1)
        self.events = Counter("veriloco_events", "events this node logged", ["event"], registry=r)
        self.steps = Counter("veriloco_steps_trained", "inner steps this trainer trained", registry=r)
        self.epoch = Gauge("veriloco_epoch", "the highest epoch this node has acted in", registry=r)
        self.loss = Gauge("veriloco_loss", "training loss of the trainer's latest inner step", registry=r)
        self.eval_loss = Gauge("veriloco_eval_loss", "eval loss of the latest model this node finalized", registry=r)
        self.txs = Counter("veriloco_transactions", "transactions this node sent", registry=r)
        self.gas = Counter("veriloco_gas_used", "gas of the transactions this node sent", registry=r)
        self.verdicts = Counter("veriloco_verdicts", "verdicts this verifier reached", ["passed"], registry=r)
        self._max_epoch = -1

    def observe(self, event: str, fields: dict[str, Any]) -> None:
        """Move the metrics an event tells about (the mapping in the module docstring)."""
        self.events.labels(event).inc()
        epoch = fields.get("epoch")
        if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch > self._max_epoch:
            self._max_epoch = epoch
            self.epoch.set(epoch)
        gas = fields.get("gas")
        if isinstance(gas, int) and not isinstance(gas, bool) and gas > 0:
            self.txs.inc()
            self.gas.inc(gas)
        if event == "step":
            self.steps.inc()
            if isinstance(fields.get("loss"), (int, float)):
                self.loss.set(fields["loss"])
        elif event == "verified" and isinstance(fields.get("passed"), bool):
            self.verdicts.labels(str(fields["passed"]).lower()).inc()
        elif event == "finalized" and isinstance(fields.get("eval_loss"), (int, float)):
            self.eval_loss.set(fields["eval_loss"])

    def wrap(self, log: Log) -> Log:
        """`log`, observed: the node calls it as before."""

        def observed(event: str, **fields: Any) -> None:
            self.observe(event, fields)
            log(event, **fields)

        return observed

    def watch_store(self, store: Any) -> None:
        """Report the bytes counted by `store` (a protocol.store.backends.Metered)."""
        self.registry.register(_StoreBytes(store))

    def watch_slashes(self, chain: Any, run_id: int) -> None:
        """Report the run's slashes as `chain` (a protocol.chain.binding.Chain, read only) shows them."""
        self.registry.register(_Slashes(chain, run_id))

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        """Serve /metrics on `host`:`port` from a daemon thread; returns the HTTP server."""
        try:
            server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise MetricsError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; "
                               "pick another --metrics-port (or --metrics-host)") from None
        return server
