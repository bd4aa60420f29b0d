"""Where a node finds its chain, contract, key and store: flags, then VERILOCO_* variables, then a devnet file.

Every command that talks to the network takes the same connection flags. A devnet file (written by
`veriloco devnet`) fills in whatever flags and variables leave open, so on a local devnet
`veriloco trainer --run 1 --account 2` is enough.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.errors import VerilocoError

DEFAULT_DEVNET_FILE = Path(".veriloco/devnet.json")


class SettingsError(VerilocoError):
    """Connection settings that are missing or unusable."""


@dataclass(frozen=True)
class Settings:
    rpc_url: str
    contract: str | None
    key: str | None  # 0x-hex private key
    store: str  # "local" | "ipfs"
    store_dir: Path
    ipfs_api: str
    workdir: Path


def add_connection_args(p: argparse.ArgumentParser, *, workdir: bool = False) -> None:
    g = p.add_argument_group("connection (flags override VERILOCO_* variables, which override the devnet file)")
    g.add_argument("--devnet", type=Path, help=f"devnet file (default: $VERILOCO_DEVNET or {DEFAULT_DEVNET_FILE} if present)")
    g.add_argument("--rpc-url", help="Ethereum JSON-RPC endpoint ($VERILOCO_RPC_URL)")
    g.add_argument("--contract", help="veriloco contract address ($VERILOCO_CONTRACT)")
    g.add_argument("--key", type=Path, help="file holding this node's hex private key ($VERILOCO_KEY)")
    g.add_argument("--account", type=int, help="use the devnet file's account N as this node's key")
    g.add_argument("--store", choices=["local", "ipfs"], help="content store backend ($VERILOCO_STORE)")
    g.add_argument("--store-dir", type=Path, help="LocalStore directory ($VERILOCO_STORE_DIR)")
    g.add_argument("--ipfs-api", help="Kubo RPC API multiaddr of your IPFS node ($VERILOCO_IPFS_API)")
    if workdir:
        g.add_argument("--workdir", type=Path, help="node-local checkpoints and logs ($VERILOCO_WORKDIR)")


def _devnet(args: argparse.Namespace) -> dict[str, Any]:
    explicit = getattr(args, "devnet", None) or os.environ.get("VERILOCO_DEVNET")
    path = Path(explicit) if explicit else DEFAULT_DEVNET_FILE
    if not path.exists():
        if explicit:
            raise SettingsError(f"devnet file {path} not found; start one with `veriloco devnet --dir {path.parent}`")
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SettingsError(f"devnet file {path} is unreadable ({exc}); restart `veriloco devnet`") from None
    if not isinstance(data, dict):
        raise SettingsError(f"devnet file {path} is not a JSON object")
    return data


def _read_key(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise SettingsError(f"cannot read key file {path}: {exc}") from None
    key = text if text.startswith("0x") else "0x" + text
    if len(key) != 66 or any(c not in "0123456789abcdefABCDEF" for c in key[2:]):
        raise SettingsError(f"key file {path} must hold a 32-byte hex private key")
    return key


def resolve(args: argparse.Namespace, *, need_key: bool = True, need_contract: bool = True) -> Settings:
    """Combine flags, environment and devnet file into Settings, naming whatever is missing."""
    env = os.environ.get
    dev = _devnet(args)
    dev_store: dict[str, Any] = dev.get("store") or {}

    def pick(flag: str, var: str, fallback: Any) -> Any:
        value = getattr(args, flag, None)
        return value if value is not None else (env(var) or fallback)

    rpc_url = pick("rpc_url", "VERILOCO_RPC_URL", dev.get("rpc_url"))
    contract = pick("contract", "VERILOCO_CONTRACT", dev.get("contract"))
    key: str | None = None
    if getattr(args, "key", None) is not None:
        key = _read_key(args.key)
    elif getattr(args, "account", None) is not None:
        accounts = dev.get("accounts") or []
        if not 0 <= args.account < len(accounts):
            raise SettingsError(f"--account {args.account}: the devnet file has {len(accounts)} accounts")
        key = accounts[args.account]["key"]
    elif env("VERILOCO_KEY"):
        key = _read_key(Path(env("VERILOCO_KEY") or ""))
    if not rpc_url:
        raise SettingsError("no RPC endpoint: pass --rpc-url, set VERILOCO_RPC_URL, or start `veriloco devnet`")
    if need_contract and not contract:
        raise SettingsError("no contract address: pass --contract, set VERILOCO_CONTRACT, or use a devnet file")
    if need_key and not key:
        raise SettingsError("no signing key: pass --key FILE, set VERILOCO_KEY, or --account N with a devnet file")
    store = pick("store", "VERILOCO_STORE", dev_store.get("kind") or "local")
    store_dir = Path(pick("store_dir", "VERILOCO_STORE_DIR", dev_store.get("path") or ".veriloco/store"))
    ipfs_api = pick("ipfs_api", "VERILOCO_IPFS_API", dev_store.get("api") or "/ip4/127.0.0.1/tcp/5001")
    workdir = Path(pick("workdir", "VERILOCO_WORKDIR", ".veriloco/node"))
    return Settings(rpc_url, contract, key, store, store_dir, ipfs_api, workdir)


def open_store(s: Settings) -> Any:
    """The configured content store (imported lazily: a chain-only command needs no store)."""
    from protocol.store import IpfsStore, LocalStore

    return IpfsStore(s.ipfs_api) if s.store == "ipfs" else LocalStore(s.store_dir)
