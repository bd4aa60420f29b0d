"""Pure parts of the chain binding: revert decoding, the commitment and audit-sampling helpers."""

from __future__ import annotations

import os

import pytest
from eth_abi import encode
from eth_utils import function_abi_to_4byte_selector, to_checksum_address
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import merkle
from protocol.chain import errors as ce
from protocol.chain.audit import COMMIT_TAG, AuditResponse, trailing_ones
from protocol.chain.binding import (
    RunParams,
    artifact,
    assigned_verifiers,
    build_response,
    challenged_steps,
    commitment,
    decode_revert,
    final_check,
    pair_proof,
    response_indices,
    revert_data,
    verify_pair,
    verify_response,
)
from protocol.digest import keccak
from protocol.errors import VerilocoError

pytestmark = pytest.mark.unit

ADDR = [to_checksum_address("0x" + f"{i:02x}" * 20) for i in range(1, 9)]


def _error_abi(name: str) -> dict:
    return next(e for e in artifact()["abi"] if e["type"] == "error" and e["name"] == name)


def test_every_abi_error_has_a_python_class_with_its_arity() -> None:
    errors = [e for e in artifact()["abi"] if e["type"] == "error"]
    assert len(errors) >= 30
    for e in errors:
        cls = ce.REVERT_CLASSES.get(e["name"])
        assert cls is not None, f"no Python class for custom error {e['name']}"
        assert len(cls.fields) == len(e["inputs"]), e["name"]
        assert issubclass(cls, ce.ChainError) and issubclass(cls, VerilocoError)


def test_decode_custom_error_with_arguments() -> None:
    abi = _error_abi("WrongPhase")
    data = function_abi_to_4byte_selector(abi) + encode(["uint256", "uint256", "uint8", "uint8"], [7, 3, 2, 1])
    err = decode_revert(data)
    assert isinstance(err, ce.WrongPhase)
    assert (err.run_id, err.epoch, err.actual, err.expected) == (7, 3, 2, 1)
    assert err.args == (7, 3, 2, 1)
    assert "WrongPhase(run_id=7, epoch=3, actual=2, expected=1)" in str(err)


def test_decode_addresses_are_checksummed_and_bytes32_reason_is_text() -> None:
    abi = _error_abi("NotCoordinator")
    data = function_abi_to_4byte_selector(abi) + encode(["uint256", "address", "address"], [1, ADDR[0], ADDR[1]])
    err = decode_revert(data)
    assert isinstance(err, ce.NotCoordinator) and err.caller == ADDR[0] and err.coordinator == ADDR[1]
    ip = decode_revert(function_abi_to_4byte_selector(_error_abi("InvalidParams")) + encode(["bytes32"], [b"quorum (1..16)"]))
    assert isinstance(ip, ce.InvalidParams) and ip.reason == "quorum (1..16)"


def test_decode_standard_and_unknown_reverts() -> None:
    e1 = decode_revert(bytes.fromhex("08c379a0") + encode(["string"], ["boom"]))
    assert isinstance(e1, ce.TransactionFailed) and "boom" in str(e1)
    e2 = decode_revert(bytes.fromhex("4e487b71") + encode(["uint256"], [0x11]))
    assert isinstance(e2, ce.TransactionFailed) and "0x11" in str(e2)
    e3 = decode_revert(b"\xde\xad\xbe\xef")
    assert isinstance(e3, ce.TransactionFailed) and "unknown" in str(e3)
    assert isinstance(decode_revert(b""), ce.TransactionFailed)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_decode_never_crashes_on_garbage(data: bytes) -> None:
    sel = function_abi_to_4byte_selector(_error_abi("RevealMismatch"))
    for blob in (data, sel + data):
        assert isinstance(decode_revert(blob), ce.ChainError)


def test_revert_data_from_each_client_shape() -> None:
    payload = bytes.fromhex("ab12cd34") + bytes(32)

    class Web3Style(Exception):
        def __init__(self) -> None:
            super().__init__("execution reverted", "0x" + payload.hex())
            self.data = "0x" + payload.hex()

    assert revert_data(Web3Style()) == payload
    assert revert_data(Exception(f"execution reverted: {payload!r}")) == payload  # eth-tester
    assert revert_data(Exception({"code": 3, "message": "reverted", "data": "0x" + payload.hex()})) == payload
    assert revert_data(Exception("execution reverted")) is None


def test_commitment_is_abi_encoding_of_the_spec_fields() -> None:
    pd, tr, salt = keccak(b"p"), keccak(b"r"), os.urandom(32)
    contract, trainer = ADDR[2], ADDR[3]
    words = (
        COMMIT_TAG
        + (31337).to_bytes(32, "big")
        + bytes(12) + bytes.fromhex(contract[2:])
        + (5).to_bytes(32, "big")
        + (9).to_bytes(32, "big")
        + bytes(12) + bytes.fromhex(trainer[2:])
        + pd + tr
        + (17).to_bytes(32, "big")
        + salt
    )
    assert COMMIT_TAG == keccak(b"veriloco.commit.v1")
    assert commitment(31337, contract, 5, 9, trainer, pd, tr, 17, salt) == keccak(words)
    # every bound field changes it
    base = commitment(31337, contract, 5, 9, trainer, pd, tr, 17, salt)
    assert commitment(1, contract, 5, 9, trainer, pd, tr, 17, salt) != base
    assert commitment(31337, contract, 5, 9, ADDR[4], pd, tr, 17, salt) != base
    assert commitment(31337, contract, 5, 10, trainer, pd, tr, 17, salt) != base
    with pytest.raises(ValueError, match="salt"):
        commitment(31337, contract, 5, 9, trainer, pd, tr, 17, b"short")


@settings(max_examples=60, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), leaves=st.integers(2, 70), steps=st.integers(1, 8),
       bps=st.sampled_from([0, 5000, 10_000]), who=st.sampled_from(ADDR))
def test_response_proofs_verify_against_the_trace_root(seed: bytes, leaves: int, steps: int, bps: int, who: str) -> None:
    digests = [keccak(i.to_bytes(4, "big") + seed) for i in range(leaves)]
    ks = challenged_steps(seed, who, steps, leaves)
    assert len(ks) == steps and all(0 <= k < leaves - 1 for k in ks)
    resp = build_response(digests, seed, who, steps, bps)
    idx = response_indices(seed, who, steps, leaves, bps)
    assert list(resp.indices) == idx
    assert len(idx) == 2 * steps + (1 if final_check(seed, who, bps) else 0)
    root = merkle.root(digests)
    assert verify_response(root, leaves, seed, who, steps, bps, resp)
    # each pair proof is the shorter equivalent of two plain proofs
    for j, k in enumerate(ks):
        pp = pair_proof(digests, k)
        assert len(pp) == merkle.proof_length(leaves) + trailing_ones(k) - 1
        assert verify_pair(root, digests[k], digests[k + 1], k, leaves, pp)
        assert not verify_pair(root, digests[k + 1], digests[k], k, leaves, pp) or digests[k] == digests[k + 1]
    # any single tampered word is rejected
    if resp.proofs:
        forged = AuditResponse(resp.indices, resp.leaves, (keccak(b"x"),) + resp.proofs[1:])
        assert not verify_response(root, leaves, seed, who, steps, bps, forged)
    forged = AuditResponse(resp.indices, (keccak(b"y"),) + resp.leaves[1:], resp.proofs)
    assert not verify_response(root, leaves, seed, who, steps, bps, forged)
    assert not verify_response(root, leaves, seed, who, steps, bps, AuditResponse(resp.indices, resp.leaves, resp.proofs + (root,)))
    if bps == 0:
        assert not final_check(seed, who, bps)
    if bps == 10_000:
        assert final_check(seed, who, bps) and idx[-1] == leaves - 1


@settings(max_examples=60, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), n=st.integers(0, 8), q=st.integers(1, 16))
def test_assigned_verifiers_are_distinct_members(seed: bytes, n: int, q: int) -> None:
    vs = ADDR[:n]
    got = assigned_verifiers(seed, ADDR[0], vs, q)
    assert len(got) == min(q, n) and len(set(got)) == len(got) and set(got) <= set(vs)


def test_challenged_steps_reject_a_trace_without_steps() -> None:
    with pytest.raises(ValueError, match="2 leaves"):
        challenged_steps(bytes(32), ADDR[0], 2, 1)


def test_run_params_roundtrip_through_abi_tuple() -> None:
    p = RunParams(config_cid="bafyc", config_digest=keccak(b"c"), init_model_cid="bafym",
                  init_model_digest=keccak(b"m"), coordinator=ADDR[0].lower(), quorum=3,
                  trainer_reward=7, verifier_reward=5, test_run=True, audit_rate=16_500)
    t = p.to_abi()
    assert t[4] == ADDR[0] and len(t) == 24 and t[-4:] == (7, 5, True, 16_500)
    back = RunParams.from_abi(t)
    assert back == RunParams(**{**p.__dict__, "coordinator": ADDR[0]})


def test_a_run_left_without_trainers_is_stalled_and_says_why() -> None:
    """`veriloco status` of a begun run whose trainers all left or were slashed: not "running"."""
    from protocol.chain.binding import RunInfo
    from protocol.membership import trainer_shortfall
    from veriloco.chaincmds import run_state

    p = RunParams(config_cid="bafyc", config_digest=keccak(b"c"), init_model_cid="bafym",
                  init_model_digest=keccak(b"m"), coordinator=ADDR[0], quorum=3)
    gone = RunInfo(run_id=4, params=p, creator=ADDR[0], next_epoch=2, active_trainers=0, trainer_slots=2, verifier_count=3)
    st = run_state(object(), gone, None)  # decided before any chain read  # type: ignore[arg-type]
    assert st["state"] == "stalled" and "no active trainer" in st["text"] and "--run 4" in st["text"]
    assert trainer_shortfall(RunInfo(**{**gone.__dict__, "next_epoch": 0})) is None  # not begun: waiting for one
    assert trainer_shortfall(RunInfo(**{**gone.__dict__, "active_trainers": 1})) is None


def test_a_run_at_exactly_its_quorum_of_verifiers_is_named_at_risk_and_a_spare_clears_it() -> None:
    """Issue 46 item 6: at V = quorum one removed verifier stops every audit; status and doctor say so
    while the run still audits, and one more verifier clears it. Below the quorum it is stalled instead."""
    from protocol.chain.binding import RunInfo
    from protocol.membership import no_spare_verifier, verifier_shortfall
    from veriloco.chaincmds import run_state

    p = RunParams(config_cid="bafyc", config_digest=keccak(b"c"), init_model_cid="bafym",
                  init_model_digest=keccak(b"m"), coordinator=ADDR[0], quorum=3, max_verifiers=7)
    exact = RunInfo(run_id=4, params=p, creator=ADDR[0], next_epoch=0, active_trainers=2, trainer_slots=2, verifier_count=3)
    warned = no_spare_verifier(exact)
    assert warned is not None and "no spare verifier (3, its quorum)" in warned and "--run 4" in warned
    st = run_state(object(), exact, None)  # decided before any chain read  # type: ignore[arg-type]
    assert st["state"] == "waiting" and "no spare verifier" in st["text"]
    assert no_spare_verifier(RunInfo(**{**exact.__dict__, "verifier_count": 4})) is None
    short = RunInfo(**{**exact.__dict__, "verifier_count": 2})
    assert no_spare_verifier(short) is None and verifier_shortfall(short) is not None
    full = RunInfo(**{**exact.__dict__, "params": RunParams(**{**p.__dict__, "max_verifiers": 3})})
    assert no_spare_verifier(full) is None  # no place for a spare: nothing an operator can do (a test run)


def test_a_run_too_small_to_judge_a_withheld_payload_is_named_until_2q_plus_1_verifiers() -> None:
    """Issue 46 item 5: below 2q + 1 verifiers the contract refuses every availability report, so a payload
    withheld after its pass aborts the epoch; status and doctor say so while the run audits."""
    from protocol.chain.binding import RunInfo
    from protocol.membership import no_availability_committee
    from veriloco.chaincmds import run_state

    p = RunParams(config_cid="bafyc", config_digest=keccak(b"c"), init_model_cid="bafym",
                  init_model_digest=keccak(b"m"), coordinator=ADDR[0], quorum=3, max_verifiers=16)
    demo = RunInfo(run_id=5, params=p, creator=ADDR[0], next_epoch=0, active_trainers=4, trainer_slots=4, verifier_count=4)
    said = no_availability_committee(demo)
    assert said is not None and "needs 7" in said and "3 more" in said and "--run 5" in said
    assert "cannot judge a withheld payload" in run_state(object(), demo, None)["text"]  # type: ignore[arg-type]
    assert no_availability_committee(RunInfo(**{**demo.__dict__, "verifier_count": 7})) is None
    assert no_availability_committee(RunInfo(**{**demo.__dict__, "verifier_count": 2})) is None  # stalled instead
    test = RunInfo(**{**demo.__dict__, "params": RunParams(**{**p.__dict__, "test_run": True})})
    assert no_availability_committee(test) is None


def test_status_names_the_audit_policy_per_epoch_or_per_step() -> None:
    from veriloco.chaincmds import _audit_policy

    assert _audit_policy({"audit_steps": 4, "audit_rate_ppm": 0}) == "audit steps 4"
    assert _audit_policy({"audit_steps": 8, "audit_rate_ppm": 16_500}) == "audits 0.0165 a step (at most 8 an epoch)"
