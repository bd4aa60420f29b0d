"""Every CLI command with malformed arguments: one clean line on stderr, a non-zero exit, never a traceback.

Commands run in process through `veriloco.cli.main` (an exception escaping it fails the test, as a
traceback would reach the user), and a few through the real console entry point in a subprocess.
Cases that need a chain run against a py-evm devnet with one small run created by the CLI; each
refusal that must come before anything is published or staked checks that nothing was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from protocol.chain.binding import Chain
from tests.fixtures.cli import create_run
from tests.fixtures.cli import run_cli as cli

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RUN_TOML = (
    "[data]\ncorpus_bytes = 200000\n[schedule]\nepochs = 1\n[audit]\nquorum = 1\ntest_run = true\n"
    "[stakes]\ntrainer_wei = 1000\nverifier_wei = 1000\nmin_trainers = 1\nmax_trainers = 1\n"
    "[windows]\ncommit_s = 60\nreveal_s = 60\nresponse_s = 60\nverdict_s = 60\nfinalize_s = 60\nunbonding_s = 100\n"
)



def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run a command that must be refused; return its one line."""
    code, _, err = cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code != 0, f"{argv} exited 0"
    assert len(lines) == 1, f"{argv}: expected one line on stderr, got {err!r}"
    assert "Traceback" not in err and lines[0].startswith("veriloco"), err
    return lines[0]


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder with no devnet file and no VERILOCO_* variables."""
    monkeypatch.chdir(tmp_path)
    for var in [v for v in os.environ if v.startswith("VERILOCO_")]:
        monkeypatch.delenv(var)
    return tmp_path


def _key(folder: Path, name: str, data: bytes) -> str:
    path = folder / name
    path.write_bytes(data)
    return str(path)


# (argv, a phrase the line must contain); none of these needs a chain
OFFLINE = [
    (["status", "--run", "-1"], "runs are numbered from 1"),
    (["status", "--run", "1", "--epoch", "-1"], "epochs are numbered from 0"),
    (["status", "--run", "one"], "not a whole number"),
    (["runs", "--rpc-url", "ws://127.0.0.1:8546", "--contract", "0x" + "11" * 20], "not an http(s) URL"),
    (["trainer", "--run", "-1"], "runs are numbered from 1"),
    (["trainer", "--run", "1", "--threads", "0"], "at least 1"),
    (["trainer", "--run", "1", "--cheat", "bogus"], "invalid choice"),
    (["trainer", "--run", "1", "--metrics-host", "all"], "not an IP address to listen on"),
    (["verifier", "--run", "0"], "runs are numbered from 1"),
    (["coordinator", "--run", "1", "--account", "-2"], "must not be negative"),
    (["coordinator", "--run", "1"], "no RPC endpoint"),
    (["deploy", "--rpc-url", "localhost:8545"], "not an http(s) URL"),
    (["deploy", "--rpc-url", "http://[::1"], "malformed"),
    (["run", "create", "--config", "run.toml", "--coordinator", "0xdead"], "not an Ethereum address"),
    (["run", "create"], "required"),
    (["run"], "required"),
    (["leave", "--run", "-3"], "runs are numbered from 1"),
    (["withdraw"], "required"),
    (["claim", "--rpc-url", "http://127.0.0.1:9", "--contract", "0xdead", "--account", "0"], "no devnet file at"),
    (["demo", "--preset", "huge"], "invalid choice"),
    (["demo", "--trainers", "0"], "at least 1"),
    (["demo", "--quorum", "0"], "at least 1"),
    (["demo", "--cheat", "lazy:x"], "COUNT must be a number"),
    (["demo", "--cheat", "lazy:2", "--trainers", "2"], "so someone is honest"),
    (["demo", "--timeout", "-1"], "positive number of seconds"),
    (["simulate", "--epochs", "0"], "at least 1"),
    (["simulate", "--methods", "nope"], "unknown methods"),
    (["simulate", "--merge-step", "-1"], "must not be negative"),
    (["devnet", "--port", "70000"], "not a TCP port"),
    (["devnet", "--accounts", "0"], "at least 1"),
    (["store", "get", "bafy", "--digest", "0x12"], "32 bytes of hex"),
    (["store", "put", "no-such-file"], "not a file"),
    (["store", "get", "x", "--max-size", "-1"], "at least 1"),
    (["status", "--run", "1", "--devnet", "missing.json"], "not found"),
    (["nosuchcommand"], "invalid choice"),
    (["dashboard", "--run", "0"], "runs are numbered from 1"),
    (["dashboard", "--run", "1", "--port", "70000"], "not a TCP port"),
    (["dashboard", "--run", "1", "--refresh", "0"], "at least 1"),
    (["dashboard", "--run", "1"], "no RPC endpoint"),
    (["trainer", "--run", "1", "--metrics-port", "-1"], "not a TCP port"),
    (["trainer", "--run", "1", "--device", "cuda:99"], "--device 'cuda:99'"),  # no CUDA here, or not 100 GPUs
    (["verifier", "--run", "1", "--device", "mps"], "only cpu and cuda"),
    (["verifier", "--run", "1", "--device", "gpu!"], "not a device name"),
    (["demo", "--dashboard", "x"], "not a whole number"),
]


@pytest.mark.parametrize("argv,phrase", OFFLINE, ids=[" ".join(a) for a, _ in OFFLINE])
def test_malformed_arguments_are_one_clean_line(offline: Path, capsys: pytest.CaptureFixture[str],
                                                argv: list[str], phrase: str) -> None:
    (offline / "run.toml").write_text(RUN_TOML)
    line = refused(capsys, *argv)
    assert phrase in line


@pytest.mark.parametrize("content,phrase", [
    (b"\x00" + os.urandom(64) + b"\xff", "is not text"),
    (b"0x" + b"0" * 64, "holds zero"),
    (b"0x" + b"f" * 64, "too large"),
    (b"0x1234", "32-byte hex private key"),
    (b"", "32-byte hex private key"),
])
def test_bad_key_files_are_refused_before_connecting(offline: Path, capsys: pytest.CaptureFixture[str],
                                                     content: bytes, phrase: str) -> None:
    key = _key(offline, "key", content)
    line = refused(capsys, "deploy", "--rpc-url", "http://127.0.0.1:9", "--key", key)
    assert phrase in line and "key file" in line
    assert "cannot read key file" in refused(capsys, "deploy", "--rpc-url", "http://127.0.0.1:9", "--key", "nokey")


def test_the_console_script_prints_no_traceback(offline: Path) -> None:
    """Through the real entry point: argument errors, settings errors and an unreachable chain."""
    key = _key(offline, "key", os.urandom(40))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERILOCO_")} | {"PYTHONPATH": str(ROOT)}
    for argv in (["status", "--run", "-1"], ["trainer", "--run", "1", "--key", key, "--rpc-url", "http://127.0.0.1:9"],
                 ["status", "--run", "1", "--rpc-url", "http://127.0.0.1:9", "--contract", "0x" + "11" * 20],
                 ["demo", "--preset", "huge"]):
        p = subprocess.run([sys.executable, "-m", "veriloco.cli", *argv], check=False, capture_output=True, text=True,
                           cwd=offline, env=env, timeout=120)
        assert p.returncode == 2, (argv, p.stderr)
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, (argv, p.stderr)
    p = subprocess.run([sys.executable, "-m", "veriloco.cli", "--version"], check=False, capture_output=True, text=True,
                       cwd=offline, env=env, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("veriloco ") and p.stdout.split()[1][0].isdigit()


def test_a_bad_workdir_is_refused_before_torch_loads_naming_the_flag(offline: Path) -> None:
    """Issue 46 item 9: a --workdir under a file (or where this user cannot write) was a bare `[Errno 2]`
    after the chain connection and torch; now one line naming the flag, before the node's first line."""
    key = _key(offline, "key", b"0x" + b"1" * 64)
    (offline / "afile").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERILOCO_")} | {"PYTHONPATH": str(ROOT)}
    for role in ("trainer", "verifier"):
        p = subprocess.run([sys.executable, "-m", "veriloco.cli", role, "--run", "1", "--key", key, "--rpc-url",
                            "http://127.0.0.1:9", "--contract", "0x" + "11" * 20, "--workdir", "afile/nodes"],
                           check=False, capture_output=True, text=True, cwd=offline, env=env, timeout=120)
        assert p.returncode == 2 and p.stdout == "", (role, p.stdout, p.stderr)  # not even the `loading` line
        assert "--workdir afile/nodes" in p.stderr and "is a file, not a folder" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ against a devnet


@pytest.fixture
def online(devnet: Any, offline: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working folder, pointed at the devnet by its devnet file."""
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (offline / "run.toml").write_text(RUN_TOML)
    return offline


def _runs(devnet: Any) -> int:
    return Chain(devnet.info.rpc_url, devnet.info.contract).run_count()


def test_run_create_refuses_a_bad_coordinator_before_publishing(online: Path, devnet: Any,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    before = _runs(devnet)
    store = online / "store"
    line = refused(capsys, "run", "create", "--config", "run.toml", "--account", "0", "--store-dir", str(store),
                   "--coordinator", "0xdead")
    assert "not an Ethereum address" in line
    assert _runs(devnet) == before and not store.exists()  # nothing published, no run created
    line = refused(capsys, "run", "create", "--config", "missing.toml", "--account", "0", "--store-dir", str(store))
    assert "not found" in line and not store.exists()


def test_unknown_runs_and_epochs_are_named(online: Path, devnet: Any, capsys: pytest.CaptureFixture[str]) -> None:
    rid = create_run(capsys)
    missing = str(rid + 5)
    for argv in (["status", "--run", missing], ["trainer", "--run", missing, "--account", "1"],
                 ["verifier", "--run", missing, "--account", "2"], ["leave", "--run", missing, "--account", "1"]):
        assert f"run {missing} does not exist" in refused(capsys, *argv)
    assert "there is no epoch 7" in refused(capsys, "status", "--run", str(rid), "--epoch", "7")
    assert "not a member" in refused(capsys, "leave", "--run", str(rid), "--account", "3")
    assert "no stake" in refused(capsys, "withdraw", "--run", str(rid), "--account", "3")
    assert "--account 9" in refused(capsys, "claim", "--account", "9")
    assert "no contract at" in refused(capsys, "runs", "--contract", "0x" + "22" * 20)


def test_account_new_refuses_cleanly(offline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "required" in refused(capsys, "account", "new")
    assert "needs a password" in refused(capsys, "account", "new", "--out", "k.json")  # no terminal here
    assert "cannot read password file" in refused(capsys, "account", "new", "--out", "k.json", "--password-file", "nope")
    assert not (offline / "k.json").exists()


def test_nodes_refuse_a_run_pinned_to_other_hardware_before_staking(online: Path, devnet: Any,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (online / "gpu.toml").write_text(RUN_TOML.replace("quorum = 1\ntest_run = true\n", 'quorum = 1\ntest_run = true\ndevice = "cuda:NVIDIA H200"\n'))
    code, out, err = cli(capsys, "run", "create", "--config", "gpu.toml", "--account", "0", "--json")
    assert code == 0, err
    rid = str(json.loads(out)["run_id"])
    chain = Chain(devnet.info.rpc_url, devnet.info.contract)
    for role, account in (("trainer", "1"), ("verifier", "2")):
        line = refused(capsys, role, "--run", rid, "--account", account, "--allow-test-run")  # past the test-run check
        assert "replays bit for bit on 'cuda:NVIDIA H200'" in line and "computes on 'cpu'" in line, line
        assert chain.member(int(rid), devnet.info.accounts[int(account)].address).role == 0  # nothing staked
