"""A run's whole life through the CLI on a py-evm devnet: runs, status at every phase, join refusals, claim, leave, withdraw.

The run is created with `veriloco run create` (a real config and corpus in the devnet's store, one
epoch, one trainer place); its epoch is played by the contract-test helpers (random traces, fixed
verdicts: no training, so the test is quick); every question is asked through `veriloco.cli.main`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.chain import DevnetNet, Run, Trainer
from tests.fixtures.cli import run_cli as cli

pytestmark = pytest.mark.integration

RUN_TOML = (
    "[data]\ncorpus_bytes = 200000\n[schedule]\nepochs = 1\n[audit]\nquorum = 1\ntest_run = true\nchallenges = 2\n"
    "[stakes]\ntrainer_wei = 1000\nverifier_wei = 1000\nmin_trainers = 1\nmax_trainers = 1\n"
    "[windows]\ncommit_s = 60\nreveal_s = 60\nresponse_s = 60\nverdict_s = 60\nfinalize_s = 60\nunbonding_s = 100\n"
    "[rewards]\ntrainer_wei = 700\nverifier_wei = 30\npool_wei = 10000\n"
)


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from devnet.launch import start_devnet

    with start_devnet(state_dir=tmp_path_factory.mktemp("devnet"), accounts=6) as net:
        yield net




def ok(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = cli(capsys, *argv)
    assert code == 0, (argv, err)
    return out


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, _, err = cli(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
    return err.strip()


def test_a_runs_life_through_the_cli(devnet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (tmp_path / "run.toml").write_text(RUN_TOML)
    net = DevnetNet(devnet)
    rid = json.loads(ok(capsys, "run", "create", "--config", "run.toml", "--account", "0", "--json"))["run_id"]
    r = str(rid)
    coord, trainer, verifier = net.chain(0), Trainer(net.chain(1), rid), net.chain(2)
    trainer.chain.join_trainer(rid)
    verifier.join_verifier(rid)
    coord.stake_coordinator(rid)
    run = Run(net, rid, coord, [trainer], [verifier])

    listed = json.loads(ok(capsys, "runs", "--json"))["runs"]
    assert [(x["run_id"], x["state"], x["epochs"], x["trainers"]) for x in listed] == [(rid, "waiting", 1, 1)]
    out = ok(capsys, "status", "--run", r)
    assert "waiting for epoch 0" in out and "NOT OPENED" in out and "responses due" not in out

    # a test run (quorum 1): refused before staking unless asked for, naming its risk (issue 46 item 9)
    monkeypatch.delenv("VERILOCO_ALLOW_TEST_RUN")  # tests/conftest.py allows the suite's test runs
    line = refused(capsys, "verifier", "--run", r, "--account", "4")
    assert "is a test run: quorum 1" in line and "--allow-test-run" in line and "nothing was staked" in line, line
    assert coord.member(rid, net.accounts[4]).role == 0

    # the only trainer place is taken: a second trainer is refused before it stakes
    line = refused(capsys, "trainer", "--run", r, "--account", "3", "--allow-test-run")
    assert "is full" in line and "nothing was staked" in line
    assert coord.member(rid, net.accounts[3]).role == 0

    trainer.commit(0)  # every active trainer committed: the epoch moves on to its reveals at once
    out = ok(capsys, "status", "--run", r)
    assert "REVEALING" in out and "reveals close" in out and "responses due" not in out
    assert "UTC chain time" in out and "wall clock" in out
    # epoch 0 was the run's last: nobody can take part any more, so a verifier is refused before staking
    line = refused(capsys, "verifier", "--run", r, "--account", "4", "--allow-test-run")  # past the test-run check
    assert "no epoch left to join" in line and "nothing was staked" in line
    assert coord.member(rid, net.accounts[4]).role == 0

    trainer.reveal(0)
    net.advance(1)
    trainer.respond(0)
    out = ok(capsys, "status", "--run", r)
    assert "AUDITING" in out and "responses due" in out and "verdicts due" in out
    run.judge_all(0)
    run.finalize(0, [trainer])
    out = ok(capsys, "status", "--run", r)
    assert "finished: 1 of 1 epochs finalized" in out and "FINALIZED" in out
    assert "responses due" not in out and "verdicts due" not in out and "pending" not in out
    rep = json.loads(ok(capsys, "status", "--run", r, "--json"))
    assert rep["run_state"] == "finished" and rep["trainers"][0]["outcome"] == "passed"
    assert json.loads(ok(capsys, "runs", "--json"))["runs"][0]["state"] == "finished"
    # without the config (its store unreachable) status still answers, from the chain alone, in seconds
    t0 = time.monotonic()
    out = ok(capsys, "status", "--run", r, "--store", "ipfs", "--ipfs-api", "/ip4/127.0.0.1/tcp/9")
    assert "FINALIZED" in out and "waiting for epoch 1 (epoch 0 finalized" in out and time.monotonic() - t0 < 30

    # rewards: 700 wei to the included trainer, 30 to the verifier whose verdict made the majority
    assert "claimed 7e-16 ETH" in ok(capsys, "claim", "--account", "1")
    assert coord.credits(net.accounts[1]) == 0
    assert "nothing to claim" in ok(capsys, "claim", "--account", "1")

    # leave, withdraw too early (told when), withdraw after the unbonding delay
    assert "withdraw" in refused(capsys, "withdraw", "--run", r, "--account", "1")  # still a member: leave first
    # a trainer whose window root of the epoch in training is posted would be slashed for abandoning it:
    # leave refuses (nothing sent) unless told --anyway (docs/protocol.md §5.4 step 7)
    trainer.chain.post_own_window(rid, 1, 0, bytes(range(32)))
    line = refused(capsys, "leave", "--run", r, "--account", "1")
    assert "window roots of epoch 1 are posted" in line and "--anyway" in line, line
    assert coord.member(rid, net.accounts[1]).leave_epoch is None
    out = ok(capsys, "leave", "--run", r, "--account", "1", "--anyway")
    assert f"left run {rid} as trainer" in out and "unbonds at" in out and "in 10" in out
    assert f"then `veriloco withdraw --run {rid} --account 1`" in out, out  # the hint works as typed: same key
    line = refused(capsys, "leave", "--run", r, "--account", "1")
    assert "already left" in line and f"`veriloco withdraw --run {rid} --account 1`" in line
    line = refused(capsys, "withdraw", "--run", r, "--account", "1")
    assert "still bonded" in line and "unbonds at" in line
    before = coord.w3.eth.get_balance(net.accounts[1])
    m = coord.member(rid, net.accounts[1])
    while coord.now() < m.left_at + 100:  # the devnet's clock may run ahead of the wall clock it advances from
        net.advance(m.left_at + 100 - coord.now())
    assert "withdrew 1e-15 ETH" in ok(capsys, "withdraw", "--run", r, "--account", "1")
    assert coord.member(rid, net.accounts[1]).role == 0
    assert coord.w3.eth.get_balance(net.accounts[1]) > before - 10**16  # the stake came back (less the fee)
    assert "no stake" in refused(capsys, "withdraw", "--run", r, "--account", "1")


def test_a_merge_rule_run_between_epochs_is_training_not_waiting(devnet: Any, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Under the merge rule trainers are past epoch 1's merge once epoch 0 closes: status says so."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (tmp_path / "run.toml").write_text(RUN_TOML.replace("epochs = 1", "epochs = 2\nmerge_step = 1\nfirst_merge_step = 0"))
    net = DevnetNet(devnet)
    rid = json.loads(ok(capsys, "run", "create", "--config", "run.toml", "--account", "0", "--json"))["run_id"]
    coord, trainer, verifier = net.chain(0), Trainer(net.chain(3), rid), net.chain(4)
    trainer.chain.join_trainer(rid)
    verifier.join_verifier(rid)
    coord.stake_coordinator(rid)
    run = Run(net, rid, coord, [trainer], [verifier])
    trainer.commit(0)
    trainer.reveal(0)
    net.advance(1)
    trainer.respond(0)
    run.judge_all(0)
    run.finalize(0, [trainer])
    out = ok(capsys, "status", "--run", str(rid))
    assert "epoch 1 of 2 training (epoch 0 finalized; trainers merged its model at step 0" in out, out
    row = next(x for x in json.loads(ok(capsys, "runs", "--json"))["runs"] if x["run_id"] == rid)
    assert row["state"] == "running" and row["epochs"] == 2


def test_a_keystore_signs_for_its_account(devnet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (tmp_path / "pw").write_text("s3cret\n")
    made = json.loads(ok(capsys, "account", "new", "--out", "node.json", "--password-file", "pw", "--json"))
    out = ok(capsys, "claim", "--key", "node.json", "--password-file", "pw")
    assert out.startswith(f"nothing to claim: {made['address']} has no credits")
    (tmp_path / "wrong").write_text("guess\n")
    assert "wrong password" in refused(capsys, "claim", "--key", "node.json", "--password-file", "wrong")


def test_a_run_with_fewer_verifiers_than_its_quorum_says_it_is_stalled(devnet: Any, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 30: a quorum-3 run with one verifier audits nothing; `status` and `runs` say so plainly."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (tmp_path / "run.toml").write_text(RUN_TOML.replace("quorum = 1\ntest_run = true\n", "quorum = 3\n"))
    net = DevnetNet(devnet)
    rid = json.loads(ok(capsys, "run", "create", "--config", "run.toml", "--account", "0", "--json"))["run_id"]
    net.chain(5).join_verifier(rid)
    out = ok(capsys, "status", "--run", str(rid))
    assert "has 1 verifier(s) of its quorum 3: no epoch is audited" in out and "2 more join" in out, out
    row = next(x for x in json.loads(ok(capsys, "runs", "--json"))["runs"] if x["run_id"] == rid)
    assert row["state"] == "stalled"


def test_a_silent_coordinator_is_named_with_what_anyone_can_do(devnet: Any, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: an audited epoch nobody finalizes. Within the coordinator's half of the finalize window the
    run is running; past it `status` and `runs` call it stalled, naming the coordinator, the time left
    and the command that finalizes in its place; once the deadline has passed, the aborted epoch is named."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERILOCO_DEVNET", str(devnet.config.devnet_file))
    (tmp_path / "run.toml").write_text(RUN_TOML.replace("epochs = 1", "epochs = 2"))
    net = DevnetNet(devnet)
    rid = json.loads(ok(capsys, "run", "create", "--config", "run.toml", "--account", "0", "--json"))["run_id"]
    coord, trainer, verifier = net.chain(0), Trainer(net.chain(1), rid), net.chain(2)
    trainer.chain.join_trainer(rid)
    verifier.join_verifier(rid)
    coord.stake_coordinator(rid)
    run = Run(net, rid, coord, [trainer], [verifier])
    trainer.commit(0)
    trainer.reveal(0)
    net.advance(1)
    trainer.respond(0)
    run.judge_all(0)  # decided: the coordinator may finalize now, and alone until half its window is gone

    def state() -> tuple[str, str]:
        rep = json.loads(ok(capsys, "status", "--run", str(rid), "--json"))
        row = next(x for x in json.loads(ok(capsys, "runs", "--json"))["runs"] if x["run_id"] == rid)
        assert (row["state"], row["summary"]) == (rep["run_state"], rep["run_summary"])
        return rep["run_state"], rep["run_summary"]

    assert state() == ("running", "epoch 0 of 2 auditing")
    times = coord.epoch_times(rid, 0)
    half = times.finalize_deadline - 30  # finalize_s = 60: from here on the coordinator's half is over
    while coord.now() < half:  # the devnet's clock may lag what it was told
        net.advance(half - coord.now() + 1)
    run_state, summary = state()
    assert run_state == "stalled", summary
    assert f"its coordinator {coord.sender} has not sent" in summary and "any staked member may finalize it" in summary
    assert f"`veriloco verifier --run {rid}`" in summary and f"`veriloco coordinator --run {rid}`" in summary
    assert summary in ok(capsys, "status", "--run", str(rid))  # the readable report's first line says the same

    while coord.now() <= times.finalize_deadline:  # nobody finalized: the epoch aborts, with no new model
        net.advance(times.finalize_deadline - coord.now() + 1)
    run_state, summary = state()
    assert run_state == "waiting" and summary.startswith("waiting for epoch 1 of 2 (epoch 0 aborted"), summary
    assert "epoch 0 aborted: nobody finalized it by its deadline" in summary and f"--run {rid}" in summary
