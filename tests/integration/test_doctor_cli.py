"""`veriloco doctor` against a py-evm devnet with a run created by `veriloco run create`.

A healthy setup passes every check it can make (exit status 0); each broken piece (an unfunded key,
a taken metrics port, an address without the contract, a key that is not the run's coordinator, an
unreachable chain) is one FAIL line that says what to do, and the exit status is 1.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cli import create_run
from tests.fixtures.cli import run_cli as cli

pytestmark = pytest.mark.integration

RUN_TOML = (
    "[data]\ncorpus_bytes = 200000\n[schedule]\nepochs = 2\n[audit]\nquorum = 1\ntest_run = true\n"
    "[stakes]\ntrainer_wei = 1000\nverifier_wei = 1000\nmin_trainers = 1\n"
    "[windows]\ncommit_s = 60\nreveal_s = 60\nresponse_s = 60\nverdict_s = 60\nfinalize_s = 60\n"
)
CHECKS = ["python", "torch", "device", "determinism", "settings", "rpc", "clock", "contract", "run", "store",
          "device pin", "numerics", "state disk", "key", "ports"]


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from devnet.launch import start_devnet

    with start_devnet(state_dir=tmp_path_factory.mktemp("devnet"), accounts=4) as net:
        yield net


@pytest.fixture
def where(devnet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder using the devnet file, with no other VERILOCO_* settings."""
    monkeypatch.chdir(tmp_path)
    for var in [v for v in os.environ if v.startswith("VERILOCO_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    return tmp_path


def doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, tuple[str, str]]]:
    """(exit status, {check: (status, detail)}): one line per check, in order, then a summary line."""
    code, out, err = cli(capsys, "doctor", *argv)
    assert err == "" and "Traceback" not in out, err
    lines = out.strip().splitlines()
    rows = [(line[:5].strip(), line[6:18].strip(), line[19:]) for line in lines[:-1]]
    assert [name for _, name, _ in rows] == CHECKS, out
    assert all(status in ("ok", "FAIL", "skip") for status, _, _ in rows), out
    failed = sum(status == "FAIL" for status, _, _ in rows)
    assert lines[-1] == (f"{failed} check(s) failed" if failed else "all checks passed")
    return code, {name: (status, detail) for status, name, detail in rows}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_healthy_trainer_setup_passes_and_each_broken_piece_fails(where: Path, devnet: Any,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (where / "run.toml").write_text(RUN_TOML)
    run = str(create_run(capsys))

    node = ["--run", run, "--workdir", str(where / "nodes")]
    code, got = doctor(capsys, *node, "--account", "1", "--metrics-port", str(free_port()))
    assert code == 0 and all(status == "ok" for status, _ in got.values()), [(k, v) for k, v in got.items() if v[0] != "ok"]
    assert f"chain id {devnet.info.chain_id}" in got["rpc"][1]
    assert f"run {run}'s config" in got["store"][1] and "digest checked" in got["store"][1]
    assert "a trainer needs about" in got["key"][1] and "stake 1e-15 ETH" in got["key"][1]
    assert "replays in exact mode on 'cpu'" in got["device pin"][1]
    assert "class x86-64-v3-cnr, 1 thread(s), fingerprint 0x" in got["numerics"][1] and "matches the run's" in got["numerics"][1]
    port = free_port()  # the node's --metrics-host: every interface is fine, and said to be reachable from elsewhere
    code, got = doctor(capsys, *node, "--account", "1", "--metrics-port", str(port), "--metrics-host", "0.0.0.0")
    assert code == 0 and got["ports"][0] == "ok", got["ports"]
    assert got["ports"][1] == f"metrics port {port} on 0.0.0.0 is free; reachable from other machines, unauthenticated: firewall it"

    # an unfunded key, a taken metrics port: two FAIL lines that say what to do, exit status 1
    key = where / "empty.key"
    key.write_text("0x" + os.urandom(32).hex())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, got = doctor(capsys, *node, "--key", str(key), "--metrics-port", str(port))
    assert code == 1 and [n for n, (s, _) in got.items() if s == "FAIL"] == ["key", "ports"], got
    assert "send it" in got["key"][1] and "more" in got["key"][1]
    assert f"metrics port {port}" in got["ports"][1] and "pick another --metrics-port" in got["ports"][1]

    # the coordinator role with another key than the run's coordinator
    code, got = doctor(capsys, *node, "--account", "2", "--role", "coordinator")
    assert code == 1 and got["key"][0] == "FAIL" and "start it with that key" in got["key"][1], got

    # an address that holds no contract: the run, its store and the key's stake cannot be checked
    code, got = doctor(capsys, *node, "--account", "1", "--contract", devnet.info.accounts[3].address)
    assert code == 1 and got["contract"][0] == "FAIL" and "no contract at" in got["contract"][1], got
    assert got["run"][0] == "skip" and got["key"][0] == "skip"


def test_an_unreachable_chain_fails_once_and_skips_what_needs_it(where: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, got = doctor(capsys, "--rpc-url", "http://127.0.0.1:9", "--contract", "0x" + "11" * 20, "--account", "0")
    assert code == 1 and got["rpc"][0] == "FAIL" and "cannot reach the chain" in got["rpc"][1], got
    assert [got[n][0] for n in ("clock", "contract", "run")] == ["skip", "skip", "skip"]
    assert got["python"][0] == got["torch"][0] == got["determinism"][0] == "ok"


def test_no_settings_at_all_is_one_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for var in [v for v in os.environ if v.startswith("VERILOCO_")]:
        monkeypatch.delenv(var)
    code, got = doctor(capsys)
    assert code == 1 and [n for n, (s, _) in got.items() if s == "FAIL"] == ["settings"], got
    assert "no RPC endpoint" in got["settings"][1]
    assert not (tmp_path / ".veriloco").exists()  # doctor reads; it creates nothing


def test_a_node_whose_numerics_differ_from_the_runs_refuses_before_it_stakes(
        where: Path, devnet: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A run whose recorded fingerprint this host cannot reproduce (another torch build or CPU class
    would show as this): doctor fails the check, and the trainer and the verifier refuse at start,
    naming the fingerprints, before joining; nothing of theirs is staked (issue 51)."""
    from protocol.chain.binding import Chain

    (where / "run.toml").write_text(RUN_TOML.replace("[audit]\n", '[audit]\nnumerics_digest = "0x' + "ab" * 32 + '"\n'))
    run = create_run(capsys)
    code, got = doctor(capsys, "--run", str(run), "--workdir", str(where / "nodes"), "--account", "1",
                       "--metrics-port", str(free_port()))
    assert code == 1 and [n for n, (s, _) in got.items() if s == "FAIL"] == ["numerics"], got
    assert "differs from the run's 0xabababab" in got["numerics"][1]
    chain = Chain(devnet.info.rpc_url, devnet.info.contract)
    for role, account in (("trainer", 1), ("verifier", 2)):
        code, _, err = cli(capsys, role, "--run", str(run), "--account", str(account), "--workdir", str(where / role),
                           "--metrics-port", "0", "--allow-test-run")  # a test run: past that check to the numerics
        assert code == 2 and "numerics class x86-64-v3-cnr" in err and "differs from the run's" in err, err
        assert chain.member(run, devnet.info.accounts[account].address).role == 0  # never joined, nothing staked
