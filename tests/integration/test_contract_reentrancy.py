"""withdraw is reentrancy-safe: a trainer contract that re-enters it from receive() gets nothing twice.

The attacker (tests/fixtures/ReentrantWithdrawer.sol) is compiled here with the pinned solc-js.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from protocol.chain import errors as ce
from protocol.chain.binding import decode_revert, revert_data
from tests.fixtures.chain import STAKE, PyEvmNet, params

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "fixtures" / "ReentrantWithdrawer.sol"
COMPILE_JS = (
    "const s=require(process.argv[1]);let d='';process.stdin.on('data',c=>d+=c);"
    "process.stdin.on('end',()=>process.stdout.write(s.compile(d)));"
)


def _compile() -> dict:
    node = shutil.which("node")
    assert node, "node is not on PATH: install Node.js 20"
    solc = ROOT / "node_modules" / "solc"
    assert solc.exists(), "node_modules/solc is missing: run `make node` (npm ci) before the tests"
    inp = {
        "language": "Solidity",
        "sources": {"R.sol": {"content": SOURCE.read_text()}},
        "settings": {"evmVersion": "cancun", "optimizer": {"enabled": True, "runs": 200},
                     "outputSelection": {"*": {"*": ["abi", "evm.bytecode.object"]}}},
    }
    out = subprocess.run([node, "-e", COMPILE_JS, str(solc)], input=json.dumps(inp), capture_output=True,
                         text=True, timeout=120, check=True)
    data = json.loads(out.stdout[out.stdout.index("{"):])
    errors = [e for e in data.get("errors", []) if e["severity"] == "error"]
    assert not errors, errors
    c = data["contracts"]["R.sol"]["ReentrantWithdrawer"]
    return {"abi": c["abi"], "bytecode": "0x" + c["evm"]["bytecode"]["object"]}


def test_reentrant_withdraw_is_refused_and_pays_once() -> None:
    art = _compile()
    net = PyEvmNet(accounts=3)
    w3, me = net.w3, net.accounts[1]
    coord = net.chain(0)
    run_id = coord.create_run(params(net.accounts[0], unbonding_delay=10))
    factory = w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
    addr = w3.eth.wait_for_transaction_receipt(factory.constructor(net.address).transact({"from": me}))["contractAddress"]
    attacker = w3.eth.contract(address=addr, abi=art["abi"])
    attacker.functions.join(run_id).transact({"from": me, "value": STAKE})
    attacker.functions.leave().transact({"from": me})
    net.advance(11)
    assert coord.balance() == STAKE
    with pytest.raises(Exception) as raw:
        attacker.functions.pull().transact({"from": me})
    data = revert_data(raw.value)
    assert data is not None
    err = decode_revert(data)
    # the re-entered withdraw reverted (reentrancy guard; the record was also already cleared), so
    # the transfer failed and the whole withdrawal rolled back
    assert isinstance(err, ce.TransferFailed) and err.account == addr and err.amount == STAKE
    assert coord.balance() == STAKE and coord.member(run_id, addr).stake == STAKE
    attacker.functions.setAttack(False).transact({"from": me})
    attacker.functions.pull().transact({"from": me})
    assert attacker.functions.received().call() == STAKE
    assert coord.balance() == 0 and coord.totals() == (0, 0)
