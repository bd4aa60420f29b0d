"""`veriloco status` and `veriloco runs` on a real chain never import torch (issue 32: start fast).

A run is deployed and created in this process (which needs torch for its initial model); each read
command then runs in a fresh interpreter (tests/fixtures/imports.py) that reads the run's config from
the store, as a user's would, and is checked to have answered without torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.cli import run_cli
from tests.fixtures.imports import probe

pytestmark = pytest.mark.integration

RUN_TOML = (
    "[data]\ncorpus_bytes = 200000\n[schedule]\nepochs = 3\n[audit]\nquorum = 1\ntest_run = true\n"
    "[stakes]\ntrainer_wei = 1000\nverifier_wei = 1000\nmin_trainers = 1\n"
    "[windows]\ncommit_s = 60\nreveal_s = 60\nresponse_s = 60\nverdict_s = 60\nfinalize_s = 60\n"
)


def test_status_and_runs_read_a_run_without_torch(anvil: object, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from devnet.launch import dev_accounts

    monkeypatch.chdir(tmp_path)
    key = tmp_path / "key"
    key.write_text(dev_accounts(1)[0].key)
    url = anvil.url  # type: ignore[attr-defined]
    code, out, err = run_cli(capsys, "deploy", "--rpc-url", url, "--key", str(key))
    assert code == 0, err
    conn = ["--rpc-url", url, "--contract", out.strip(), "--store", "local", "--store-dir", str(tmp_path / "store")]
    (tmp_path / "run.toml").write_text(RUN_TOML)
    code, out, err = run_cli(capsys, "run", "create", "--config", "run.toml", "--key", str(key), *conn)
    assert code == 0, err
    run = out.strip()

    status = probe(["status", "--run", run, "--json", *conn], tmp_path)
    assert status.code == 0, status.stderr
    rep = json.loads(status.stdout)
    assert rep["epochs"] == 3 and rep["run_state"] == "stalled"  # epochs: from the config in the store; no verifier yet
    assert "torch" not in status.modules

    runs = probe(["runs", "--json", *conn], tmp_path)
    assert runs.code == 0, runs.stderr
    assert [(r["run_id"], r["epochs"]) for r in json.loads(runs.stdout)["runs"]] == [(int(run), 3)]
    assert "torch" not in runs.modules
