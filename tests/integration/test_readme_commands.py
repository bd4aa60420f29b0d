"""Every command the README tells a user to run parses today and is run by some test (and every command of
docs/results.md and docs/operators.md, where the README's result tables and node details moved with their
commands).

The README's commands are read from its fenced blocks (one command per logical line, `&&` chains
split, comments dropped), from the `veriloco ...` lines its sample output tells you to copy, and
from inline `veriloco ...` / `make ...` spans in its prose. Each command has a shape: the program,
its subcommands and the sorted names of its flags (values and file names left out, so an example's
numbers may change freely). Three checks:

- every shape is in COVERED, which names the test that runs it for real (this file runs the cheap
  ones itself: the "Running a network by hand" block's devnet, run create, status, runs, claim, and
  account new), and every COVERED entry is still in the README and names a test that exists; a new
  README command without a test fails here, and so does a stale entry;
- every `veriloco` line, and the `veriloco demo` each `make demo DEMO_ARGS=...` runs through the
  Makefile's recipe, goes through the real argparse parser of veriloco/cli.py, placeholders filled;
- every benchmark command line goes through its script's own parser (captured, nothing runs).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cli import run_cli
from veriloco.cli import build_parser

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MOVED = (ROOT / "docs" / "results.md", ROOT / "docs" / "operators.md")  # the README's tables and node details
HERE = "tests/integration/test_readme_commands.py"

# README placeholders -> values the parser accepts
PLACEHOLDERS = {
    "$CONTRACT": "0x" + "11" * 20,
    "$RPC_URL": "http://127.0.0.1:8545",
    "URL": "http://127.0.0.1:8545",
    "FILE": "key.txt",
    "F": "password.txt",
    "MULTIADDR": "/ip4/127.0.0.1/tcp/5001",
}

# shape -> the test(s) that run it. `HERE::name` is a test of this file; `.ci/run` is the CI entry point.
# The trainer lines are run by the e2e networks (veriloco/netdemo.py starts `veriloco trainer --run N
# --account I ...` processes, the same command with its own workdir and --log-format json).
COVERED: dict[str, list[str]] = {
    # Two commands
    "make demo": ["tests/integration/test_wheel.py::test_wheel_installs_in_a_fresh_venv_and_runs_the_demo",
                  "tests/e2e/test_demo.py::test_the_readme_adversary_demo_prints_its_summary_and_slashes_every_cheater_once"],
    "make test": [".ci/run"],
    "make test-fast": ["tests/unit/test_make_targets.py::test_make_test_fast_runs_the_unit_tier_and_make_test_runs_every_tier"],
    # the demo's summary: the lines it tells you to copy
    "veriloco store get --store-dir -o": ["tests/integration/test_store.py::test_cli_put_and_get_local",
                                          "tests/e2e/test_demo.py::test_the_readme_adversary_demo_prints_its_summary_and_slashes_every_cheater_once"],
    "veriloco export --config --out --state": ["tests/unit/test_export.py::test_cli_prepare_train_export_sample"],
    # prose after the summary
    "make demo --cheat --trainers": ["tests/e2e/test_demo.py::test_the_readme_adversary_demo_prints_its_summary_and_slashes_every_cheater_once"],
    # Installing with pip
    "python -m venv": ["tests/integration/test_wheel.py::test_wheel_installs_in_a_fresh_venv_and_runs_the_demo"],
    "pip install torch==2.13.0 numpy": ["tests/integration/test_wheel.py::test_wheel_installs_in_a_fresh_venv_and_runs_the_demo"],
    "pip install PATH/TO/veriloco": ["tests/integration/test_wheel.py::test_wheel_installs_in_a_fresh_venv_and_runs_the_demo"],
    "cd": ["tests/integration/test_wheel.py::test_wheel_installs_in_a_fresh_venv_and_runs_the_demo"],
    "veriloco demo --epochs": ["tests/integration/test_wheel.py::test_wheel_installs_in_a_fresh_venv_and_runs_the_demo"],
    "veriloco run init": ["tests/integration/test_run_init_cli.py::test_init_writes_the_example_and_refuses_to_overwrite",
                          "tests/integration/test_wheel.py::test_wheel_installs_in_a_fresh_venv_and_runs_the_demo"],
    # Running a network by hand
    "veriloco devnet": [f"{HERE}::test_the_network_by_hand_block_runs_as_written",
                        "tests/integration/test_devnet.py::test_devnet_fund_sends_eth_to_a_key_of_ones_own",
                        "tests/integration/test_devnet.py::test_devnet_command_runs_until_sigint_and_frees_its_port"],
    "veriloco run create --account --config": [f"{HERE}::test_the_network_by_hand_block_runs_as_written"],
    "veriloco verifier --account --run": [f"{HERE}::test_the_network_by_hand_block_runs_as_written",
                                           "tests/e2e/test_network.py::test_honest_network_on_anvil_and_ipfs_learns_and_nobody_is_slashed"],
    "veriloco trainer --account --run": ["tests/e2e/test_network.py::test_honest_network_on_anvil_and_ipfs_learns_and_nobody_is_slashed"],
    "veriloco coordinator --account --run": [f"{HERE}::test_the_network_by_hand_block_runs_as_written",
                                              "tests/e2e/test_network.py::test_honest_network_on_anvil_and_ipfs_learns_and_nobody_is_slashed"],
    "veriloco status --run": [f"{HERE}::test_the_network_by_hand_block_runs_as_written",
                              "tests/integration/test_lifecycle_cli.py::test_a_runs_life_through_the_cli"],
    "veriloco runs": [f"{HERE}::test_the_network_by_hand_block_runs_as_written",
                      "tests/integration/test_lifecycle_cli.py::test_a_runs_life_through_the_cli"],
    "veriloco leave --account --run": ["tests/integration/test_lifecycle_cli.py::test_a_runs_life_through_the_cli"],
    "veriloco withdraw --account --run": ["tests/integration/test_lifecycle_cli.py::test_a_runs_life_through_the_cli"],
    "veriloco claim --account": [f"{HERE}::test_the_network_by_hand_block_runs_as_written",
                                 "tests/integration/test_lifecycle_cli.py::test_a_runs_life_through_the_cli"],
    "veriloco account new --out": [f"{HERE}::test_the_network_by_hand_block_runs_as_written",
                                   "tests/integration/test_lifecycle_cli.py::test_a_keystore_signs_for_its_account"],
    "veriloco doctor --account --run": ["tests/integration/test_doctor_cli.py::test_a_healthy_trainer_setup_passes_and_each_broken_piece_fails"],
    "veriloco earnings --account": ["tests/integration/test_earnings_cli.py::test_rewards_bounties_and_slashes_by_account"],
    # reading a round with cast
    "make node": ["tests/integration/test_readme_cast.py::test_readme_cast_block_reads_a_round"],
    "set CONTRACT": ["tests/integration/test_readme_cast.py::test_readme_cast_block_reads_a_round"],
    "set RPC_URL": ["tests/integration/test_readme_cast.py::test_readme_cast_block_reads_a_round"],
    "cast call --rpc-url": ["tests/integration/test_readme_cast.py::test_readme_cast_block_reads_a_round"],
    "veriloco deploy": ["tests/integration/test_contract_cli.py::test_deploy_create_status"],
    "veriloco simulate": ["tests/unit/test_simulate.py::test_demo_command_prints_the_table_and_writes_a_report"],
    "veriloco deploy --key --rpc-url": ["tests/integration/test_contract_cli.py::test_deploy_create_status"],
    # Dashboard and metrics
    "veriloco dashboard --run": ["tests/e2e/test_dashboard.py::test_dashboard_and_metrics_of_a_live_run"],
    "veriloco trainer --account --metrics-port --run": ["tests/e2e/test_dashboard.py::test_dashboard_and_metrics_of_a_live_run"],
    "make demo --dashboard --metrics-port": ["tests/e2e/test_dashboard.py::test_dashboard_and_metrics_of_a_live_run"],
    "veriloco demo --cheat --epochs --trainers --workdir": ["tests/e2e/test_dashboard.py::test_dashboard_and_metrics_of_a_live_run"],
    # Your own data
    "veriloco data prepare --out --vocab": ["tests/unit/test_export.py::test_cli_prepare_train_export_sample"],
    "veriloco data import --dtype --out --tokenizer": ["tests/unit/test_tokens.py::test_cli_import_of_llmc_shards_with_their_tokenizer"],
    "veriloco run create --account --config --corpus": ["tests/integration/test_own_data_cli.py::test_run_create_with_a_prepared_corpus"],
    "veriloco export --out --run": ["tests/e2e/test_own_data.py::test_llama_on_a_bpe_corpus_trains_verifies_exports_and_samples"],
    "veriloco sample --prompt --tokens": ["tests/unit/test_export.py::test_cli_prepare_train_export_sample"],
    "make demo --corpus --preset": ["tests/e2e/test_own_data.py::test_llama_on_a_bpe_corpus_trains_verifies_exports_and_samples"],
    # Results: the benchmarks (their quick paths or drivers; every line is parsed by its own parser below)
    "python benchmarks.convergence --batch-size --eval-rows --inner-lr --jobs --merge-step --methods --out --preset --rank --seeds":
        ["tests/unit/test_convergence_bench.py::test_runs_of_other_methods_on_the_same_seeds_join_against_one_baseline",
         "tests/unit/test_convergence_bench.py::test_runs_in_parallel_processes_give_the_sequential_results"],
    "python benchmarks.convergence --dilocox --merge --out":
        ["tests/unit/test_convergence_bench.py::test_a_method_run_seed_by_seed_or_at_another_rank_pairs_against_one_baseline"],
    "make headline": ["tests/unit/test_headline_bench.py::test_dry_run_prints_one_command_per_piece_and_the_merge"],
    "python benchmarks.convergence --render": ["tests/unit/test_convergence_bench.py::test_two_seed_run_writes_the_agreed_keys"],
    "python benchmarks.codec --h --out --preset --ranks --rounds": [f"{HERE}::test_benchmark_lines_parse_with_their_own_parsers"],
    "python benchmarks.codec --baselines --budget-ranks --cache --h --out --preset --rounds": [
        f"{HERE}::test_benchmark_lines_parse_with_their_own_parsers",
        "tests/unit/test_codec_baselines.py::test_the_baselines_command_writes_every_codec_at_each_budget"],
    "python benchmarks.gas --out": [f"{HERE}::test_benchmark_lines_parse_with_their_own_parsers"],
    "python benchmarks.scale --out": ["tests/integration/test_scale.py::test_64_trainers_8_verifiers_3_epochs_all_finalize"],
    "python benchmarks.store --out": [f"{HERE}::test_benchmark_lines_parse_with_their_own_parsers"],
    "python benchmarks.verification --out": [f"{HERE}::test_benchmark_lines_parse_with_their_own_parsers"],
    "python benchmarks.protocol --out": [f"{HERE}::test_benchmark_lines_parse_with_their_own_parsers"],
    "python benchmarks.projection --md --out --validate": [f"{HERE}::test_benchmark_lines_parse_with_their_own_parsers",
                                                          "tests/unit/test_projection_bench.py"],
    "python benchmarks.protocol --merge --out": ["tests/unit/test_protocol_bench.py::test_merge_writes_the_means_and_every_run"],
}

# The benchmarks whose full runs take hours on this machine; only their command lines are checked (above).
PARSED_ONLY = {"python benchmarks.codec --h --out --preset --ranks --rounds", "python benchmarks.gas --out",
               "python benchmarks.store --out", "python benchmarks.verification --out", "python benchmarks.protocol --out",
               "python benchmarks.projection --md --out --validate"}


@dataclass(frozen=True)
class Command:
    line: str  # the README's text of this one command
    program: str  # veriloco, make, python, pip, cast, cd, set
    args: tuple[str, ...]  # the tokens after the program, placeholders filled
    key: str  # the shape COVERED is keyed by


def _logical_lines(block: str) -> Iterator[str]:
    pending = ""
    for raw in block.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line, pending = pending + raw, ""
        if line.strip():
            yield line.strip()


def _segments(line: str) -> Iterator[list[str]]:
    """The `&&`-separated commands of a line, tokenized as a shell would (comments dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="&;")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    seg: list[str] = []
    for tok in tokens:
        if tok in ("&&", ";"):
            if seg:
                yield seg
            seg = []
        else:
            seg.append(tok)
    if seg:
        yield seg


def _subcommands(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """The chain of subcommand names at the start of `args`, as the parser's subparsers define them."""
    path: list[str] = []
    while args:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or args[0] not in subs[0].choices:
            break
        path.append(args[0])
        parser, args = subs[0].choices[args[0]], args[1:]
    return path


def _flags(args: list[str] | tuple[str, ...]) -> list[str]:
    return sorted({a.split("=", 1)[0] for a in args if re.match(r"^--?[A-Za-z]", a)})


def _fill(tok: str) -> str:
    for name, value in PLACEHOLDERS.items():
        if tok == name or (name.startswith("$") and tok.startswith(name)):
            return tok.replace(name, value, 1)
    return tok


def _command(tokens: list[str], line: str) -> Command | None:
    """A Command from one shell segment; None for something that is not a command (prose, output)."""
    if not tokens:
        return None
    if re.match(r"^[A-Z_]+=", tokens[0]):  # VAR=$(...): a shell variable the next lines use
        return Command(line, "set", tuple(tokens), f"set {tokens[0].split('=', 1)[0]}")
    if tokens[:1] == ["nice"]:
        tokens = tokens[3:] if tokens[1:2] == ["-n"] else tokens[1:]
    if tokens[:1] == ["npx"]:
        tokens = tokens[1:]
    program = os.path.basename(tokens[0])
    args = [_fill(t) for t in tokens[1:]]
    if program == "veriloco":
        sub = _subcommands(build_parser(args[0] if args else None), args)
        return Command(line, program, tuple(args), " ".join(["veriloco", *sub, *_flags(args)]))
    if program == "make":
        targets = [a for a in args if "=" not in a]
        demo_args = [a.split("=", 1)[1] for a in args if a.startswith("DEMO_ARGS=")]
        flags = _flags(shlex.split(demo_args[0])) if demo_args else []
        return Command(line, program, tuple(args), " ".join(["make", *targets, *flags]))
    if program in ("python", "python3"):
        if args[:1] == ["-m"]:
            target, rest = args[1], args[2:]
        else:
            target, rest = args[0].removesuffix(".py").replace("/", "."), args[1:]
        key = ["python", *(["-m", target] if not target.startswith("benchmarks.") else [target])]
        return Command(line, "python", tuple(args), " ".join([*key, *_flags(rest)]))
    if program == "pip":
        return Command(line, program, tuple(args), " ".join(["pip", *args]))
    if program == "cast":
        return Command(line, program, tuple(args), " ".join(["cast", args[0], *_flags(args)]))
    if program == "cd":
        return Command(line, program, tuple(args), "cd")
    return None


def _inline_commands(text: str) -> Iterator[Command]:
    """`veriloco ...` and `make ...` spans in prose (a span may wrap across lines), not names like `veriloco trainer|verifier`."""
    for span in re.findall(r"`([^`]+)`", text):
        span = " ".join(span.split())
        if re.match(r"^(veriloco|make) [a-z]", span) and "|" not in span and "[" not in span:
            for seg in _segments(span):
                if (cmd := _command(seg, span)) is not None:
                    yield cmd


def readme_commands(text: str | None = None, *, prose: bool = True) -> list[Command]:
    """Every command README.md (then the MOVED docs) tells a user to run, in order (fenced blocks first)."""
    text = "\n".join(p.read_text() for p in (README, *MOVED)) if text is None else text
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    out: list[Command] = []
    for block in blocks:
        lines = list(_logical_lines(block))
        if not lines or all(ln.startswith("|") for ln in lines):
            continue
        first = next(iter(_segments(lines[0])), [])
        if _command(first, lines[0]) is None:  # sample output: only the commands it tells you to copy
            for ln in lines:
                if (at := ln.find(" veriloco ")) >= 0:
                    out += [c for seg in _segments(ln[at + 1:]) if (c := _command(seg, ln)) is not None]
            continue
        for ln in lines:
            cmds = [_command(seg, ln) for seg in _segments(ln)]
            assert all(c is not None for c in cmds), f"README command block has a line this test cannot read: {ln!r}"
            out += [c for c in cmds if c is not None]
    if prose:
        out += list(_inline_commands(re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)))
    return out


def _test_exists(ref: str) -> bool:
    path, _, name = ref.partition("::")
    f = ROOT / path
    if not f.is_file():
        return False
    if not name:
        return True
    tree = ast.parse(f.read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


# ---------------------------------------------------------------------------------------------- tests


def test_the_extractor_reads_blocks_chains_output_and_prose() -> None:
    sample = (
        "```\nveriloco devnet   # terminal 1\nnice -n 19 .venv/bin/python benchmarks/gas.py --out g.json\n"
        "python3 -m venv v && v/bin/pip install x \\\n    y\n```\n"
        "```\nsummary\n  fetch it   veriloco store get Qm1 --store-dir s -o m\n```\n"
        "Try `make demo DEMO_ARGS=\"--trainers 5 --cheat lazy:1\"`, not `veriloco trainer|verifier`.\n"
    )
    keys = [c.key for c in readme_commands(sample)]
    assert keys == ["veriloco devnet", "python benchmarks.gas --out", "python -m venv", "pip install x y",
                    "veriloco store get --store-dir -o", "make demo --cheat --trainers"]
    with pytest.raises(AssertionError, match="cannot read"):
        readme_commands("```\nveriloco runs\nrm -rf /\n```\n")


def uncovered(commands: list[Command]) -> dict[str, str]:
    """shape -> README line of each command COVERED does not map to a test."""
    return {c.key: c.line for c in commands if c.key not in COVERED}


def parse_failures(commands: list[Command], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """`line: parser error` of each `veriloco` command the real parser refuses."""
    failed = []
    for cmd in commands:
        if cmd.program != "veriloco":
            continue
        try:
            ns = build_parser(cmd.args[0] if cmd.args else None).parse_args(list(cmd.args))
            assert callable(ns.func), cmd.line
        except SystemExit:
            failed.append(f"{cmd.line}: {capsys.readouterr().err.strip()}")
    return failed


def test_every_readme_command_is_covered_by_a_test() -> None:
    commands = readme_commands()
    missing_tests = uncovered(commands)
    assert not missing_tests, (
        "README commands no test runs; add a test and map each shape in COVERED:\n"
        + "\n".join(f"  {k!r}  (from: {line})" for k, line in missing_tests.items()))
    stale = sorted(set(COVERED) - {c.key for c in commands})
    assert not stale, f"COVERED lists commands the README no longer has: {stale}"
    missing = sorted({ref for refs in COVERED.values() for ref in refs if not _test_exists(ref)})
    assert not missing, f"COVERED names tests that do not exist: {missing}"
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert PARSED_ONLY <= set(COVERED)
    # a new command, or a new flag on a covered one, is caught
    added = readme_commands("```\nveriloco runs --json\nveriloco status --run 1\nveriloco export --run 1 --epoch 2 --out m/\n```\n")
    assert sorted(uncovered(added)) == ["veriloco export --epoch --out --run", "veriloco runs --json"]


def test_every_readme_veriloco_line_parses(capsys: pytest.CaptureFixture[str]) -> None:
    commands = readme_commands()
    assert sum(c.program == "veriloco" for c in commands) >= 20
    failed = parse_failures(commands, capsys)
    assert not failed, "README commands the CLI no longer accepts:\n" + "\n".join(failed)
    # the check itself: a renamed flag, a missing required one, a removed subcommand
    bad = readme_commands("```\nveriloco trainer --runs 1\nveriloco leave --account 2\nveriloco store fetch Qm1\n```\n")
    assert len(parse_failures(bad, capsys)) == 3


def _make_demo_recipe() -> list[str]:
    """The `veriloco demo` arguments of the Makefile's `demo` recipe, $(DEMO_ARGS) marked."""
    recipe = re.search(r"^demo:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe, "the Makefile has no demo recipe"
    tokens = shlex.split(recipe.group(1))
    at = next(i for i, t in enumerate(tokens) if t.endswith("/veriloco"))
    return tokens[at + 1:]


def test_every_readme_make_demo_runs_a_demo_line_that_parses(capsys: pytest.CaptureFixture[str]) -> None:
    recipe = _make_demo_recipe()
    assert recipe[0] == "demo" and "$(DEMO_ARGS)" in recipe
    makes = [c for c in readme_commands() if c.program == "make" and "demo" in c.args]
    assert len(makes) >= 4
    for cmd in makes:
        demo_args = next((shlex.split(a.split("=", 1)[1]) for a in cmd.args if a.startswith("DEMO_ARGS=")), [])
        argv = [a for t in recipe for a in (demo_args if t == "$(DEMO_ARGS)" else [t])]
        try:
            build_parser("demo").parse_args(argv)
        except SystemExit:
            pytest.fail(f"README: `{cmd.line}` runs `veriloco {' '.join(argv)}`, which does not parse: "
                        f"{capsys.readouterr().err.strip()}")


class _Parsed(Exception):
    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns


def test_benchmark_lines_parse_with_their_own_parsers(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Each benchmark's `main` is entered with the README's arguments and stopped right after it parses them."""
    real = argparse.ArgumentParser.parse_args

    def parse_and_stop(self: argparse.ArgumentParser, args: object = None, namespace: object = None) -> None:
        raise _Parsed(real(self, args, namespace))  # type: ignore[call-overload]

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    benches = [c for c in readme_commands() if c.program == "python" and c.key.startswith("python benchmarks.")]
    assert len(benches) >= 7
    for cmd in benches:
        args = list(cmd.args)
        module, rest = (args[1], args[2:]) if args[0] == "-m" else (args[0].removesuffix(".py").replace("/", "."), args[1:])
        monkeypatch.setattr(sys, "argv", [module, *rest])
        main = importlib.import_module(module).main
        try:
            main()
        except _Parsed as done:
            assert vars(done.ns), cmd.line
        except SystemExit:
            pytest.fail(f"README: `{cmd.line}` no longer parses: {capsys.readouterr().err.strip()}")
        else:
            pytest.fail(f"{module}.main() returned without parsing its arguments")


def _hand_block() -> list[Command]:
    text = README.read_text()
    section = text.split("## Running a network by hand", 1)[1].split("\n## ", 1)[0]
    return [c for c in readme_commands(section, prose=False) if c.program == "veriloco"]


# what a node's readable output shows once it is at work (veriloco/logs.py's text format)
NODE_SHOWS = {
    "veriloco verifier": r"^\d\d:\d\d:\d\d INFO  verifier +started",
    "veriloco coordinator": r"^\d\d:\d\d:\d\d INFO  coordinator +waiting +what=epoch 0 to be ready to finalize",
}


def _popen_with_ctrl_c(args: list[str], **kw: Any) -> subprocess.Popen[str]:
    """Popen whose child takes Ctrl-C as at a terminal. A suite started as a background job has SIGINT
    ignored, an ignored signal stays ignored across exec, and Python keeps it so: the node would never
    see the Ctrl-C. A handled signal is reset to the default in the child, so handle it around the fork."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, **kw)
    finally:
        signal.signal(signal.SIGINT, previous)


def _node_until(cmd: Command, pattern: str, cwd: Path, timeout: float = 180) -> None:
    """Run a node command as a process until a line of its output matches `pattern`, then Ctrl-C it."""
    proc = _popen_with_ctrl_c([sys.executable, "-m", "veriloco.cli", *cmd.args], cwd=cwd,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if re.search(pattern, line):
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        found.wait(timeout)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(10)
    out = "".join(lines)
    assert found.is_set(), f"`{cmd.line}` never printed {pattern!r}:\n{out}"
    # Ctrl-C is a stop asked for: one `stopped` line, status 0 (README, "stopping")
    assert proc.returncode == 0 and " stopped " in out and "Traceback" not in out and "{" not in out, out


def test_the_network_by_hand_block_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`veriloco devnet` as a process in an empty folder, then the block's quick commands as the README has them.

    The verifier and the coordinator run as processes until their readable output shows them at work
    (the coordinator's wait for epoch 0 included), then get Ctrl-C; a trainer would train, which the
    e2e networks do. Leave and withdraw need a played epoch (tests/integration/test_lifecycle_cli.py);
    here they must be refused cleanly.
    """
    cmds = _hand_block()
    assert [c.key for c in cmds][:2] == ["veriloco devnet", "veriloco run create --account --config"]
    shutil.copytree(ROOT / "examples", tmp_path / "examples")  # the README runs in a checkout
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_KEY_PASSWORD", "readme")
    for var in ("VERILOCO_DEVNET", "VERILOCO_RPC_URL", "VERILOCO_CONTRACT", "VERILOCO_KEY"):
        monkeypatch.delenv(var, raising=False)
    devnet = subprocess.Popen([sys.executable, "-m", "veriloco.cli", *cmds[0].args], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        end = time.monotonic() + 120
        while not (tmp_path / ".veriloco" / "devnet.json").exists():
            assert devnet.poll() is None and time.monotonic() < end, "veriloco devnet did not come up"
            time.sleep(0.2)
        ran: set[str] = set()
        for cmd in cmds[1:]:
            name = cmd.key.split(" --")[0]
            if name == "veriloco trainer":
                continue  # trains: the e2e networks run it
            if name in NODE_SHOWS:  # started as written, read until its readable output says it is at work
                _node_until(cmd, NODE_SHOWS[name], tmp_path)
                ran.add(name)
                continue
            code, out, err = run_cli(capsys, *cmd.args)
            if name in ("veriloco leave", "veriloco withdraw"):  # account 2 never joined: told so, in one line
                assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (cmd.line, err)
                ran.add(name)
                continue
            assert code == 0, (cmd.line, err)
            ran.add(name)
            if name == "veriloco run create":
                assert out.strip().splitlines()[-1] == "1", out  # "prints the run id"
            elif name == "veriloco status":
                assert "run 1" in out and "waiting for epoch 0" in out, out
            elif name == "veriloco runs":
                assert re.search(r"^\s*1\s", out, re.MULTILINE) and "waiting" in out, out
            elif name == "veriloco claim":
                assert "nothing to claim" in out, out
            elif name == "veriloco account new":
                assert json.loads((tmp_path / "node.json").read_text())["crypto"], out
        assert ran == {"veriloco run create", "veriloco verifier", "veriloco coordinator", "veriloco status", "veriloco runs", "veriloco leave",
                       "veriloco withdraw", "veriloco claim", "veriloco account new", "veriloco doctor", "veriloco earnings"}
    finally:
        if devnet.poll() is None:
            os.killpg(devnet.pid, signal.SIGINT)
        try:
            log, _ = devnet.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(devnet.pid, signal.SIGKILL)
            log, _ = devnet.communicate()
    assert devnet.returncode == 0, log
    assert "Traceback" not in log, log
