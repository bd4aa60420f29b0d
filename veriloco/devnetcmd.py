"""`veriloco devnet`: a local chain, a content store and a deployed contract until Ctrl-C (devnet/launch.py).

    veriloco devnet [--chain py-evm|anvil] [--store local|ipfs] [--port P] [--dir DIR] [--accounts N]
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

from devnet.anvil import AnvilError
from devnet.launch import DEFAULT_DIR, Devnet, DevnetConfig, DevnetError, DevnetInfo
from veriloco.argtypes import non_negative, positive


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "devnet",
        help="local chain + store + deployed contract, until Ctrl-C",
        description=(
            "Start a local devnet: a chain (py-evm over JSON-RPC, or anvil), a content store and "
            "the deployed Veriloco contract. Writes DIR/devnet.json for the other commands and "
            "runs until Ctrl-C. The dev keys are public test keys: never use them for real funds."
        ),
    )
    p.add_argument("--chain", choices=["py-evm", "anvil"], default="py-evm")
    p.add_argument("--store", choices=["local", "ipfs"], default="local")
    p.add_argument("--port", type=non_negative, default=0, help="JSON-RPC port on 127.0.0.1 (0: a free one)")
    p.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help=f"state directory (default {DEFAULT_DIR})"
    )
    p.add_argument("--accounts", type=positive, default=10, help="funded dev accounts (default 10)")
    p.add_argument("--chain-id", type=positive, help="default 1337 (py-evm) or 31337 (anvil)")
    p.add_argument(
        "--block-time",
        type=float,
        default=1.0,
        help="mine an empty block when idle this many seconds, so block time keeps up (0: off)",
    )
    p.add_argument("--no-deploy", action="store_true", help="do not deploy the contract")
    p.add_argument(
        "--no-persist", action="store_true", help="anvil: start fresh, do not keep state in DIR"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = DevnetConfig(
        chain=args.chain,
        store=args.store,
        state_dir=args.dir,
        port=args.port,
        accounts=args.accounts,
        chain_id=args.chain_id,
        deploy=not args.no_deploy,
        block_time=args.block_time or None,
        persist=not args.no_persist,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    devnet = Devnet(config)
    try:
        try:
            devnet.start()
        except AnvilError as exc:
            raise DevnetError(str(exc)) from None
        print(summary(devnet.info, config.devnet_file), flush=True)
        stop.wait()
        print("devnet: stopping", flush=True)
    finally:
        devnet.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    print("devnet: stopped", flush=True)
    return 0


def summary(info: DevnetInfo, path: Path) -> str:
    lines = [
        f"veriloco devnet ({info.chain}) ready",
        f"  rpc url     {info.rpc_url}",
        f"  chain id    {info.chain_id}",
        f"  contract    {info.contract or '(not deployed)'}",
        f"  store       {info.store.kind} {info.store.path or info.store.api}",
        f"  devnet file {path}",
        "  accounts (public test keys: never use them for real funds)",
    ]
    for i, acct in enumerate(info.accounts[:4]):
        lines.append(f"    [{i}] {acct.address}  {acct.key}")
    if len(info.accounts) > 4:
        lines.append(f"    ... {len(info.accounts) - 4} more in the devnet file")
    lines.append("Ctrl-C to stop.")
    return "\n".join(lines)
