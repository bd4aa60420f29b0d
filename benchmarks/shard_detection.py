"""How likely a shard audit catches each forgery, what that costs, and what cheating then gains.

    nice -n 19 .venv/bin/python benchmarks/shard_detection.py --out benchmarks/results/verification.json

Writes the key `shard_policy` into that JSON (the rest of the file, benchmarks/verification.py's, is
kept). Under a policy of s audited steps per trainer and epoch and segments of r steps, each draw k
(protocol.chain.audit.challenged_steps) becomes the segment of r steps around it, of one audit block
of B (protocol.shard_audit.shard_challenges); the verifier replays that block over the segment. So:

- (a) a trainer faking a fraction f of its H steps (skipping them) is caught when a drawn segment
  holds a faked step, whatever the block. `spread`: the faked steps are scattered at random;
  `clustered`: packed into as few segments as possible, the cheater's best placement.
- (b) one forged transition (every block's state off after one step): caught when its segment is drawn.
- (c) one forged shard (one block's update at one step) or one boundary tensor: caught when its
  segment and its block are drawn. A boundary tensor forged only where committed (the next block
  computed from the true one) fails both neighbours (2 blocks); forged consistently, only the block
  that produced it (1 block). The worse case, 1/B, is reported.

Each figure three ways: the closed form; sampled over many seeds through the real draws; and, on a
tiny real trace with each forgery planted, the real trainer answer (trainer.shard_response) judged by
the real checks (verifier.shard.audit_findings) for a set of seeds: the check must fail exactly when
the draws cover the forgery, i.e. a forgery is caught whenever it is drawn.

Costs per policy (small preset, 8 rows of its 128-token context, the K = 4 network run's; `--batch`,
`--seq-len`): the shard files a trainer
publishes per epoch (exact tensor bytes from protocol.shard_audit.challenge_spec; leaf preimages and
proofs, a few KB, not counted) and the verifier's replay in block-steps over the trainer's H x B,
with the measured verifier/trainer compute of benchmarks/protocol.py when its results exist.

Expected gain (docs/security.md, "Expected gain of a cheat"): W - p (b S + R) per epoch, with
the default stake S, slash b and the demo's reward R, for each catalogued cheat that saves work.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from dilocox.blockstep import blockwise_step
from dilocox.compress import CompressionConfig
from dilocox.delay import StartRule
from dilocox.inner import MOM1, MOM2, PARAM, STEP, InnerConfig, configure_determinism
from dilocox.round import RoundSpec, compress_seed, epoch_batch
from protocol import merkle
from protocol.chain.audit import challenged_steps
from protocol.config import RunConfig
from protocol.data import Corpus
from protocol.digest import keccak
from protocol.formats.codec import load_state
from protocol.formats.payload import wrap
from protocol.leaf import block_count, block_names
from protocol.model import init_params, n_params, param_shapes, preset
from protocol.shard_audit import (
    challenge_spec,
    decode_manifest,
    encode_manifest,
    shard_challenges,
    transition_spec,
)
from protocol.store.backends import LocalStore
from protocol.types import Address
from trainer.checkpoints import EpochDir
from trainer.engine import LocalEngine
from trainer.shard_response import shard_response
from verifier.shard import Chained, audit_findings

F = 0.10  # the fraction of steps a lazy trainer fakes
CHOSEN = (4, 4)  # (s, r) of the demo, the examples and benchmarks/protocol.py
EPOCHS = 10
TRAINER = Address("0x" + "ab" * 20)

# ---------------------------------------------------------------- closed forms


def _p_distinct(n: int, s: int, d: int) -> float:
    """P(s uniform draws from n equal segments hit exactly d distinct ones)."""
    stirling = sum((-1) ** i * math.comb(d, i) * (d - i) ** s for i in range(d + 1)) // math.factorial(d)
    return math.comb(n, d) * stirling * math.factorial(d) / n**s


def analytic(h: int, s: int, r: int, blocks: int, f: float = F) -> dict[str, float]:
    """Per-epoch detection probabilities (H a multiple of r: n = H / r equal segments)."""
    n, m = h // r, round(f * h)
    spread = clustered = 0.0
    c = math.ceil(m / r)  # segments a clustering cheater must touch
    for d in range(1, min(n, s) + 1):
        pd = _p_distinct(n, s, d)
        spread += pd * math.comb(h - d * r, m) / math.comb(h, m)  # no faked step in d segments
        clustered += pd * math.comb(n - c, d) / math.comb(n, d)
    one = r / h
    return {
        "fake_fraction_spread": 1 - spread,
        "fake_fraction_clustered": 1 - clustered,
        "one_transition": 1 - (1 - one) ** s,
        "one_shard_or_boundary": 1 - (1 - one / blocks) ** s,
    }


def over_epochs(p: float, epochs: int = EPOCHS) -> float:
    return 1 - (1 - p) ** epochs


# ---------------------------------------------------------------- sampled over the real draws


def _covered(chals: list[tuple[int, int, int]], steps: Any) -> bool:
    return any(lo <= x < hi for lo, hi, _ in chals for x in steps)


def sampled(h: int, s: int, r: int, blocks: int, seeds: int, f: float = F) -> dict[str, dict[str, float]]:
    """The same figures from protocol.chain.audit / protocol.shard_audit draws over `seeds` seeds; the
    forgery's place is drawn afresh per seed. 10-epoch figures use 10 consecutive seeds per run."""
    rng = random.Random(f"{h}-{s}-{r}")
    m = round(f * h)
    caught: dict[str, list[bool]] = {k: [] for k in ("fake_fraction_spread", "fake_fraction_clustered",
                                                     "one_transition", "one_shard_or_boundary")}
    for _ in range(seeds):
        seed = rng.randbytes(32)
        chals = shard_challenges(seed, TRAINER, challenged_steps(seed, TRAINER, s, h + 1), h + 1, r, blocks)
        spread = set(rng.sample(range(h), m))
        first = rng.randrange(h // r - math.ceil(m / r) + 1) * r  # m consecutive steps from a segment start
        clustered = set(range(first, first + m))
        k, b = rng.randrange(h), rng.randrange(1, blocks - 1)  # a middle block: the data ends go with every draw
        caught["fake_fraction_spread"].append(_covered(chals, spread))
        caught["fake_fraction_clustered"].append(_covered(chals, clustered))
        caught["one_transition"].append(_covered(chals, [k]))
        caught["one_shard_or_boundary"].append(any(lo <= k < hi and blk == b for lo, hi, blk in chals))
    out = {}
    for name, hits in caught.items():
        runs = [any(hits[i:i + EPOCHS]) for i in range(0, len(hits) - EPOCHS + 1, EPOCHS)]
        out[name] = {"per_epoch": round(sum(hits) / len(hits), 4), f"{EPOCHS}_epochs": round(sum(runs) / len(runs), 4),
                     "seeds": len(hits)}
    return out


# ---------------------------------------------------------------- real checks on tiny traces

TINY = preset("tiny")
SEGMENT, H_TINY, SLOT, RANK = 2, 6, 0, 4
SPEC = RoundSpec(TINY, InnerConfig(lr=3e-3, warmup_steps=2, total_steps=50), CompressionConfig(), StartRule.DELAYED,
                 run_seed=1, batch_size=4, seq_len=16, microbatches=2, shard=True, segment=SEGMENT)
CORPUS = Corpus(bytes((i * 7 + i // 13) % 251 for i in range(4096 * 24)))
G0 = init_params(TINY, 0)
FORGED_STEP, FORGED_BLOCK = 3, 1


class _Store(LocalStore):
    def fetcher(self) -> Any:
        return lambda cid, spec: load_state(self.get(cid), expect=spec)


class Forger(LocalEngine):
    """A trainer that forges one thing at inner step FORGED_STEP of an epoch and is honest elsewhere."""

    kind = "honest"

    def begin(self, d, steps, g, prev):  # type: ignore[no-untyped-def]
        leaf = super().begin(d, steps, g, prev)
        self.base = int(self.state[STEP].item())  # the step counter at leaf 0
        return leaf

    def _step(self, state, batch, on_partial=None):  # type: ignore[no-untyped-def]
        new, loss, ios = blockwise_step(state, batch, self.spec.model, self.spec.inner, self.spec.microbatches, on_partial)
        if int(state[STEP].item()) - self.base != FORGED_STEP:
            return new, loss, ios
        if self.kind == "transition":  # the step's update skipped for every block (a lazy step)
            new = {k: (state[k] if k.startswith((PARAM, MOM1, MOM2)) else v) for k, v in new.items()}
        elif self.kind == "shard":  # block FORGED_BLOCK's update skipped
            names = block_names(self.spec.model)[FORGED_BLOCK]
            own = tuple(p + n for p in (PARAM, MOM1, MOM2) for n in names)
            new = {k: (state[k] if k in own else v) for k, v in new.items()}
        elif self.kind == "boundary":  # block FORGED_BLOCK's output activations forged where committed
            ios = list(ios)
            ios[FORGED_BLOCK] = replace(ios[FORGED_BLOCK], act=ios[FORGED_BLOCK].act * 1.01)
        return new, loss, ios


def real_checks(root: Path, s: int, seeds: int) -> dict[str, Any]:
    """Plant each forgery in one real tiny epoch; judge the real answer for `seeds` seeds."""
    configure_determinism(1)
    blocks = block_count(TINY)
    out: dict[str, Any] = {"preset": "tiny", "H": H_TINY, "segment": SEGMENT, "blocks": blocks, "audit_steps": s,
                           "forged_step": FORGED_STEP, "forged_block": FORGED_BLOCK}
    for kind in ("transition", "shard", "boundary"):
        eng = type(f"Forger_{kind}", (Forger,), {"kind": kind})(SPEC, every=2)
        store = _Store(root / kind / "store")
        d = EpochDir(root / kind / "node", 0)
        leaves = [eng.begin(d, H_TINY, G0, None)]
        for k in range(H_TINY):
            leaves.append(eng.step(d, k, epoch_batch(SPEC, CORPUS, 0, SLOT, k))[1])
        payload, _ = eng.finish(d, RANK, compress_seed(SPEC.run_seed, 0, SLOT))
        pub, pre = wrap(1, 0, TRAINER, payload), [lf.encode() for lf in leaves]
        root_ = merkle.root([keccak(p) for p in pre])
        # which blocks' replay reads the forgery: all (transition), its own (shard), both neighbours (boundary)
        readers = {"transition": set(range(blocks)), "shard": {FORGED_BLOCK},
                   "boundary": {FORGED_BLOCK, FORGED_BLOCK + 1}}[kind]
        agree = drawn_n = caught_n = 0
        for i in range(seeds):
            seed = keccak(f"shard-detection-{kind}-{i}".encode())
            steps = challenged_steps(seed, TRAINER, s, H_TINY + 1)
            m = shard_response(engine=eng, spec=SPEC, run_id=1, epoch=0, trainer=TRAINER, d=d, preimages=pre,
                               seed=seed, steps=steps, final_bps=10_000,
                               batch_of=lambda k: epoch_batch(SPEC, CORPUS, 0, SLOT, k), publish=store.put,
                               prev=None, prev_preimages=())
            m = decode_manifest(encode_manifest(m, blocks), blocks, max_bytes=1 << 24)
            chained = Chained(root_, H_TINY + 1, seed, tuple(steps), 10_000, prev_revealed=False,
                              prev_root=bytes(32), prev_leaf_count=0)
            findings = audit_findings(m, chained, store.fetcher(), SPEC,
                                      CORPUS, G0, pub, run_id=1, epoch=0, slot=SLOT, trainer=TRAINER, rank=RANK,
                                      prev_rank=RANK)
            caught = any(not f.passed for f in findings)
            drawn = any(c.start <= FORGED_STEP < c.end and c.block in readers for c in m.challenges)
            agree += caught == drawn
            drawn_n += drawn
            caught_n += caught
        out[kind] = {"seeds": seeds, "drawn": drawn_n, "caught": caught_n, "caught_exactly_when_drawn": agree == seeds,
                     "caught_when_drawn": f"{caught_n}/{drawn_n}" if agree == seeds else None}
    return out


# ---------------------------------------------------------------- costs and gains


def shard_bytes(cfg_name: str, r: int, batch: int, seq: int) -> dict[str, float]:
    """Mean bytes of one challenge's shard file (block drawn uniformly) and of one final-check file."""
    cfg = preset(cfg_name)
    shapes, groups = param_shapes(cfg), block_names(cfg)
    nb = len(groups)
    act = (batch, seq, cfg.d_model)

    def size(spec: dict) -> int:
        return sum(math.prod(t.shape) * torch.empty((), dtype=t.dtype).element_size() for t in spec.values())

    chal = [size(challenge_spec(shapes, groups[b], b, nb, 0, r, act)) for b in range(nb)]
    final = [size(transition_spec(shapes, groups[b])) for b in range(nb)]
    return {"challenge": sum(chal) / nb, "final": sum(final) / nb}


def policy_cost(h: int, s: int, r: int, blocks: int, q: int, final_p: float, files: dict[str, float],
                payload_bytes: float | None) -> dict[str, Any]:
    """Expected replayed block-steps and audit bytes per trainer and epoch (distinct segments only)."""
    n = h // r
    distinct = sum(d * _p_distinct(n, s, d) for d in range(1, min(n, s) + 1))  # challenges deduplicate
    audit = distinct * files["challenge"] + final_p * files["final"]
    return {
        "verifier_block_steps_over_trainer_block_steps": round(q * distinct * r / (h * blocks), 4),
        "audit_bytes_per_trainer_epoch": round(audit),
        "audit_bytes_per_payload_byte": round(audit / payload_bytes, 1) if payload_bytes else None,
    }


def gains(p: dict[str, float], stake: int, slash_bps: int, reward: int, final_p: float, blocks: int,
          s: int, largest: float) -> list[dict[str, Any]]:
    """W - p (b S + R) per epoch for the cheats that save work, W in units of the epoch's honest work C,
    valued at C = R (the work is worth what it is paid). ``largest``: the largest block's share of the
    parameters, a proxy for its share of the step's compute (what a lazy block saves)."""
    price = slash_bps / 10_000 * stake + reward
    eth = 1e18
    rows = [
        ("T1 lazy, f = 0.1, spread", 0.1, p["fake_fraction_spread"]),
        ("T1 lazy, f = 0.1, clustered", 0.1, p["fake_fraction_clustered"]),
        ("T1 lazy, f = 1 (no training)", 1.0, 1.0),
        ("lazy block: the largest of B blocks' work skipped every step (W = its parameter share)", largest,
         1 - (1 - 1 / blocks) ** s),
        ("T2 noise payload (T4 alike), final check 100% (the demo)", 1.0, final_p),
        ("T2 noise payload (T4 alike), final check 50% (RunConfig default)", 1.0, 0.5),
    ]
    out = []
    for name, w, pr in rows:
        out.append({"cheat": name, "work_saved_W_over_C": round(w, 4), "p_caught_per_epoch": round(pr, 4),
                    "expected_loss_eth": round(pr * price / eth, 4),
                    "gain_eth_at_C_eq_R": round((w * reward - pr * price) / eth, 6),
                    "break_even_C_eth": round(pr * price / w / eth, 4) if w else None})
    return out


def markdown(section: dict[str, Any]) -> str:
    """The detection table (per epoch / 10 epochs; closed form, then sampled) and the gains table."""
    names = {"fake_fraction_spread": "(a) 10% faked, spread", "fake_fraction_clustered": "(a) 10% faked, clustered",
             "one_transition": "(b) one transition", "one_shard_or_boundary": "(c) one shard or boundary"}
    rows = ["| s x r | H | " + " | ".join(names.values()) + " | verifier block-steps / trainer's | shard files / trainer / epoch |",
            "|---|---:|" + "---:|" * (len(names) + 2)]
    for p in section["policies"]:
        cells = [f"{p['analytic'][k]['per_epoch']:.3f} / {p['analytic'][k][f'{EPOCHS}_epochs']:.3f} "
                 f"({p['sampled'][k]['per_epoch']:.3f} / {p['sampled'][k][f'{EPOCHS}_epochs']:.3f})" for k in names]
        rows.append(f"| {p['s']} x {p['r']} | {p['H']} | " + " | ".join(cells) +
                    f" | {p['cost']['verifier_block_steps_over_trainer_block_steps']:.3f} | "
                    f"{p['cost']['audit_bytes_per_trainer_epoch'] / 1e6:.0f} MB |")
    g = section["expected_gain"]
    rows += ["", (f"Stake S = {g['stake_wei'] / 1e18:g} ETH, slash b = {g['slash_bps'] / 10_000:g}, reward R = "
             f"{g['trainer_reward_wei'] / 1e18:g} ETH per epoch (the demo's), s = {g['audit_steps']}, r = {g['segment']}; W in units of the "
             "epoch's honest work C:"), "",
             "| cheat | H | W / C | p caught per epoch | expected loss p (bS + R) | gain at C = R | pays only if C > |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for h, table in g["by_H"].items():
        for r in table:
            rows.append(f"| {r['cheat']} | {h} | {r['work_saved_W_over_C']:g} | {r['p_caught_per_epoch']:.3f} | "
                        f"{r['expected_loss_eth']:.4f} ETH | {r['gain_eth_at_C_eq_R']:.4f} ETH | {r['break_even_C_eth']:.3f} ETH |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, default=20_000, help="seeds sampled for s = 2; 2 x seeds / s for larger s (as many draws)")
    ap.add_argument("--real-seeds", type=int, default=24, help="seeds judged per planted forgery on the tiny trace")
    ap.add_argument("--protocol", type=Path, default=Path("benchmarks/results/protocol-small-k4.json"),
                    help="benchmarks/protocol.py's results, for measured costs (its scenarios at --batch x --seq-len)")
    ap.add_argument("--batch", type=int, default=8, help="rows per trainer and step the shard files are priced at")
    ap.add_argument("--seq-len", type=int, default=128, help="tokens per row (`small`'s context)")
    args = ap.parse_args()
    t0 = time.time()
    small = preset("small")
    blocks = block_count(small)
    demo = RunConfig()
    stake, slash = demo.stakes.trainer_wei, demo.stakes.slash_bps
    reward = 10**15  # the demo's trainer reward (veriloco/netdemo.py); RunConfig() pays none
    q = demo.audit.quorum
    measured = {}
    if args.protocol.exists():
        for sc in json.loads(args.protocol.read_text()).get("scenarios", []):
            if sc.get("preset") == "small":
                measured[(sc["audit_mode"], sc["H"], sc["audit_steps"], sc["audit_segment"], sc.get("tokens_per_step"))] = sc
    policies = []
    # the chosen policy; ones that deter a clustering cheater (>= 37% per epoch, >= 99% in 10 epochs);
    # the per-epoch 99% ones: s r >= 44 against spread fakes, s >= 44 segments against clustered ones
    for s, r in ((2, 8), (3, 8), CHOSEN, (4, 8), (5, 8), (6, 8), (44, 1), (44, 8)):
        for h in (64, 256):
            a = analytic(h, s, r, blocks)
            ms = measured.get(("shard", h, s, r, args.batch * args.seq_len))
            payload = ms["payload_bytes_per_trainer_per_epoch"] if ms else None
            files_r = shard_bytes("small", r, args.batch, args.seq_len)
            cost = policy_cost(h, s, r, blocks, q, 1.0, files_r, payload)
            pol: dict[str, Any] = {"s": s, "r": r, "H": h, "blocks": blocks, "quorum": q, "f": F,
                   "analytic": {k: {"per_epoch": round(v, 4), f"{EPOCHS}_epochs": round(over_epochs(v), 4)} for k, v in a.items()},
                   "sampled": sampled(h, s, r, blocks, max(1000, args.seeds * 2 // s)),  # about equal draws per policy
                   "cost": cost}
            if ms:
                pol["measured"] = {k: ms[k] for k in ("verifier_compute_fraction", "audit_bytes_per_payload_byte",
                                                      "audit_bytes_per_trainer_per_epoch", "trainer_compute_per_epoch_seconds")}
            policies.append(pol)
            print(f"s={s} r={r} H={h}: " + ", ".join(f"{k} {v:.3f}" for k, v in a.items()), file=sys.stderr, flush=True)
    chosen = {h: next(p for p in policies if (p["s"], p["r"], p["H"]) == (*CHOSEN, h)) for h in (64, 256)}
    shapes = param_shapes(small)
    largest = max(sum(math.prod(shapes[n]) for n in names) for names in block_names(small)) / n_params(small)
    gain_tables = {}
    for h in (64, 256):
        p = {k: v["per_epoch"] for k, v in chosen[h]["analytic"].items()}
        gain_tables[str(h)] = gains(p, stake, slash, reward, 1.0, blocks, CHOSEN[0], largest)
    with tempfile.TemporaryDirectory(prefix="veriloco-shard-detection-") as tmp:
        real = real_checks(Path(tmp), 2, args.real_seeds)
    section = {
        "command": "benchmarks/shard_detection.py " + " ".join(sys.argv[1:]),
        "chosen_policy": {"audit_steps": CHOSEN[0], "segment": CHOSEN[1], "final_check": 1.0, "quorum": q, "preset": "small",
                          "blocks": blocks, "params": n_params(small)},
        "policies": policies,
        "real_checks": real,
        "expected_gain": {"stake_wei": stake, "slash_bps": slash, "trainer_reward_wei": reward,
                          "audit_steps": CHOSEN[0], "segment": CHOSEN[1],
                          "final_check": 1.0, "by_H": gain_tables},
        "wall_s": round(time.time() - t0, 1),
    }
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    data["shard_policy"] = section
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps({"real_checks": real}, indent=1))
    print(markdown(section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
