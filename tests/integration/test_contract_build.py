"""The committed contract artifact is exactly what the pinned solc-js builds from the sources.

Recompiles contracts/*.sol with `node contracts/build.mjs --out TMP` and compares every artifact
with the committed one; a stale artifact (source edited, build not rerun) fails here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from protocol.chain.binding import ARTIFACT_PATH, COMPANIONS, artifact, blueprint, companion_code

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_committed_artifact_matches_a_fresh_build(tmp_path: Path) -> None:
    node = shutil.which("node")
    assert node, "node is not on PATH: install Node.js 20 (make test needs it for the contract build)"
    solc = ROOT / "node_modules" / "solc" / "package.json"
    assert solc.exists(), "node_modules/solc is missing: run `make node` (npm ci) before the tests"
    proc = subprocess.run(
        [node, str(ROOT / "contracts" / "build.mjs"), "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, f"contract build failed:\n{proc.stderr}"
    built = sorted(p.name for p in tmp_path.glob("*.json"))
    committed = sorted(p.name for p in (ROOT / "contracts" / "build").glob("*.json"))
    assert built == committed, f"artifact set differs: built {built}, committed {committed}"
    for name in built:
        fresh = json.loads((tmp_path / name).read_text())
        old = json.loads((ROOT / "contracts" / "build" / name).read_text())
        assert fresh == old, f"contracts/build/{name} is stale: run `node contracts/build.mjs` and commit it"


def test_artifact_records_compiler_and_evm_version() -> None:
    art = artifact()
    assert ARTIFACT_PATH.name == "Veriloco.json"
    assert art["compiler"]["version"].startswith("0.8.37+")
    assert art["settings"]["evmVersion"] == "cancun"
    assert art["settings"]["optimizer"]["enabled"] is True
    runtime = bytes.fromhex(art["deployedBytecode"][2:])
    assert 0 < len(runtime) <= 24_576, "runtime code exceeds the EIP-170 limit: it would not deploy"
    names = {e["name"] for e in art["abi"] if e.get("type") == "function"}
    assert {"currentEpoch", "epochStatus", "createRun", "commit", "reveal", "respond", "finalize"} <= names


def test_every_contract_keeps_2kb_of_room_under_the_code_limits() -> None:
    """Issue 30: at least 2 KB under EIP-170 (24,576 bytes of runtime) in every contract and in each
    companion's blueprint (0xFE + its creation code), and under EIP-3860 (49,152 bytes of initcode) in
    Veriloco's creation code, so the next fix has room without another split."""
    room = 2048
    art = artifact()
    assert len(art["bytecode"]) // 2 - 1 <= 49_152 - room
    for name in ("Veriloco", *COMPANIONS):
        built = json.loads((ROOT / "contracts" / "build" / f"{name}.json").read_text())
        runtime = len(built["deployedBytecode"]) // 2 - 1
        assert runtime <= 24_576 - room, f"{name}: {runtime} bytes of runtime leave less than 2 KB of room"
        if name in COMPANIONS:
            print_size = len(blueprint(companion_code(name)[1])) - 12  # what the blueprint holds as code
            assert print_size <= 24_576 - room, f"{name}'s blueprint: {print_size} bytes"


def test_read_interface_is_exactly_design_section_3() -> None:
    fns = {e["name"]: e for e in artifact()["abi"] if e.get("type") == "function"}
    cur, st = fns["currentEpoch"], fns["epochStatus"]
    assert [i["type"] for i in cur["inputs"]] == ["uint256"] and [o["type"] for o in cur["outputs"]] == ["uint256"]
    assert [i["type"] for i in st["inputs"]] == ["uint256", "uint256"]
    assert [o["type"] for o in st["outputs"]] == ["uint8", "uint32", "uint32", "uint32", "uint32", "string"]
    assert [o["name"] for o in st["outputs"]] == ["phase", "committed", "revealed", "passed", "failed", "modelCid"]
    assert cur["stateMutability"] == st["stateMutability"] == "view"
