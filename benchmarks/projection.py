"""What verification costs at the token counts users train with: a cost model from the code's own shapes.

    .venv/bin/python benchmarks/projection.py --out benchmarks/results/projection.json --md docs/results-projection.md
    .venv/bin/python benchmarks/projection.py --render benchmarks/results/projection.json

Issue 31: a shard challenge used to ship one block's boundary tensors for the whole batch; since leaf
v4 it opens one group (micro-batch) of U tokens per step, plus the block's running gradient sum around
it, so a challenge is bounded by U and the model, not the batch. A trainer still logs every step's
boundaries to answer cheaply (that log grows with the batch). This prices today's audits
(`audit.unit = "shard"`, docs/protocol.md §5.3) for a
model, batch, H, K and q without training anything: every file size is the canonical file the code
would write (`protocol.formats.codec.state_file_size` of `protocol.shard_audit.challenge_spec`,
`transition_spec` and `start_spec`; the manifest encoded by `protocol.shard_audit.build_manifest` over
placeholder leaves; the payload by `dilocox.compress.payload_size`), for each audit block of the
model (`protocol.leaf.block_names`), averaged over the uniformly drawn block. Measured inputs: none;
the shapes are the code's. Assumed: nothing about hardware for the byte figures. The compute figures
are FLOP ratios (`6 · parameters · tokens` per training step, the same per replayed block-token, plus
attention), not seconds: a model of work, not a measurement.

Per trainer and epoch, at the steady state of a long run (a continued start, the final check drawn
as often as `final_check_bps` says):

- sent: the wrapped payload, the manifest, `s` draws of challenge files (the drawn block and the data
  ends, blocks 0 and B − 1, over the same segment: `protocol.shard_audit.data_ends`; each file `r` steps: the block's
  parameters and moments, `2 r` boundary tensors of one group of U tokens, and with M > 1 groups two
  block-sized sums per step; under the merge rule, when the segment covers the merge step, the
  block's start parameters too), the final check's transition
  file and, with a carried error buffer (`compression.error_feedback = "buffer"`), the continued start's
  start file (every parameter and error buffer; none with the error feedback in the parameters);
- received: the other K − 1 payloads (a trainer rebuilds G_e from the payloads);
- each byte once: AllReduce (a ring over fp32 gradients, `2 (K − 1) / K · 4 P` per step, H steps)
  over sent + received; per verifier fetch: the audit answer counted once per judging verifier (q);
- what a trainer keeps to answer: its checkpoints (each the whole state with its error buffer: every
  `c = max(16, r)` steps while it keeps the boundary log, every step's boundaries, and every
  `max(4, r)` without one, trainer/checkpoints.py `CheckpointRule`); answering a challenge starts at
  the checkpoint at or before it, `(c − r) / 2` steps before on average, and runs `r` more: block b
  alone on the log, or whole steps without it.

`--validate JSON` compares the model with a measured network run (`benchmarks/protocol.py` results:
each scenario's preset, H, K, batch and policy) and reports model / measured for every byte figure.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from dilocox.compress import CompressionConfig, payload_size
from protocol import windows
from protocol.formats.codec import TensorSpec, state_file_size
from protocol.leaf import BlockEntry, GroupLeaf, StepLeaf, block_count, block_names, group_root
from protocol.model import PRESETS, GPTConfig, param_shapes
from protocol.shard_audit import (
    build_manifest,
    challenge_spec,
    data_ends,
    encode_manifest,
    open_groups,
    start_spec,
    transition_spec,
)
from protocol.types import Address, Cid
from trainer.checkpoints import CheckpointRule
from veriloco.simulate import ring_allreduce_bytes

# Models beyond the presets, as shapes only (meta tensors: nothing is allocated). The 7B is Llama-2's
# shape; the 107B is Qwen1.5-110B's (the DiLoCoX paper trained a 107B modification of it), without
# its attention biases: about 111B parameters here.
SHAPES: dict[str, GPTConfig] = {
    "small": PRESETS["small"],
    "gpt2-124m": PRESETS["gpt2-124m"],
    "llama-1b": PRESETS["llama-1b"],
    "llama-7b": GPTConfig(n_layer=32, n_head=32, d_model=4096, seq_len=4096, vocab_size=32000, arch="llama", d_ff=11008),
    "qwen-107b": GPTConfig(n_layer=80, n_head=64, d_model=8192, seq_len=4096, vocab_size=152064, arch="llama",
                           n_kv_head=8, d_ff=49152),
}
SEGMENT_TOKENS = 4096  # a segment's tokens: r = 4 at 1,024 tokens a step, 1 past 4,096 (examples/small.toml's 8,192)
SEGMENT_MAX = 4  # audit.segment as the examples ship it
# trainer/node.py's defaults: --checkpoint-every where the answer log misses a step, --checkpoint-every-logged
# while it holds them (a sharded run keeps max(each, r), the logged one a multiple of the other); the kept
# runs that validate reads checkpointed every 16 steps too, as their trainers kept every step's log
CHECKPOINT_EVERY, CHECKPOINT_EVERY_LOGGED = 4, 16
WRAP_BYTES = 74  # protocol.formats.payload.wrap: magic, version, run id, epoch, address, length
CID = Cid("QmPpqKocqm3WSUSVrTS4wCUXJW1eFQKgbszWH5HvLdLKBf")  # any CIDv0 (what `ipfs add` names)


@dataclass(frozen=True)
class Setting:
    """One row: a model at a batch, H, K, q and the audit policy (examples/small.toml's by default)."""

    model: str
    rows: int  # sequences per trainer and step
    seq_len: int
    H: int
    K: int
    q: int = 3
    s: int = 4  # audit.challenges: per trainer and epoch (with a rate, only a cap)
    rate: float = 0.0  # audit.rate: each transition challenged on its own with this chance (0: s an epoch)
    r: int = 0  # audit.segment: steps per challenge; 0: SEGMENT_TOKENS // tokens, within 1..SEGMENT_MAX
    final_check: float = 1.0  # final_check_bps / 10,000
    merge: bool = True  # the merge rule (schedule.merge_step): start files carry no start parameters
    # compression.error_feedback = "params" (the merge rule only): no error buffer, so no start file
    # and no start parameters in a challenge (the merge offset is public)
    ef_in_params: bool = True
    rank: int = 128
    bits: int = 4
    group_size: int = 64
    element_bytes: int = 4  # 2: every tensor file in bf16 (the 107B row; the code writes fp32 today)
    group_tokens: int = 4096  # U: tokens per group (inner.microbatches = rows · seq_len / U)
    # windowed challenges (issue 48, protocol/windows.py): the gas a trainer allows its windows' posts an
    # epoch (0: challenges drawn after the epoch, as today), what one aggregated post costs (assumed:
    # the contract's post is not built yet) and the steps trained between a window's end and its safe seed
    window_gas: int = 0
    window_post_gas: int = 35_000
    seed_lag_steps: int = 1

    @property
    def tokens(self) -> int:
        return self.rows * self.seq_len

    @property
    def segment(self) -> int:
        """r: a segment spans about SEGMENT_TOKENS tokens (4 steps at 1,024 tokens, 1 step past 4,096), so
        the state hashed every r steps costs the same fraction of a step at any batch, and a
        challenge's total sums (one block-sized tensor per step when M > 1) stay few."""
        return self.r or max(1, min(SEGMENT_MAX, SEGMENT_TOKENS // self.tokens))

    def draws(self) -> float:
        """Challenges an epoch ships: s, or with a rate the expected distinct segments drawn (a segment is
        challenged when any of its transitions is)."""
        if not self.rate:
            return float(self.s)
        seg = min(self.segment, self.H)
        return sum(1 - (1 - self.rate) ** (min(a + seg, self.H) - a) for a in range(0, self.H, seg))

    def skip10_within_256(self) -> float:
        """10% of the steps skipped in whole segments, caught within 256 steps of work: 1 − (1 − rate)^25.6,
        or under s draws an epoch 1 − (0.9^s)^(256 / H) (benchmarks/audit_rate.py simulates both)."""
        return 1 - (1 - self.rate) ** 25.6 if self.rate else 1 - 0.9 ** (self.s * 256 / self.H)

    @property
    def group_rows(self) -> int:
        return max(1, min(self.rows, self.group_tokens // self.seq_len))

    @property
    def micro(self) -> int:
        """M, the groups of a step: inner.microbatches at U tokens per group."""
        return max(1, self.rows // self.group_rows)


def _as(spec: Mapping[str, TensorSpec], element_bytes: int) -> dict[str, TensorSpec]:
    if element_bytes == 4:
        return dict(spec)
    return {n: TensorSpec(torch.bfloat16, s.shape) if s.dtype == torch.float32 else s for n, s in spec.items()}


def _manifest_bytes(n_blocks: int, H: int, s: int, r: int, final: bool, micro: int) -> int:
    """The manifest of a continued start with ``s`` distinct segments (spread over the trace), each
    opening group M−1 of a middle block at every step (the most openings), and the final check, over
    placeholder leaves of the model's preimage size: its bytes do not depend on the digests' values."""
    groups = [GroupLeaf()] * micro
    root = group_root(groups)
    leaves = [StepLeaf(k, 0, (BlockEntry(groups=root),) * n_blocks).encode() for k in range(H + 1)]
    seg = max(1, min(r, H))
    starts = sorted({(j * (H // max(1, s))) // seg * seg for j in range(s)})
    b = min(n_blocks - 2, max(1, n_blocks // 2))
    challenges = [(a, min(a + seg, H), b) for a in starts]
    every = {k: dict.fromkeys(range(n_blocks), groups) for k in range(H)}

    def opened(a: int, e: int, blk: int) -> tuple[Cid, tuple]:
        return CID, open_groups(every, a, e, blk, [micro - 1] * (e - a), n_blocks)

    m = build_manifest(run_id=1, epoch=1, trainer=Address("0x" + "11" * 20), preimages=leaves, segment=seg,
                       groups=micro, challenges=challenges, cid_of_challenge=opened, final_block=0 if final else -1,
                       cid_of_final=lambda _: CID, previous=leaves, cid_of_start=lambda: CID, n_blocks=n_blocks)
    return len(encode_manifest(m, n_blocks))


def flops_per_token(cfg: GPTConfig, names: Sequence[str] | None = None) -> float:
    """Training FLOPs per token (forward and backward) of the model, or of the parameters ``names``:
    6 per weight outside the embedding tables (a lookup), plus the attention scores and values,
    12 · d_model · seq_len per attention layer (counted for ``names`` holding an ``attn_proj``)."""
    shapes = param_shapes(cfg)
    chosen = list(shapes) if names is None else list(names)
    dense = 6.0 * sum(math.prod(shapes[n]) for n in chosen if not n.startswith(("wte.", "wpe.")))
    attn_layers = sum(1 for n in chosen if n.endswith(".attn_proj.weight"))
    return dense + 12.0 * cfg.d_model * cfg.seq_len * attn_layers


def log_bytes_per_step(shapes: Mapping[str, tuple[int, ...]], n_blocks: int, act: tuple[int, ...],
                       w: int) -> dict[str, int]:
    """What one step adds to a trainer's answer log, by kind (trainer/boundaries.py): every block's input
    and output gradient on ``act`` (the B − 1 edges, two tensors each), or every parameter's total gradient."""
    return {"boundaries": 2 * (n_blocks - 1) * math.prod(act) * w, "gradients": w * sum(math.prod(s) for s in shapes.values())}


def project(st: Setting) -> dict[str, Any]:
    """Every byte and FLOP figure of one setting (docs/protocol.md §5.3's files; see the module doc)."""
    cfg = SHAPES[st.model]
    cfg = replace(cfg, seq_len=st.seq_len) if st.seq_len != cfg.seq_len else cfg
    shapes = param_shapes(cfg)
    blocks = block_names(cfg)
    B = block_count(cfg)
    P = sum(math.prod(s) for s in shapes.values())
    w = st.element_bytes
    act = (st.rows, st.seq_len, cfg.d_model)
    group = (st.group_rows, st.seq_len, cfg.d_model)
    M = st.micro
    seg = min(st.segment, st.H)
    params = st.merge and st.ef_in_params
    log_step = log_bytes_per_step(shapes, B, act, w)["boundaries"]  # one step's in/gout of every block
    bound_step = log_bytes_per_step(shapes, B, group, w)["boundaries"]  # of one group
    challenge, buffered, final, final_buffered, block_p = [], [], [], [], []
    for b, names in enumerate(blocks):
        spec = challenge_spec(shapes, names, b, B, 0, seg, group, merge=False, micro=M)
        plain = state_file_size(_as(spec, w))
        merged = state_file_size(_as(challenge_spec(shapes, names, b, B, 0, seg, group, merge=True, micro=M), w))
        cover = min(1.0, seg / st.H) if st.merge else 0.0  # a segment covers the merge step
        buffered.append(plain + cover * (merged - plain))  # its block's start parameters ride along
        challenge.append(plain if params else buffered[-1])
        final.append(state_file_size(_as(transition_spec(shapes, names, params), w)))
        final_buffered.append(state_file_size(_as(transition_spec(shapes, names), w)))
        block_p.append(sum(math.prod(shapes[n]) for n in names))
    def per_draw(per_block: list[float]) -> float:
        """A draw's mean over its uniformly drawn block: that block and the data ends (shard_audit.data_ends)."""
        return sum(sum(per_block[x] for x in data_ends(b, B)) for b in range(B)) / B

    per_challenge = per_draw(challenge)
    per_final = sum(final) / B
    buffer_start = state_file_size(_as(start_spec(shapes, st.merge), w))  # what a carried buffer's start ships
    start = 0 if params else buffer_start
    s = st.draws()
    if st.rate:  # a manifest grows by one challenge's entries per draw: its mean over the draw
        m0 = _manifest_bytes(B, st.H, 0, seg, st.final_check > 0, M)
        manifest = round(m0 + s * (_manifest_bytes(B, st.H, 1, seg, st.final_check > 0, M) - m0))
    else:
        manifest = _manifest_bytes(B, st.H, st.s, seg, st.final_check > 0, M)
    comp = CompressionConfig(bits=st.bits, group_size=st.group_size, rank_initial=st.rank, rank_min=st.rank, rank_max=st.rank)
    payload = WRAP_BYTES + payload_size(shapes, st.rank, comp)
    answer = manifest + s * per_challenge + st.final_check * per_final + start
    sent = payload + answer
    received = (st.K - 1) * payload
    # the same answer with a carried buffer: its start file, a challenge over the merge step ships the
    # block's start parameters, and the final check its start parameters and buffer (its manifest is the
    # same size: start_cid is a CID either way)
    with_buffer = (answer - start + buffer_start + s * (per_draw(buffered) - per_draw(challenge))
                   + st.final_check * (sum(final_buffered) - sum(final)) / B)
    allreduce = ring_allreduce_bytes(w * P, st.K) * st.H
    state = 3 * w * P  # parameters and the two AdamW moments
    rule = CheckpointRule.of(max(CHECKPOINT_EVERY, seg), CHECKPOINT_EVERY_LOGGED)

    def checkpoints_at(c: int) -> int:
        return (st.H // c + 1 + int(st.H % c > 0)) * 4 * w * P  # d_0, every c-th, d_H: params, moments, ef

    def answer_steps_at(c: int) -> float:
        return s * ((c - seg) / 2 + seg)  # per epoch, from the checkpoint at or before each challenge

    checkpoints, unlogged_checkpoints = checkpoints_at(rule.logged), checkpoints_at(rule.every)
    # the gradient log: every step's total gradients (w bytes a parameter); an answer advances the state
    # by AdamW alone (no forward pass, left out here) and runs groups 0..m of each of its r steps
    grad_log = w * P * st.H
    grad_steps = s * seg * (M + 1) / (2 * M)
    drawn_flops = per_draw([flops_per_token(cfg, names) for names in blocks])  # a draw replays its data ends too
    block_share = drawn_flops / flops_per_token(cfg)
    train = flops_per_token(cfg) * st.tokens * st.H
    replay = drawn_flops * (st.tokens / M) * seg * s
    # per step: every block's boundaries (whole batch), M − 1 running sums of every block, and the
    # state (parameters, moments) at every r-th leaf
    hashed = 2 * (B - 1) * st.tokens * cfg.d_model * w + (M - 1) * P * w + 3 * P * w / seg
    windowed: dict[str, Any] = {}
    if st.window_gas:
        W = windows.width_rule(st.H, st.K, st.window_post_gas, st.window_gas)
        n_windows = windows.window_count(st.H + 1, W)
        logged = windows.peak_log_steps(st.H, W, st.seed_lag_steps) * min(log_step, w * P)  # the smaller log
        # one checkpoint at the oldest pending window (parameters and moments, and the error buffer where one
        # is carried), the log since, and the epoch's built answers until the verifiers fetch them
        checkpoint = (3 if params else 4) * w * P
        windowed = {"W": W, "windows_per_epoch": n_windows,
                    "window_gas_per_trainer_per_epoch": round(n_windows * st.window_post_gas / st.K),
                    "answer_memory_windowed_fraction_of_state": round((checkpoint + logged + answer) / state, 3)}
    return {
        "setting": asdict(st),
        **windowed,
        "tokens_per_step": st.tokens,
        "K": st.K,
        "segment": seg,
        "groups": M,
        "group_tokens": st.tokens // M,
        "params": P,
        "blocks": B,
        "block_params_mean": sum(block_p) / B,
        "block_params_max": max(block_p),
        "payload_bytes": payload,
        "manifest_bytes": manifest,
        "audit_bytes_per_challenge": round(per_challenge),
        "final_check_bytes": round(per_final),
        "start_file_bytes": start,
        "ef_in_params": params,
        "audit_answer_bytes_per_epoch": round(answer),
        "boundary_bytes_per_challenge": round(seg * bound_step / (2 * (B - 1)) * per_draw([(b > 0) + (b < B - 1) for b in range(B)])),
        "bytes_sent_per_trainer_per_epoch": round(sent),
        "bytes_received_per_trainer_per_epoch": round(received),
        "allreduce_bytes_per_trainer_per_epoch": allreduce,
        "challenges_per_epoch": round(s, 4),
        "traffic_reduction_vs_allreduce": round(allreduce / (sent + received), 2) if st.K > 1 else None,
        "payload_only_traffic_reduction": round(allreduce / (payload + received), 2) if st.K > 1 else None,
        "verification_share_of_bytes": round(answer / (sent + received), 4),
        "skip10_detection_within_256_steps": round(st.skip10_within_256(), 4),
        "traffic_reduction_per_verifier_fetch": round(allreduce / (payload + st.q * answer + received), 2) if st.K > 1 else None,
        # the same with a carried error buffer (compression.error_feedback = "buffer"): a start file every epoch
        "buffer_start_file_bytes": buffer_start,
        "traffic_reduction_vs_allreduce_buffer": round(allreduce / (payload + with_buffer + received), 2) if st.K > 1 else None,
        "traffic_reduction_per_verifier_fetch_buffer": (round(allreduce / (payload + st.q * with_buffer + received), 2)
                                                        if st.K > 1 else None),
        "boundary_log_bytes_per_epoch": log_step * st.H,
        "training_state_bytes": state,
        "checkpoint_every": rule.logged,
        "checkpoint_every_without_log": rule.every,
        "checkpoint_bytes_per_epoch": checkpoints,
        "answer_memory_fraction_of_state": round((log_step * st.H + checkpoints) / state, 3),
        "answer_memory_without_log_fraction_of_state": round(unlogged_checkpoints / state, 3),
        "answer_flops_fraction": round(answer_steps_at(rule.logged) * block_share / st.H, 5),
        "answer_flops_without_log_fraction": round(answer_steps_at(rule.every) / st.H, 5),
        "gradient_log_bytes_per_epoch": grad_log,
        "answer_memory_gradient_log_fraction_of_state": round((grad_log + checkpoints) / state, 3),
        "answer_flops_gradient_log_fraction": round(grad_steps / st.H, 5),
        # what the trainer keeps by default: boundaries while they are no larger than the gradients
        # (trainer/boundaries.py; it keeps them past that too while a whole epoch's fit its budgets)
        "smaller_log": "boundaries" if log_step <= w * P else "gradients",
        "verifier_replay_flops_fraction": round(st.q * replay / train, 5),
        "hashed_bytes_per_training_flop": hashed / (flops_per_token(cfg) * st.tokens),
        "detect_one_group_forgery_per_epoch": min(1.0, s * seg / (st.H * B * M)),
    }


def validate(workdir: Path) -> dict[str, Any]:
    """Model against measurement for one kept network run (``benchmarks/protocol.py --keep``): every
    audit answer a trainer sent, priced by the same specs for the segments, blocks, final block and
    start file its manifest names, against the bytes the trainer logged (``responded.audit_bytes``:
    its files and manifest), and each file against its size in the run's store."""
    from dilocox.delay import StartRule
    from dilocox.round import RoundSpec
    from protocol.config import from_json
    from protocol.shard_audit import covers_merge, decode_manifest
    from protocol.store.backends import LocalStore

    summary = json.loads((workdir / "bench-summary.json").read_text())
    store = LocalStore(workdir / "devnet" / "store")
    spec = RoundSpec.from_config(from_json(store.get(summary["config_cid"])))
    cfg = spec.model
    shapes, blocks, B = param_shapes(cfg), block_names(cfg), block_count(cfg)
    act = (spec.batch_size, spec.seq_len, cfg.d_model)
    group = (spec.batch_size // spec.microbatches, spec.seq_len, cfg.d_model)
    step_log = log_bytes_per_step(shapes, B, act, 4)
    answers, files, logs = [], [], []
    for log in sorted((workdir / "logs").glob("trainer*.jsonl")):
        for line in log.read_text().splitlines():
            ev = json.loads(line) if line.startswith("{") else {}
            if ev.get("event") == "trained" and ev.get("boundary_log_bytes"):
                logs.append(step_log[ev.get("answer_log", "boundaries")] * ev["steps"] / ev["boundary_log_bytes"])
            if ev.get("event") != "responded":
                continue
            raw = store.get(ev["manifest"])
            m = decode_manifest(raw, B, max_bytes=1 << 26)
            parts = [(c.cid, challenge_spec(shapes, blocks[c.block], c.block, B, c.start, c.end, group,
                                            covers_merge(c.start, c.end, spec.merge_step_in(m.epoch)) and not spec.ef_in_params,
                                            spec.microbatches))
                     for c in m.challenges]
            if m.final.block >= 0:
                parts.append((m.final.cid, transition_spec(shapes, blocks[m.final.block])))
            if m.previous and m.start_cid:  # none with error feedback in the parameters
                parts.append((m.start_cid, start_spec(shapes, spec.rule is StartRule.MERGE)))
            modelled = len(raw) + sum(state_file_size(sp) for _, sp in parts)
            answers.append({"trainer": log.stem, "epoch": m.epoch, "modelled": modelled, "measured": ev["audit_bytes"],
                            "ratio": round(modelled / ev["audit_bytes"], 4)})
            files += [state_file_size(sp) / store.path_of(Cid(cid)).stat().st_size for cid, sp in parts]
    total_m, total_x = sum(a["modelled"] for a in answers), sum(a["measured"] for a in answers)
    return {"workdir": str(workdir), "tokens_per_step": spec.batch_size * spec.seq_len, "d_model": cfg.d_model,
            "settings_key": [spec.seq_len, spec.batch_size // spec.microbatches, spec.segment, spec.rule.value, spec.ef_in_params],
            "compute": _work_done(workdir, spec, store), "answers": answers, "audit_bytes_modelled_over_measured": round(total_m / total_x, 4) if total_x else None,
            "files_checked": len(files), "file_ratio_min": min(files, default=None), "file_ratio_max": max(files, default=None),
            # the answer log's tensor bytes (the model: boundaries, or the gradient log where the trainer kept
            # that) over what the trainer logged (its files' headers included)
            "boundary_log_ratio_min": round(min(logs), 4) if logs else None, "boundary_log_ratio_max": round(max(logs), 4) if logs else None}


def _work_done(workdir: Path, spec: Any, store: Any) -> dict[str, float]:
    """A kept run's compute: each figure's CPU seconds as its nodes logged them, beside the work the
    model prices it by, counted from what the run did (its manifests' challenges, its steps):

    - training: FLOPs of every step (``flops_per_token`` · T);
    - answers: block b's FLOPs on the whole batch from the checkpoint at or before each challenge's
      start through its end (the trainer replays the block on its boundary log, trainer/engine.py);
    - verification: block b's FLOPs on one group (T / M tokens) over each challenge, per verifier
      that judged it; the RPC and store CPU its nodes metered beside it (protocol/cpumeter.py);
    - commitments: the bytes hashed per step (every block's boundaries, the M − 1 running sums, the
      state every r steps), as ``project`` counts them."""
    from protocol.shard_audit import decode_manifest

    cfg = spec.model
    blocks, B = block_names(cfg), block_count(cfg)
    fpt = [flops_per_token(cfg, names) for names in blocks]
    P = sum(math.prod(x) for x in param_shapes(cfg).values())
    T, M, seg = spec.batch_size * spec.seq_len, spec.microbatches, spec.segment
    every = CheckpointRule.of(max(CHECKPOINT_EVERY, seg), CHECKPOINT_EVERY_LOGGED).logged  # the benchmark's trainers, logged
    hashed_step = (2 * (B - 1) * T * cfg.d_model + (M - 1) * P) * 4 + 3 * P * 4 / seg
    out = dict.fromkeys(("train_cpu_s", "train_flops", "answer_cpu_s", "answer_flops", "verifier_cpu_s",
                         "verifier_flops", "verifier_edge_cpu_s", "commit_cpu_s", "hashed_bytes"), 0.0)
    flops: dict[tuple[str, int], float] = {}  # (trainer, epoch) -> one verifier's replay FLOPs
    for log in sorted((workdir / "logs").glob("*.jsonl")):
        for line in log.read_text().splitlines():
            ev = json.loads(line) if line.startswith("{") else {}
            if ev.get("event") == "trained":
                out["train_cpu_s"] += ev["compute_s"]
                out["train_flops"] += flops_per_token(cfg) * T * ev["steps"]
                out["commit_cpu_s"] += ev["digest_s"]
                out["hashed_bytes"] += hashed_step * ev["steps"]
            elif ev.get("event") == "responded":
                m = decode_manifest(store.get(ev["manifest"]), B, max_bytes=1 << 26)
                out["answer_cpu_s"] += ev["answer_cpu_s"]
                out["answer_flops"] += sum(fpt[c.block] * T * (c.end - c.start // every * every) for c in m.challenges)
                flops[(m.trainer.lower(), m.epoch)] = sum(fpt[c.block] * T / M * (c.end - c.start) for c in m.challenges)
            elif ev.get("event") == "verified":
                out["verifier_cpu_s"] += ev["cpu_s"]
                out["verifier_edge_cpu_s"] += ev.get("rpc_cpu_s", 0.0) + ev.get("store_cpu_s", 0.0)
                out["verifier_flops"] += flops.get((ev["trainer"].lower(), ev["epoch"]), 0.0)
    return {k: round(v, 4) for k, v in out.items()}


# (figure, its CPU seconds, the work that prices it): compute_check fits seconds = a + b · work
COMPUTE_FIGURES = (("training", "train_cpu_s", "train_flops"), ("audit answers", "answer_cpu_s", "answer_flops"),
                   ("verification", "verifier_cpu_s", "verifier_flops"), ("commitments", "commit_cpu_s", "hashed_bytes"))


def compute_check(validation: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The compute model against measurement across batch sizes: for each figure, a fixed cost plus a
    cost per unit of its work (FLOPs, or bytes hashed) is fitted on the two smallest batches of the
    kept runs that share everything else, and predicts the largest batch's seconds. A figure whose
    work the model prices wrongly (the boundary log's replay, say, or a term that grows with T that
    it does not count) misses there; so does one whose fixed cost is not fixed."""
    runs = sorted((v for v in validation if v.get("compute") and v["compute"]["verifier_flops"]),
                  key=lambda v: v["tokens_per_step"])
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for v in runs:
        # one invocation's runs (benchmarks/protocol.py --keep puts them side by side), alike but for the batch
        groups.setdefault((str(Path(v["workdir"]).parent), v["d_model"], *v["settings_key"]), []).append(v)
    out = []
    for same in groups.values():
        if len({v["tokens_per_step"] for v in same}) < 3:
            continue
        a, c = same[0], same[-1]
        b = next(v for v in same if v["tokens_per_step"] > a["tokens_per_step"])
        for figure, cpu, work in COMPUTE_FIGURES:
            dw = b["compute"][work] - a["compute"][work]
            # work that did not change with the batch (a verification's groups) leaves only the fixed cost
            slope = (b["compute"][cpu] - a["compute"][cpu]) / dw if dw else 0.0
            fixed = a["compute"][cpu] - slope * a["compute"][work] if dw else (a["compute"][cpu] + b["compute"][cpu]) / 2
            predicted = fixed + slope * c["compute"][work]
            out.append({"figure": figure, "fitted_at_tokens": [a["tokens_per_step"], b["tokens_per_step"]],
                        "predicted_at_tokens": c["tokens_per_step"], "fixed_s": round(fixed, 4),
                        "s_per_unit": slope, "predicted_s": round(predicted, 4), "measured_s": c["compute"][cpu],
                        "ratio": round(predicted / c["compute"][cpu], 4)})
    return out


HALF_M = 1 << 19  # 524,288 tokens per step: "the batches people train with" (issue 31)


def grid() -> list[Setting]:
    """Today's network benchmark, `small` at its context and 8x that batch, examples/small.toml's batch
    (its groups of 2,048 tokens), then 0.5M tokens per step for
    every model at H = 256 (and 500, the DiLoCoX paper's) and K = 4 and 64; the 107B in bf16."""
    rows: list[Setting] = [
        Setting("small", 8, 64, 256, 2),  # the network benchmark's setting (benchmarks/protocol.py)
        Setting("small", 8, 128, 256, 4),  # its own context (the K = 4 network run, r = 4)
        Setting("small", 64, 128, 256, 4, group_tokens=2048),  # 8x that batch in groups of 16 rows
        Setting("small", 128, 64, 256, 4, group_tokens=2048),  # examples/small.toml: 128 rows of 64, groups of 32
        Setting("small", 128, 64, 64, 4, group_tokens=2048),  # the same at the 8x network run's H
        Setting("small", 128, 64, 8, 4, group_tokens=2048),  # and at its own H = 8: every epoch carries its audits
        Setting("gpt2-124m", 8, 1024, 64, 4),
    ]
    for model in ("gpt2-124m", "llama-1b", "llama-7b", "qwen-107b"):
        seq = min(SHAPES[model].seq_len, 4096)
        for H in (256, 500):
            for K in (4, 64):
                rows.append(Setting(model, HALF_M // seq, seq, H, K, element_bytes=2 if model == "qwen-107b" else 4))
    return rows


# examples/small.toml's per-step policy (issue 47): each step challenged with probability 0.0165, at most 8 an
# epoch, the final check in one epoch of 8
SHIPPED_RATE = {"rate": 0.0165, "s": 8, "final_check": 0.125}
RATE_HS = (4, 8, 16, 32, 64, 256)
# where a row's loss was measured: the engine benchmark at examples/small.toml's batch (128 rows of 64)
LOSS_MEASURED = {("small", 8192, 8): "measured: +1.22% of AllReduce (selection), +1.54% (held out); docs/results-engine.md"}


def rate_grid() -> list[Setting]:
    """The per-step policy as examples/small.toml ships it, at H = 4 to 256: `small` at its 8,192 tokens
    (groups of 2,048) and every larger model at 0.5M tokens, K = 4; the 107B in bf16."""
    rows = [Setting("small", 128, 64, H, 4, group_tokens=2048, **SHIPPED_RATE) for H in RATE_HS]  # type: ignore[arg-type]
    for model in ("gpt2-124m", "llama-1b", "llama-7b", "qwen-107b"):
        seq = min(SHAPES[model].seq_len, 4096)
        rows += [Setting(model, HALF_M // seq, seq, H, 4, element_bytes=2 if model == "qwen-107b" else 4, **SHIPPED_RATE)  # type: ignore[arg-type]
                 for H in RATE_HS]
    return rows


# issue 48's rows: the shipped per-step policy with windows. Gas allowances per trainer and epoch: the issue's
# targets at K = 64 and 1,024; at K = 4 (a devnet or a rollup, four payers) 150k. Seed lag: assumed one step
# for the large models (a step takes minutes, a post and two confirmations seconds), four for `small` on a CPU.
WINDOW_GAS = Path(__file__).resolve().parent / "results" / "window-gas.json"  # benchmarks/window_gas.py


def measured_post_gas(K: int) -> int | None:
    """The relay's post measured for the nearest bitmap size at or above K (None before window_gas.py ran)."""
    if not WINDOW_GAS.exists():
        return None
    relay = {int(k): max(v) for k, v in json.loads(WINDOW_GAS.read_text())["relay"].items()}
    fits = [k for k in relay if k >= K]
    return relay[min(fits)] if fits else None


WINDOW_ROWS = [("small", 8, 128, 4, 150_000, 4), ("llama-1b", 0, 0, 64, 10_000, 1), ("llama-1b", 0, 0, 1024, 2_500, 1),
               ("qwen-107b", 0, 0, 64, 10_000, 1), ("qwen-107b", 0, 0, 1024, 2_500, 1)]


def window_grid() -> list[Setting]:
    rows = []
    for model, n_rows, seq, K, gas, lag in WINDOW_ROWS:
        seq = seq or min(SHAPES[model].seq_len, 4096)
        for H in ((256,) if model == "small" else (256, 500)):
            post = measured_post_gas(K) or Setting.window_post_gas
            rows.append(Setting(model, n_rows or HALF_M // seq, seq, H, K, element_bytes=2 if model == "qwen-107b" else 4,
                                window_gas=gas, window_post_gas=post, seed_lag_steps=lag, **SHIPPED_RATE))  # type: ignore[arg-type]
    return rows


def _gb(x: float) -> str:
    return "none" if x == 0 else f"{x / 1e9:,.2f} GB" if x >= 1e8 else f"{x / 1e6:,.1f} MB"


def _table(intro: Sequence[str], columns: Sequence[str], rows: Iterable[str]) -> list[str]:
    """A paragraph, then a Markdown table: the first column left-aligned, the rest right-aligned."""
    return ["", *intro, "", "| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1), *rows]


def render(doc: dict[str, Any]) -> str:
    lines = [
        "# Verification cost by batch size: today's shard audits, projected from the code's shapes",
        "",
        "Generated by `benchmarks/projection.py` (do not edit by hand; rerun the command). Every byte figure",
        "is the size of the file the code would write for that model, batch and policy (no training, no",
        "hardware assumption); the replay figure is a FLOP ratio. See the script's docstring for the terms.",
        "",
        "```",
        doc["command"],
        "```",
        "",
        "| model | params | tokens / step | H | K | groups M (tokens) | r | boundary log / epoch | answer memory / state: with the log (without) | answer FLOPs / training: with the log (without) | gradient log / epoch: memory / state, answer FLOPs / training | per challenge (boundaries) | start file (with a carried buffer) | answer / epoch | vs AllReduce, each byte once (with a carried buffer) | per verifier fetch (with a carried buffer) | replay FLOPs / training | hashed bytes / training FLOP | one-group forgery caught / epoch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        st = r["setting"]
        seg = r["segment"]
        lines.append(
            f"| {st['model']}{' (bf16)' if st['element_bytes'] == 2 else ''} | {r['params'] / 1e6:,.1f}M | {r['tokens_per_step']:,} "
            f"| {st['H']} | {st['K']} | {r['groups']} ({r['group_tokens']:,}) | {seg} "
            f"| {_gb(r['boundary_log_bytes_per_epoch'])} | {r['answer_memory_fraction_of_state']:,.1f} ({r['answer_memory_without_log_fraction_of_state']:,.1f}) "
            f"| {r['answer_flops_fraction']:.4f} ({r['answer_flops_without_log_fraction']:.3f}) "
            f"| {_gb(r['gradient_log_bytes_per_epoch'])}{' (smaller)' if r['smaller_log'] == 'gradients' else ''}: "
            f"{r['answer_memory_gradient_log_fraction_of_state']:,.1f}, {r['answer_flops_gradient_log_fraction']:.4f} "
            f"| {_gb(r['audit_bytes_per_challenge'])} ({_gb(r['boundary_bytes_per_challenge'])}) "
            f"| {_gb(r['start_file_bytes'])} ({_gb(r['buffer_start_file_bytes'])}) "
            f"| {_gb(r['audit_answer_bytes_per_epoch'])} | {r['traffic_reduction_vs_allreduce']:,.1f}x ({r['traffic_reduction_vs_allreduce_buffer']:,.1f}x) "
            f"| {r['traffic_reduction_per_verifier_fetch']:,.1f}x ({r['traffic_reduction_per_verifier_fetch_buffer']:,.1f}x) "
            f"| {r['verifier_replay_flops_fraction']:.4f} "
            f"| {r['hashed_bytes_per_training_flop']:.2e} | {r['detect_one_group_forgery_per_epoch']:.1e} |")
    st0 = doc["rows"][0]["setting"]
    lines += ["", (f"Policy in every row: s = {st0['s']} challenges, each of r steps (a segment spans about "
              f"{SEGMENT_TOKENS:,} tokens: r = {SEGMENT_MAX} at 1,024 tokens per step, 1 past {SEGMENT_TOKENS:,}), one group of up to "
              f"{st0['group_tokens']:,} tokens opened per step (the `small` rows past 4,096 tokens: 2,048, as "
              f"examples/small.toml ships), quorum {st0['q']}, the final check drawn every epoch, "
              "the merge rule with error feedback in the parameters (no start file; in brackets the same with a "
              "carried error buffer, whose continued start ships every parameter and buffer), rank 128 at 4 bits "
              "(examples/small.toml). Hashed bytes per training FLOP: every "
              "block's boundaries, M − 1 running gradient sums and the state every r steps; the fraction of a step "
              "is that times the FLOP rate over the hash rate, which is the hardware's. Answer memory: checkpoints every "
              f"max({CHECKPOINT_EVERY_LOGGED}, r) steps (the whole state with its error buffer) plus the boundary log, over parameters "
              f"and moments; without the log, checkpoints every max({CHECKPOINT_EVERY}, r) steps and a challenge replays whole "
              "steps from its checkpoint. Where the boundaries of a "
              "step outgrow its total gradients (w bytes a parameter), a trainer whose budgets cannot hold the epoch's "
              "boundaries keeps those instead (marked smaller where they are: trainer/boundaries.py), batch-free: an answer advances every block "
              "by AdamW alone from the checkpoint and runs groups 0..m of each challenged step through the whole model, "
              "(M + 1) / 2M of a step per step on average. Its memory counts the checkpoints too, which then only "
              "serve a restart: `--checkpoint-every-logged` at H leaves about H/3 + 3 states.")]
    if doc.get("rate_rows"):
        pol = doc["rate_rows"][0]["setting"]
        lines += _table(
            [(f"Audits priced per step of work (issue 47): each step challenged on its own with probability {pol['rate']} "
              f"(at most {pol['s']} an epoch), the final check drawn with probability {pol['final_check']}, everything else "
              "as above; K = 4, every byte each trainer sends and receives counted once. Payload only: the same run "
              "without a verification byte. Loss: where the engine benchmark measured this model, batch and H.")],
            ["model", "tokens / step", "H", "challenges / epoch", "payload only vs AllReduce", "all bytes vs AllReduce",
             "per verifier fetch", "verification share of bytes", "answer FLOPs / training", "replay FLOPs / training",
             "10% skipped caught within 256 steps", "loss"],
            [f"| {r['setting']['model']}{' (bf16)' if r['setting']['element_bytes'] == 2 else ''} | {r['tokens_per_step']:,} "
             f"| {r['setting']['H']} | {r['challenges_per_epoch']:.3f} | {r['payload_only_traffic_reduction']:,.1f}x "
             f"| {r['traffic_reduction_vs_allreduce']:,.1f}x | {r['traffic_reduction_per_verifier_fetch']:,.1f}x "
             f"| {r['verification_share_of_bytes']:.1%} | {r['answer_flops_fraction']:.4f} | {r['verifier_replay_flops_fraction']:.4f} "
             f"| {r['skip10_detection_within_256_steps']:.1%} "
             f"| {LOSS_MEASURED.get((r['setting']['model'], r['tokens_per_step'], r['setting']['H']), 'not measured')} |"
             for r in doc["rate_rows"]])
    if doc.get("window_rows"):
        lines += _table(
            [("Windowed challenges (issue 48, `protocol/windows.py`; the trainer's retention is not wired in yet, "
              "so this is the rule's arithmetic): the shipped per-step policy drawn per window of W steps, W the "
              "narrowest window whose aggregated posts fit the gas allowance per trainer and epoch (one post's gas "
              "measured for a bitmap of K positions, `benchmarks/results/window-gas.json`, where that file exists; "
              f"else assumed at {Setting.window_post_gas:,}). Answer memory: one checkpoint at the oldest pending window, the smaller "
              "log over that window and the steps trained until its seed is safe (the seed lag, assumed), and the "
              "epoch's built answers until fetched; today's: checkpoints and the gradient log over the epoch.")],
            ["model", "tokens / step", "H", "K", "gas allowance", "post gas", "seed lag (steps)", "W", "window gas / trainer / epoch",
             "answer memory / state, windowed", "today (gradient log)"],
            [f"| {r['setting']['model']}{' (bf16)' if r['setting']['element_bytes'] == 2 else ''} | {r['tokens_per_step']:,} "
             f"| {r['setting']['H']} | {r['K']} | {r['setting']['window_gas']:,} | {r['setting']['window_post_gas']:,} "
             f"| {r['setting']['seed_lag_steps']} | {r['W']} "
             f"| {r['window_gas_per_trainer_per_epoch']:,} | {r['answer_memory_windowed_fraction_of_state']:,.1f} "
             f"| {r['answer_memory_gradient_log_fraction_of_state']:,.1f} |" for r in doc["window_rows"]])
    if doc.get("validation"):
        lines += _table(
            ["Validation against measured network runs (`benchmarks/protocol.py --keep`): every audit answer the",
             "trainers sent, priced by the model for the segments, blocks and files its manifest names, over the bytes",
             "the trainer logged; every file over its size in the run's store; the answer log (boundaries or gradients) over what was logged."],
            ["run", "tokens / step", "r", "answers", "answer bytes, model / measured", "files (model / store)",
             "answer log, model / measured (above 1: steps a full log left unlogged)"],
            [f"| `{Path(v['workdir']).parent.name}/{Path(v['workdir']).name}` | {v['tokens_per_step']:,} "
             f"| {v['settings_key'][2]} | {len(v['answers'])} "
             f"| {v['audit_bytes_modelled_over_measured']:.4f} | {v['files_checked']}: {v['file_ratio_min']:.4f} to {v['file_ratio_max']:.4f} "
             f"| {v['boundary_log_ratio_min']} to {v['boundary_log_ratio_max']} |" for v in doc["validation"]])
    if doc.get("compute_validation"):
        lines += _table(
            ["Compute against measurement across batch sizes (`compute_check`): each figure's CPU seconds over the",
             "whole run, fitted as a fixed cost plus a cost per unit of the work the model prices it by on the two",
             "smallest batches, predicting the largest (CPU seconds as the nodes log them, on a shared 2-core machine)."],
            ["figure", "fitted at tokens / step", "predicted at", "fixed", "per unit of work", "predicted", "measured",
             "predicted / measured"],
            [f"| {c['figure']} | {c['fitted_at_tokens'][0]:,} and {c['fitted_at_tokens'][1]:,} | {c['predicted_at_tokens']:,} "
             f"| {c['fixed_s']:.3f} s | {c['s_per_unit']:.3g} s | {c['predicted_s']:.3f} s | {c['measured_s']:.3f} s | {c['ratio']:.3f} |"
             for c in doc["compute_validation"]])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, help="results JSON to write")
    ap.add_argument("--md", type=Path, help="write the Markdown table here too")
    ap.add_argument("--render", type=Path, metavar="JSON", help="print (and with --md write) the Markdown of a results file")
    ap.add_argument("--validate", type=Path, nargs="+", default=[], metavar="DIR",
                    help="kept network runs (benchmarks/protocol.py --keep DIR): model / measured for their audit answers")
    ap.add_argument("--validated", type=Path, metavar="JSON",
                    help="keep the validation entries of this earlier results file (runs whose folders are gone) "
                         "before those of --validate")
    a = ap.parse_args(argv)
    if a.render is not None:
        doc = json.loads(a.render.read_text())
    else:
        if a.out is None:
            ap.error("--out is required (or --render)")
        rows: list[dict[str, Any]] = []
        for st in grid():
            print(f"projecting {st.model} at {st.tokens:,} tokens, H {st.H}, K {st.K}", file=sys.stderr)
            rows.append(project(st))
        rate_rows = []
        for st in rate_grid():
            print(f"projecting {st.model} at {st.tokens:,} tokens, H {st.H}, K {st.K}, rate {st.rate}", file=sys.stderr)
            rate_rows.append(project(st))
        window_rows = []
        for st in window_grid():
            print(f"projecting {st.model} at {st.tokens:,} tokens, H {st.H}, K {st.K}, windows at {st.window_gas:,} gas",
                  file=sys.stderr)
            window_rows.append(project(st))
        validation = json.loads(a.validated.read_text())["validation"] if a.validated else []
        validation += [validate(d) for d in a.validate]
        doc = {"benchmark": "projection", "command": " ".join(["benchmarks/projection.py", *(argv if argv is not None else sys.argv[1:])]),
               "python": platform.python_version(), "torch": torch.__version__, "rows": rows, "rate_rows": rate_rows,
               "window_rows": window_rows,
               "validation": validation, "compute_validation": compute_check(validation)}
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    md = render(doc)
    if a.md is not None:
        a.md.write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
