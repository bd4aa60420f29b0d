"""Key files: `veriloco account new` keystores and plain keys, read back through the connection settings."""

from __future__ import annotations

import argparse
import json
import os
import stat
from pathlib import Path

import pytest
from eth_account import Account

from protocol.errors import VerilocoError
from tests.fixtures.cli import run_cli as _cli
from veriloco.settings import resolve


def _key_of(path: Path, password_file: Path | None = None) -> str:
    args = argparse.Namespace(key=path, password_file=password_file, rpc_url="http://127.0.0.1:9", devnet=None,
                              contract=None, account=None)
    s = resolve(args, need_key=True, need_contract=False)
    assert s.key is not None
    return s.key


@pytest.fixture(autouse=True)
def _clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for var in [v for v in os.environ if v.startswith("VERILOCO_")]:
        monkeypatch.delenv(var)


def test_a_new_keystore_decrypts_to_the_printed_address(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pw = tmp_path / "pw"
    pw.write_text("correct horse\n")
    code, out, err = _cli(capsys, "account", "new", "--out", "keys/node.json", "--password-file", str(pw), "--json")
    assert code == 0, err
    made = json.loads(out)
    ks = tmp_path / "keys" / "node.json"
    assert made["encrypted"] and stat.S_IMODE(ks.stat().st_mode) == 0o600
    assert "crypto" in json.loads(ks.read_text())  # eth-account keystore v3
    assert Account.from_key(_key_of(ks, pw)).address == made["address"]
    monkeypatch.setenv("VERILOCO_KEY_PASSWORD", "correct horse")  # the environment instead of a file
    assert Account.from_key(_key_of(ks)).address == made["address"]
    monkeypatch.delenv("VERILOCO_KEY_PASSWORD")

    bad = tmp_path / "bad"
    bad.write_text("wrong")
    with pytest.raises(VerilocoError, match="wrong password for keystore"):
        _key_of(ks, bad)
    with pytest.raises(VerilocoError, match="needs a password"):  # no file, no variable, no terminal
        _key_of(ks)
    code, _, err = _cli(capsys, "account", "new", "--out", str(ks), "--password-file", str(pw))
    assert code == 2 and "never overwritten" in err and len(err.strip().splitlines()) == 1


def test_plain_key_files_and_broken_keystores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "account", "new", "--out", "plain.key", "--plain", "--json")
    assert code == 0, err
    assert Account.from_key(_key_of(tmp_path / "plain.key")).address == json.loads(out)["address"]
    for content, phrase in (("{not json", "not valid JSON"), ('{"version": 3}', "not an Ethereum keystore"),
                            ('{"crypto": {}, "version": 3}', "keystore")):
        (tmp_path / "k.json").write_text(content)
        pw = tmp_path / "pw"
        pw.write_text("x")
        with pytest.raises(VerilocoError, match=phrase):
            _key_of(tmp_path / "k.json", pw)


def test_a_devnet_account_outside_a_devnet_folder_names_the_folder_not_the_count(tmp_path: Path,
                                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Operators who start a node from the wrong folder were told "the devnet file has 0 accounts (0..-1)"."""
    args = argparse.Namespace(key=None, password_file=None, rpc_url=None, devnet=None, contract=None, account=1)
    with pytest.raises(VerilocoError, match=r"no devnet file at .*devnet.json.*--devnet FILE.*--key FILE"):
        resolve(args, need_key=True, need_contract=False)
    code, _, err = _cli(capsys, "deploy", "--account", "1")
    assert code == 2 and "no devnet file" in err and "0..-1" not in err, err


def test_datadir_is_the_workdir_under_the_name_node_operators_type() -> None:
    from veriloco.settings import add_connection_args

    p = argparse.ArgumentParser()
    add_connection_args(p, workdir=True)
    assert p.parse_args(["--datadir", "/srv/node"]).workdir == p.parse_args(["--workdir", "/srv/node"]).workdir


def test_read_only_commands_offer_no_signing_flags_and_read_no_key(capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """status, runs, the dashboard and export sign nothing: their help lists no key flags, and a
    $VERILOCO_KEY that would need a password is not even opened."""
    from veriloco.cli import build_parser

    for cmd in ("status", "runs", "dashboard", "export"):
        helptext = build_parser(cmd)._subparsers._group_actions[0].choices[cmd].format_help()  # type: ignore[union-attr]
        assert "--key" not in helptext and "--account" not in helptext and "--max-fee-gwei" not in helptext, cmd
    monkeypatch.setenv("VERILOCO_KEY", "/nonexistent/keystore.json")
    args = argparse.Namespace(rpc_url="http://127.0.0.1:8545", devnet=None, contract=None)
    assert resolve(args, need_key=False, need_contract=False).key is None
