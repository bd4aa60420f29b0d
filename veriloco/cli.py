"""`veriloco` console script: one parser, subcommands registered by the modules that implement them.

Each module in COMMANDS exposes `register(subparsers)`, which adds its subcommand(s) and sets
`func(args) -> int`. Foreseeable failures (VerilocoError) become one clean line and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from protocol.errors import VerilocoError

COMMANDS: list[str] = [
    "veriloco.devnetcmd",
    "veriloco.storecmd",
    "veriloco.nodes",
    "veriloco.netdemo",
    "veriloco.chaincmds",
    "veriloco.lifecycle",
    "veriloco.keys",
    "veriloco.simcmd",
    "veriloco.datacmd",
    "veriloco.dashweb",
]


# Which module serves a command, so `veriloco trainer ...` imports the trainer's dependencies only
# (the node processes of a demo start several seconds sooner); `veriloco --help` imports all.
OWNER: dict[str, str] = {
    "demo": "veriloco.netdemo",
    "simulate": "veriloco.simcmd",
    "devnet": "veriloco.devnetcmd",
    "store": "veriloco.storecmd",
    "trainer": "veriloco.nodes",
    "verifier": "veriloco.nodes",
    "coordinator": "veriloco.nodes",
    "deploy": "veriloco.chaincmds",
    "run": "veriloco.chaincmds",
    "status": "veriloco.chaincmds",
    "runs": "veriloco.chaincmds",
    "leave": "veriloco.lifecycle",
    "withdraw": "veriloco.lifecycle",
    "claim": "veriloco.lifecycle",
    "account": "veriloco.keys",
    "data": "veriloco.datacmd",
    "export": "veriloco.datacmd",
    "sample": "veriloco.datacmd",
    "dashboard": "veriloco.dashweb",
}


class Parser(argparse.ArgumentParser):
    """An argument error is one line on stderr (what is wrong, where to read more), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("veriloco")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(
        prog="veriloco",
        description="Verifiable, on-chain-coordinated DiLoCoX training across untrusted machines.",
    )
    parser.add_argument("--version", action="version", version=f"veriloco {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    owner = OWNER.get(command or "")
    for name in [owner] if owner in COMMANDS else COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except VerilocoError as exc:
        print(f"veriloco {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the machine's own failures (permissions, a full disk): no traceback either
        print(f"veriloco {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"veriloco {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
