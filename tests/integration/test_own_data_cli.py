"""`veriloco data prepare` then `veriloco run create --corpus` on a real anvil: every node's
`open_run` gets the user's corpus and tokenizer, committed in the on-chain config digest."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from protocol.chain.binding import Chain
from protocol.digest import keccak
from protocol.run import open_run, tokenizer_for
from protocol.store.backends import LocalStore
from veriloco.cli import main

pytestmark = pytest.mark.integration


def test_run_create_with_a_prepared_corpus(anvil: object, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from devnet.launch import dev_accounts

    monkeypatch.chdir(tmp_path)
    url = anvil.url  # type: ignore[attr-defined]
    key = tmp_path / "key"
    key.write_text(dev_accounts(1)[0].key)
    assert main(["deploy", "--rpc-url", url, "--key", str(key), "--json"]) == 0
    address = json.loads(capsys.readouterr().out)["contract"]

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((stdlib / "json").glob("*.py")) + sorted((stdlib / "email").glob("*.py"))
    assert main(["data", "prepare", *map(str, files), "--vocab", "400", "--out", str(tmp_path / "corpus")]) == 0
    made = json.loads(capsys.readouterr().out)

    (tmp_path / "run.toml").write_text('[model]\npreset = "llama-tiny"\n[audit]\nquorum = 1\ntest_run = true\n')
    store = ["--store", "local", "--store-dir", str(tmp_path / "store")]
    code = main(["run", "create", "--config", str(tmp_path / "run.toml"), "--corpus", str(tmp_path / "corpus"),
                 "--rpc-url", url, "--key", str(key), "--contract", address, *store, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    run_id = json.loads(out.out)["run_id"]

    ctx = open_run(Chain(url, address), LocalStore(tmp_path / "store"), run_id)
    cfg = ctx.config
    assert cfg.model.preset == "llama-tiny" and cfg.model.vocab_size == 400 == made["vocab_size"]
    assert cfg.data.token_dtype == "uint16" and cfg.data.corpus_digest == made["digest"]
    assert "0x" + ctx.corpus.digest.hex() == made["digest"]
    assert cfg.data.tokenizer_digest == made["tokenizer_digest"]
    tok = tokenizer_for(cfg, LocalStore(tmp_path / "store"))
    assert "0x" + keccak(tok.raw).hex() == made["tokenizer_digest"]
    assert ctx.param_shapes["wte.weight"] == (400, 64)
