"""What `veriloco dashboard` shows about a run, gathered from the chain and the content store alone.

No node's log is read: everything here is public and anyone can recompute it. Per epoch: the
phase and counts `veriloco status` reports (`chaincmds.status_report`, reused as is), each
trainer's commitment (trace root, leaves, payload and manifest CIDs), verdicts, outcome and slash;
the gas of every transaction that emitted one of the run's events (from its receipt); the bytes each
trainer published (payload, audit manifest and the state files it names, sized in the store)
against a ring AllReduce of fp32 gradients for the steps it committed to (`traffic.allreduce_bytes`,
the definition the demo and benchmarks use); and the global model's eval loss, recomputed from the
finalized model in the store on the run's validation rows (the rows the coordinator evaluates).

Downloads are not public, so bytes here are uploads only; a node's own traffic in both directions
is on its metrics endpoint (`--metrics-port`). Facts that cannot change (receipts, sizes, eval
losses, the reports of finished epochs) are cached in `Cache`, so a refresh costs a few RPC calls
per live epoch. What needs torch (the model's parameter count, eval losses) is computed on a worker
thread beside the page (`Cache.later`): the first page answers without it, says it is evaluating
(`evaluating` in the JSON), and the figures appear on a later refresh.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from protocol.chain.binding import Chain, ChainEvent, Phase
from protocol.errors import VerilocoError
from protocol.store.backends import LocalStore, Store
from veriloco.chaincmds import TERMINAL, run_schedule, run_state, status_report
from veriloco.traffic import allreduce_bytes

# events shown in the run's event list (commitments, reveals and verdicts are in the trainer rows)
NOTABLE = ("TrainerJoined", "VerifierJoined", "TrainerLeft", "VerifierLeft", "VerifierRemoved", "AuditStarted",
           "VerdictsRevealed", "EpochFinalized", "ModelConfirmed", "Slashed", "VerifierSlashed",
           "AvailabilityReported", "AvailabilityDecided", "RewardsPaid", "Withdrawn")
SLASHES = ("Slashed", "VerifierSlashed")
CID_ARGS = ("configCid", "payloadCid", "manifestCid", "evidenceCid", "modelCid")


@dataclass
class Cache:
    """Facts that never change once known, so each is read once per dashboard."""

    gas: dict[str, int] = field(default_factory=dict)  # tx hash -> gas used
    sizes: dict[str, int] = field(default_factory=dict)  # cid -> bytes
    states: dict[str, list[str]] = field(default_factory=dict)  # manifest cid -> state file cids
    epochs: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # finished epoch -> (its event count, report)
    ctx: Any = None  # protocol.run.RunContext, opened on the first eval
    events: list[ChainEvent] = field(default_factory=list)  # the run's events so far, in chain order
    stream: Any = None  # the EventStream that reads the ones after them
    slow: dict[Hashable, Any] = field(default_factory=dict)  # what the worker thread computed, by key
    queued: set[Hashable] = field(default_factory=set)  # what it has still to compute
    _jobs: queue.Queue[tuple[Hashable, Callable[[], Any]]] = field(default_factory=queue.Queue)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _worker: threading.Thread | None = None

    def later(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()``'s value once the worker thread has it, None until then. A None result (the
        store or chain could not serve it yet) is not kept: the next refresh asks again."""
        with self._lock:
            if key in self.slow:
                return self.slow[key]
            if key not in self.queued:
                self.queued.add(key)
                self._jobs.put((key, compute))
                if self._worker is None:
                    self._worker = threading.Thread(target=self._work, name="dashboard-eval", daemon=True)
                    self._worker.start()
        return None

    def _work(self) -> None:
        while True:
            key, compute = self._jobs.get()
            value = compute()
            with self._lock:
                self.queued.discard(key)
                if value is not None:
                    self.slow[key] = value


def run_events(chain: Chain, run_id: int, cache: Cache) -> list[ChainEvent]:
    """All of the run's events so far; each refresh reads only the blocks since the last."""
    if cache.stream is None:
        cache.stream = chain.stream(run_id=run_id)
    while True:
        cache.events += cache.stream.poll()
        if cache.stream.cursor > cache.stream.last_seen_head:
            return cache.events


def _plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return "0x" + v.hex()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def event_json(ev: ChainEvent) -> dict[str, Any]:
    return {"name": ev.name, "block": ev.block_number, "tx": ev.tx_hash,
            "args": {k: _plain(v) for k, v in ev.args.items() if k != "runId"}}


def size_of(store: Store, cid: str, cache: Cache) -> int | None:
    """Bytes of a CID's content (None when the store does not have it)."""
    if cid not in cache.sizes:
        try:
            if isinstance(store, LocalStore):
                cache.sizes[cid] = store.path_of(cid).stat().st_size  # type: ignore[arg-type]
            else:
                cache.sizes[cid] = len(store.get(cid))
        except (VerilocoError, OSError):
            return None
    return cache.sizes[cid]


def _cids_in(value: Any) -> list[str]:
    """Every non-empty `cid` or `*_cid` field of a JSON document (the state files an audit manifest
    names: each challenge's and the final check's `cid`, a continued start's `start_cid`)."""
    if isinstance(value, dict):
        named = [k for k, v in value.items() if (k == "cid" or k.endswith("_cid")) and isinstance(v, str) and v]
        return [value[k] for k in named] + [c for k, v in value.items() if k not in named for c in _cids_in(v)]
    if isinstance(value, list):
        return [c for v in value for c in _cids_in(v)]
    return []


def manifest_states(store: Store, cid: str, cache: Cache) -> list[str]:
    """The state files an audit manifest publishes (empty while the store cannot serve it)."""
    if cid not in cache.states:
        try:
            doc = json.loads(store.get(cid, max_size=16 << 20))
        except (VerilocoError, OSError, ValueError):
            return []
        cache.states[cid] = sorted(set(_cids_in(doc)))
    return cache.states[cid]


def gas_of(chain: Chain, tx: str, cache: Cache) -> int:
    if tx not in cache.gas:  # a transport failure is ChainUnavailable: the page says so, the next refresh retries
        cache.gas[tx] = chain.gas_used(tx)
    return cache.gas[tx]


def eval_loss(chain: Chain, store: Store, run_id: int, cid: str, digest: bytes, cache: Cache, rows: int) -> float | None:
    """The model's loss on the run's first `rows` validation rows (64: what the coordinator logs)."""
    if rows <= 0:
        return None

    def compute() -> float | None:
        from protocol.run import eval_model, load_model, params_of

        ctx = _ctx(chain, store, run_id, cache)
        try:
            return None if ctx is None else round(eval_model(ctx, params_of(load_model(store, cid, digest, ctx.param_shapes)), rows), 4)
        except (VerilocoError, OSError):
            return None

    return cache.later(("eval", digest), compute)


def _ctx(chain: Chain, store: Store, run_id: int, cache: Cache) -> Any:
    """The run's context (protocol.run.RunContext: imports torch), opened once; None while unreadable."""
    from protocol.run import open_run

    if cache.ctx is None:
        try:
            cache.ctx = open_run(chain, store, run_id)
        except (VerilocoError, OSError):
            return None
    return cache.ctx


def _n_params(chain: Chain, store: Store, run_id: int, cache: Cache) -> int | None:
    def compute() -> int | None:
        from protocol.model import n_params

        ctx = _ctx(chain, store, run_id, cache)
        return None if ctx is None else int(n_params(ctx.config.model_config()))

    return cache.later("params", compute)


def epoch_facts(chain: Chain, store: Store, run_id: int, e: int, events: list[ChainEvent], cache: Cache,
                params: int | None, eval_rows: int) -> dict[str, Any]:
    """One epoch: `status`'s report plus gas, published bytes against AllReduce, eval loss, its events."""
    mine = [ev for ev in events if ev.args.get("epoch") == e]
    cached = cache.epochs.get(e)
    if cached is not None and cached[0] == len(mine):
        return cached[1]
    r = status_report(chain, run_id, e)
    k = r["committed"]
    published = baseline = 0
    for t in r["trainers"]:
        files = [c for c in (t["payload_cid"], t["manifest_cid"]) if c]
        files += manifest_states(store, t["manifest_cid"], cache) if t["manifest_cid"] else []
        t["state_cids"] = files[2:] if t["manifest_cid"] and t["payload_cid"] else []
        sizes = [size_of(store, c, cache) for c in files]
        t["published_bytes"] = sum(s for s in sizes if s is not None)
        steps = max(0, t["leaf_count"] - 1)  # leaf 0 is the start state; one leaf per inner step after it
        t["steps"] = steps
        t["allreduce_bytes"] = allreduce_bytes(k, params, steps) if params and k > 1 and steps else None
        published += t["published_bytes"]
        baseline += t["allreduce_bytes"] or 0
    txs = {ev.tx_hash for ev in mine}
    r["transactions"] = len(txs)
    r["gas_used"] = sum(gas_of(chain, tx, cache) for tx in txs)
    r["published_bytes"] = published
    r["allreduce_bytes"] = baseline or None
    r["eval_loss"] = None
    if r["phase"] == "finalized":
        r["eval_loss"] = eval_loss(chain, store, run_id, r["model_cid"], bytes.fromhex(r["model_digest"][2:]),
                                   cache, eval_rows)
    r["events"] = [event_json(ev) for ev in mine if ev.name in NOTABLE]
    # a terminal epoch changes only through transactions, and each emits an event of it: keyed by their count
    done = Phase(r["phase_code"]) in TERMINAL
    if done and params is not None and (r["eval_loss"] is not None or eval_rows <= 0 or r["phase"] != "finalized"):
        cache.epochs[e] = (len(mine), r)
    return r


def gather(chain: Chain, store: Store, run_id: int, cache: Cache | None = None, eval_rows: int = 64) -> dict[str, Any]:
    """The dashboard's whole view of a run, as JSON-able data (`/api/run.json`)."""
    cache = cache if cache is not None else Cache()
    info = chain.run_info(run_id)
    schedule = run_schedule(info, store)
    overall = run_state(chain, info, schedule)
    events = run_events(chain, run_id, cache)
    params = _n_params(chain, store, run_id, cache)
    epochs = [epoch_facts(chain, store, run_id, e, events, cache, params, eval_rows) for e in range(info.next_epoch)]
    p = info.params
    g0 = eval_loss(chain, store, run_id, p.init_model_cid, p.init_model_digest, cache, eval_rows)
    curve = ([{"epoch": -1, "eval_loss": g0, "model_cid": p.init_model_cid}] if g0 is not None else [])
    curve += [{"epoch": r["epoch"], "eval_loss": r["eval_loss"], "model_cid": r["model_cid"]}
              for r in epochs if r["eval_loss"] is not None]
    trainers = sorted({t["address"] for r in epochs for t in r["trainers"]})
    verdicts = [v for r in epochs for t in r["trainers"] for v in t["verdicts"]]
    slashes = [event_json(ev) for ev in events if ev.name in SLASHES]
    txs = {ev.tx_hash for ev in events}
    published = sum(r["published_bytes"] for r in epochs)
    baseline = sum(r["allreduce_bytes"] or 0 for r in epochs)
    data: dict[str, Any] = {
        "run_id": run_id,
        "contract": chain.address,
        "chain_id": chain.chain_id,
        "rpc_url": chain.where,
        "store": store.where,
        "generated_at": int(time.time()),
        "chain_time": chain.now(),
        "state": overall["state"],
        "summary": overall["text"],
        "epochs_total": schedule.epochs if schedule is not None else None,
        "epochs_opened": info.next_epoch,
        "epochs_finalized": sum(r["phase"] == "finalized" for r in epochs),
        "params": params,
        "eval_rows": eval_rows,
        "evaluating": bool(cache.queued),  # figures that need torch still being computed beside the page
        "run": {
            "config_cid": p.config_cid, "config_digest": "0x" + p.config_digest.hex(),
            "init_model_cid": p.init_model_cid, "coordinator": p.coordinator, "creator": info.creator,
            "active_trainers": info.active_trainers, "max_trainers": p.max_trainers,
            "verifiers": info.verifier_count, "quorum": p.quorum, "audit_steps": p.audit_steps,
            "pool_wei": int(info.pool),
        },
        "trainers": trainers,
        "accounts": run_accounts(info.params.coordinator, trainers, events),
        "loss_curve": curve,
        "totals": {
            "transactions": len(txs),
            "gas_used": sum(gas_of(chain, tx, cache) for tx in txs),
            "verdicts_pass": sum(v["passed"] for v in verdicts),
            "verdicts_fail": sum(not v["passed"] for v in verdicts),
            "slashes": len(slashes),
            "slashed_wei": sum(int(s["args"].get("amount", 0)) for s in slashes),
            "published_bytes": published,
            "allreduce_bytes": baseline or None,
            "allreduce_over_published": round(baseline / published, 2) if baseline and published else None,
        },
        "slashes": slashes,
        "epochs": epochs,
    }
    data["cids"] = sorted(cids_of(data))
    return data


def run_accounts(coordinator: str, trainers: list[str], events: list[ChainEvent]) -> list[str]:
    """Every account that took a part in the run (its coordinator, trainers and verifiers): whose earnings
    the page links (veriloco/dashweb.py, from veriloco/earnings.py)."""
    joined = {str(ev.args.get("trainer") or ev.args.get("verifier") or "")
              for ev in events if ev.name in ("TrainerJoined", "VerifierJoined")}
    return sorted({coordinator, *trainers, *joined} - {""})


def cids_of(data: dict[str, Any]) -> set[str]:
    """Every CID the view names: the only content the dashboard serves from the store."""
    run = data["run"]
    out = {run["config_cid"], run["init_model_cid"]}
    for r in data["epochs"]:
        out.add(r["model_cid"])
        for t in r["trainers"]:
            out |= {t["payload_cid"], t["manifest_cid"], *t.get("state_cids", [])}
        for ev in r["events"]:
            out |= {ev["args"][k] for k in CID_ARGS if isinstance(ev["args"].get(k), str)}
    out.discard("")
    return out
