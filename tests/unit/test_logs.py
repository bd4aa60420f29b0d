"""Node output (veriloco/logs.py): readable lines by default, JSON lines on request, a JSON log file beside either."""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from veriloco.cli import build_parser
from veriloco.logs import LogSetupError, TextLog, level, node_logger

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_json_format_is_one_object_per_line() -> None:
    out = io.StringIO()
    log = node_logger("trainer", "json", stream=out)
    log("committed", epoch=0, payload_cid="Qm1", gas=129176)
    log("step", epoch=0, step=1, of=8, loss=5.1)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["node"] == "trainer" and first["event"] == "committed" and first["gas"] == 129176
    assert isinstance(first["t"], float) and second["step"] == 1


def test_text_format_reads_as_time_level_node_event_fields() -> None:
    out = io.StringIO()
    log = node_logger("verifier", "text", stream=out)
    log("verified", epoch=2, trainer="0xabc", passed=False, gas=73621)
    log("commit-failed", epoch=2, error="nonce too low")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert re.match(r"^\d\d:\d\d:\d\d WARN  verifier +verified +epoch=2 trainer=0xabc passed=false gas=73,621$", lines[0])
    assert re.match(r"^\d\d:\d\d:\d\d ERROR verifier +commit-failed +epoch=2 error=nonce too low$", lines[1])
    assert "{" not in out.getvalue()  # no JSON, no markup


def test_text_format_off_a_terminal_prints_steps_at_quarters_only() -> None:
    out = io.StringIO()
    log = node_logger("trainer", "text", stream=out)
    for k in range(1, 17):
        log("step", epoch=0, step=k, of=16, loss=4.0)
    log("trained", epoch=0, steps=16)
    printed = [re.search(r"step=(\d+)", line) for line in out.getvalue().splitlines()]
    assert [int(m.group(1)) for m in printed if m] == [4, 8, 12, 16]
    assert "trained" in out.getvalue().splitlines()[-1]


def test_on_a_terminal_steps_and_waits_are_a_progress_line_and_events_still_print() -> None:
    out = io.StringIO()
    log = TextLog("trainer", out, force_terminal=True)
    log("waiting", what="the run's first epoch")
    for k in range(1, 9):
        log("step", epoch=0, step=k, of=8, loss=4.0)
    log("committed", epoch=0, payload_cid="QmX")
    log.close()
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue())
    assert "committed" in text and "payload_cid=QmX" in text
    assert re.search(r"INFO  trainer +waiting +what=the run's first epoch", text)  # a wait is also a line
    assert not re.search(r"INFO.*\bstep\b.*step=3", text)  # steps went to the progress line, not the log


def test_log_file_keeps_json_lines_whatever_the_console_shows(tmp_path: Path) -> None:
    out = io.StringIO()
    path = tmp_path / "logs" / "trainer.jsonl"
    log = node_logger("trainer", "text", log_file=path, stream=out)
    log("step", epoch=0, step=1, of=16, loss=4.0)  # not on the console (not a quarter), but in the file
    log("revealed", epoch=0, gas=61147)
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["event"] for e in events] == ["step", "revealed"]
    assert "revealed" in out.getvalue() and "step=1" not in out.getvalue()


def test_an_unopenable_log_file_is_a_clean_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(LogSetupError, match="--log-file"):
        node_logger("trainer", "json", log_file=tmp_path / "f" / "x.jsonl")
    with pytest.raises(LogSetupError, match="choose one of"):
        node_logger("trainer", "xml")


def test_levels() -> None:
    assert level("step", {}) == "DEBUG"
    assert level("committed", {}) == "INFO"
    assert level("verified", {"passed": True}) == "INFO"
    assert level("verified", {"passed": False}) == "WARN"
    assert level("reveal-retry", {}) == "WARN"
    assert level("alarm", {}) == level("aggregate-error", {}) == level("attest-failed", {}) == "ERROR"
    assert level("attest-late", {}) == "INFO"  # the committee finalized first: routine, not an error
    # expected races (issue 46 item 9): a stand-in verifier another member beat to finalize, a commit after `leave`
    assert level("finalize-lost", {}) == level("commit-skipped", {}) == "INFO"


@pytest.mark.parametrize("role", ["trainer", "verifier", "coordinator"])
def test_every_node_takes_the_log_flags(role: str, tmp_path: Path) -> None:
    args = build_parser(role).parse_args([role, "--run", "1", "--log-format", "json", "--log-file", str(tmp_path / "l")])
    assert args.log_format == "json" and args.log_file == tmp_path / "l"
    assert build_parser(role).parse_args([role, "--run", "1"]).log_format == "text"


def test_an_ipfs_store_prints_no_dependency_warning() -> None:
    """ipfshttpclient makes urllib3 warn on every request; a node's output must not carry it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: the request fails, after urllib3 would warn
    code = (
        "from protocol.store.backends import IpfsStore, StoreError\n"
        f"try:\n    IpfsStore('/ip4/127.0.0.1/tcp/{port}', timeout=2).has('QmbU7ZwcKTDES6uww9Tp48iHwcHpNognsgTWR44ZHMZmrs')\n"
        "except StoreError as e:\n    print('unavailable')\n"
    )
    done = subprocess.run([sys.executable, "-W", "default", "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.stdout.strip() == "unavailable", done.stderr
    assert "Warning" not in done.stderr, done.stderr


def test_fields_text_is_what_a_text_line_shows() -> None:
    from veriloco.logs import fields_text

    assert fields_text({"epoch": 3, "gas": 129176, "passed": True, "steps": [0, 2]}) == "epoch=3 gas=129,176 passed=true steps=[0, 2]"


def test_a_bad_log_format_from_the_environment_is_refused_up_front(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VERILOCO_LOG_FORMAT", "xml")
    with pytest.raises(SystemExit) as exc:
        build_parser("trainer").parse_args(["trainer", "--run", "1"])
    assert exc.value.code == 2 and "VERILOCO_LOG_FORMAT" in capsys.readouterr().err
    monkeypatch.setenv("VERILOCO_LOG_FORMAT", "json")
    assert build_parser("trainer").parse_args(["trainer", "--run", "1"]).log_format == "json"


def test_json_lines_carry_level_run_and_address(tmp_path: Path) -> None:
    """Every JSON line, on the console and in the log file, says its level, and the node's run and address
    once bound: a collector can filter many nodes' lines without parsing events."""
    out = io.StringIO()
    path = tmp_path / "trainer.jsonl"
    log = node_logger("trainer", "json", log_file=path, stream=out, run=7)
    log("loading", what="torch")
    log.bind(address="0x00000000000000000000000000000000000000aA")
    log("step", epoch=0, step=1, of=8, loss=5.0)
    log("verified", epoch=0, trainer="0xabc", passed=False)
    log("commit-failed", epoch=0, error="nonce too low")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["level"] for e in lines] == ["INFO", "DEBUG", "WARN", "ERROR"]
    assert all(e["run"] == 7 and e["node"] == "trainer" for e in lines)
    assert "address" not in lines[0] and {e["address"] for e in lines[1:]} == {"0x00000000000000000000000000000000000000aA"}
    assert list(lines[1])[:6] == ["t", "level", "node", "run", "address", "event"]  # the head first, then the fields
    # a text console shows none of it, but its log file does
    text, kept = io.StringIO(), tmp_path / "text.jsonl"
    log = node_logger("verifier", "text", log_file=kept, stream=text, run=2)
    log("started")
    assert "run=" not in text.getvalue() and json.loads(kept.read_text())["run"] == 2


def test_a_node_binds_its_run_and_its_keys_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`veriloco trainer --run 7 --key FILE --log-format json`: the first line (written before the key's
    address is derived) has the run and the level; the next ones the address as well."""
    from eth_account import Account

    from veriloco.nodes import starting

    key = "0x" + "11" * 32
    (tmp_path / "key").write_text(key)
    args = build_parser("trainer").parse_args([
        "trainer", "--run", "7", "--key", str(tmp_path / "key"), "--rpc-url", "http://127.0.0.1:8545",
        "--contract", "0x" + "22" * 20, "--log-format", "json", "--workdir", str(tmp_path / "w")])
    _, log = starting(args, "trainer")
    log("started", slot=0)
    first, second = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert first["event"] == "loading" and first["level"] == "INFO" and first["run"] == 7 and "address" not in first
    assert second["event"] == "started" and second["run"] == 7 and second["address"] == Account.from_key(key).address
