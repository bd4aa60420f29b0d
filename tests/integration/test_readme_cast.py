"""The README's `cast` block, run as written: the locked npm tooling's cast reads a round from a devnet.

`$CONTRACT` and `$RPC_URL` come from the devnet file exactly as the README says; only `npx cast` is
pointed at the checkout's node_modules, since the test runs in a temporary folder.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from devnet.launch import DevnetConfig, DevnetProcess
from protocol.chain.binding import Chain
from veriloco.cli import main

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _cast_block() -> str:
    blocks = re.findall(r"```\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    found = [b for b in blocks if "npx cast call" in b]
    assert len(found) == 1, "the README should have one command block reading a round with cast"
    return found[0]


def test_readme_cast_block_reads_a_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cast = ROOT / "node_modules" / ".bin" / "cast"
    assert cast.exists(), "node_modules/.bin/cast is missing: run `make node` (npm install from the lockfile)"
    locked = json.loads((ROOT / "package-lock.json").read_text())["packages"]
    assert locked["node_modules/@foundry-rs/cast"]["version"] == locked["node_modules/@foundry-rs/anvil"]["version"]

    monkeypatch.chdir(tmp_path)
    with DevnetProcess(DevnetConfig(state_dir=Path(".veriloco"), accounts=2, block_time=None)) as net:
        assert main(["run", "create", "--config", str(ROOT / "examples" / "run.toml"), "--account", "0"]) == 0
        script = _cast_block().replace("npx cast", str(cast))
        done = subprocess.run(["bash", "-euc", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 0, done.stderr
        status = Chain(net.web3(), net.info.contract).epoch_status(1, 0)
        assert done.stdout.split() == [str(int(status.phase)), str(status.committed), str(status.revealed),
                                       str(status.passed), str(status.failed), json.dumps(status.model_cid)]
