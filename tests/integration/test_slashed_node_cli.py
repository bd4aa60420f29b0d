"""A slashed node ends saying so (issue 32): a real `veriloco trainer`, `veriloco verifier` and
`veriloco coordinator` process, each slashed in its run, end with one `slashed` line (an ERROR) naming
the reason, the amount and what to do, and exit status 3, nothing on stderr.

The run is created by the CLI (its config and corpus in the devnet's store, so the nodes load it as
they would any run); its epoch 0 is played through the contract-test helpers, no training: trainer 1
fails its audit unanimously, trainer 2 passes with one dissenting verifier, who is outvoted. Both are
slashed at finalize and taken out of the run; the attestation committee then replaces the coordinator's
model with another, which slashes the coordinator and ends its role. Then the three nodes start for that
run with those keys: the trainer has no epoch left to take part in, the verifier no audit it is drawn
for, the coordinator may finalize nothing more, and each ends.
The payloads are placeholders, so the verifier's own check of epoch 0's model raises an alarm on the
way; what is asserted is how each node ends. (A trainer slashed while it runs reaches the same end
through its removal check, trainer/node.py `_removed`, as the demo's cheaters do; the demo takes exit
status 3 from a node as a cheater's end, not a failure.)

The second test is a trainer that committed to the run's last epoch and never revealed (it was down
through the reveal window): its node, started afterwards, waits until that epoch is decided, since
the slash for the missing reveal lands only at its finalize, and then ends slashed rather than with a
plain finish.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from protocol.chain.binding import SLASH_REASONS
from protocol.digest import keccak
from tests.fixtures.chain import DevnetNet, Run, Trainer
from tests.fixtures.cli import run_cli
from veriloco.nodes import SLASHED_EXIT

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COORD, TRAINERS, VERIFIERS = 0, [1, 2], [3, 4, 5]
RUN_TOML = (
    "[data]\ncorpus_bytes = 200000\n[schedule]\nepochs = 3\nh_initial = 8\nh_min = 8\nh_max = 8\n"
    "[audit]\nquorum = 3\n"
    "[stakes]\ntrainer_wei = 1000\nverifier_wei = 1000\nmin_trainers = 1\n"
    "[windows]\ncommit_s = 600\nreveal_s = 600\nresponse_s = 600\nverdict_s = 600\nfinalize_s = 600\n"
)


def start(role: str, account: int, common: list[str]) -> subprocess.Popen[str]:
    """`veriloco ROLE --account N ...` as its own process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "veriloco.cli", role, *common, "--account", str(account)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ended(proc: subprocess.Popen[str], log: Path) -> tuple[int, list[dict[str, Any]], str]:
    """(exit status, JSON lines, stderr) of a node run to its end."""
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    log.write_text(out)
    return proc.returncode, [json.loads(line) for line in out.splitlines() if line.startswith("{")], err


def test_a_slashed_trainer_and_a_slashed_verifier_end_saying_why_with_a_failing_status(
        devnet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (tmp_path / "run.toml").write_text(RUN_TOML)
    code, out, err = run_cli(capsys, "run", "create", "--config", "run.toml", "--account", str(COORD), "--json")
    assert code == 0, err
    run_id = int(json.loads(out)["run_id"])

    # epoch 0 through the contract: trainer 1 fails its audit, trainer 2 passes over one dissenting verifier
    net = DevnetNet(devnet)
    coord = net.chain(COORD)
    coord.stake_coordinator(run_id)
    r = Run(net, run_id, coord, [Trainer(net.chain(i), run_id) for i in TRAINERS], [net.chain(i) for i in VERIFIERS])
    for t in r.trainers:
        t.chain.join_trainer(run_id)
    for v in r.verifiers:
        v.join_verifier(run_id)
    r.open_epoch(0)
    failed, passed = r.trainers
    r.judge(0, failed, [False, False, False])
    r.judge(0, passed, [True, True, False])
    dissenter = str(r.assigned(0, passed)[2].sender)
    slashes = r.finalize(0, [passed], confirm=False)
    assert slashes == {failed.address: 3} and SLASH_REASONS[3] == "failed audit"
    amount = next(int(e.args["amount"]) for e in coord.events(["Slashed"], run_id=run_id))
    confirmed = r.attest(0, keccak(b"the model the committee recomputed"))[-1]  # not the coordinator's: replaced
    coord_slashed = next(int(e.args["slashed"]) for e in confirmed.events if e.name == "ModelConfirmed")
    assert coord_slashed > 0 and coord.member(run_id, coord.sender).leave_epoch == 1

    common = ["--run", str(run_id), "--devnet", str(devnet.config.devnet_file), "--workdir", str(tmp_path / "nodes"),
              "--log-format", "json"]
    procs = {"trainer": start("trainer", TRAINERS[0], common),  # all at once: each spends most of its time importing
             "verifier": start("verifier", net.accounts.index(dissenter), common),
             "coordinator": start("coordinator", COORD, common)}
    try:
        code, events, err = ended(procs["trainer"], tmp_path / "trainer.jsonl")
        vcode, vevents, verr = ended(procs["verifier"], tmp_path / "verifier.jsonl")
        ccode, cevents, cerr = ended(procs["coordinator"], tmp_path / "coordinator.jsonl")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    assert code == SLASHED_EXIT and err == "", (code, err[-3000:], events[-3:])
    last = events[-1]
    assert [e["event"] for e in events].count("slashed") == 1 and last["event"] == "slashed", events[-3:]
    assert last["level"] == "ERROR" and last["run"] == run_id and last["address"] == failed.address
    assert last["reason"] == "failed audit" and last["epochs"] == [0], last
    assert last["slashed_wei"] == amount and last["stake_left_wei"] == 1000 - amount
    assert f"veriloco earnings --run {run_id} --address {failed.address}" in last["detail"]
    assert (f"veriloco withdraw --run {run_id} --devnet {devnet.config.devnet_file} --account {TRAINERS[0]}"
            in last["detail"]), last["detail"]

    code, events, err = vcode, vevents, verr
    assert code == SLASHED_EXIT and err == "", (code, err[-3000:], events[-3:])
    last = events[-1]
    assert last["event"] == "slashed" and last["address"] == dissenter, events[-3:]
    assert last["reason"] == f"voted against the majority on {passed.address}" and last["epochs"] == [0], last
    assert "removed" in [e["event"] for e in events]  # off the list, it stopped instead of idling to the run's end

    code, events, err = ccode, cevents, cerr
    assert code == SLASHED_EXIT and err == "", (code, err[-3000:], events[-3:])
    last = events[-1]
    assert [e["event"] for e in events].count("slashed") == 1 and last["event"] == "slashed", events[-3:]
    assert last["address"] == coord.sender and last["epochs"] == [0] and last["slashed_wei"] == coord_slashed
    assert last["reason"] == "finalized a wrong model (the attestation committee replaced it)", last
    assert "removed" in [e["event"] for e in events] and "finalize-failed" not in [e["event"] for e in events]
    assert f"veriloco withdraw --run {run_id} --devnet {devnet.config.devnet_file} --account {COORD}" in last["detail"]


NO_REVEAL_COORD, SILENT, REVEALER = 6, 7, 2


def wait_for_line(proc: subprocess.Popen[str], lines: list[dict[str, Any]], match: Any, timeout: float = 600) -> None:
    """Read `proc`'s JSON lines into `lines` until one satisfies `match` (the node still running)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        raw = proc.stdout.readline()
        if not raw:
            raise AssertionError(f"the node ended ({proc.wait()}) before the line: {lines[-5:]}")
        if raw.startswith("{"):
            lines.append(json.loads(raw))
            if match(lines[-1]):
                return
    raise AssertionError(f"no such line within {timeout} s: {lines[-5:]}")


def test_a_trainer_that_never_revealed_the_last_epoch_waits_for_its_slash_and_ends_slashed(
        devnet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (tmp_path / "run.toml").write_text(RUN_TOML.replace("epochs = 3", "epochs = 1"))
    code, out, err = run_cli(capsys, "run", "create", "--config", "run.toml", "--account", str(NO_REVEAL_COORD), "--json")
    assert code == 0, err
    run_id = int(json.loads(out)["run_id"])

    # the run's only epoch: both trainers commit, the silent one never reveals; the other passes its audit
    net = DevnetNet(devnet)
    coord = net.chain(NO_REVEAL_COORD)
    coord.stake_coordinator(run_id)
    silent, revealer = Trainer(net.chain(SILENT), run_id), Trainer(net.chain(REVEALER), run_id)
    r = Run(net, run_id, coord, [silent, revealer], [net.chain(i) for i in VERIFIERS])
    for t in r.trainers:
        t.chain.join_trainer(run_id)
    for v in r.verifiers:
        v.join_verifier(run_id)
    for t in r.trainers:
        t.commit(0)
    revealer.reveal(0)
    closes = coord.epoch_times(run_id, 0).reveals_close
    while coord.now() <= closes:  # its reveal window ends unrevealed (the devnet's clock may lag what it was told)
        net.advance(closes - coord.now() + 1)
    revealer.respond(0)
    r.judge(0, revealer, [True, True, True])
    r.reveal_verdicts(0)

    argv = ["--run", str(run_id), "--devnet", str(devnet.config.devnet_file), "--workdir", str(tmp_path / "nodes"),
            "--log-format", "json"]
    proc = start("trainer", SILENT, argv)
    lines: list[dict[str, Any]] = []
    try:  # without the wait it would finish (status 0) here: the slash comes with the finalize
        wait_for_line(proc, lines, lambda e: e["event"] == "waiting" and "never revealed" in e.get("what", ""))
        assert r.finalize(0, [revealer]) == {silent.address: 1} and SLASH_REASONS[1] == "no reveal"
        code, events, err = ended(proc, tmp_path / "trainer.jsonl")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = lines + events
    assert code == SLASHED_EXIT and err == "", (code, err[-3000:], events[-3:])
    last = events[-1]
    assert [e["event"] for e in events][-2:] == ["finished", "slashed"], events[-4:]
    assert last["reason"] == "no reveal" and last["epochs"] == [0] and last["address"] == silent.address, last
