"""One store suite over both backends: LocalStore (a directory) and IpfsStore (a real js-ipfs node).

Both must name content exactly as the node's own `ipfs add` does, return only verified bytes, and
fail with a StoreError subclass that names the CID for corrupt, missing, oversized or unreachable
content.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import ipfshttpclient
import numpy as np
import pytest
import torch

from devnet.ipfsnode import IpfsNode, free_port
from protocol.digest import keccak, state_digest
from protocol.formats import codec as formats
from protocol.store.backends import (
    IntegrityError,
    IpfsStore,
    LocalStore,
    NotFound,
    Store,
    StoreError,
    StoreUnavailable,
    TooLarge,
)
from protocol.store.unixfs import CHUNK_SIZE, cid_of
from tests.fixtures.ipfs import ipfs_node  # noqa: F401 - fixture

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:The .strict. parameter:FutureWarning"),
]

ROOT = Path(__file__).resolve().parents[2]


def _pattern(n: int, seed: int = 0) -> bytes:
    x = np.arange(n, dtype=np.uint64) + np.uint64(seed * 7919)
    return (x * np.uint64(2654435761) >> np.uint64(7)).astype(np.uint8).tobytes()


@pytest.fixture(params=["local", "ipfs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "local":
        yield LocalStore(tmp_path / "store")
    else:
        node: IpfsNode = request.getfixturevalue("ipfs_node")
        s = IpfsStore(node.api, timeout=2.0)
        yield s
        s.close()


def _client(node: IpfsNode) -> ipfshttpclient.Client:
    return ipfshttpclient.Client(node.api, timeout=60)


@pytest.mark.parametrize("size", [0, 1, CHUNK_SIZE, CHUNK_SIZE + 1, 10 << 20])
def test_cids_equal_the_nodes_default_add(
    size: int, ipfs_node: IpfsNode, tmp_path: Path  # noqa: F811
) -> None:
    data = _pattern(size, seed=size)
    node_cid = _client(ipfs_node).add_bytes(data)  # the node's own default options
    assert LocalStore(tmp_path).put(data) == node_cid == cid_of(data)


def test_two_level_dag_cid_equals_the_nodes(ipfs_node: IpfsNode, tmp_path: Path) -> None:  # noqa: F811
    size = 175 * CHUNK_SIZE + 12345  # more than 174 chunks: the root links to two inner nodes
    path = tmp_path / "big.bin"
    path.write_bytes(_pattern(size, seed=3))
    node_cid = _client(ipfs_node).add(str(path))["Hash"]
    assert LocalStore(tmp_path / "s").put_file(path) == node_cid
    assert IpfsStore(ipfs_node.api).put_file(path) == node_cid


@pytest.mark.parametrize("size", [0, 5, 3 * CHUNK_SIZE + 7])
def test_round_trip(store: Store, size: int, tmp_path: Path) -> None:
    data = _pattern(size, seed=11 + size)
    cid = store.put(data)
    assert cid == cid_of(data)
    assert store.has(cid)
    store.pin(cid)
    assert store.get(cid) == data
    assert store.get(cid, digest=keccak(data)) == data
    out = tmp_path / "out.bin"
    seen: list[int] = []
    assert store.get_to_file(cid, out, progress=seen.append) == size
    assert out.read_bytes() == data
    assert not seen or seen[-1] == size
    assert store.put_stream(data[i : i + 1000] for i in range(0, size, 1000)) == cid


def test_state_file_published_and_fetched(store: Store, tmp_path: Path) -> None:
    state = {"param/w": torch.randn(300, 500), "meta/step": torch.tensor([3])}
    cid = store.put_stream(formats.iter_state(state))
    assert cid == cid_of(formats.save_state(state))
    path = tmp_path / "state.safetensors"
    store.get_to_file(cid, path)
    back = formats.load_state_file(path, expect=formats.spec_of(state))
    assert state_digest(back) == state_digest(state)
    assert formats.publish_state(store, state) == cid
    again = formats.fetch_state(store, cid, expect=formats.spec_of(state))
    assert state_digest(again) == state_digest(state)
    with pytest.raises(formats.FormatError, match="expected"):
        formats.fetch_state(store, cid, expect={**formats.spec_of(state), "meta/step": formats.TensorSpec(torch.int32, (1,))})
    with pytest.raises(TooLarge):
        formats.fetch_state(store, cid, max_bytes=1000)


def test_oversize_is_refused(store: Store, tmp_path: Path) -> None:
    data = _pattern(CHUNK_SIZE + 10, seed=5)
    cid = store.put(data)
    with pytest.raises(TooLarge, match=cid):
        store.get(cid, max_size=CHUNK_SIZE)
    with pytest.raises(TooLarge):
        store.get_to_file(cid, tmp_path / "x", max_size=100)
    assert not (tmp_path / "x").exists()
    assert store.get(cid, max_size=len(data)) == data


def test_wrong_expected_digest_is_refused(store: Store) -> None:
    data = b"payload bytes"
    cid = store.put(data)
    with pytest.raises(IntegrityError, match="keccak"):
        store.get(cid, digest=keccak(b"something else"))


def test_missing_content_is_not_found(store: Store) -> None:
    cid = cid_of(b"never stored anywhere " + os.urandom(8))
    assert not store.has(cid)
    with pytest.raises(NotFound, match=cid):
        store.get(cid)
    with pytest.raises(NotFound):
        store.pin(cid)


@pytest.mark.parametrize("bad", ["not-a-cid", "bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4"])
def test_malformed_cid_is_a_store_error(store: Store, bad: str) -> None:
    with pytest.raises(StoreError, match="CIDv0"):
        store.get(bad)


def test_corrupt_object_on_disk_is_detected_and_dropped(tmp_path: Path) -> None:
    s = LocalStore(tmp_path)
    data = _pattern(2 * CHUNK_SIZE, seed=9)
    cid = s.put(data)
    path = s.path_of(cid)
    raw = bytearray(path.read_bytes())
    raw[CHUNK_SIZE + 17] ^= 0x40
    path.write_bytes(raw)
    with pytest.raises(IntegrityError, match=cid):
        s.get(cid)
    assert not s.has(cid)  # quarantined, so a fresh put restores it
    assert s.put(data) == cid and s.get(cid) == data
    path.write_bytes(raw)
    with pytest.raises(IntegrityError):
        s.get_to_file(cid, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_content_under_the_wrong_name_is_rejected(tmp_path: Path) -> None:
    s = LocalStore(tmp_path)
    cid = s.put(b"the real content")
    s.path_of(cid).write_bytes(b"substituted content")
    with pytest.raises(IntegrityError, match="hashes to"):
        s.get(cid)


def test_corrupt_block_in_the_nodes_repo_is_detected(ipfs_node: IpfsNode) -> None:  # noqa: F811
    s = IpfsStore(ipfs_node.api)
    data = b"a block that will rot on disk " * 2000 + os.urandom(16)
    cid = s.put(data)
    blocks = [
        p for p in (ipfs_node.repo / "repo" / "blocks").rglob("*.data") if data[:64] in p.read_bytes()
    ]
    assert len(blocks) == 1
    raw = bytearray(blocks[0].read_bytes())
    raw[len(raw) // 2] ^= 0x01
    blocks[0].write_bytes(raw)
    with pytest.raises(IntegrityError, match=cid):
        s.get(cid)


def test_node_going_away_mid_transfer(ipfs_node: IpfsNode, tmp_path: Path) -> None:  # noqa: F811
    """Kill the shared node while a download streams, then restart it for the tests after."""
    node = ipfs_node
    s = IpfsStore(node.api, timeout=5.0)
    data = _pattern(40 << 20, seed=21)
    cid = s.put(data)
    out = tmp_path / "partial.bin"

    def kill_after_first_piece(n: int) -> None:
        node.kill()

    try:
        with pytest.raises(StoreError, match=cid) as info:
            s.get_to_file(cid, out, progress=kill_after_first_piece)
        assert isinstance(info.value, StoreUnavailable), info.value
        assert not out.exists() and not list(tmp_path.glob("*.part"))
        with pytest.raises(StoreUnavailable, match="lost contact|did not answer"):
            s.get(cid)
    finally:
        node.start()  # same repo, new ports: the content survived the crash
    s2 = IpfsStore(node.api, timeout=5.0)
    assert s2.get_to_file(cid, out) == len(data)


def test_unreachable_node_is_unavailable() -> None:
    s = IpfsStore(f"/ip4/127.0.0.1/tcp/{free_port()}", timeout=2.0)
    with pytest.raises(StoreUnavailable, match="lost contact"):
        s.put(b"x")
    with pytest.raises(StoreUnavailable):
        s.get(cid_of(b"x"))


_WRITER = textwrap.dedent(
    """
    import sys
    from protocol.store.backends import LocalStore
    root, who = sys.argv[1], int(sys.argv[2])
    s = LocalStore(root)
    for i in range(12):
        shared = bytes([i % 251]) * (300_000 + 1000 * i)        # every process writes these
        mine = bytes([who, i]) * (100_000 + who)                 # and these only this one
        c1, c2 = s.put(shared), s.put(mine)
        assert s.get(c1) == shared and s.get(c2) == mine
        print(c1, c2)
    """
)


def test_several_processes_share_one_local_store(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(root), str(w)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(4)
    ]
    cids = set()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        cids |= set(out.split())
    s = LocalStore(root)
    assert len(cids) == 12 + 4 * 12
    for c in cids:
        s.get(c)  # every object whole and verified
    assert not list((root / "tmp").iterdir())  # no temp files left behind
    assert all(p.name.startswith("Qm") for p in (root / "objects").rglob("*") if p.is_file())


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERILOCO_")}
    return subprocess.run(
        [sys.executable, "-m", "veriloco.cli", "store", *args],
        cwd=cwd, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=120, check=False,
    )


def test_cli_put_and_get_local(tmp_path: Path) -> None:
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(_pattern(CHUNK_SIZE * 2 + 1, seed=1))
    b.write_bytes(b"")
    d = str(tmp_path / "store")
    r = _cli("put", str(a), str(b), "--store-dir", d)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split() == [cid_of(a.read_bytes()), cid_of(b"")]
    cid = cid_of(a.read_bytes())
    out = tmp_path / "out.bin"
    assert _cli("get", cid, "-o", str(out), "--store-dir", d).returncode == 0
    assert out.read_bytes() == a.read_bytes()
    r = _cli("get", cid, "--store-dir", d, "--digest", "0x" + keccak(a.read_bytes()).hex())
    assert r.returncode == 0 and r.stdout == a.read_bytes()
    LocalStore(d).path_of(cid).write_bytes(b"tampered")
    r = _cli("get", cid, "-o", str(tmp_path / "bad.bin"), "--store-dir", d)
    assert r.returncode == 2 and not (tmp_path / "bad.bin").exists()
    assert cid in r.stderr.decode() and "Traceback" not in r.stderr.decode()
    r = _cli("put", str(tmp_path / "missing"), "--store-dir", d)
    assert r.returncode == 2 and b"not a file" in r.stderr


def test_cli_put_and_get_ipfs(ipfs_node: IpfsNode, tmp_path: Path) -> None:  # noqa: F811
    f = tmp_path / "f.bin"
    f.write_bytes(_pattern(1000, seed=77))
    r = _cli("put", str(f), "--store", "ipfs", "--ipfs-api", ipfs_node.api)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip() == cid_of(f.read_bytes())
    r = _cli("get", cid_of(f.read_bytes()), "--store", "ipfs", "--ipfs-api", ipfs_node.api)
    assert r.returncode == 0 and r.stdout == f.read_bytes()


def test_unwritable_target_is_a_store_error(tmp_path: Path) -> None:
    s = LocalStore(tmp_path / "s")
    cid = s.put(b"content")
    with pytest.raises(StoreError, match="cannot write"):
        s.get_to_file(cid, tmp_path / "no" / "such" / "dir" / "f")


def test_publishing_a_missing_file_names_it(store: Store, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot publish .*missing.bin"):
        store.put_file(tmp_path / "missing.bin")
