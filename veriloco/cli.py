"""`veriloco` console script: one parser, subcommands registered by the modules that implement them.

Each module in COMMANDS exposes `register(subparsers)`, which adds its subcommand(s) and sets
`func(args) -> int`. Foreseeable failures (VerilocoError) become one clean line and exit status 2.
A command imports its own module only, and `--version` and `--help` none (COMMAND_TABLE).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from protocol.errors import VerilocoError
from protocol.numerics import pin_environment

# Every command: the module whose `register` adds it, and its one-line help as that `register` declares it
# (tests/unit/test_cli_start.py holds them equal). `veriloco CMD ...` imports CMD's module alone (the node
# processes of a demo start seconds sooner); `--version`, `--help` and no command import none, and list
# the commands from here: the command modules import torch and web3, which take seconds (issue 32).
COMMAND_TABLE: dict[str, tuple[str, str]] = {
    "devnet": ("veriloco.devnetcmd", "local chain + store + deployed contract, until Ctrl-C"),
    "store": ("veriloco.storecmd", "publish / fetch verified content"),
    "trainer": ("veriloco.nodes", "run a trainer node: train, publish, commit, reveal, answer audits"),
    "verifier": ("veriloco.nodes", "run a verifier node: replay sampled steps of assigned trainers, post verdicts"),
    "coordinator": ("veriloco.nodes", "run the coordinator node: aggregate verified pseudo-gradients, finalize epochs"),
    "demo": ("veriloco.netdemo", "run a whole verifiable training network on this machine"),
    "deploy": ("veriloco.chaincmds", "deploy the Veriloco contract to any EVM JSON-RPC endpoint"),
    "run": ("veriloco.chaincmds", "write an example run config (init), create a run on the contract (create)"),
    "runs": ("veriloco.chaincmds", "list the runs of a contract with their state"),
    "status": ("veriloco.chaincmds", "query a run's round status from the contract"),
    "leave": ("veriloco.lifecycle", "leave a run: stop taking part; the stake starts unbonding"),
    "withdraw": ("veriloco.lifecycle", "withdraw a run's stake once it has unbonded after `leave`"),
    "claim": ("veriloco.lifecycle", "claim this account's credits (rewards and bounties) from the contract"),
    "earnings": ("veriloco.earnings", "every reward, bounty and slash of an account, from the contract's events, with totals"),
    "doctor": ("veriloco.doctor", "check this machine, the chain, the key and the store before running a node"),
    "account": ("veriloco.keys", "make signing keys"),
    "simulate": ("veriloco.simcmd", "simulate K trainers in one process (no chain) and compare AllReduce, DiLoCo and DiLoCoX"),
    "data": ("veriloco.datacmd", "turn your own text or token files into a run corpus"),
    "export": ("veriloco.datacmd", "write a global model as a Hugging Face (transformers) checkpoint"),
    "sample": ("veriloco.datacmd", "generate text from an exported model with the run's tokenizer"),
    "dashboard": ("veriloco.dashweb", "serve a live web page of a run on 127.0.0.1, from the chain and the store"),
}
# which module serves a command, and the command modules in the order `--help` lists them
OWNER: dict[str, str] = {name: module for name, (module, _) in COMMAND_TABLE.items()}
COMMANDS: list[str] = list(dict.fromkeys(OWNER.values()))


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


class Version(argparse.Action):
    """`--version`, looked up only when asked (importlib.metadata would cost every command tens of ms)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        print(f"veriloco {version()}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of `veriloco COMMAND ...`: COMMAND's module registers it (and its siblings).

    Without a known COMMAND every command is a stub from COMMAND_TABLE: `--help` lists them, a typo
    is refused with their names, and no command module is imported.
    """
    parser = Parser(
        prog="veriloco",
        description="Verifiable, on-chain-coordinated DiLoCoX training across untrusted machines.",
    )
    parser.add_argument("--version", action=Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    owner = OWNER.get(command or "")
    if owner is not None:
        importlib.import_module(owner).register(sub)
    else:
        for name, (_, help_) in COMMAND_TABLE.items():
            sub.add_parser(name, help=help_, add_help=False)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The command `argv` names: its first word that is not an option (the top level takes no values)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    # before any command module loads torch: every veriloco process computes in the CPU numerics class
    # exact runs pin (protocol/numerics.py), whatever the host's own kernels would be
    pin_environment()
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_of(argv))
    if not argv:  # what there is to type, rather than a one-line error about a missing COMMAND
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    args.argv = list(argv)  # the command line as typed: what a node's `stopped` line offers to resume with
    try:
        return int(args.func(args) or 0)
    except VerilocoError as exc:
        print(f"veriloco {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `veriloco status | head`: the reader has what it wanted, which is no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush does not raise again
        return 0
    except OSError as exc:  # the machine's own failures (permissions, a full disk): no traceback either
        print(f"veriloco {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"veriloco {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
