"""Signing keys on disk: encrypted keystores (eth-account's keystore JSON, v3) next to plain hex key files.

A node's `--key FILE` may name either. A keystore's password comes from `--password-file FILE`,
else `$VERILOCO_KEY_PASSWORD`, else a prompt when a terminal is attached; without any, the node
refuses with what to pass. `veriloco account new` makes a new key, encrypted unless `--plain`.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path
from typing import Any

from protocol.errors import VerilocoError

PASSWORD_VAR = "VERILOCO_KEY_PASSWORD"


class KeyFileError(VerilocoError):
    """A key file or keystore that cannot be used."""


def read_password(path: Path | None, *, what: str, confirm: bool = False) -> str:
    """The password from `path`, else $VERILOCO_KEY_PASSWORD, else a prompt on a terminal."""
    if path is not None:
        try:
            text = path.read_bytes().decode("utf-8")
        except OSError as exc:
            raise KeyFileError(f"cannot read password file {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise KeyFileError(f"password file {path} is not UTF-8 text") from None
        password = text.rstrip("\r\n")
    elif os.environ.get(PASSWORD_VAR) is not None:
        password = os.environ[PASSWORD_VAR]
    elif sys.stdin.isatty():
        password = getpass.getpass(f"password for {what}: ")
        if confirm and getpass.getpass("again: ") != password:
            raise KeyFileError("the two passwords differ; nothing was written")
    else:
        raise KeyFileError(f"{what} needs a password: pass --password-file FILE or set ${PASSWORD_VAR} "
                        "(no terminal to ask on)")
    if not password:
        raise KeyFileError(f"the password for {what} is empty")
    return password


def is_keystore(raw: bytes) -> bool:
    return raw.lstrip()[:1] == b"{"


def decrypt_keystore(raw: bytes, path: Path, password_file: Path | None) -> str:
    """The 0x-hex private key in a keystore file."""
    from eth_account import Account

    try:
        data = json.loads(raw)
    except ValueError:
        raise KeyFileError(f"key file {path} looks like JSON but is not valid JSON; it must be a keystore "
                        "(see `veriloco account new`) or a hex private key") from None
    if not isinstance(data, dict) or "crypto" not in {k.lower() for k in data}:
        raise KeyFileError(f"key file {path} is JSON but not an Ethereum keystore (no crypto section)")
    password = read_password(password_file, what=f"keystore {path}")
    try:
        key = Account.decrypt(data, password)
    except ValueError as exc:
        if "MAC mismatch" in str(exc):
            raise KeyFileError(f"wrong password for keystore {path}") from None
        raise KeyFileError(f"keystore {path} cannot be decrypted: {exc}") from None
    except (KeyError, TypeError) as exc:
        raise KeyFileError(f"keystore {path} is malformed (missing {exc})") from None
    return "0x" + bytes(key).hex()


def _write_private(path: Path, text: str) -> None:
    """Create `path` readable by its owner only; never overwrite."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyFileError(f"{path} exists; choose another --out (an existing key is never overwritten)") from None
    except OSError as exc:
        raise KeyFileError(f"cannot create {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)


def cmd_account_new(args: argparse.Namespace) -> int:
    from eth_account import Account

    account = Account.create()
    if args.plain:
        _write_private(args.out, account.key.hex().removeprefix("0x") + "\n")
        kind = "plain hex key file (anyone who can read it controls the account)"
    else:
        password = read_password(args.password_file, what=f"the new keystore {args.out}", confirm=True)
        _write_private(args.out, json.dumps(Account.encrypt(account.key, password)) + "\n")
        kind = "encrypted keystore"
    if args.json:
        print(json.dumps({"address": account.address, "file": str(args.out), "encrypted": not args.plain}))
    else:
        print(f"{account.address}\n  {kind} written to {args.out}; use it with --key {args.out}"
              + ("" if args.plain else f" and --password-file FILE or ${PASSWORD_VAR}"))
    return 0


def register(sub: Any) -> None:
    a = sub.add_parser("account", help="make signing keys")
    asub = a.add_subparsers(dest="account_command", required=True, metavar="SUBCOMMAND")
    n = asub.add_parser("new", help="create a new account: an encrypted keystore (or a plain hex key file)")
    n.add_argument("--out", type=Path, required=True, help="file to create (never overwritten)")
    n.add_argument("--password-file", type=Path, help=f"read the password from this file (else ${PASSWORD_VAR} or a prompt)")
    n.add_argument("--plain", action="store_true", help="write an unencrypted hex key file instead")
    n.add_argument("--json", action="store_true", help="print a JSON object")
    n.set_defaults(func=cmd_account_new)
