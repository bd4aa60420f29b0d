"""Protocol-level scale check on anvil: 64 trainers and 8 verifiers, each its own account, 3 epochs.

    .venv/bin/python benchmarks/scale.py --out benchmarks/results/scale.json [--trainers 64 --verifiers 8 --epochs 3]

The script starts a fresh anvil (npm @foundry-rs/anvil, free loopback port, stopped by PID) with
1 + T + V funded accounts, deploys the contract and creates a run from account 0 (the coordinator).
Every trainer and verifier is a separate node: its own account, its own Web3 connection and its own
`protocol.chain.binding.Chain`. All of them join, then E full epochs are played through the real binding:

    commit   every trainer commits to a random 33-leaf trace (tiny payloads: only digests on chain)
    reveal   every trainer reveals
    seed     `startAudit` until `epochAudit` reports the seed fixed (the last reveal may fix it, or
             only schedule it for a later block; at most 5 calls)
    respond  every trainer posts its challenged leaves with Merkle proofs (build_response)
    verdicts every assigned verifier (`assignment(...).verifiers`) posts one batched
             `submitVerdicts` with a pass for each of its trainers
    finalize the coordinator reads who passed and finalizes with that list (sorted by the binding)

Each phase's transactions go out from a thread pool (8 workers by default), one transaction per
account per phase, so the nodes act concurrently while each account's transactions stay sequential.
anvil automines: every transaction is its own block.

Per epoch: wall-clock latency from the first commit sent to the finalize receipt, the latency of
each phase, the number of transactions, their total gas (receipts: 21k intrinsic and calldata
included), gas per trainer, the largest single transaction, and the phase / counts read back from
the contract (`epochStatus`). The script exits non-zero unless every epoch is FINALIZED with every
trainer included and nobody slashed.

Settings: quorum 3, 2 challenged transitions, final check always drawn (worst case), traces of 33
leaves, all windows 1 h (no window ever has to pass: every epoch advances early).
Prints a Markdown table and writes JSON: machine, versions, settings, per_epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from web3 import Web3

from benchmarks import gas
from devnet.anvil import Anvil, AnvilConfig
from protocol import merkle
from protocol.chain.binding import (
    Chain,
    ContractRevert,
    Phase,
    RunParams,
    TxResult,
    artifact,
    build_response,
    deploy,
)
from protocol.digest import keccak
from protocol.types import Address, Cid, Digest, Wei

BLOCK_GAS = 30_000_000
LEAVES = 33
QUORUM = 3  # the default: a majority of three judges each trainer and attests each model
STEPS = 2
FINAL_BPS = 10_000
SEED_TRIES = 5
PHASES = ("commit", "reveal", "seed", "respond", "verdict-commits", "verdicts", "finalize", "attest")

PAYLOAD_CID = "bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"  # realistic 59-char CIDv1s
MANIFEST_CID = "bafkreimanifestmanifestmanifestmanifestmanifestmanifestmani"
EVIDENCE_CID = "bafkreievidenceevidenceevidenceevidenceevidenceevidenceevide"
MODEL_CID = "bafkreidvbhs33ighmljlvr7zbv2ywwzcmp5adtf4kqvlly67cy56bdtmve"

_T = TypeVar("_T")
_R = TypeVar("_R")


class ScaleFailure(RuntimeError):
    """An epoch did not reach FINALIZED with everyone included (or the seed never got fixed)."""


def run_params(coordinator: str, trainers: int, verifiers: int) -> RunParams:
    return RunParams(
        config_cid=Cid("bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"),
        config_digest=keccak(b"scale config"),
        init_model_cid=Cid("bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"),
        init_model_digest=keccak(b"scale model"),
        coordinator=Address(coordinator),
        min_trainers=1, max_trainers=trainers, max_verifiers=verifiers,
        commit_window=3600, reveal_window=3600, response_window=3600, verdict_window=3600,
        finalize_window=3600, unbonding_delay=60,
        audit_steps=STEPS, final_check_bps=FINAL_BPS, quorum=QUORUM, slash_bps=5_000,
        trainer_stake=Wei(10**16), verifier_stake=Wei(10**16),
    )


@dataclass(frozen=True)
class Material:
    """One trainer's epoch: a random trace of digests, a salt and a payload digest."""

    digests: tuple[bytes, ...]
    salt: bytes
    payload_digest: Digest

    @property
    def root(self) -> Digest:
        return merkle.root(self.digests)

    @classmethod
    def random(cls, leaves: int) -> Material:
        return cls(tuple(os.urandom(32) for _ in range(leaves)), os.urandom(32), keccak(os.urandom(32)))


class Node:
    """One participant: its own account, Web3 connection and Chain."""

    def __init__(self, url: str, address: str, account: str) -> None:
        w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": 60}))
        self.chain = Chain(w3, address, account, receipt_timeout=60)
        assert self.chain.sender is not None
        self.address: Address = self.chain.sender


class Phaser:
    """Runs one phase's per-node work on the pool and books its transactions, gas and time."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.seconds: dict[str, float] = {}
        self.txs: dict[str, list[TxResult]] = defaultdict(list)

    def run(self, name: str, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        t0 = time.perf_counter()
        out = list(self.pool.map(fn, items))
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
        for r in out:
            if isinstance(r, TxResult):
                self.txs[name].append(r)
        return out

    def book(self, name: str, seconds: float, txs: Sequence[TxResult]) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.txs[name].extend(txs)


def fix_seed(w3: Web3, coord: Chain, run_id: int, epoch: int) -> tuple[list[TxResult], list[str]]:
    """Make sure the epoch's audit seed is fixed: `startAudit` (at most SEED_TRIES times) until seeded.

    Works whether the last reveal fixes the seed itself or only schedules it for a later block.
    A refused `startAudit` is noted and a block is mined before the next try.
    """
    txs: list[TxResult] = []
    refusals: list[str] = []
    for _ in range(SEED_TRIES):
        if coord.epoch_times(run_id, epoch).seeded:
            return txs, refusals
        try:
            txs.append(coord.start_audit(run_id, epoch))
        except ContractRevert as exc:
            refusals.append(f"{type(exc).__name__}: {exc}")
            w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    if coord.epoch_times(run_id, epoch).seeded:
        return txs, refusals
    raise ScaleFailure(
        f"epoch {epoch}: audit seed not fixed after {SEED_TRIES} startAudit attempts "
        f"({len(txs)} mined, refusals: {refusals})"
    )


def play_epoch(
    w3: Web3, pool: ThreadPoolExecutor, coord: Chain, trainers: Sequence[Node], verifiers: dict[str, Node],
    run_id: int, epoch: int, leaves: int,
) -> dict[str, Any]:
    """One full epoch with every node acting; returns the epoch's record."""
    material = {t.address: Material.random(leaves) for t in trainers}
    commitments = {
        t.address: t.chain.commitment_for(run_id, epoch, m.payload_digest, m.root, leaves, m.salt)
        for t in trainers for m in [material[t.address]]
    }
    ph = Phaser(pool)
    t_start = time.perf_counter()

    ph.run("commit", lambda t: t.chain.commit(run_id, epoch, commitments[t.address]), trainers)

    def reveal(t: Node) -> TxResult:
        m = material[t.address]
        return t.chain.reveal(run_id, epoch, PAYLOAD_CID, m.payload_digest, m.root, leaves, m.salt)

    ph.run("reveal", reveal, trainers)

    t0 = time.perf_counter()
    seed_txs, refusals = fix_seed(w3, coord, run_id, epoch)
    times = coord.epoch_times(run_id, epoch)
    seed = times.seed
    ph.book("seed", time.perf_counter() - t0, seed_txs)

    def respond(t: Node) -> TxResult:
        resp = build_response(material[t.address].digests, seed, t.address, STEPS, FINAL_BPS)
        return t.chain.respond(run_id, epoch, MANIFEST_CID, resp)

    ph.run("respond", respond, trainers)

    # verifiers learn their trainers from the contract's assignment, then each sends one batch
    assigned = ph.run("verdicts", lambda t: coord.assignment(run_id, epoch, t.address).verifiers, trainers)
    jobs: dict[str, list[str]] = defaultdict(list)
    for t, vs in zip(trainers, assigned):
        for v in vs:
            jobs[str(v)].append(t.address)
    unknown = set(jobs) - set(verifiers)
    if unknown:
        raise ScaleFailure(f"epoch {epoch}: assignment names verifiers that never joined: {sorted(unknown)}")
    # every verifier of the frozen list commits (an empty list if it has no trainer), then each reveals
    salt = keccak(b"verdict salt %d" % epoch)
    batch = {v: [(a, True, keccak(b"witness " + a.encode())) for a in jobs.get(v, [])] for v in verifiers}
    ph.run("verdict-commits", lambda v: verifiers[v].chain.commit_verdicts(run_id, epoch, batch[v], salt), sorted(verifiers))
    ph.run("verdicts", lambda v: verifiers[v].chain.submit_verdicts(run_id, epoch, batch[v], salt, EVIDENCE_CID), sorted(verifiers))

    # the coordinator includes exactly the trainers the contract says passed
    passed = ph.run("finalize", lambda t: coord.submission(run_id, epoch, t.address).passed, trainers)
    included = [t.address for t, ok in zip(trainers, passed) if ok]
    t0 = time.perf_counter()
    fin = coord.finalize(run_id, epoch, MODEL_CID, keccak(b"model %d" % epoch), included)
    ph.book("finalize", time.perf_counter() - t0, [fin])

    # a majority of the epoch's attestation committee confirms the model (each recomputes it in a real run)
    committee = coord.model_committee(run_id, epoch)
    ph.run("attest", lambda v: verifiers[str(v)].chain.attest_model(run_id, epoch, keccak(b"model %d" % epoch), MODEL_CID),
           committee[: len(committee) // 2 + 1])
    latency = time.perf_counter() - t_start

    status = coord.epoch_status(run_id, epoch)
    finalized = [e for e in fin.events if e.name == "EpochFinalized"]
    slashed = [e for e in fin.events if e.name == "Slashed"]
    all_txs = [tx for name in PHASES for tx in ph.txs[name]]
    total_gas = sum(tx.gas_used for tx in all_txs)
    biggest = max(all_txs, key=lambda tx: tx.gas_used)
    biggest_phase = next(name for name in PHASES if biggest in ph.txs[name])
    blocks = [tx.block_number for tx in all_txs]
    return {
        "epoch": epoch,
        "latency_s": round(latency, 3),
        "phase_s": {name: round(ph.seconds.get(name, 0.0), 3) for name in PHASES},
        "transactions": len(all_txs),
        "transactions_by_phase": {name: len(ph.txs[name]) for name in PHASES},
        "blocks": max(blocks) - min(blocks) + 1,
        "gas_total": total_gas,
        "gas_by_phase": {name: sum(tx.gas_used for tx in ph.txs[name]) for name in PHASES},
        "gas_per_trainer": round(total_gas / len(trainers)),
        "largest_tx_gas": biggest.gas_used,
        "largest_tx_phase": biggest_phase,
        "tx_per_s": round(len(all_txs) / latency, 1),
        "seed_start_audit_calls": len(seed_txs),
        "seed_refusals": refusals,
        "verifier_batches": {v: len(ts) for v, ts in sorted(jobs.items())},
        "status": {
            "phase": status.phase.name,
            "committed": status.committed,
            "revealed": status.revealed,
            "passed": status.passed,
            "failed": status.failed,
            "model_cid": status.model_cid,
        },
        "included": len(included),
        "included_event": int(finalized[0].args["included"]) if finalized else None,
        "slashed": [str(e.args["trainer"]) for e in slashed],
        "finalized": status.phase == Phase.FINALIZED,
    }


def run_scale(
    trainers: int = 64, verifiers: int = 8, epochs: int = 3, workers: int = 8, leaves: int = LEAVES,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Start anvil, deploy, create a run, join T trainers and V verifiers, play E epochs; the result dict.

    Raises on a failed transaction or a seed that never gets fixed; an epoch that ends anywhere but
    FINALIZED with everyone included shows in `ok` / `per_epoch[i].finalized`.
    """
    if trainers < 1 or verifiers < 1 or epochs < 1 or workers < 1:
        raise ValueError("trainers, verifiers, epochs and workers must all be at least 1")
    if verifiers < QUORUM:
        raise ValueError(f"need at least {QUORUM} verifiers (the quorum) for trainers to pass")
    say = log or (lambda _msg: None)
    t_all = time.time()
    load_start = os.getloadavg()
    with Anvil(AnvilConfig(accounts=1 + trainers + verifiers, gas_limit=BLOCK_GAS)) as node, \
            ThreadPoolExecutor(max_workers=workers) as pool:
        w3 = Web3(Web3.HTTPProvider(node.url, request_kwargs={"timeout": 60}))
        accounts = list(w3.eth.accounts)
        if len(accounts) < 1 + trainers + verifiers:
            raise ScaleFailure(f"anvil gave {len(accounts)} accounts, need {1 + trainers + verifiers}")
        address = deploy(w3, accounts[0])
        coord = Chain(w3, address, accounts[0])
        run_id = coord.create_run(run_params(accounts[0], trainers, verifiers))
        coord.stake_coordinator(run_id)

        t0 = time.perf_counter()
        tnodes = list(pool.map(lambda a: Node(node.url, address, a), accounts[1:1 + trainers]))
        vnodes = list(pool.map(lambda a: Node(node.url, address, a), accounts[1 + trainers:1 + trainers + verifiers]))
        joins = list(pool.map(lambda n: n.chain.join_trainer(run_id), tnodes))
        joins += list(pool.map(lambda n: n.chain.join_verifier(run_id), vnodes))
        join_s = time.perf_counter() - t0
        members = list(pool.map(lambda n: coord.member(run_id, n.address), tnodes + vnodes))
        slots = [m.slot for m in members[:trainers]]
        if any(m.role != 1 for m in members[:trainers]) or any(m.role != 2 for m in members[trainers:]):
            raise ScaleFailure("a node's member role is not what it joined as")
        if len(set(slots)) != trainers:
            raise ScaleFailure(f"trainer slots are not distinct: {sorted(slots)}")
        info = coord.run_info(run_id)
        say(f"  run {run_id}: {info.active_trainers} trainers, {info.verifier_count} verifiers joined "
            f"in {join_s:.1f} s")

        per_epoch = []
        vmap: dict[str, Node] = {str(v.address): v for v in vnodes}
        for e in range(epochs):
            rec = play_epoch(w3, pool, coord, tnodes, vmap, run_id, e, leaves)
            per_epoch.append(rec)
            say(f"  epoch {e}: {rec['status']['phase']} in {rec['latency_s']:.1f} s, {rec['transactions']} txs, "
                f"{rec['gas_per_trainer']:,} gas/trainer")

        slashed_all = coord.events(["Slashed"], run_id=run_id)
        stakes = [m.stake for m in pool.map(lambda n: coord.member(run_id, n.address), tnodes)]
        final_info = coord.run_info(run_id)
        head = coord.block_number()
    ok = (
        len(per_epoch) == epochs
        and all(r["finalized"] and r["included"] == trainers and r["status"]["passed"] == trainers
                and r["status"]["failed"] == 0 and not r["slashed"] for r in per_epoch)
        and not slashed_all
        and all(s == info.params.trainer_stake for s in stakes)
    )
    lat = [r["latency_s"] for r in per_epoch]
    return {
        "benchmark": "scale",
        "machine": gas.machine() | {"loadavg_start": [round(x, 2) for x in load_start],
                                "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
        "versions": versions(),
        "settings": {
            "trainers": trainers, "verifiers": verifiers, "epochs": epochs, "workers": workers,
            "leaves": leaves, "audit_steps": STEPS, "final_check_bps": FINAL_BPS, "quorum": QUORUM,
            "windows_s": 3600, "block_gas_limit": BLOCK_GAS, "automine": True,
            "accounts": 1 + trainers + verifiers,
        },
        "run_id": run_id,
        "setup": {
            "join_s": round(join_s, 3),
            "join_transactions": len(joins),
            "join_gas": sum(tx.gas_used for tx in joins),
            "trainer_slots": sorted(slots),
            "active_trainers": final_info.active_trainers,
            "verifier_count": final_info.verifier_count,
        },
        "per_epoch": per_epoch,
        "summary": {
            "epochs_finalized": sum(r["finalized"] for r in per_epoch),
            "latency_s_mean": round(sum(lat) / len(lat), 3),
            "latency_s_max": max(lat),
            "gas_per_trainer_mean": round(sum(r["gas_per_trainer"] for r in per_epoch) / len(per_epoch)),
            "largest_tx_gas": max(r["largest_tx_gas"] for r in per_epoch),
            "transactions": sum(r["transactions"] for r in per_epoch),
            "slashed": [str(e.args["trainer"]) for e in slashed_all],
            "trainer_stakes_intact": all(s == info.params.trainer_stake for s in stakes),
            "chain_head": head,
        },
        "ok": ok,
        "wall_s": round(time.time() - t_all, 1),
    }


def versions() -> dict[str, str]:
    """gas.py's toolchain versions, plus which contract code was measured."""
    art = artifact()
    return gas.versions() | {
        "runtime_keccak": "0x" + keccak(bytes.fromhex(art["deployedBytecode"][2:])).hex(),
        "git_head": _git("rev-parse", "HEAD"),
        # the contract and binding measured are the working tree's: say whether they differ from HEAD
        "contract_or_binding_modified": str(bool(_git("status", "--porcelain", "--", "contracts", "protocol"))),
    }


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except OSError:
        return ""


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    rows = [
        "| epoch | status | included | latency s | commit | reveal | seed | respond | verdict commits | verdicts | finalize | attest | txs | gas total | **gas / trainer** | largest tx |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["per_epoch"]:
        p = r["phase_s"]
        rows.append(
            f"| {r['epoch']} | {r['status']['phase']} | {r['included']}/{s['trainers']} | {r['latency_s']:.2f} | "
            + " | ".join(f"{p[name]:.2f}" for name in PHASES)
            + f" | {r['transactions']} | {r['gas_total']:,} | **{r['gas_per_trainer']:,}** | "
            f"{r['largest_tx_gas']:,} ({r['largest_tx_phase']}) |"
        )
    sm = result["summary"]
    head = (f"{s['trainers']} trainers, {s['verifiers']} verifiers (separate accounts), {s['epochs']} epochs "
            f"on anvil, {s['workers']} sender threads; phase columns in seconds:")
    foot = (f"{sm['epochs_finalized']}/{s['epochs']} epochs finalized; mean latency {sm['latency_s_mean']:.2f} s; "
            f"slashed: {', '.join(sm['slashed']) or 'nobody'}; largest transaction {sm['largest_tx_gas']:,} gas "
            f"({sm['largest_tx_gas'] / s['block_gas_limit']:.1%} of a 30M block); setup (joins) "
            f"{result['setup']['join_s']:.1f} s; whole run {result['wall_s']:.1f} s.")
    return "\n".join([head, "", *rows, "", foot])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", type=Path, help="JSON result file (required unless --render)")
    ap.add_argument("--render", type=Path, help="print the Markdown table of an existing result JSON and exit")
    ap.add_argument("--trainers", type=int, default=64)
    ap.add_argument("--verifiers", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=8, help="sender threads per phase")
    args = ap.parse_args(argv)
    if args.render:
        print(markdown(json.loads(args.render.read_text())))
        return 0
    if args.out is None:
        ap.error("--out is required")
    if args.trainers + args.verifiers + 1 > 1000:
        ap.error("at most 999 trainers + verifiers (anvil accounts)")
    if args.verifiers < QUORUM:
        ap.error(f"--verifiers must be at least the quorum ({QUORUM})")
    res = run_scale(args.trainers, args.verifiers, args.epochs, args.workers,
                    log=lambda m: print(m, file=sys.stderr))
    argv_used = list(argv) if argv is not None else sys.argv[1:]
    result = {"benchmark": res.pop("benchmark"), "command": "benchmarks/scale.py " + " ".join(argv_used), **res}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    if not result["ok"]:
        print("FAILED: not every epoch finalized with every trainer included and nobody slashed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
