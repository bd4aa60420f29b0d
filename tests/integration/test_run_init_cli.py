"""`veriloco run init`: the commented example config, written where asked, never over a file unless forced,
and shipped inside the wheel so a pip-only user gets it too.

The wheel is built from the files git would commit (as tests/integration/test_wheel.py does, without
its venv and demo) and unpacked; `veriloco run init` then runs from the unpacked packages in an empty
folder, so it can only have read the copy the wheel carries.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from protocol.config import load_toml
from tests.fixtures.cli import run_cli as cli

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "examples" / "run.toml").read_text()


def test_init_writes_the_example_and_refuses_to_overwrite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, "run", "init")
    assert code == 0 and err == "" and "wrote run.toml" in out and "veriloco run create --config run.toml" in out
    written = tmp_path / "run.toml"
    assert written.read_text() == EXAMPLE and "#" in EXAMPLE  # commented, and a config the CLI loads
    assert load_toml(written).audit.quorum == 3

    written.write_text("# mine\n")
    code, out, err = cli(capsys, "run", "init")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "run.toml already exists; pass --force" in err and written.read_text() == "# mine\n"

    code, out, err = cli(capsys, "run", "init", "--force")
    assert code == 0 and written.read_text() == EXAMPLE, err

    code, out, err = cli(capsys, "run", "init", "--out", "configs/a.toml")
    assert code == 0 and (tmp_path / "configs" / "a.toml").read_text() == EXAMPLE, err
    code, out, err = cli(capsys, "run", "init", "--out", "configs")
    assert code == 2 and "is a folder" in err

    code, out, err = cli(capsys, "run", "init", "--out", "-")
    assert code == 0 and out == EXAMPLE, err


def test_the_wheel_carries_the_example_and_init_writes_it_from_there(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.fail("git is needed to list the sources to package")
    src, dist, unpacked, work = (tmp_path / d for d in ("src", "dist", "unpacked", "work"))
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if (ROOT / rel).is_file() and not (ROOT / rel).is_symlink():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    # this venv's setuptools builds it (no isolated build environment to install: nothing is downloaded)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(src)], cwd=tmp_path, capture_output=True, check=True, timeout=600)
    (wheel,) = dist.glob("veriloco-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert z.read("veriloco/examples/run.toml").decode() == EXAMPLE
        z.extractall(unpacked)

    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VERILOCO_"))}
    probe = ("import sys, veriloco.runinit as r; from veriloco.cli import main; "
             "print(r.EXAMPLES); sys.exit(main(['run', 'init']))")
    got = subprocess.run([sys.executable, "-c", probe], cwd=work, env={**env, "PYTHONPATH": str(unpacked)},
                         capture_output=True, text=True, timeout=300, check=False)
    assert got.returncode == 0, got.stderr
    assert Path(got.stdout.splitlines()[0]) == unpacked / "veriloco" / "examples"  # the wheel's copy, not a checkout's
    assert (work / "run.toml").read_text() == EXAMPLE


def test_a_reader_that_stops_early_is_no_error() -> None:
    """`veriloco run init --out - | head -1`: the pipe closes before the config is written; the command
    ends quietly with status 0 (no broken-pipe message), as `veriloco status | head` does."""
    p = subprocess.Popen([sys.executable, "-m", "veriloco.cli", "run", "init", "--out", "-"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # before the child has imported anything: its first write meets a closed pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and err == "", err
