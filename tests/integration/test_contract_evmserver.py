"""The binding over the py-evm JSON-RPC devnet server (`veriloco devnet --chain py-evm`).

Nodes reach the embedded chain over HTTP through devnet.evmserver, whose revert and log paths
differ from in-process eth-tester; this checks that custom errors still decode with their
arguments, that raw-key signing works and that event queries filter by run.
"""

from __future__ import annotations

import pytest
from web3 import Web3

from devnet.evmserver import EvmConfig, EvmServer
from devnet.launch import dev_accounts
from protocol.chain import errors as ce
from protocol.chain.binding import Chain, Phase, deploy
from tests.fixtures.chain import Trainer, params

pytestmark = pytest.mark.integration


def test_binding_over_the_pyevm_rpc_server() -> None:
    with EvmServer(EvmConfig(accounts=4)) as server:
        keys = dev_accounts(3)
        address = deploy(Web3(Web3.HTTPProvider(server.url)), keys[0].key)
        coord = Chain(server.url, address, keys[0].key)
        run_id = coord.create_run(params(keys[0].address, quorum=1))
        t = Trainer(Chain(server.url, address, keys[1].key), run_id)
        v = Chain(server.url, address, keys[2].key)
        t.chain.join_trainer(run_id)
        v.join_verifier(run_id)
        coord.stake_coordinator(run_id)
        with pytest.raises(ce.WrongPhase) as wp:
            t.chain.commit(run_id, 5, b"\x01" * 32)
        assert wp.value.args == (run_id, 5, 0, 1)
        with pytest.raises(ce.InvalidParams) as ip:
            coord.create_run(params(keys[0].address, quorum=0))
        assert ip.value.reason == "quorum 3..7 (1..2: testRun)"
        t.commit(0)
        t.reveal(0)
        t.respond(0)
        verdicts = [(t.address, True, bytes(32))]
        v.commit_verdicts(run_id, 0, verdicts, b"\x01" * 32)  # the only verifier: reveals open at once
        v.submit_verdicts(run_id, 0, verdicts, b"\x01" * 32)
        coord.finalize(run_id, 0, "bafkreimodel1", b"\x02" * 32, [t.address])
        assert coord.model_committee(run_id, 0) == [v.sender]
        v.attest_model(run_id, 0, b"\x02" * 32, "bafkreimodel1")
        st = coord.epoch_status(run_id, 0)
        assert (st.phase, st.passed, st.model_cid) == (Phase.FINALIZED, 1, "bafkreimodel1")
        names = [e.name for e in coord.events(run_id=run_id)]
        assert names[:2] == ["RunCreated", "TrainerJoined"] and names[-3:] == ["EpochFinalized", "ModelAttested", "ModelConfirmed"]
