"""One node per key through the CLI (issues 30, 46): a second `veriloco trainer` with the first one's
key, in its --workdir or another, is refused and told its PID; a SIGKILLed node blocks no restart.

A real `veriloco trainer` process on a py-evm devnet holds the lock; a second trainer process, and a
verifier and the coordinator whose folders this test locks itself, must answer with one line on
stderr and exit status 2 before they stake anything (as processes: one that wrongly starts is killed
at a deadline instead of running on in the test).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from protocol.chain.binding import Chain
from protocol.nodelock import LOCK_FILE, lock_node
from tests.fixtures.cli import create_run

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RUN_TOML = (
    "[data]\ncorpus_bytes = 200000\n[schedule]\nepochs = 1\n[audit]\nquorum = 1\ntest_run = true\nchallenges = 2\n"
    "[stakes]\ntrainer_wei = 1000\nverifier_wei = 1000\nmin_trainers = 1\nmax_trainers = 2\n"
    "[windows]\ncommit_s = 600\nreveal_s = 600\nresponse_s = 600\nverdict_s = 600\nfinalize_s = 600\n"
    "unbonding_s = 100\n"
)


def veriloco(*argv: str, **kw: Any) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "veriloco.cli", *argv], cwd=ROOT, env=env, **kw)


def refused(proc: subprocess.Popen[bytes], role: str, timeout: float = 120) -> str:
    """The one line a node refused with (exit status 2); a node that started instead is killed."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the second {role} started instead of refusing") from None
    text = err.decode()
    assert proc.returncode == 2 and len(text.strip().splitlines()) == 1, (text, out)
    assert text.startswith(f"veriloco {role}: error: "), text
    return text.strip()


def wait_for_lock(workdir: Path, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> Path:
    """The lock file once `proc` has written its PID into it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        for path in workdir.glob(f"trainer-*/*/run-*/{LOCK_FILE}"):
            if path.read_text().strip() == str(proc.pid):
                return path
        time.sleep(0.2)
    raise AssertionError(f"the trainer took no lock within {timeout} s: {log.read_text()}")


def test_the_same_key_twice_is_refused_and_a_killed_node_blocks_no_restart(
        devnet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    monkeypatch.setenv("VERILOCO_LOCK_DIR", str(tmp_path / "locks"))  # the per-user key locks, this test's own
    (tmp_path / "run.toml").write_text(RUN_TOML)
    r = str(create_run(capsys))
    keys = [a.key for a in devnet.info.accounts]
    addr = [Account.from_key(k).address for k in keys]
    chain = Chain(devnet.info.rpc_url, devnet.info.contract)
    workdir = tmp_path / "nodes"
    node = ["--run", r, "--devnet", str(devnet.config.devnet_file), "--workdir", str(workdir)]

    log = tmp_path / "trainer1.jsonl"
    with open(log, "wb") as out_file:
        first = veriloco("trainer", *node, "--account", "1", "--log-format", "json",
                         stdout=out_file, stderr=subprocess.STDOUT)
    try:
        path = wait_for_lock(workdir, first, log)
        assert path.parent.parent.parent == workdir / f"trainer-{addr[1]}"
        second = veriloco("trainer", *node, "--account", "1", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = refused(second, "trainer")
        assert f"PID {first.pid} holds {path}" in line and f"kill {first.pid}" in line and "--workdir" in line
        # the same key from another state folder (issue 46): the per-user key lock, naming the first's folder
        elsewhere = ["--run", r, "--devnet", str(devnet.config.devnet_file), "--workdir", str(tmp_path / "other")]
        third = veriloco("trainer", *elsewhere, "--account", "1", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = refused(third, "trainer")
        assert f"key {addr[1]} already runs in run {r} on this machine" in line and f"PID {first.pid}" in line, line
        assert str(workdir / f"trainer-{addr[1]}") in line and f"kill {first.pid}" in line, line
        assert first.poll() is None  # the first one runs on, undisturbed
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)

    # the file still names the dead trainer; its restart takes the lock all the same
    assert path.read_text().strip() == str(first.pid)
    with lock_node(chain, int(r), workdir / f"trainer-{addr[1]}") as lock:
        assert lock.path == path and path.read_text().strip() == str(os.getpid())

    # the verifier and the coordinator lock their own folders, as early: before they stake
    others = {"verifier": 2, "coordinator": 0}
    locks = [lock_node(chain, int(r), workdir / f"{role}-{addr[a]}") for role, a in others.items()]
    try:
        procs = {role: veriloco(role, *node, "--account", str(a), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for role, a in others.items()}
        for role, a in others.items():
            line = refused(procs[role], role)
            assert f"PID {os.getpid()} holds {workdir / f'{role}-{addr[a]}'}" in line
            assert chain.member(int(r), addr[a]).role == 0  # nothing staked
    finally:
        for lock in locks:
            lock.release()


def test_the_same_key_on_two_machines_stops_the_second_before_it_sends_anything(
        devnet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 46 item 1: two machines' worth of processes (each its own --workdir and its own per-user lock
    folder, so no lock on this machine sees the other) with one key. The one that commits epoch 0 first
    goes on; the other finds on chain a commitment its folder did not send (before its commit, or as the
    contract's AlreadyCommitted) and stops with one line naming both ways out, having sent nothing more."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (tmp_path / "run.toml").write_text(RUN_TOML)
    r = str(create_run(capsys))
    addr = Account.from_key(devnet.info.accounts[3].key).address
    chain = Chain(devnet.info.rpc_url, devnet.info.contract)
    procs, errs = [], []
    for m in ("a", "b"):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "VERILOCO_LOCK_DIR": str(tmp_path / f"locks-{m}")}
        errs.append(tmp_path / f"machine-{m}.err")
        with open(tmp_path / f"machine-{m}.jsonl", "wb") as out, open(errs[-1], "wb") as err_file:  # files: a full
            procs.append(subprocess.Popen(  # pipe nobody reads would block a node mid-run
                [sys.executable, "-m", "veriloco.cli", "trainer", "--run", r, "--devnet", str(devnet.config.devnet_file),
                 "--workdir", str(tmp_path / f"machine-{m}"), "--account", "3", "--log-format", "json"],
                cwd=ROOT, env=env, stdout=out, stderr=err_file))
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.5)
        stopped = [i for i, p in enumerate(procs) if p.poll() is not None]
        logs = {m: (tmp_path / f"machine-{m}.jsonl").read_text()[-3000:] for m in ("a", "b")}
        assert len(stopped) == 1, ("neither trainer stopped", logs)
        err = errs[stopped[0]].read_text()
        assert procs[stopped[0]].returncode == 2 and "Traceback" not in err, (err, logs)
        line = err.strip().splitlines()[-1]
        assert f"the chain holds a commitment of {addr} for epoch 0 of run {r}" in line, line
        assert "another instance runs with this key" in line and "stop the other instance" in line, line
        assert chain.submission(int(r), 0, addr).state >= 1  # the first one's commitment stands
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=60)


def test_a_verifier_stops_on_a_verdict_commitment_of_its_key_it_did_not_make(tmp_path: Path) -> None:
    """Issue 46 item 1, for verifiers: another instance with this key (another machine's folder) committed
    epoch 0's verdicts with its own salt. This node used to take any commitment of its key as its own,
    sent before a crash, and then failed to reveal it, leaving the other one's reveal as the only one and
    this node's ledger unusable; where the other stopped first, the commitment went unrevealed and the key
    was slashed. It now stops before sending anything, naming the other instance; its own commitment,
    sent before a crash, is still recognised as its own."""
    from tests.fixtures.chain import SALT, PyEvmNet, make_run
    from verifier.node import ForeignInstance, VerifierNode

    net = PyEvmNet(accounts=8)
    try:
        r = make_run(net, [1, 2], [3, 4, 5], 0, quorum=2)
        r.open_epoch(0)
        v = net.chain(3)
        mine = [(t.address, True, r.witness(0, t)) for t in r.trainers if v.sender in {x.sender for x in r.assigned(0, t)}]
        node = VerifierNode.__new__(VerifierNode)  # the real method, against the real contract
        node.chain, node.run_id, node.me, node.ledger = v, r.run_id, v.sender, tmp_path / "verdicts.json"
        assert not node._own_commitment(0, mine, SALT)  # nothing on chain: nothing to stop for, commit
        other_salt = bytes(31) + b"\x07"
        v.commit_verdicts(r.run_id, 0, mine, other_salt)  # the other instance: same verdicts, its own salt
        with pytest.raises(ForeignInstance, match="another instance runs with this key") as e:
            node._own_commitment(0, mine, SALT)
        assert f"epoch 0 of run {r.run_id}" in str(e.value) and str(tmp_path) in str(e.value)
        assert node._own_commitment(0, mine, other_salt)  # the same commitment is this folder's own (a crash): no resend
    finally:
        net.close()


def test_a_revealed_commitment_of_another_instance_is_told_apart_by_its_salt_not_its_trace(tmp_path: Path) -> None:
    """Two instances of one key train the same epoch alike (same slot, data, start), so once the first has
    revealed, the chain's trace root matches the second's too: judged by the trace root, the second took
    the first's reveal for its own and ran on (seen under load in CI). Only the salted commitment tells
    them apart: the folder's kept commitment against the Committed event."""
    from types import SimpleNamespace

    from tests.fixtures.chain import PyEvmNet
    from tests.fixtures.chain import make_run as fixture_run
    from trainer.checkpoints import EpochDir
    from trainer.node import TrainerError, TrainerNode

    net = PyEvmNet()
    try:
        run = fixture_run(net, [1], [7, 8, 9], 0)
        t = run.trainers[0]
        t.commit(0)
        t.reveal(0)
        m = t.material(0)
        node = SimpleNamespace(chain=t.chain, run_id=run.run_id, me=t.address, rundir=tmp_path, behaviour=None)
        other = t.chain.commitment_for(run.run_id, 0, m.payload_digest, m.root, len(m.digests), os.urandom(32))
        twin = EpochDir(tmp_path / "twin", 0)
        twin.update(commitment=bytes(other).hex(), trace_root=m.root.hex(), status="committing")
        err = TrainerNode._foreign(node, 0, twin)  # type: ignore[arg-type]
        assert isinstance(err, TrainerError) and "another instance runs with this key" in str(err)
        own = EpochDir(tmp_path / "own", 0)
        own.update(commitment=bytes(t.commitment(0)).hex(), trace_root=m.root.hex(), status="revealed")
        assert TrainerNode._foreign(node, 0, own) is None  # its own reveal, after a restart
    finally:
        net.close()
