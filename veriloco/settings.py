"""Where a node finds its chain, contract, key and store: flags, then VERILOCO_* variables, then a devnet file.

Every command that talks to the network takes the same connection flags. A devnet file (written by
`veriloco devnet`) fills in whatever flags and variables leave open, so on a local devnet
`veriloco trainer --run 1 --account 2` is enough.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.errors import VerilocoError
from veriloco.argtypes import non_negative

DEFAULT_DEVNET_FILE = Path(".veriloco/devnet.json")
# the connection flags that name a command's key and where it signs: what a later command for the same account repeats
KEY_FLAGS = ("--devnet", "--rpc-url", "--contract", "--key", "--password-file", "--account", "--max-fee-gwei")


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
    max_fee_wei: int | None = None  # no transaction offers more per gas (--max-fee-gwei); None: no cap


def add_connection_args(p: argparse.ArgumentParser, *, workdir: bool = False, signing: bool = True) -> None:
    g = p.add_argument_group("connection (flags override VERILOCO_* variables, which override the devnet file)")
    g.add_argument("--devnet", type=Path, help=f"devnet file (default: $VERILOCO_DEVNET or {DEFAULT_DEVNET_FILE} if present)")
    g.add_argument("--rpc-url", help="Ethereum JSON-RPC endpoint ($VERILOCO_RPC_URL)")
    g.add_argument("--contract", help="veriloco contract address ($VERILOCO_CONTRACT)")
    if signing:  # a read-only command (status, runs, the dashboard, export) takes no key and offers none
        g.add_argument("--key", type=Path,
                       help="this node's key file: a hex private key or an encrypted keystore ($VERILOCO_KEY)")
        g.add_argument("--password-file", type=Path,
                       help="the keystore's password, in a file ($VERILOCO_KEY_PASSWORD holds it otherwise; else a prompt)")
        g.add_argument("--account", type=non_negative, help="use the devnet file's account N as this node's key")
    g.add_argument("--store", choices=["local", "ipfs"], help="content store backend ($VERILOCO_STORE)")
    g.add_argument("--store-dir", type=Path, help="LocalStore directory ($VERILOCO_STORE_DIR)")
    g.add_argument("--ipfs-api", help="Kubo RPC API multiaddr of your IPFS node ($VERILOCO_IPFS_API)")
    if signing:
        g.add_argument("--max-fee-gwei", help="never offer more than this max fee per gas, in gwei; refuse to send while "
                       "the chain's price is above it ($VERILOCO_MAX_FEE_GWEI; docs/real-chain.md)")
    if workdir:
        g.add_argument("--workdir", "--datadir", dest="workdir", type=Path,
                       help="node-local checkpoints and logs ($VERILOCO_WORKDIR; --datadir as geth and reth name it)")


def _devnet(args: argparse.Namespace) -> dict[str, Any]:
    explicit = getattr(args, "devnet", None) or os.environ.get("VERILOCO_DEVNET")
    path = Path(explicit) if explicit else DEFAULT_DEVNET_FILE
    if not path.exists():
        if explicit:
            raise SettingsError(f"devnet file {path} not found; start one with `veriloco devnet --dir {path.parent}`")
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SettingsError(f"devnet file {path} is unreadable ({exc}); restart `veriloco devnet`") from None
    if not isinstance(data, dict):
        raise SettingsError(f"devnet file {path} is not a JSON object")
    return data


# secp256k1's group order: a private key is a number in [1, N)
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def check_key(key: str, where: str) -> str:
    """A 0x-hex private key that eth-account accepts, or SettingsError naming `where` it came from."""
    key = key.strip()
    key = key if key.startswith(("0x", "0X")) else "0x" + key
    if len(key) != 66 or any(c not in "0123456789abcdefABCDEF" for c in key[2:]):
        raise SettingsError(f"{where} must hold a 32-byte hex private key (64 hex digits, optionally 0x-prefixed)")
    if not 0 < int(key, 16) < SECP256K1_N:
        raise SettingsError(f"{where} holds {'zero' if int(key, 16) == 0 else 'a number too large'}, which is not a "
                            "valid secp256k1 private key; make a new key (e.g. `veriloco account new`)")
    return "0x" + key[2:].lower()


def _read_key(path: Path, password_file: Path | None = None) -> str:
    """The 0x-hex key in a plain key file, or decrypted from a keystore (veriloco/keys.py)."""
    from veriloco.keys import decrypt_keystore, is_keystore

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SettingsError(f"cannot read key file {path}: {exc.strerror or exc}") from None
    if is_keystore(raw):
        return check_key(decrypt_keystore(raw, path, password_file), f"keystore {path}")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise SettingsError(f"key file {path} is not text; it must hold a 32-byte hex private key "
                            "or an encrypted keystore") from None
    return check_key(text, f"key file {path}")


def check_rpc_url(url: str) -> str:
    """An http(s) JSON-RPC URL (the only transport the binding speaks), or SettingsError."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a malformed port)
    except ValueError as exc:
        raise SettingsError(f"RPC URL {url!r} is malformed ({exc}); use e.g. http://127.0.0.1:8545") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"RPC URL {url!r} is not an http(s) URL; veriloco speaks JSON-RPC over HTTP, "
                            "e.g. http://127.0.0.1:8545")
    return url


def check_contract(address: str) -> str:
    from eth_utils import is_address, to_checksum_address

    if not (address.startswith("0x") and is_address(address)):
        raise SettingsError(f"contract address {address!r} is not an Ethereum address (0x followed by 40 hex digits)")
    return str(to_checksum_address(address))


def max_fee_wei(text: str | None) -> int | None:
    """--max-fee-gwei / VERILOCO_MAX_FEE_GWEI in wei per gas (None: no cap), or SettingsError."""
    if text is None or str(text).strip() == "":
        return None
    try:
        gwei = float(text)
    except ValueError:
        gwei = float("nan")
    if not gwei > 0 or gwei == float("inf"):
        raise SettingsError(f"max fee {text!r} is not a positive number of gwei; e.g. --max-fee-gwei 50")
    return int(gwei * 10**9)


def resolve(args: argparse.Namespace, *, need_key: bool = True, need_contract: bool = True) -> Settings:
    """Combine flags, environment and devnet file into Settings, naming whatever is missing."""
    env = os.environ.get
    dev = _devnet(args)
    dev_store: dict[str, Any] = dev.get("store") or {}
    if not isinstance(dev_store, dict):
        raise SettingsError("the devnet file's store entry is not an object; restart `veriloco devnet`")

    def pick(flag: str, var: str, fallback: Any) -> Any:
        value = getattr(args, flag, None)
        return value if value is not None else (env(var) or fallback)

    rpc_url = pick("rpc_url", "VERILOCO_RPC_URL", dev.get("rpc_url"))
    contract = pick("contract", "VERILOCO_CONTRACT", dev.get("contract"))
    key: str | None = None
    if not hasattr(args, "key") and not hasattr(args, "account"):
        pass  # a read-only command's parser has no signing flags: no key is read, not even $VERILOCO_KEY
    elif getattr(args, "key", None) is not None:
        key = _read_key(args.key, getattr(args, "password_file", None))
    elif getattr(args, "account", None) is not None:
        if not dev:  # no devnet file where we look: a wrong folder, not a wrong number
            raise SettingsError(
                f"--account {args.account} names a devnet account, but there is no devnet file at {DEFAULT_DEVNET_FILE} "
                "(run from the folder where `veriloco devnet` runs, pass --devnet FILE, or use --key FILE)")
        accounts = dev.get("accounts") or []
        if not isinstance(accounts, list) or not 0 <= args.account < len(accounts):
            n = len(accounts) if isinstance(accounts, list) else 0
            raise SettingsError(f"--account {args.account}: the devnet file has {n} accounts (0..{n - 1})")
        entry = accounts[args.account]
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
            raise SettingsError(f"account {args.account} of the devnet file has no key; restart `veriloco devnet`")
        key = check_key(entry["key"], f"account {args.account} of the devnet file")
    elif env("VERILOCO_KEY"):
        key = _read_key(Path(env("VERILOCO_KEY") or ""), getattr(args, "password_file", None))
    if not rpc_url:
        raise SettingsError("no RPC endpoint: pass --rpc-url, set VERILOCO_RPC_URL, or start `veriloco devnet`")
    rpc_url = check_rpc_url(str(rpc_url))
    if need_contract and not contract:
        raise SettingsError("no contract address: pass --contract, set VERILOCO_CONTRACT, or use a devnet file")
    if contract:
        contract = check_contract(str(contract))
    if need_key and not key:
        raise SettingsError("no signing key: pass --key FILE, set VERILOCO_KEY, or --account N with a devnet file")
    store = pick("store", "VERILOCO_STORE", dev_store.get("kind") or "local")
    if store not in ("local", "ipfs"):
        raise SettingsError(f"store kind {store!r} is neither local nor ipfs; check VERILOCO_STORE")
    store_dir = Path(pick("store_dir", "VERILOCO_STORE_DIR", dev_store.get("path") or ".veriloco/store"))
    ipfs_api = pick("ipfs_api", "VERILOCO_IPFS_API", dev_store.get("api") or "/ip4/127.0.0.1/tcp/5001")
    workdir = Path(pick("workdir", "VERILOCO_WORKDIR", ".veriloco/node"))
    max_fee = max_fee_wei(pick("max_fee_gwei", "VERILOCO_MAX_FEE_GWEI", None))
    return Settings(rpc_url, contract, key, store, store_dir, ipfs_api, workdir, max_fee)


def check_workdir(path: Path) -> None:
    """A node's --workdir, checked before torch loads (nothing created yet): a folder this user can write,
    or one it can create under the nearest folder that exists."""
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise SettingsError(f"--workdir {path}: {probe} is a file, not a folder; pass a folder the node may create "
                            "or write (default .veriloco/node)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise SettingsError(f"--workdir {path}: this user cannot write in {probe}; pass a folder it may create or "
                            "write (default .veriloco/node)")


def withdraw_command(args: argparse.Namespace) -> str:
    """`veriloco withdraw` for this command's run and key: the key flags of its command line (veriloco/cli.py
    keeps it as `args.argv`), nothing else, so the hint works as typed (a node's `slashed` line, `leave`)."""
    argv, kept = list(getattr(args, "argv", sys.argv[1:])), []
    i = 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        if flag in KEY_FLAGS:
            take = 1 if "=" in argv[i] else 2
            kept += argv[i:i + take]
            i += take
        else:
            i += 1
    return shlex.join(["veriloco", "withdraw", "--run", str(args.run), *kept])


def open_store(s: Settings) -> Any:
    """The configured content store (imported lazily: a chain-only command needs no store)."""
    from protocol.store.backends import IpfsStore, LocalStore

    return IpfsStore(s.ipfs_api) if s.store == "ipfs" else LocalStore(s.store_dir)
