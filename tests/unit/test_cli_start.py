"""The command line starts fast (issue 32): what each way in imports, checked in a fresh interpreter.

`--version` and the top-level help import no command module (so neither torch nor web3); a command
imports its own module only, and `status`, `runs`, `dashboard` and the nodes do not import torch to
read their arguments and settings; a node's first line comes before torch and the chain client. No
check here has a wall-clock threshold (the machines running them are loaded): the one timing test
prints what it measured.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.imports import ROOT, probe
from veriloco.cli import COMMAND_TABLE, COMMANDS, OWNER

pytestmark = pytest.mark.unit

CONTRACT = "0x" + "11" * 20
UNREACHABLE = "http://127.0.0.1:9"  # connection refused at once


def registered(module: str) -> dict[str, tuple[str, str]]:
    """command -> (module, help) of what `module.register` adds."""
    sub = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(module).register(sub)
    return {a.dest: (module, str(a.help)) for a in sub._choices_actions}


def test_the_command_table_is_what_the_modules_register() -> None:
    """`veriloco --help` lists COMMAND_TABLE without importing the modules: it must say what they say."""
    assert {name: pair for m in COMMANDS for name, pair in registered(m).items()} == COMMAND_TABLE
    assert set(OWNER) == set(COMMAND_TABLE) and set(OWNER.values()) == set(COMMANDS)


@pytest.mark.parametrize("argv", [["--version"], ["--help"], [], ["no-such-command"]], ids=repr)
def test_version_and_top_level_help_import_no_command_module(tmp_path: Path, argv: list[str]) -> None:
    got = probe(argv, tmp_path)
    assert got.heavy() == [] and not got.modules & set(COMMANDS), sorted(got.modules & {*COMMANDS, "torch", "web3"})
    if argv == ["--version"]:
        assert got.code == 0 and got.stdout.startswith("veriloco ")
        return
    listing = got.stdout if argv == ["--help"] else got.stderr
    assert got.code == (0 if argv == ["--help"] else 2)
    if argv != ["no-such-command"]:  # the listing: every command, with the start of its help line
        assert all(name in listing and help_[:20] in listing for name, (_, help_) in COMMAND_TABLE.items()), listing
    else:
        assert "invalid choice: 'no-such-command'" in got.stderr and "'dashboard'" in got.stderr


@pytest.mark.parametrize("command", ["status", "runs", "dashboard", "trainer", "verifier", "coordinator", "deploy"])
def test_a_command_help_imports_its_own_module_and_no_torch(tmp_path: Path, command: str) -> None:
    got = probe([command, "--help"], tmp_path)
    assert got.code == 0 and got.stdout.startswith(f"usage: veriloco {command}")
    assert "torch" not in got.modules
    assert OWNER[command] in got.modules
    # other command modules only where the owner imports them itself (dashweb shows chaincmds' slash reasons)
    allowed = {OWNER[command], *({"veriloco.chaincmds"} if command == "dashboard" else set())}
    assert got.modules & set(COMMANDS) == allowed


@pytest.mark.parametrize("argv", [
    ["status", "--run", "1"],
    ["runs"],
    ["dashboard", "--run", "1"],
    ["status", "--run", "1", "--rpc-url", UNREACHABLE, "--contract", CONTRACT],
    ["runs", "--rpc-url", UNREACHABLE, "--contract", CONTRACT],
], ids=" ".join)
def test_status_runs_and_dashboard_reach_the_chain_without_torch(tmp_path: Path, argv: list[str]) -> None:
    """Arguments, settings and the chain client: no torch (a missing RPC endpoint, or a refused connection)."""
    got = probe(argv, tmp_path)
    assert got.code == 2 and got.stderr.startswith(f"veriloco {argv[0]}: error: "), got.stderr
    assert "torch" not in got.modules


@pytest.mark.parametrize("role", ["trainer", "verifier", "coordinator"])
def test_a_node_says_it_is_loading_before_torch_and_the_chain_client(tmp_path: Path, role: str) -> None:
    key = tmp_path / "key"
    key.write_text("0x" + "4c" * 32)
    got = probe([role, "--run", "1", "--rpc-url", UNREACHABLE, "--contract", CONTRACT, "--key", str(key),
                 "--log-format", "json"], tmp_path)
    assert got.code == 2 and "cannot reach the chain" in got.stderr, got.stderr
    first, heavy_then = got.lines[0]
    assert '"event": "loading"' in first and f'"node": "{role}"' in first
    assert heavy_then == []  # written before torch and web3 were imported
    assert got.heavy() == ["torch", "web3"]  # which the node did import next


def test_settings_errors_of_a_node_come_before_its_first_line(tmp_path: Path) -> None:
    """A node that cannot start says why on stderr alone, as at once as the loading line would."""
    got = probe(["trainer", "--run", "1"], tmp_path)
    assert got.code == 2 and "no RPC endpoint" in got.stderr and got.lines == [] and got.heavy() == []


def test_version_wall_time_is_recorded(tmp_path: Path) -> None:
    """Prints how long `veriloco --version` takes through the console script here; asserts no threshold."""
    script = shutil.which("veriloco", path=str(Path(sys.executable).parent))
    cmd = [script, "--version"] if script else [sys.executable, "-m", "veriloco.cli", "--version"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
        times.append(time.perf_counter() - t0)
        assert p.returncode == 0 and p.stdout.startswith("veriloco "), p.stderr
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n`{' '.join(Path(c).name for c in cmd)}`: {', '.join(f'{t:.3f}' for t in times)} s (load average {load})")
