"""`veriloco` console script: one parser, subcommands registered by the modules that implement them.

Each module in COMMANDS exposes `register(subparsers)`, which adds its subcommand(s) and sets
`func(args) -> int`. Foreseeable failures (VerilocoError) become one clean line and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from protocol.errors import VerilocoError

COMMANDS: list[str] = [
    "veriloco.demo",
    "veriloco.devnet",
    "veriloco.storecmd",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="veriloco",
        description="Verifiable, on-chain-coordinated DiLoCoX training across untrusted machines.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except VerilocoError as exc:
        print(f"veriloco {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"veriloco {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
