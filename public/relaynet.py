"""The window-root channel (issue 48): a relay's HTTP endpoint and a trainer's client for it.

The coordinator serves it by default (any staked member may after a deadline); trainers send their
signed window roots (`protocol.relay`) and fetch the proof of their leaf in each window's aggregate.
HTTP works between machines; everything a relay says is checked by the reader: a message is
authenticated by its signature, not by the connection, and a proof by `verify_inclusion`, so a lying
relay can withhold (the trainer then posts its root itself) but not forge.

    POST /v1/window                                     a signed root (at most 1,024 bytes)
    GET  /v1/aggregate/CHAIN/CONTRACT/RUN/EPOCH/WINDOW  the window's root and inclusion bitmap
    GET  /v1/proof/CHAIN/CONTRACT/RUN/EPOCH/WINDOW/TRAINER
    GET  /v1/equivocations/CHAIN/CONTRACT/RUN/EPOCH     every pair of different roots one trainer signed

Statuses: 400 malformed or unauthenticated, 404 a run or epoch this relay does not collect, 409
equivocation (kept as evidence), 413 too large (refused unread), 429 over the trainer's budget.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from eth_utils import is_address, to_checksum_address

from protocol import relay
from protocol.errors import VerilocoError
from protocol.relay import Aggregate, Domain, RelayError, SignedRoot, WindowBook
from protocol.types import Digest


class RelayUnavailable(VerilocoError):
    """The relay could not be reached or failed: the trainer posts its window root itself."""


@dataclass(frozen=True)
class EpochFacts:
    """What a relay needs to collect an epoch's roots: the trainer eligible at each contract slot ("" where
    none is) and the epoch's window count."""

    positions: Sequence[str]
    windows: int


class Relay:
    """One WindowBook per epoch, opened on first use from `facts` (None: not an epoch this relay
    collects). Thread-safe: the HTTP server calls it from several threads."""

    def __init__(self, facts: Callable[[Domain], EpochFacts | None], clock: Callable[[], float] = time.monotonic) -> None:
        self._facts, self._clock = facts, clock
        self._books: dict[Domain, tuple[WindowBook, int]] = {}
        self._first: dict[tuple[Domain, int], float] = {}  # when each window's first root arrived
        self._posted: set[tuple[Domain, int]] = set()
        self._lock = threading.Lock()

    def _book(self, domain: Domain) -> tuple[WindowBook, int]:
        if domain not in self._books:
            f = self._facts(domain)
            if f is None:
                raise LookupError(f"this relay does not collect run {domain.run_id} epoch {domain.epoch} "
                                  f"of {domain.contract} on chain {domain.chain_id}")
            self._books[domain] = (WindowBook(domain, list(f.positions), self._clock), f.windows)
        return self._books[domain]

    def submit(self, raw: bytes) -> tuple[SignedRoot, bool]:
        msg = relay.from_wire(raw)
        with self._lock:
            book, n = self._book(msg.domain)
            new = book.accept(msg, n)
            if (msg.domain, msg.window) not in self._posted:
                self._first.setdefault((msg.domain, msg.window), self._clock())
            return msg, new

    def ready(self, wait_s: float) -> list[tuple[Domain, int]]:
        """Windows to post now: every trainer's root is in, or the first arrived `wait_s` ago."""
        now, out = self._clock(), []
        with self._lock:
            for (domain, w), first in sorted(self._first.items(), key=lambda kv: kv[1]):
                book = self._books[domain][0]
                if now - first >= wait_s or book.complete(w):
                    out.append((domain, w))
        return out

    def evidence(self, domain: Domain, window: int) -> bytes:
        with self._lock:
            return self._book(domain)[0].evidence(window)

    def forget(self, domain: Domain, window: int) -> None:
        """A posted window: later roots for it are still kept (as evidence) but never posted again."""
        with self._lock:
            self._first.pop((domain, window), None)
            self._posted.add((domain, window))

    def aggregate(self, domain: Domain, window: int) -> Aggregate:
        with self._lock:
            book, n = self._book(domain)
            if not 0 <= window < n:
                raise RelayError(f"window {window} outside 0..{n - 1}")
            return book.aggregate(window)

    def equivocations(self, domain: Domain) -> list[relay.Equivocation]:
        with self._lock:
            return list(self._book(domain)[0].equivocations)

    def positions(self, domain: Domain) -> list[str]:
        with self._lock:
            return [to_checksum_address(t) if t else "" for t in self._book(domain)[0].positions]


class RelayPoster:
    """The relay's chain side: each window's aggregate posted once (with its evidence published to the
    store first), when every trainer's root is in or `wait_s` after the first arrived. Late roots are
    not posted again: their trainers post their own (`trainer/windowpost.py`)."""

    def __init__(self, r: Relay, chain: Any, store: Any, wait_s: float, log: Callable[..., None] | None = None) -> None:
        self.relay, self.chain, self.store, self.wait_s = r, chain, store, wait_s
        self.log = log or (lambda event, **kv: None)
        self.posted: dict[tuple[Domain, int], str] = {}  # -> transaction hash

    def poll(self) -> list[tuple[Domain, int]]:
        done = []
        for domain, w in self.relay.ready(self.wait_s):
            agg = self.relay.aggregate(domain, w)
            cid = self.store.put(self.relay.evidence(domain, w))
            tx = self.chain.post_window(domain.run_id, domain.epoch, w, agg.root, agg.bitmap, len(agg.leaves), cid)
            self.relay.forget(domain, w)
            self.posted[(domain, w)] = tx.tx_hash
            self.log("window-posted", epoch=domain.epoch, window=w, included=agg.bitmap.bit_count(),
                     of=len(agg.leaves), gas=tx.gas_used)
            done.append((domain, w))
        return done


def _domain(parts: Sequence[str]) -> Domain:
    chain, contract, run, epoch = parts
    if not (chain.isdigit() and run.isdigit() and epoch.isdigit() and is_address(contract)):
        raise RelayError("a path names CHAIN/CONTRACT/RUN/EPOCH: three decimal numbers and an address")
    return Domain(int(chain), to_checksum_address(contract), int(run), int(epoch))


def make_handler(r: Relay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # one request per trainer and window: not worth a line each

        def _send(self, code: int, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if code == 429:
                self.send_header("Retry-After", "1")
            self.end_headers()
            self.wfile.write(body)

        def _error(self, exc: Exception) -> None:
            code = (429 if isinstance(exc, relay.RateLimited) else 409 if isinstance(exc, relay.Equivocated)
                    else 404 if isinstance(exc, LookupError) else 400)
            self._send(code, {"error": str(exc).strip("'\"")})

        def do_POST(self) -> None:
            if self.path != "/v1/window":
                self._send(404, {"error": "POST /v1/window only"})
                return
            try:
                size = int(self.headers.get("Content-Length", "-1"))
            except ValueError:
                size = -1
            if not 0 <= size <= relay.MAX_MESSAGE_BYTES:
                self.close_connection = True  # the body is not read: the connection cannot be reused
                self._send(413, {"error": f"a window-root message is 0..{relay.MAX_MESSAGE_BYTES} bytes with a "
                                          f"Content-Length, got {self.headers.get('Content-Length')}"})
                return
            try:
                msg, new = r.submit(self.rfile.read(size))
            except (RelayError, LookupError) as exc:
                self._error(exc)
                return
            self._send(200, {"trainer": msg.trainer, "window": msg.window, "new": new})

        def do_GET(self) -> None:
            parts = self.path.split("?", 1)[0].strip("/").split("/")
            try:
                if parts[:2] == ["v1", "aggregate"] and len(parts) == 7:
                    a = r.aggregate(_domain(parts[2:6]), _index(parts[6]))
                    self._send(200, {"window": a.window, "root": "0x" + a.root.hex(), "bitmap": hex(a.bitmap),
                                     "trainers": len(a.leaves)})
                elif parts[:2] == ["v1", "proof"] and len(parts) == 8:
                    domain, trainer = _domain(parts[2:6]), parts[7]
                    a = r.aggregate(domain, _index(parts[6]))
                    order = r.positions(domain)
                    if not is_address(trainer) or to_checksum_address(trainer) not in order:
                        raise LookupError(f"{trainer} is not a trainer of this epoch")
                    i = order.index(to_checksum_address(trainer))
                    self._send(200, {"window": a.window, "position": i, "root": "0x" + a.root.hex(),
                                     "bitmap": hex(a.bitmap), "trainers": len(a.leaves),
                                     "proof": ["0x" + p.hex() for p in a.proof(i)]})
                elif parts[:2] == ["v1", "equivocations"] and len(parts) == 6:
                    ev = r.equivocations(_domain(parts[2:6]))
                    self._send(200, {"equivocations": [[e.first.to_wire().decode(), e.second.to_wire().decode()]
                                                       for e in ev]})
                else:
                    self._send(404, {"error": "GET /v1/aggregate/..., /v1/proof/... or /v1/equivocations/..."})
            except (RelayError, LookupError) as exc:
                self._error(exc)

    return Handler


def _index(text: str) -> int:
    if not text.isdigit():
        raise RelayError(f"a window is a decimal number, got {text!r}")
    return int(text)


def serve(r: Relay, port: int = 0) -> ThreadingHTTPServer:
    """The relay's HTTP server on 127.0.0.1:`port` (0: any free port), not yet serving."""
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(r))
    server.daemon_threads = True
    return server


def start(r: Relay, port: int = 0) -> ThreadingHTTPServer:
    """Serve from a daemon thread; `.shutdown()` stops it, `.server_address` says where it listens."""
    server = serve(r, port)
    threading.Thread(target=server.serve_forever, name="relay", daemon=True).start()
    return server


@dataclass(frozen=True)
class Inclusion:
    """A trainer's leaf in a window's aggregate, checked against the relay's own root."""

    window: int
    position: int
    root: Digest
    bitmap: int
    trainers: int
    proof: tuple[Digest, ...]


class RelayClient:
    """A trainer's side of the channel. Every answer is checked: a relay can refuse or withhold, never
    make the trainer accept a proof that does not hold."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def _call(self, path: str, body: bytes | None = None) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path, data=body, method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "application/json"} if body is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read(1 << 20)
        except urllib.error.HTTPError as exc:
            try:
                why = json.loads(exc.read(1 << 16)).get("error", "")
            except (ValueError, AttributeError):
                why = ""
            if exc.code >= 500:
                raise RelayUnavailable(f"the relay at {self.url} failed ({exc.code}): {why}") from None
            kind = {429: relay.RateLimited, 409: relay.Equivocated}.get(exc.code, RelayError)
            raise kind(f"the relay at {self.url} refused ({exc.code}): {why}") from None
        except (OSError, urllib.error.URLError) as exc:
            raise RelayUnavailable(f"the relay at {self.url} is unreachable: {exc}") from None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise RelayUnavailable(f"the relay at {self.url} answered something that is not JSON") from None
        if not isinstance(doc, dict):
            raise RelayUnavailable(f"the relay at {self.url} answered something that is not a JSON object")
        return doc

    def send(self, msg: SignedRoot) -> bool:
        """Deliver a signed root; True when the relay had not held it yet."""
        return bool(self._call("/v1/window", msg.to_wire()).get("new"))

    def inclusion(self, msg: SignedRoot) -> Inclusion:
        """The proof of `msg`'s leaf in its window's aggregate, verified here."""
        d = msg.domain
        doc = self._call(f"/v1/proof/{d.chain_id}/{d.contract}/{d.run_id}/{d.epoch}/{msg.window}/{msg.trainer}")
        try:
            inc = Inclusion(int(doc["window"]), int(doc["position"]), Digest(bytes.fromhex(doc["root"][2:])),
                            int(doc["bitmap"], 16), int(doc["trainers"]),
                            tuple(Digest(bytes.fromhex(p[2:])) for p in doc["proof"]))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise RelayUnavailable(f"the relay at {self.url} sent a malformed proof") from None
        if inc.window != msg.window or not relay.verify_inclusion(inc.root, inc.bitmap, inc.trainers, inc.position,
                                                                  msg.trainer, msg.root, inc.proof):
            raise RelayError(f"the relay at {self.url} sent a proof that does not hold for window {msg.window}: "
                             "post the root directly")
        return inc
