"""`veriloco devnet`: a local chain, a content store and a deployed contract until Ctrl-C (devnet/launch.py).

    veriloco devnet [--chain py-evm|anvil] [--store local|ipfs] [--port P] [--dir DIR] [--accounts N]
    veriloco devnet fund ADDRESS [ETH] [--dir DIR]     # a key of your own, funded from the running devnet
"""

from __future__ import annotations

import argparse
import json
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
    p.add_argument("fund", nargs="*", metavar="fund ADDRESS [ETH]",
                   help="instead of starting one: send ETH (default 10) from the running devnet's last account "
                        "to ADDRESS (a key of your own: `veriloco account new`), then exit")
    p.set_defaults(func=run)


FUND_MAX_ETH = 1000.0


def fund(args: argparse.Namespace) -> int:
    """`veriloco devnet fund ADDRESS [ETH]`: a plain transfer from the devnet file's last account, which the
    demo and the README's network leave unused, mined before it returns."""
    from veriloco.argtypes import address

    words = args.fund
    if words[0] != "fund" or not 2 <= len(words) <= 3:
        raise DevnetError(f"unknown devnet command {' '.join(words)!r}: `veriloco devnet` starts one, "
                          "`veriloco devnet fund ADDRESS [ETH]` funds a key from a running one")
    try:
        to = address(words[1])
    except argparse.ArgumentTypeError as exc:
        raise DevnetError(f"devnet fund: {exc}") from None
    try:
        eth = float(words[2]) if len(words) == 3 else 10.0
    except ValueError:
        raise DevnetError(f"devnet fund: {words[2]!r} is not an amount of ETH") from None
    if not 0 < eth <= FUND_MAX_ETH:
        raise DevnetError(f"devnet fund: {eth:g} ETH is outside (0, {FUND_MAX_ETH:g}]")
    path = DevnetConfig(state_dir=args.dir).devnet_file
    try:
        info = DevnetInfo.from_json(json.loads(path.read_text()), str(path))
    except FileNotFoundError:
        raise DevnetError(f"no devnet file at {path}: start `veriloco devnet` (or pass its --dir) first") from None
    from eth_account import Account
    from web3 import Web3

    w3 = Web3(Web3.HTTPProvider(info.rpc_url, request_kwargs={"timeout": 30}))
    payer = Account.from_key(info.accounts[-1].key)
    try:
        tx = {"to": to, "value": int(eth * 10**18), "gas": 21_000, "chainId": info.chain_id,
              "nonce": w3.eth.get_transaction_count(payer.address, "pending"), "gasPrice": w3.eth.gas_price}
        h = w3.eth.send_raw_transaction(payer.sign_transaction(tx).raw_transaction)
        w3.eth.wait_for_transaction_receipt(h, timeout=60)
        held = w3.eth.get_balance(to) / 10**18  # type: ignore[arg-type]
    except (OSError, ValueError) as exc:  # requests' connection errors are OSErrors; node refusals ValueErrors
        raise DevnetError(f"the devnet at {info.rpc_url} did not take the transfer ({exc}); is `veriloco devnet` "
                          "still running?") from None
    print(f"sent {eth:g} ETH to {to} from the devnet's account {len(info.accounts) - 1} (tx 0x{bytes(h).hex()}); "
          f"it holds {held:g} ETH")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.fund:
        return fund(args)
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
