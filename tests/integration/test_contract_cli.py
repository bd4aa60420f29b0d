"""`veriloco deploy`, `veriloco run create` and `veriloco status` against a real anvil.

The commands run in process through `veriloco.cli.main`; the chain is an anvil started from npm on
a free loopback port and stopped by PID.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.chain.binding import Chain, Phase
from tests.fixtures.chain import Trainer
from veriloco.cli import main

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def anvil() -> Iterator[object]:
    from devnet.anvil import Anvil, AnvilConfig

    node = Anvil(AnvilConfig(accounts=6)).start()
    try:
        yield node
    finally:
        node.close()


def _key_file(tmp_path: Path, index: int = 0) -> Path:
    from devnet.launch import dev_accounts

    path = tmp_path / f"key{index}"
    path.write_text(dev_accounts(index + 1)[index].key)
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_deploy_create_status(anvil: object, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no stray devnet file is picked up
    url = anvil.url  # type: ignore[attr-defined]
    key = _key_file(tmp_path)
    code, out, err = _run(capsys, "deploy", "--rpc-url", url, "--key", str(key), "--json")
    assert code == 0, err
    deployed = json.loads(out)
    assert deployed["chain_id"] == 31337
    address = deployed["contract"]
    Chain(url, address)  # the binding accepts it: right code at the address

    toml = tmp_path / "run.toml"
    toml.write_text(
        "[data]\ncorpus_bytes = 200000\n[audit]\nquorum = 1\ntest_run = true\nfinal_check_bps = 10000\n"
        "[stakes]\ntrainer_wei = 1000\nverifier_wei = 1000\nmin_trainers = 1\n"
        "[windows]\ncommit_s = 60\nreveal_s = 60\nresponse_s = 60\nverdict_s = 60\nfinalize_s = 60\n"
    )
    store = ["--store", "local", "--store-dir", str(tmp_path / "store")]
    code, out, err = _run(capsys, "run", "create", "--config", str(toml), "--rpc-url", url, "--key", str(key),
                          "--contract", address, *store)
    assert code == 0, err
    run_id = int(out.strip())
    assert run_id == 1

    # settings from the environment this time
    monkeypatch.setenv("VERILOCO_RPC_URL", url)
    monkeypatch.setenv("VERILOCO_CONTRACT", address)
    code, out, err = _run(capsys, "status", "--run", str(run_id), "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert (rep["epoch"], rep["phase"], rep["committed"], rep["trainers"]) == (0, "not_started", 0, [])
    assert rep["run"]["quorum"] == 1 and rep["run"]["trainer_stake_wei"] == 1000

    # two trainers join and one commits: status shows the epoch committing with per-trainer rows
    import web3

    w3 = web3.Web3(web3.HTTPProvider(url))
    t1 = Trainer(Chain(w3, address, w3.eth.accounts[1]), run_id)
    t2 = Trainer(Chain(w3, address, w3.eth.accounts[2]), run_id)
    for t in (t1, t2):
        t.chain.join_trainer(run_id)
    t1.commit(0)
    code, out, err = _run(capsys, "status", "--run", str(run_id), "--json")
    rep = json.loads(out)
    assert rep["phase"] == "committing" and rep["committed"] == 1 and rep["expected"] == 2
    rows = {r["address"]: r for r in rep["trainers"]}
    assert rows[t1.address]["state"] == "committed" and rows[t2.address]["state"] == "-"
    t2.commit(0)
    for t in (t1, t2):
        t.reveal(0)
    code, out, err = _run(capsys, "status", "--run", str(run_id))
    assert code == 0, err
    assert "AUDITING" in out and "revealed" in out and "bafkreipayload0" in out
    # the same numbers through a generic client call of epochStatus
    raw = t1.chain.contract.functions.epochStatus(run_id, 0).call()
    assert list(raw)[:5] == [int(Phase.AUDITING), 2, 2, 0, 0]
    code, out, err = _run(capsys, "status", "--run", str(run_id), "--epoch", "1", "--json")
    assert json.loads(out)["phase"] == "not_started"


def test_clean_errors(anvil: object, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = anvil.url  # type: ignore[attr-defined]
    code, _, err = _run(capsys, "status", "--run", "1", "--rpc-url", url, "--contract", "0x" + "11" * 20)
    assert code == 2 and "no contract at" in err and "veriloco deploy" in err
    code, _, err = _run(capsys, "status", "--run", "1", "--rpc-url", "http://127.0.0.1:9", "--contract", "0x" + "11" * 20)
    assert code == 2 and "cannot reach the chain" in err
    code, _, err = _run(capsys, "status", "--run", "1")
    assert code == 2 and "no RPC endpoint" in err
    key = _key_file(tmp_path)
    code, out, err = _run(capsys, "deploy", "--rpc-url", url, "--key", str(key))
    assert code == 0
    address = out.strip()
    code, _, err = _run(capsys, "status", "--run", "7", "--rpc-url", url, "--contract", address)
    assert code == 2 and "run 7 does not exist" in err and "veriloco runs" in err
