"""A pip user's install: build the wheel, install it into a fresh venv, run `veriloco demo` from an empty folder.

Nothing from the checkout may leak in: the sources are copied out first (building in place would
leave build/ behind), the venv has no system site-packages, PYTHONPATH is dropped, and the demo runs
in a folder holding nothing. torch goes in first, pinned as the Makefile pins it (the CPU build);
pip's own cache keeps the repeat runs short, and --no-compile skips byte-compiling every installed
module (torch's alone is ~15 s): Python compiles what the demo imports when it imports it, and pip
never fails an install on a module that does not compile, so nothing checked here depends on it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str | Path], cwd: Path, timeout: float) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "VERILOCO_"))}
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{out[-6000:]}"
    return out


def _torch_pin() -> str:
    found = re.search(r"^TORCH\s*:=\s*(\S+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, "Makefile no longer names TORCH := torch==VERSION"
    return found.group(1)


def _copy_sources(dest: Path) -> None:
    """The files git would commit (tracked, or new and not ignored): what a clone holds."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.mark.timeout(1500)
def test_wheel_installs_in_a_fresh_venv_and_runs_the_demo(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.fail("git is needed to list the sources to package")
    src, dist, venv, work = (tmp_path / d for d in ("src", "dist", "venv", "work"))
    _copy_sources(src)
    work.mkdir()

    built = _run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", dist, src], tmp_path, 600)
    assert "SetuptoolsDeprecationWarning" not in built, "the build warns about the project metadata"
    (wheel,) = dist.glob("veriloco-*.whl")

    _run([sys.executable, "-m", "venv", venv], tmp_path, 120)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile"]
    _run([*pip, _torch_pin(), "numpy"], tmp_path, 900)
    _run([*pip, wheel], tmp_path, 900)

    where = _run([venv / "bin" / "python", "-c", "import protocol.chain.binding as c; print(c.ARTIFACT_PATH)"], work, 120)
    assert Path(where.strip()).is_relative_to(venv), f"the contract artifact is not the installed one: {where}"

    out = _run([venv / "bin" / "veriloco", "demo", "--trainers", "1", "--verifiers", "1", "--quorum", "1",
                "--epochs", "1", "--steps", "4", "--report", "report"], work, 600)
    summary = json.loads((work / "report" / "summary.json").read_text())
    assert summary["epochs_finalized"] == summary["epochs"] == 1, out[-3000:]
    assert (work / "report" / "loss.png").stat().st_size > 0
    assert "Warning" not in out, f"a dependency's warning reached the user:\n{out}"

    # a pip-only user's starting config: the commented example, from the wheel's own copy (issue 32)
    _run([venv / "bin" / "veriloco", "run", "init", "--out", "run.toml"], work, 300)
    assert (work / "run.toml").read_text() == (ROOT / "examples" / "run.toml").read_text()
