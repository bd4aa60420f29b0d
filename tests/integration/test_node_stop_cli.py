"""A requested stop (issue 32): SIGTERM or SIGINT ends a real node process with exit status 0 and one
`stopped` line naming the signal, the state folder it kept and the command that resumes it.

Three node processes (`python -m veriloco.cli trainer|verifier|coordinator`) run against a py-evm
devnet with a run created by the CLI; each is signalled once it holds its node lock (so it is inside
its loop, the trainer in the middle of training), and the trainer's resume command is then run as printed
and takes the same folder again.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from protocol.nodelock import LOCK_FILE
from tests.fixtures.cli import create_run

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RUN_TOML = (
    "[data]\ncorpus_bytes = 200000\n[schedule]\nepochs = 2\nh_initial = 64\nh_min = 64\nh_max = 64\n"
    "[audit]\nquorum = 1\ntest_run = true\n"
    "[stakes]\ntrainer_wei = 1000\nverifier_wei = 1000\nmin_trainers = 1\n"
    "[windows]\ncommit_s = 600\nreveal_s = 600\nresponse_s = 600\nverdict_s = 600\nfinalize_s = 600\n"
)


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`veriloco *argv` as its own process (stdout to `log`, stderr kept apart)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "veriloco.cli", *argv], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.PIPE)


def locked_by(proc: subprocess.Popen[bytes], folder: Path, log: Path, timeout: float = 300) -> Path:
    """The node lock `proc` holds under `folder`, once it has written its PID there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the node exited ({proc.returncode}) before locking: {log.read_text()}"
                                 f"{proc.stderr.read().decode() if proc.stderr else ''}")
        for path in folder.glob(f"*/run-*/{LOCK_FILE}"):
            if path.read_text().strip() == str(proc.pid):
                return path
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no lock within {timeout} s: {log.read_text()}")


def wait_for(event: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> None:
    """Until `proc` has logged `event` (a JSON line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        if any(json.loads(line).get("event") == event for line in log.read_text().splitlines() if line.startswith("{")):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {event} event within {timeout} s: {log.read_text()}")


def events_of(log: Path) -> list[dict[str, Any]]:
    """The JSON events of a node's log, in order."""
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def stopped(proc: subprocess.Popen[bytes], sig: int, log: Path) -> dict[str, Any]:
    """Signal `proc`; it must exit 0 with nothing on stderr, its last line the one `stopped` event."""
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the node did not stop within 120 s of {signal.Signals(sig).name}") from None
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and err.decode() == "", (proc.returncode, err.decode()[-3000:])
    assert [e["event"] for e in events].count("stopped") == 1 and events[-1]["event"] == "stopped", events[-3:]
    return events[-1]


def test_sigterm_and_sigint_stop_each_node_cleanly_and_the_trainer_resumes(
        devnet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (tmp_path / "run.toml").write_text(RUN_TOML)
    run = str(create_run(capsys))
    addr = [Account.from_key(a.key).address for a in devnet.info.accounts]
    workdir = tmp_path / "nodes"
    common = ["--run", run, "--devnet", str(devnet.config.devnet_file), "--workdir", str(workdir), "--log-format", "json"]
    roles = {"trainer": (1, signal.SIGTERM), "verifier": (2, signal.SIGINT), "coordinator": (0, signal.SIGTERM)}
    logs = {role: tmp_path / f"{role}.jsonl" for role in roles}
    procs = {role: start([role, *common, "--account", str(a)], logs[role]) for role, (a, _) in roles.items()}
    try:
        locks = {role: locked_by(procs[role], workdir / f"{role}-{addr[a]}", logs[role]) for role, (a, _) in roles.items()}
        wait_for("step", procs["trainer"], logs["trainer"])  # stopped while training
        for role, (a, sig) in roles.items():
            line = stopped(procs[role], sig, logs[role])
            assert line["node"] == role and line["signal"] == signal.Signals(sig).name
            assert line["kept"].startswith(str(locks[role].parent)), line
            assert shlex.split(line["resume"]) == ["veriloco", role, *common, "--account", str(a)]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    # the trainer kept its run folder (its identity and epoch records) and resumes with the command it printed
    trainer = json.loads(logs["trainer"].read_text().splitlines()[-1])
    kept = Path(trainer["kept"])
    assert (kept / "identity.json").is_file() and any(kept.glob("epoch-*")), sorted(p.name for p in kept.iterdir())
    again = tmp_path / "trainer-again.jsonl"
    argv = shlex.split(trainer["resume"])[1:]
    proc = start(argv, again)
    try:
        assert locked_by(proc, workdir / f"trainer-{addr[1]}", again) == locks["trainer"]
        assert stopped(proc, signal.SIGTERM, again)["kept"] == trainer["kept"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


LONG_EPOCH = 2000  # steps: the trainer is still inside epoch 0 when it leaves


def test_a_trainer_that_leaves_while_training_stops_before_finishing_the_epoch(
        devnet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: `veriloco leave` while the node trains an epoch the contract will no longer let it commit
    stops the node within seconds (`removed`, then `finished`, status 0), not after training the whole
    epoch; leave's own message says so and gives the withdraw command for the same key.

    The same trainer serves its metrics on every interface (`--metrics-host 0.0.0.0`): it says once, as a
    warning, that the endpoint is reachable from other machines, and the endpoint answers."""
    import socket
    import urllib.request

    from tests.fixtures.cli import run_cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (tmp_path / "run.toml").write_text(RUN_TOML.replace("h_initial = 64\nh_min = 64\nh_max = 64",
                                                        f"h_initial = {LONG_EPOCH}\nh_min = 64\nh_max = {LONG_EPOCH}"))
    run = str(create_run(capsys))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "trainer.jsonl"
    proc = start(["trainer", "--run", run, "--devnet", str(devnet.config.devnet_file), "--workdir", str(tmp_path / "n"),
                  "--log-format", "json", "--account", "1", "--checkpoint-every", "500",
                  "--metrics-port", str(port), "--metrics-host", "0.0.0.0"], log)
    try:
        wait_for("step", proc, log)
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
        assert "veriloco_steps_trained_total" in scraped
        code, out, err = run_cli(capsys, "leave", "--run", run, "--account", "1")
        assert code == 0, err
        assert "it takes part in no epoch from 0 on (a running trainer node stops before training it)" in out, out
        assert f"`veriloco withdraw --run {run} --account 1`" in out, out
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert proc.returncode == 0 and err.decode() == "", (proc.returncode, err.decode()[-3000:])
    assert names[-2:] == ["removed", "finished"] and events[-2]["epoch"] == 0, events[-3:]
    assert "trained" not in names and "committed" not in names
    assert names.count("step") < LONG_EPOCH, "it trained the whole epoch it could no longer commit"
    warnings = [e for e in events if e["event"] == "warning" and e.get("what") == "metrics"]
    assert len(warnings) == 1 and warnings[0]["level"] == "WARN" and f"0.0.0.0:{port}" in warnings[0]["detail"]


def test_a_trainer_stopped_with_an_answer_owed_reveals_and_answers_before_it_exits(
        devnet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 46 item 2: SIGTERM between a trainer's commit and its audit answer. The node used to exit at
    once, naming the answer due; a restart 18 s later missed the response window and was slashed. Now
    it stays to reveal and answer what it committed to (`draining`, then `revealed` and `responded`),
    then stops with nothing due, and the chain holds its answer. A second trainer that never commits
    keeps the commit window open, so the reveal is still owed when the signal comes."""
    from protocol.chain.binding import Chain

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (tmp_path / "run.toml").write_text(RUN_TOML.replace("h_initial = 64\nh_min = 64\nh_max = 64", "h_initial = 4\nh_min = 4\nh_max = 4")
                                       .replace("commit_s = 600", "commit_s = 45"))
    run = create_run(capsys)
    info = devnet.info
    keys = [Account.from_key(a.key) for a in info.accounts]
    Chain(info.rpc_url, info.contract, keys[2]).join_verifier(run)  # the audit's quorum of one
    Chain(info.rpc_url, info.contract, keys[3]).join_trainer(run)  # never commits: the window runs its 45 s
    log = tmp_path / "trainer.jsonl"
    proc = start(["trainer", "--run", str(run), "--devnet", str(devnet.config.devnet_file), "--workdir", str(tmp_path / "n"),
                  "--log-format", "json", "--account", "1"], log)
    try:
        wait_for("committed", proc, log)
        line = stopped(proc, signal.SIGTERM, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = events_of(log)
    names = [e["event"] for e in events]
    assert "draining" in names and names.index("draining") < names.index("revealed") < names.index("responded"), names
    assert [e["epoch"] for e in events if e["event"] == "responded"] == [0] and "due" not in line, line
    assert Chain(info.rpc_url, info.contract).submission(run, 0, keys[1].address).state == 3  # answered on chain


def test_a_verifier_stopped_with_verdicts_owed_commits_and_reveals_them_before_it_exits(
        devnet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 46 item 2, the verifier's side: SIGTERM once a trainer has answered, before the verifier's
    verdicts are in. A second verifier that never commits keeps reveals closed until the middle of the
    verdict window, so the reveal is still owed when the signal comes. The verifier stays to commit and
    reveal (`draining`, then `verdicts`), stops with nothing due, and the chain holds its reveal. Short
    response and verdict windows (20 s, 40 s) bound that wait: the verdict window opens when the response
    window closes."""
    from protocol.chain.binding import Chain

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (tmp_path / "run.toml").write_text(RUN_TOML.replace("h_initial = 64\nh_min = 64\nh_max = 64", "h_initial = 4\nh_min = 4\nh_max = 4")
                                       .replace("response_s = 600", "response_s = 20").replace("verdict_s = 600", "verdict_s = 40"))
    run = create_run(capsys)
    info = devnet.info
    keys = [Account.from_key(a.key) for a in info.accounts]
    Chain(info.rpc_url, info.contract, keys[3]).join_verifier(run)  # never commits verdicts
    common = ["--run", str(run), "--devnet", str(devnet.config.devnet_file), "--workdir", str(tmp_path / "n"), "--log-format", "json"]
    logs = {r: tmp_path / f"{r}.jsonl" for r in ("trainer", "verifier")}
    procs = {"verifier": start(["verifier", *common, "--account", "2"], logs["verifier"])}
    try:
        wait_for("started", procs["verifier"], logs["verifier"])  # joined before the trainer's epoch 0 audit
        procs["trainer"] = start(["trainer", *common, "--account", "1"], logs["trainer"])
        wait_for("responded", procs["trainer"], logs["trainer"])
        line = stopped(procs["verifier"], signal.SIGTERM, logs["verifier"])
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    events = events_of(logs["verifier"])
    names = [e["event"] for e in events]
    assert "draining" in names and names.index("draining") < names.index("verdicts"), names
    assert [e["epoch"] for e in events if e["event"] == "verdicts"] == [0] and "due" not in line, line
    chain = Chain(info.rpc_url, info.contract)
    assert any(ev.args["verifier"] == keys[2].address for ev in chain.events(["VerdictsRevealed"], run_id=run, epoch=0))
