"""`veriloco store put FILE... | get CID [-o FILE]`: publish and fetch verified content.

    veriloco store put model.safetensors config.json        # prints one CID per file, in order
    veriloco store get QmX... -o model.safetensors           # fetched, checked against the CID
    veriloco store get QmX... --store ipfs --ipfs-api /ip4/127.0.0.1/tcp/5001 > out.bin

The backend is chosen by flags, then VERILOCO_STORE / VERILOCO_STORE_DIR / VERILOCO_IPFS_API,
then the store section of a devnet file, then a LocalStore in .veriloco/store. Nothing is
written to the output until the whole content has been verified.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from protocol.store.backends import (
    DEFAULT_IPFS_API,
    DEFAULT_MAX_SIZE,
    IpfsStore,
    LocalStore,
    Store,
    StoreError,
)
from veriloco import settings
from veriloco.argtypes import positive, seconds


def _add_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", choices=["local", "ipfs"], help="backend ($VERILOCO_STORE; default local)")
    p.add_argument("--store-dir", type=Path, help="LocalStore directory ($VERILOCO_STORE_DIR; default .veriloco/store)")
    p.add_argument("--ipfs-api", help=f"Kubo RPC API multiaddr of your IPFS node ($VERILOCO_IPFS_API; default {DEFAULT_IPFS_API})")
    p.add_argument("--devnet", type=Path, help="devnet file to take the store from ($VERILOCO_DEVNET)")
    p.add_argument("--timeout", type=seconds, default=30.0, help="seconds to wait for the IPFS node per request")


def register(sub: Any) -> None:
    p = sub.add_parser("store", help="publish / fetch verified content", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    put = actions.add_parser("put", help="store files, print their CIDs")
    put.add_argument("files", nargs="+", type=Path, metavar="FILE")
    _add_store_args(put)
    get = actions.add_parser("get", help="fetch a CID, verify it, write it to a file or stdout")
    get.add_argument("cid", metavar="CID")
    get.add_argument("-o", "--output", type=Path, help="output file (default: stdout)")
    get.add_argument("--max-size", type=positive, default=DEFAULT_MAX_SIZE, help="refuse content larger than this many bytes")
    get.add_argument("--digest", help="expected keccak-256 of the content (0x-hex), e.g. from the chain")
    _add_store_args(get)
    p.set_defaults(func=run)


def open_store_from_args(args: argparse.Namespace) -> Store:
    """Flags, then VERILOCO_* variables, then the devnet file's store, then a local default."""
    dev = settings._devnet(args).get("store") or {}

    def pick(value: Any, var: str, fallback: Any) -> Any:
        return value if value is not None else (os.environ.get(var) or fallback)

    kind = pick(args.store, "VERILOCO_STORE", dev.get("kind") or "local")
    if kind == "ipfs":
        api = pick(args.ipfs_api, "VERILOCO_IPFS_API", dev.get("api") or DEFAULT_IPFS_API)
        return IpfsStore(api, timeout=args.timeout)
    if kind != "local":
        raise StoreError(f"store kind {kind!r} is neither local nor ipfs; check VERILOCO_STORE")
    return LocalStore(pick(args.store_dir, "VERILOCO_STORE_DIR", dev.get("path") or ".veriloco/store"))


def _hex32(text: str) -> bytes:
    body = text.removeprefix("0x")
    try:
        raw = bytes.fromhex(body)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise StoreError(f"--digest must be 32 bytes of hex (0x + 64 digits), got {text!r}")
    return raw


def run(args: argparse.Namespace) -> int:
    store = open_store_from_args(args)
    if args.action == "put":
        for f in args.files:
            if not f.is_file():
                raise StoreError(f"cannot publish {f}: not a file")
        for f in args.files:
            print(store.put_file(f), flush=True)
        return 0
    digest = _hex32(args.digest) if args.digest else None
    if args.output is not None:
        store.get_to_file(args.cid, args.output, max_size=args.max_size, digest=digest)
        return 0
    data = store.get(args.cid, max_size=args.max_size, digest=digest)
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0
