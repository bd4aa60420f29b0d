"""The window-root channel over real HTTP on loopback (issue 48): authenticated, bounded, checked by the reader."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest
from eth_account import Account

from protocol import relay
from protocol.digest import keccak
from public import relaynet

KEYS = [keccak(bytes([i + 7])) for i in range(3)]
TRAINERS = [Account.from_key(k).address for k in KEYS]
DOMAIN = relay.Domain(1337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0", 2, 5)


@pytest.fixture
def served() -> Iterator[tuple[relaynet.Relay, str]]:
    r = relaynet.Relay(lambda d: relaynet.EpochFacts(TRAINERS, 4) if d == DOMAIN else None)
    server = relaynet.start(r)
    try:
        yield r, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def post_raw(url: str, body: bytes, length: str | None = None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    c.putrequest("POST", "/v1/window")
    c.putheader("Content-Length", length if length is not None else str(len(body)))
    c.endheaders()
    if length is None:
        c.send(body)
    resp = c.getresponse()
    out = resp.status, json.loads(resp.read())
    c.close()
    return out


def test_trainers_send_roots_and_get_proofs_the_client_checks(served: tuple[relaynet.Relay, str]) -> None:
    _, url = served
    client = relaynet.RelayClient(url)
    msgs = [relay.sign_root(k, DOMAIN, 1, keccak(b"w1" + bytes([i]))) for i, k in enumerate(KEYS[:2])]
    assert [client.send(m) for m in msgs] == [True, True]
    assert client.send(msgs[0]) is False  # a retry is harmless
    for i, m in enumerate(msgs):
        inc = client.inclusion(m)
        assert inc.position == i and inc.bitmap == 0b011 and inc.trainers == 3
    with pytest.raises(relay.RelayError, match="not in window"):  # the third trainer sent nothing
        client.inclusion(relay.sign_root(KEYS[2], DOMAIN, 1, keccak(b"never sent")))


def test_a_relay_that_lies_about_a_proof_is_caught_by_the_trainer(served: tuple[relaynet.Relay, str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    r, url = served
    client = relaynet.RelayClient(url)
    mine = relay.sign_root(KEYS[0], DOMAIN, 0, keccak(b"mine"))
    client.send(mine)
    real = r.aggregate
    forged_root = keccak(b"a root without my leaf")
    monkeypatch.setattr(r, "aggregate", lambda d, w: relay.Aggregate(w, forged_root, 1, real(d, w).leaves))
    with pytest.raises(relay.RelayError, match="does not hold"):
        client.inclusion(mine)


def test_bad_input_gets_a_status_and_a_reason_and_loses_nothing(served: tuple[relaynet.Relay, str]) -> None:
    r, url = served
    client = relaynet.RelayClient(url)
    good = relay.sign_root(KEYS[1], DOMAIN, 2, keccak(b"good"))
    client.send(good)
    assert post_raw(url, b"x", length=str(relay.MAX_MESSAGE_BYTES + 1))[0] == 413  # refused unread
    assert post_raw(url, b"", length="nope")[0] == 413
    code, doc = post_raw(url, b"{oops")
    assert code == 400 and "JSON" in doc["error"]
    other = relay.Domain(DOMAIN.chain_id, DOMAIN.contract, DOMAIN.run_id, DOMAIN.epoch + 1)
    with pytest.raises(relay.RelayError, match="404"):
        client.send(relay.sign_root(KEYS[1], other, 0, keccak(b"x")))
    with pytest.raises(relay.Equivocated, match="409"):
        client.send(relay.sign_root(KEYS[1], DOMAIN, 2, keccak(b"second")))
    ev = json.loads(http_get(url, f"/v1/equivocations/1337/{DOMAIN.contract}/2/5"))["equivocations"]
    assert len(ev) == 1 and relay.from_wire(ev[0][1].encode()).root == keccak(b"second")
    with pytest.raises(relay.RateLimited, match="429"):
        for w in range(4):
            for _ in range(3):
                client.send(relay.sign_root(KEYS[2], DOMAIN, w, keccak(b"flood")))
    assert r.aggregate(DOMAIN, 2).included(1)  # the first root stands through all of it
    assert relaynet.RelayClient(url).inclusion(good).position == 1


def http_get(url: str, path: str) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    c.request("GET", path)
    body = c.getresponse().read()
    c.close()
    return body


def test_an_unreachable_relay_says_so_so_the_trainer_posts_itself() -> None:
    with pytest.raises(relaynet.RelayUnavailable, match="unreachable"):
        relaynet.RelayClient("http://127.0.0.1:9", timeout_s=2).send(relay.sign_root(KEYS[0], DOMAIN, 0, keccak(b"r")))
