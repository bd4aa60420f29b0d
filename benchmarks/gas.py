"""Gas cost of the Veriloco contract on anvil: every call, and per trainer per epoch at 1-256 trainers.

    .venv/bin/python benchmarks/gas.py --out benchmarks/results/gas.json [--trainers 1,8,64,256] [--rewards]

For each trainer count T the script creates a run on a fresh anvil (npm @foundry-rs/anvil, started
on a free loopback port and stopped by PID), lets T trainers and V verifiers join, and plays four
full epochs through the Python binding, each verifier committing its epoch's verdicts once and
revealing them (with replay witnesses) in one `submitVerdicts` transaction. Epochs 0-2 are the
first use of each trainer's three rotating hash slots; epoch 3 is the steady state (the headline).
Every transaction's gasUsed comes from its receipt (21k intrinsic gas and calldata included).

gas per trainer per epoch = (all commits + reveals + the two startAudit calls that schedule and fix
the seed + audit responses + verdict transactions + finalize + the attestation committee's
`attestModel` calls) / T; each mechanism's own share is its column. With --rewards the run funds a
pool that pays every epoch in full (trainer and verifier rewards, credited in finalize's scan), so
the finalize column shows the payout's cost against a run without. Target: at most 300k (issue 9:
with attestation, verdict commitments and rewards, at quorum 3). The 30M-gas block check is
the largest single transaction of the 256-trainer epoch (it must fit in one block) and the epoch's
total in blocks.

Settings: quorum 3 (verdicts and model attestation), 2 challenged transitions, final check always drawn (worst case), traces of
33 leaves (H = 32 inner steps, 6-sibling proofs), V = 8 verifiers.
Prints a Markdown table and writes JSON: machine, versions, settings, per_call, per trainer count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from web3 import Web3

from devnet.anvil import Anvil, AnvilConfig, anvil_binary
from protocol import merkle
from protocol.chain.binding import Chain, Phase, RunParams, artifact, build_response, deploy
from protocol.digest import keccak
from protocol.types import Address, Cid, Wei

TARGET = 300_000
BLOCK_GAS = 30_000_000
LEAVES = 33
QUORUM = 3
STEPS = 2
VERIFIERS = 8


class Ledger:
    """gasUsed per function name, in call order."""

    def __init__(self) -> None:
        self.calls: dict[str, list[int]] = defaultdict(list)

    def add(self, name: str, gas: int) -> int:
        self.calls[name].append(gas)
        return gas


REWARD_T = 10**12  # trainer reward (wei per epoch) with --rewards
REWARD_V = 10**11  # verifier reward (wei per majority verdict) with --rewards


def run_params(coordinator: str, trainers: int, rewards: bool = False) -> RunParams:
    return RunParams(
        config_cid=Cid("bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"),
        config_digest=keccak(b"bench config"),
        init_model_cid=Cid("bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"),
        init_model_digest=keccak(b"bench model"),
        coordinator=Address(coordinator),
        min_trainers=1, max_trainers=trainers, max_verifiers=VERIFIERS,
        commit_window=3600, reveal_window=3600, response_window=3600, verdict_window=3600,
        finalize_window=3600, unbonding_delay=60,
        audit_steps=STEPS, final_check_bps=10_000, quorum=QUORUM, slash_bps=5_000,
        trainer_stake=Wei(10**16), verifier_stake=Wei(10**16),
        trainer_reward=Wei(REWARD_T if rewards else 0), verifier_reward=Wei(REWARD_V if rewards else 0),
    )


PAYLOAD_CID = "bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"  # a realistic 59-char CIDv1
MODEL_CID = "bafkreidvbhs33ighmljlvr7zbv2ywwzcmp5adtf4kqvlly67cy56bdtmve"


def play_epoch(ledger: Ledger, coord: Chain, trainers: list[Chain], verifiers: Mapping[str, Chain], run_id: int,
               epoch: int) -> dict[str, int]:
    """One full epoch; returns gas totals by stage."""
    totals: dict[str, int] = defaultdict(int)
    material = {}
    for t in trainers:
        digests = [os.urandom(32) for _ in range(LEAVES)]
        salt, pd = os.urandom(32), keccak(os.urandom(32))
        material[t.sender] = (digests, salt, pd)
        c = t.commitment_for(run_id, epoch, pd, merkle.root(digests), LEAVES, salt)
        res = t.commit(run_id, epoch, c)
        totals["commit"] += ledger.add("commit (opens epoch)" if t is trainers[0] else "commit", res.gas_used)
    for t in trainers:
        digests, salt, pd = material[t.sender]
        res = t.reveal(run_id, epoch, PAYLOAD_CID, pd, merkle.root(digests), LEAVES, salt)
        last = t is trainers[-1]
        totals["reveal"] += ledger.add("reveal (last: closes reveals)" if last else "reveal", res.gas_used)
    assert coord.epoch_status(run_id, epoch).phase == Phase.AUDITING
    # a first startAudit schedules the seed (this block's hash), a second in a later block fixes it
    totals["seed"] += ledger.add("startAudit (schedules seed)", coord.start_audit(run_id, epoch).gas_used)
    totals["seed"] += ledger.add("startAudit (fixes seed)", coord.start_audit(run_id, epoch).gas_used)
    seed = coord.fix_audit_seed(run_id, epoch, tries=0)
    assert seed is not None
    for t in trainers:
        digests, _, _ = material[t.sender]
        resp = build_response(digests, seed, t.sender, STEPS, 10_000)  # type: ignore[arg-type]
        res = t.respond(run_id, epoch, "bafkreimanifestmanifestmanifestmanifestmanifestmanifestmani", resp)
        totals["respond"] += ledger.add("respond", res.gas_used)
    jobs: dict[str, list[str]] = defaultdict(list)
    for t in trainers:
        for va in coord.assignment(run_id, epoch, t.sender).verifiers:  # type: ignore[arg-type]
            jobs[str(va)].append(t.sender)  # type: ignore[arg-type]
    evidence = "bafkreievidenceevidenceevidenceevidenceevidenceevidenceevide"
    # verdicts are committed (every verifier of the frozen list, once) and then revealed with their
    # replay witnesses (one reveal transaction per verifier)
    salt = keccak(b"verdict salt %d" % epoch)
    batches = {v: [(a, True, keccak(b"witness " + bytes.fromhex(a[2:]))) for a in ts] for v, ts in jobs.items()}
    for addr in coord.frozen_verifiers(run_id, epoch):
        res = verifiers[addr].commit_verdicts(run_id, epoch, batches.get(addr, []), salt)
        totals["verdict_commits"] += ledger.add("commitVerdicts", res.gas_used)
    for v in coord.frozen_verifiers(run_id, epoch):  # every commitment is revealed, an empty one too
        vs = batches.get(v, [])
        res = verifiers[v].submit_verdicts(run_id, epoch, vs, salt, evidence)
        label = "submitVerdicts (1 verdict)" if len(vs) == 1 else f"submitVerdicts ({len(vs)} verdicts)"  # 0: an empty reveal
        totals["verdicts"] += ledger.add(label, res.gas_used)
        totals["max_tx"] = max(totals["max_tx"], res.gas_used)
        if vs:
            ledger.add("submitVerdicts per verdict", res.gas_used // len(vs))
    res = coord.finalize(run_id, epoch, MODEL_CID, keccak(b"model %d" % epoch), [t.sender for t in trainers])  # type: ignore[misc]
    totals["finalize"] += ledger.add(f"finalize ({len(trainers)} trainers)", res.gas_used)
    totals["max_tx"] = max(totals["max_tx"], res.gas_used)
    committee = coord.model_committee(run_id, epoch)
    for va in committee[: len(committee) // 2 + 1]:
        att = verifiers[str(va)].attest_model(run_id, epoch, keccak(b"model %d" % epoch), MODEL_CID)
        totals["attest"] += ledger.add("attestModel", att.gas_used)
    assert coord.epoch_status(run_id, epoch).phase == Phase.FINALIZED
    return dict(totals)


def bench_count(url: str, address: str, ledger: Ledger, n: int, rewards: bool = False) -> dict[str, Any]:
    w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": 60}))
    accts = list(w3.eth.accounts)
    coord = Chain(w3, address, accts[0])
    pool = 5 * n * (REWARD_T + QUORUM * REWARD_V) if rewards else 0  # five epochs paid in full
    res = coord._transact("createRun", run_params(accts[0], n, rewards).to_abi(), value=pool)
    ledger.add("createRun", res.gas_used)
    run_id = int(next(e for e in res.events if e.name == "RunCreated").args["runId"])
    trainers = [Chain(w3, address, a) for a in accts[1:1 + n]]
    verifiers: dict[str, Chain] = {str(a): Chain(w3, address, a) for a in accts[257:257 + VERIFIERS]}
    for t in trainers:
        ledger.add("joinTrainer", t.join_trainer(run_id).gas_used)
    for v in verifiers.values():
        ledger.add("joinVerifier", v.join_verifier(run_id).gas_used)
    ledger.add("stakeCoordinator", coord.stake_coordinator(run_id).gas_used)
    # epochs 0-2 are the run's first use of each trainer's three rotating hash slots (cold storage);
    # from epoch 3 on every slot is reused: the steady state of a long run
    cold = play_epoch(ledger, coord, trainers, verifiers, run_id, 0)
    play_epoch(Ledger(), coord, trainers, verifiers, run_id, 1)
    play_epoch(Ledger(), coord, trainers, verifiers, run_id, 2)
    batched = play_epoch(ledger, coord, trainers, verifiers, run_id, 3)
    if rewards:
        ledger.add("claim", trainers[0].claim().gas_used)  # five epochs of rewards

    def per_trainer(t: dict[str, int]) -> dict[str, float]:
        stages = {k: v / n for k, v in t.items() if k != "max_tx"}
        stages["total"] = sum(stages.values())
        return stages

    return {
        "trainers": n,
        "verifiers": VERIFIERS,
        "batched": per_trainer(batched),
        "first_epoch": per_trainer(cold),
        "epoch_total_gas": sum(v for k, v in batched.items() if k != "max_tx"),
        "largest_tx_gas": batched["max_tx"],
    }


def extra_calls(url: str, address: str, ledger: Ledger) -> None:
    """startAudit, settle, leaveRun, withdraw and claim, each measured once on a small run."""
    w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": 60}))
    a = list(w3.eth.accounts)
    coord = Chain(w3, address, a[0])
    p = run_params(a[0], 2)
    run_id = coord.create_run(p)
    ledger.add("fundRun", coord.fund_run(run_id, 10**12).gas_used)
    t1, t2 = Chain(w3, address, a[1]), Chain(w3, address, a[2])
    for t in (t1, t2):
        t.join_trainer(run_id)
    for v in a[5:5 + QUORUM]:  # an audit is scheduled only with a quorum of verifiers
        Chain(w3, address, v).join_verifier(run_id)
    digests = [os.urandom(32) for _ in range(LEAVES)]
    salt, pd = os.urandom(32), keccak(b"p")
    t1.commit(run_id, 0, t1.commitment_for(run_id, 0, pd, merkle.root(digests), LEAVES, salt))
    t2.commit(run_id, 0, keccak(b"never revealed"))
    t1.reveal(run_id, 0, PAYLOAD_CID, pd, merkle.root(digests), LEAVES, salt)
    w3.provider.make_request("evm_increaseTime", [3601])  # type: ignore[arg-type]
    w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    ledger.add("startAudit (schedules seed)", coord.start_audit(run_id, 0).gas_used)
    w3.provider.make_request("evm_increaseTime", [3 * 3600 + 1])  # type: ignore[arg-type]
    w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    ledger.add("settle (2 committed, 2 slashed)", Chain(w3, address, a[3]).settle(run_id, 0).gas_used)
    t3 = Chain(w3, address, a[4])
    t3.join_trainer(run_id)
    ledger.add("leaveRun", t3.leave(run_id).gas_used)
    w3.provider.make_request("evm_increaseTime", [61])  # type: ignore[arg-type]
    w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    ledger.add("withdraw", t3.withdraw(run_id).gas_used)
    t1.leave(run_id)  # it revealed and its seed was never fixed: excused, not slashed
    w3.provider.make_request("evm_increaseTime", [61])  # type: ignore[arg-type]
    w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    ledger.add("withdraw", t1.withdraw(run_id).gas_used)


def versions() -> dict[str, str]:
    import web3 as web3_mod

    art = artifact()
    try:
        anvil_v = subprocess.run([str(anvil_binary()), "--version"], capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except OSError as exc:
        anvil_v = f"unknown ({exc})"
    return {
        "python": platform.python_version(),
        "web3": web3_mod.__version__,
        "anvil": anvil_v.splitlines()[0] if anvil_v else "unknown",
        "solc": art["compiler"]["version"],
        "evm_version": art["settings"]["evmVersion"],
        "optimizer": json.dumps(art["settings"]["optimizer"]),
        "via_ir": str(art["settings"].get("viaIR", False)),
        "runtime_bytes": str(len(art["deployedBytecode"]) // 2 - 1),
    }


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count()}


def summarize(ledger: Ledger) -> dict[str, dict[str, int]]:
    out = {}
    for name, xs in ledger.calls.items():
        out[name] = {"n": len(xs), "mean": round(sum(xs) / len(xs)), "min": min(xs), "max": max(xs)}
    return out


def collapse_batches(per_call: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """One row for all `submitVerdicts (N verdicts)` batch sizes (the JSON keeps each size)."""
    out: dict[str, dict[str, int]] = {}
    batches = [(k, v) for k, v in per_call.items() if k.startswith("submitVerdicts (")]
    for k, v in per_call.items():
        if not k.startswith("submitVerdicts ("):
            out[k] = v
    if batches:
        n = sum(v["n"] for _, v in batches)
        sizes = [int(k.split("(")[1].split()[0]) for k, _ in batches]
        out[f"submitVerdicts (batch of {min(sizes)}-{max(sizes)})"] = {
            "n": n, "mean": round(sum(v["mean"] * v["n"] for _, v in batches) / n),
            "min": min(v["min"] for _, v in batches), "max": max(v["max"] for _, v in batches),
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    rows = ["| trainers | commit | reveal | seed | respond | verdict commits | verdict reveals | finalize | attest | **total / trainer / epoch** | vs 300k target | first epoch (cold storage) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, r in result["per_count"].items():
        b = r["batched"]
        rows.append(
            f"| {n} | {b['commit']:,.0f} | {b['reveal']:,.0f} | {b.get('seed', 0):,.0f} | {b['respond']:,.0f} | "
            f"{b.get('verdict_commits', 0):,.0f} | {b['verdicts']:,.0f} | {b['finalize']:,.0f} | {b.get('attest', 0):,.0f} | "
            f"**{b['total']:,.0f}** | {b['total'] / TARGET:.2f}× | {r['first_epoch']['total']:,.0f} |"
        )
    calls = ["| call | mean gas | min | max | n |", "|---|---:|---:|---:|---:|"]
    for name, s in sorted(collapse_batches(result["per_call"]).items()):
        calls.append(f"| `{name}` | {s['mean']:,} | {s['min']:,} | {s['max']:,} | {s['n']} |")
    big = result["per_count"].get("256") or list(result["per_count"].values())[-1]
    fits = (f"{big['trainers']}-trainer epoch: {big['epoch_total_gas']:,} gas in all "
            f"({big['epoch_total_gas'] / BLOCK_GAS:.2f} × a 30M block); largest single transaction "
            f"{big['largest_tx_gas']:,} gas ({big['largest_tx_gas'] / BLOCK_GAS:.1%} of a 30M block).")
    slope = result.get("finalize_slope_per_trainer")
    win = result.get("window_gas_per_trainer_per_epoch")
    windows = (f"Window posts (issue 48): {', '.join(f'{v:,} gas a trainer and epoch at K = {k}' for k, v in win.items())}"
               f" (H = 256); a trainer's own post {result['window_direct_post_gas']:,} gas." if win else "")
    return "\n".join([
        "Gas per trainer per epoch (steady state: epoch 3 of a run, batched verdicts):", "", *rows, "",
        fits, f"finalize slope: {slope:,.0f} gas per additional trainer." if slope else "", windows, "",
        "Gas per call:", "", *calls,
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="JSON result file (required unless --render)")
    ap.add_argument("--render", type=Path, help="print the Markdown tables of an existing result JSON and exit")
    ap.add_argument("--trainers", default="1,8,64,256", help="comma-separated trainer counts (max 256)")
    ap.add_argument("--rewards", action="store_true", help="fund a reward pool that pays every epoch in full")
    args = ap.parse_args()
    if args.render:
        print(markdown(json.loads(args.render.read_text())))
        return 0
    if args.out is None:
        ap.error("--out is required")
    counts = [int(x) for x in args.trainers.split(",")]
    if max(counts) > 256 or min(counts) < 1:
        ap.error("trainer counts must be within 1..256")
    ledger = Ledger()
    per_count: dict[str, Any] = {}
    t0 = time.time()
    with Anvil(AnvilConfig(accounts=1 + 256 + VERIFIERS + 4, gas_limit=BLOCK_GAS)) as node:
        w3 = Web3(Web3.HTTPProvider(node.url))
        address = deploy(w3, w3.eth.accounts[0])
        for n in counts:
            per_count[str(n)] = bench_count(node.url, address, ledger, n, args.rewards)
            print(f"  {n} trainers: {per_count[str(n)]['batched']['total']:,.0f} gas/trainer/epoch", file=sys.stderr)
        extra_calls(node.url, address, ledger)
        from benchmarks.window_gas import derive
        from benchmarks.window_gas import measure as measure_windows

        windows = measure_windows(node.url, address)  # issue 48's posts, on the same chain and build
    fin = {int(k.split("(")[1].split()[0]): v["mean"] for k, v in summarize(ledger).items() if k.startswith("finalize (")}
    slope = None
    if len(fin) >= 2:
        lo, hi = min(fin), max(fin)
        slope = (fin[hi] - fin[lo]) / (hi - lo)
    result = {
        "benchmark": "gas",
        "command": "benchmarks/gas.py " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "versions": versions(),
        "settings": {"leaves": LEAVES, "audit_steps": STEPS, "final_check_bps": 10_000, "quorum": QUORUM,
                     "verifiers": VERIFIERS, "rewards": args.rewards, "block_gas_limit": BLOCK_GAS, "target_per_trainer_epoch": TARGET},
        "per_call": summarize(ledger),
        "gas_per_trainer_per_epoch": {k: round(v["batched"]["total"]) for k, v in per_count.items()},
        "finalize_slope_per_trainer": slope,
        "per_count": per_count,
        # the relay's aggregate post per window shared by K trainers at H = 256, W by protocol.windows.width_rule
        "window_gas_per_trainer_per_epoch": {str(r["K"]): r["window_gas_per_trainer_per_epoch"]
                                             for r in derive(windows) if r["H"] == 256 and r["K"] in (64, 1024)},
        "window_direct_post_gas": windows["own_later_epoch"],  # the first of an epoch, as window_gas.py reports it
        "wall_s": round(time.time() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
