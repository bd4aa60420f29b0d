"""`veriloco dashboard --run ID`: a local web page of a run, from the chain and the store alone.

    /               one HTML page (inline CSS and SVG, no scripts or external assets), reloading itself
    /api/run.json   the same data as JSON (veriloco/dashboard.py `gather`)
    /cid/<cid>      content the page links to, served from the store (only CIDs the run names)
    /earnings/<address>           every reward, bounty and slash of an account in this run (`veriloco
    /api/earnings/<address>.json  earnings`'s report, veriloco/earnings.py); every address on the page links here

The server binds 127.0.0.1 only. A view older than `--refresh` seconds is gathered again on the next
request; requests meanwhile share it.
"""

from __future__ import annotations

import argparse
import html
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from protocol.errors import VerilocoError
from veriloco.argtypes import non_negative, positive, run_id, tcp_port
from veriloco.chaincmds import SLASH_REASONS
from veriloco.dashboard import Cache, gather

Gather = Callable[[], dict[str, Any]]


class View:
    """The newest gathered view, refreshed at most every `max_age` seconds (one gatherer at a time), and
    an account's earnings in the run on request (`earnings_fn`; under the same lock: one chain client).

    `get` waits for a fresh view (the JSON API: a client wants data); `peek` never waits, so the page
    is served from the first second and fills in once the run's history is read (a long run's first
    gather reads every epoch's events and files: minutes)."""

    def __init__(self, gather_fn: Gather, max_age: float,
                 earnings_fn: Callable[[str], dict[str, Any]] | None = None) -> None:
        self.gather_fn, self.max_age, self.earnings_fn = gather_fn, max_age, earnings_fn
        self._lock = threading.Lock()  # one chain client: gathers and earnings one at a time
        self._state = threading.Lock()  # guards the fields below
        self._data: dict[str, Any] | None = None
        self._at = 0.0
        self._error: VerilocoError | None = None  # the last gather's, while it left no view
        self._busy = False  # a background gather is running

    def _stale(self) -> bool:
        return self._data is None or time.monotonic() - self._at >= self.max_age

    def _gather(self) -> dict[str, Any]:  # under self._lock
        if self._stale():
            data = self.gather_fn()
            with self._state:
                self._data, self._at, self._error = data, time.monotonic(), None
        assert self._data is not None
        return self._data

    def get(self) -> dict[str, Any]:
        with self._lock:
            return self._gather()

    def peek(self) -> dict[str, Any] | None:
        """The newest view without waiting (None before the first); a missing or stale one is gathered in
        the background. Raises the last gather's error while there is no view to show."""
        with self._state:
            data, error, start = self._data, self._error, self._stale() and not self._busy
            self._busy = self._busy or start
        if start:
            threading.Thread(target=self._background, name="dashboard-gather", daemon=True).start()
        if data is None and error is not None:
            raise error
        return data

    def _background(self) -> None:
        try:
            with self._lock:
                self._gather()
        except (VerilocoError, OSError) as exc:  # the chain or the store is unreachable: the page says so
            with self._state:
                self._error = exc if isinstance(exc, VerilocoError) else VerilocoError(f"{type(exc).__name__}: {exc}")
        finally:
            with self._state:
                self._busy = False

    def earnings(self, account: str) -> dict[str, Any] | None:
        """`veriloco earnings --run ID --address ACCOUNT`'s report, or None if this view has no chain for it."""
        if self.earnings_fn is None:
            return None
        with self._lock:
            return self.earnings_fn(account)


def run_view(chain: Any, store: Any, run: int, max_age: float, eval_rows: int = 64) -> View:
    """A run's view: `gather` with its cache, and each account's earnings in the run (veriloco/earnings.py)."""
    from veriloco.earnings import earnings

    cache = Cache()
    return View(lambda: gather(chain, store, run, cache, eval_rows=eval_rows), max_age,
                earnings_fn=lambda account: earnings(chain, account, run))


# ---------------------------------------------------------------- the page


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _cid(cid: str) -> str:
    return f'<a class="cid" href="/cid/{_e(cid)}" title="{_e(cid)}">{_e(cid[:8])}…{_e(cid[-4:])}</a>' if cid else "-"


def _files(cids: list[str]) -> str:
    """A list of CID links, folded (an audit publishes several states)."""
    if not cids:
        return "-"
    return f'<details><summary>{len(cids)} files</summary>{"<br>".join(_cid(c) for c in cids)}</details>'


def _eth(wei: Any) -> str:
    return f"{int(wei) / 1e18:g} ETH" if isinstance(wei, int) else "-"


def _addr(a: str) -> str:
    """A short address, linked to its earnings in this run."""
    return f'<a href="/earnings/{_e(a)}" title="{_e(a)}: earnings">{_e(a[:8])}…{_e(a[-4:])}</a>' if a else "-"


def _n(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) else ("-" if v is None else _e(v))


def _time(ts: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts)) if ts else "-"


def loss_svg(curve: list[dict[str, Any]], w: int = 560, h: int = 220) -> str:
    """The global model's eval loss per epoch as an inline SVG line chart."""
    pts = [(c["epoch"], c["eval_loss"]) for c in curve if c.get("eval_loss") is not None]
    if not pts:
        return '<p class="dim">no finalized model evaluated yet</p>'
    pad = 40
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(ys), max(ys) if max(ys) > min(ys) else min(ys) + 1

    def at(x: float, y: float) -> tuple[float, float]:
        return (pad + (x - x0) / (x1 - x0) * (w - 2 * pad), h - pad - (y - y0) / (y1 - y0) * (h - 2 * pad))

    coords = [at(x, y) for x, y in pts]
    line = " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy in coords)
    dots = "".join(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5"><title>epoch {x}: {y}</title></circle>'
                   f'<text x="{cx:.1f}" y="{cy - 8:.1f}" text-anchor="middle">{y:.3f}</text>'
                   for (cx, cy), (x, y) in zip(coords, pts))
    ticks = "".join(f'<text x="{at(x, y0)[0]:.1f}" y="{h - pad + 16}" text-anchor="middle">'
                    f'{"G0" if x < 0 else x}</text>' for x in xs)
    return (f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="global eval loss">'
            f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" class="axis"/>'
            f'<line x1="{pad}" y1="{pad / 2}" x2="{pad}" y2="{h - pad}" class="axis"/>'
            f'<polyline points="{line}" fill="none"/>{dots}{ticks}'
            f'<text x="{w / 2}" y="{h - 4}" text-anchor="middle" class="dim">epoch (G0: initial model)</text></svg>')


CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:18px 24px;color:#1d232a;background:#f7f8fa}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 8px}
.dim{color:#6b7480}.cards{display:flex;gap:10px;flex-wrap:wrap;margin:12px 0}
.card{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:8px 12px;min-width:120px}
.card b{display:block;font-size:18px}table{border-collapse:collapse;background:#fff;margin-bottom:8px}
td,th{border:1px solid #dde1e6;padding:3px 8px;text-align:left;font-size:13px}th{background:#eef1f4}
td.r{text-align:right}.pass{color:#1a7f37}.fail{color:#c62828;font-weight:600}.cid{font-family:monospace}
.phase{font-weight:600;text-transform:uppercase}svg polyline{stroke:#2f6fdb;stroke-width:2}
svg circle{fill:#2f6fdb}svg text{font-size:11px}svg .axis{stroke:#9aa3ad}
"""


def _epoch_html(r: dict[str, Any]) -> str:
    rows = []
    for t in r["trainers"]:
        votes = " ".join(f'<span class="{"pass" if v["passed"] else "fail"}" title="{_e(v["verifier"])}">'
                         f'{"✓" if v["passed"] else "✗"}</span>' for v in t["verdicts"]) or "-"
        cls = "pass" if t["outcome"] == "passed" else ("fail" if "fail" in t["outcome"] or "slash" in t["outcome"] else "")
        rows.append(
            f'<tr><td>{t["slot"]}</td><td>{_addr(t["address"])}</td><td>{_e(t["state"])}</td>'
            f'<td class="r">{t["steps"] or "-"}</td><td class="cid">{_e(t["trace_root"][:12]) or "-"}</td>'
            f'<td>{_cid(t["payload_cid"])}</td><td>{_cid(t["manifest_cid"])}</td>'
            f'<td>{_files(t.get("state_cids", []))}</td>'
            f'<td>{votes}</td><td class="{cls}">{_e(t["outcome"])}</td>'
            f'<td class="r">{_n(t["published_bytes"])}</td><td class="r">{_n(t["allreduce_bytes"])}</td></tr>')
    events = "".join(f'<li>{_e(ev["name"])} {_e(json.dumps(ev["args"], default=str))}</li>' for ev in r["events"])
    loss = f' · eval loss <b>{r["eval_loss"]}</b>' if r.get("eval_loss") is not None else ""
    return (
        f'<h2>epoch {r["epoch"]} <span class="phase">{_e(r["phase"])}</span></h2>'
        f'<p>committed {r["committed"]}/{r["expected"]} · revealed {r["revealed"]} · responded {r["responded"]} · '
        f'passed {r["passed"]} · failed {r["failed"]} · model {_cid(r["model_cid"])}{loss} · '
        f'{r["transactions"]} txs, gas {_n(r["gas_used"])} · opened {_time(r["deadlines"]["opened_at"])} '
        f'done {_time(r["deadlines"]["done_at"])} (chain time, UTC)</p>'
        '<table><tr><th>slot</th><th>trainer</th><th>state</th><th>steps</th><th>trace root</th><th>payload</th>'
        '<th>manifest</th><th>audit states</th><th>verdicts</th><th>outcome</th><th>published bytes</th>'
        f'<th>AllReduce bytes</th></tr>{"".join(rows) or "<tr><td colspan=12>no trainers</td></tr>"}</table>'
        + (f'<details><summary>{len(r["events"])} events</summary><ul>{events}</ul></details>' if events else "")
    )


def loading_page(refresh_s: int = 5) -> str:
    """What the page shows until the run's history is read (it reloads itself until then)."""
    return (f'<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{int(refresh_s)}">'
            "<title>veriloco: reading the run</title></head><body><h1>Reading the run</h1><p>The dashboard is reading "
            "the run's events and files from the chain and the store; this page fills in when it has them "
            f"(it reloads every {int(refresh_s)} s).</p></body></html>")


def render(d: dict[str, Any], refresh_s: int = 5) -> str:
    """The dashboard page for `gather`'s data; it reloads itself every `refresh_s` seconds."""
    t, run = d["totals"], d["run"]
    ratio = (f'{t["allreduce_over_published"]}x' if t["allreduce_over_published"] is not None else "-")
    cards = [
        ("state", d["state"]), ("epochs finalized", f'{d["epochs_finalized"]}/{d["epochs_total"] or "?"}'),
        ("trainers", f'{run["active_trainers"]}/{run["max_trainers"]}'), ("verifiers", run["verifiers"]),
        ("verdicts", f'{t["verdicts_pass"]} pass, {t["verdicts_fail"]} fail'), ("slashes", f'{t["slashes"]} ({_eth(t["slashed_wei"])})' if t["slashes"] else "0"),
        ("transactions", _n(t["transactions"])), ("gas used", _n(t["gas_used"])),
        ("bytes published", _n(t["published_bytes"])), ("AllReduce bytes", _n(t["allreduce_bytes"])),
        ("AllReduce / published", ratio),
    ]
    slashes = "".join(
        f'<li>epoch {_e(s["args"].get("epoch"))}: '
        + (f'verifier {_addr(s["args"]["verifier"])} (outvoted on trainer {_addr(s["args"].get("trainer") or "")})'
           if s["name"] == "VerifierSlashed" else
           f'trainer {_addr(s["args"].get("trainer") or "")} ({_e(SLASH_REASONS.get(s["args"].get("reason"), "?"))})')
        + f' lost {_eth(s["args"].get("amount"))}</li>' for s in d["slashes"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{int(refresh_s)}">
<title>veriloco run {d["run_id"]}</title><style>{CSS}</style></head><body>
<h1>veriloco run {d["run_id"]} — {_e(d["summary"])}</h1>
<div class="dim">contract {_e(d["contract"])} on chain {d["chain_id"]} ({_e(d["rpc_url"])}) · {_e(d["store"])} ·
config {_cid(run["config_cid"])} · initial model {_cid(run["init_model_cid"])} · coordinator {_addr(run["coordinator"])} ·
quorum {run["quorum"]} · audit steps {run["audit_steps"]} · updated {_time(d["generated_at"])} UTC ·
<a href="/api/run.json">run.json</a></div>
<div class="cards">{"".join(f'<div class="card"><span class="dim">{_e(k)}</span><b>{_e(v)}</b></div>' for k, v in cards)}</div>
<h2>global model eval loss <span class="dim">({d["eval_rows"]} validation rows, recomputed from the store{"; evaluating, the page fills in as it refreshes" if d.get("evaluating") else ""})</span></h2>
{loss_svg(d["loss_curve"])}
<h2>slashes</h2>{f"<ul>{slashes}</ul>" if slashes else '<p class="dim">nobody slashed</p>'}
<h2>earnings <span class="dim">(each account's rewards, bounties and slashes in this run, from the contract's
events: <code>veriloco earnings --run {d["run_id"]} --address …</code>)</span></h2>
<p>{" · ".join(_addr(a) for a in d.get("accounts", [])) or '<span class="dim">no members yet</span>'}</p>
{"".join(_epoch_html(r) for r in reversed(d["epochs"]))}
<p class="dim">Bytes are what each trainer published to the store (payload, audit manifest, audit states), against
a ring AllReduce of fp32 gradients for the steps it trained; downloads are on the nodes' metrics.</p>
</body></html>
"""


# ---------------------------------------------------------------- the server


def earnings_page(r: dict[str, Any], run_id: Any) -> str:
    """An account's earnings in the run: `veriloco earnings`'s own table (veriloco/earnings.py `render`)."""
    from veriloco.earnings import render as render_earnings

    a = r["account"]
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>earnings of {_e(a)}</title>'
            f'<style>{CSS}</style></head><body><h1>earnings of {_e(a)} in run {_e(run_id)}</h1>'
            f'<p class="dim"><a href="/">the run</a> · <a href="/api/earnings/{_e(a)}.json">JSON</a> · the same as '
            f'<code>veriloco earnings --run {_e(run_id)} --address {_e(a)}</code></p>'
            f'<pre>{_e(render_earnings(r))}</pre></body></html>')


def _account(text: str) -> str | None:
    """The checksummed address in a request path, or None."""
    from eth_utils import is_address, to_checksum_address

    return str(to_checksum_address(text)) if text.startswith("0x") and is_address(text) else None


def make_handler(view: View, store: Any, refresh_s: int) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # a request per refresh: not worth a line each

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
                if path == "/":
                    d = view.peek()
                    self._send(200, (render(d, refresh_s) if d is not None else loading_page(refresh_s)).encode(),
                               "text/html; charset=utf-8")
                elif path == "/api/run.json":
                    self._send(200, json.dumps(view.get(), indent=1).encode(), "application/json")
                elif path.startswith("/cid/"):
                    cid = path[5:]
                    if cid not in view.get()["cids"]:
                        self._send(404, f"{cid} is not a CID of this run\n".encode(), "text/plain; charset=utf-8")
                        return
                    data = store.get(cid)
                    json_like = data[:1] in (b"{", b"[")
                    self._send(200, data, "text/plain; charset=utf-8" if json_like else "application/octet-stream")
                elif path.startswith(("/earnings/", "/api/earnings/")):
                    self._earnings(path)
                else:
                    self._send(404, b"not found: try / or /api/run.json\n", "text/plain; charset=utf-8")
            except VerilocoError as exc:  # the chain or the store is unreachable: say so, keep serving
                self._send(503, f"{type(exc).__name__}: {exc}\n".encode(), "text/plain; charset=utf-8")

        def _earnings(self, path: str) -> None:
            as_json = path.startswith("/api/")
            text = path.rsplit("/", 1)[1].removesuffix(".json") if as_json else path.rsplit("/", 1)[1]
            account = _account(text)
            if account is None:
                self._send(404, f"{text} is not an address (0x and 40 hex digits)\n".encode(), "text/plain; charset=utf-8")
                return
            r = view.earnings(account)
            if r is None:
                self._send(404, b"this dashboard reports no earnings\n", "text/plain; charset=utf-8")
            elif as_json:
                self._send(200, json.dumps(r, indent=1).encode(), "application/json")
            else:
                self._send(200, earnings_page(r, r["run_id"]).encode(), "text/html; charset=utf-8")

    return Handler


def serve(view: View, store: Any, port: int = 0, refresh_s: int = 5) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1:`port` (0: any free port; see `.server_address`), not yet serving."""
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(view, store, refresh_s))
    server.daemon_threads = True
    return server


def start_dashboard(chain: Any, store: Any, run: int, port: int, refresh_s: int = 5, eval_rows: int = 64) -> ThreadingHTTPServer:
    """Serve a run's dashboard from a daemon thread (the demo's --dashboard); `.shutdown()` stops it."""
    try:
        server = serve(run_view(chain, store, run, refresh_s / 2, eval_rows), store, port, refresh_s)
    except OSError as exc:
        raise DashboardError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}; pick another port") from None
    threading.Thread(target=server.serve_forever, name="dashboard", daemon=True).start()
    return server


def cmd_dashboard(args: argparse.Namespace) -> int:
    from protocol.chain.binding import Chain
    from protocol.statedir import check_run
    from veriloco.settings import open_store, resolve

    s = resolve(args, need_key=False, need_contract=True)
    chain = Chain(s.rpc_url, str(s.contract))
    check_run(chain, args.run)
    store = open_store(s)
    view = run_view(chain, store, args.run, args.refresh / 2, args.eval_rows)
    try:
        server = serve(view, store, args.port, args.refresh)
    except OSError as exc:
        raise DashboardError(f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}; pick another --port") from None
    view.peek()  # the first gather starts now, in the background: the port is open meanwhile
    port = server.server_address[1]
    print(f"dashboard of run {args.run}: http://127.0.0.1:{port}/  (JSON: http://127.0.0.1:{port}/api/run.json; Ctrl-C stops)",
          flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


class DashboardError(VerilocoError):
    """The dashboard cannot serve (its port is taken)."""


def register(sub: Any) -> None:
    from veriloco.settings import add_connection_args

    d = sub.add_parser("dashboard", help="serve a live web page of a run on 127.0.0.1, from the chain and the store")
    d.add_argument("--run", type=run_id, required=True, help="run id")
    d.add_argument("--port", type=tcp_port, default=8600, help="port on 127.0.0.1 (0: any free port; default 8600)")
    d.add_argument("--refresh", type=positive, default=5, help="seconds between page reloads (default 5)")
    d.add_argument("--eval-rows", type=non_negative, default=64,
                   help="validation rows to evaluate each finalized model on (0: no loss curve; default 64)")
    add_connection_args(d, signing=False)
    d.set_defaults(func=cmd_dashboard)
