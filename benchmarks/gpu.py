"""The GPU path, measured: tokens/s and MFU of a sharded trainer with the protocol on, and replay.

One short script for the device machine (it also runs on a CPU, at a toy size, as a test):

    python -m benchmarks.gpu --device cuda --preset gpt2-124m --rows 8 --seq 1024 \\
        --out benchmarks/results/gpu.json

For each precision (fp32, then bf16 autocast), on the trainer's own code path (``LocalEngine``):

- **Throughput.** Wall seconds per step (the device synchronised) of three things on the same
  batches: the plain whole-model step (``train_step``: what an unverified trainer runs), the
  block-wise step alone, and the engine's step with the protocol on (block-wise step, step leaf
  hashed on the CPU, checkpoints every ``segment`` steps; no boundary log: at GPU batch sizes it
  would hold gigabytes per step). Tokens/s and MFU against the GPU's dense bf16 peak for both
  precisions (so fp32 MFU reads low by design); FLOPs per token are ``6 N + 12 L T d`` (weights
  plus attention scores, the PaLM appendix's count).
- **Replay.** The same steps run twice from one state give the same state digest (exact mode on
  this device); one middle block replayed alone from the trainer's boundaries gives its bits (what
  a verifier on the same GPU model does); and one step on the CPU from the same state, against the
  device's: the largest relative parameter difference, next to the CPU-calibrated tolerant bound
  (``verifier.calibrate.CALIBRATED_TOLERANCE``). That last number says whether a CPU verifier could
  check a GPU trainer in tolerant mode.

- **Commitment hashing.** BLAKE3 of one boundary-sized tensor computed on the device
  (``protocol.devicehash``: only the digest leaves it) against copying it to the host and hashing
  it there with the library, as a CPU node does; both digests must agree. At GPU batches every step
  commits every block's boundaries (docs/audit-scaling.md §2c), so this rate sets whether
  commitments keep up with the step.

The JSON records the device's torch, CUDA and cuDNN builds next to the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dilocox.blockstep import blockwise_step, replay_block
from dilocox.compress import CompressionConfig
from dilocox.delay import StartRule
from dilocox.device import device_class, resolve_device
from dilocox.inner import (
    MOM1,
    MOM2,
    PARAM,
    InnerConfig,
    configure_determinism,
    init_state,
    train_step,
)
from dilocox.round import RoundSpec
from protocol.data import batch, default_corpus
from protocol.devicehash import blake3_tensor
from protocol.digest import state_digest, tensor_bytes
from protocol.leaf import block_names
from protocol.model import GPTConfig, init_params, n_params, preset
from trainer.checkpoints import EpochDir
from trainer.engine import LocalEngine, restrict
from verifier.calibrate import CALIBRATED_TOLERANCE
from verifier.replay import max_rel_error

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, by a substring of the name torch
# reports; the SXM parts (H100 PCIe is lower: 756 TFLOP/s, so it is matched first).
PEAK_BF16 = [("H100 PCIe", 756e12), ("H200", 989.4e12), ("H100", 989.4e12), ("A100", 312e12), ("L40S", 362e12)]


def peak_bf16(dev: torch.device) -> float | None:
    if dev.type != "cuda":
        return None
    name = torch.cuda.get_device_name(dev)
    return next((p for key, p in PEAK_BF16 if key in name), None)


def flops_per_token(cfg: GPTConfig, seq: int) -> int:
    return 6 * n_params(cfg) + 12 * cfg.n_layer * seq * cfg.d_model


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def step_times(dev: torch.device, run: Callable[[int], object], n: int) -> list[float]:
    """Wall seconds of ``run(0) .. run(n-1)``, the device synchronised around each; the first (the
    warm-up: kernel selection, the allocator) dropped."""
    out = []
    for k in range(n):
        sync(dev)
        t = time.perf_counter()
        run(k)
        sync(dev)
        out.append(time.perf_counter() - t)
    return out[1:]


def build(name: str, precision: str) -> GPTConfig:
    return dataclasses.replace(preset(name), precision=precision)


def throughput(cfg: GPTConfig, dev: torch.device, rows: int, seq: int, steps: int, segment: int,
               corpus: Any) -> dict[str, Any]:
    spec = RoundSpec(cfg, InnerConfig(lr=3e-4, warmup_steps=2, total_steps=1000), CompressionConfig(),
                     StartRule.DELAYED, run_seed=1, batch_size=rows, seq_len=seq, shard=True, segment=segment)
    batches = [batch(corpus, 1, 0, 0, k, rows, seq) for k in range(steps + 1)]
    on_dev = [(x.to(dev), y.to(dev)) for x, y in batches]
    inner = spec.inner
    out: dict[str, Any] = {}

    state = init_state(cfg, 0, device=str(dev))  # the same state each time: steps are pure
    plain = step_times(dev, lambda k: train_step(state, on_dev[k], cfg, inner), steps + 1)
    block = step_times(dev, lambda k: blockwise_step(state, on_dev[k], cfg, inner, 1), steps + 1)
    state.clear()
    eng = LocalEngine(spec, segment, keep_boundaries=False, device=dev)
    with tempfile.TemporaryDirectory() as tmp:
        d = EpochDir(Path(tmp), 0)
        eng.begin(d, steps + 1, init_params(cfg, 0), None)
        proto = step_times(dev, lambda k: eng.step(d, k, batches[k]), steps + 1)
        t0 = time.perf_counter()
        payload, _ = eng.finish(d, 8, 0)
        finish_s = time.perf_counter() - t0
        eng.close()
    tokens, fpt, peak = rows * seq, flops_per_token(cfg, seq), peak_bf16(dev)
    for label, times in (("plain_step", plain), ("blockwise_step", block), ("protocol_step", proto)):
        s = statistics.median(times)
        out[label] = {"s_per_step": round(s, 5), "tokens_per_s": round(tokens / s, 1),
                      "mfu_vs_bf16_peak": None if peak is None else round(fpt * tokens / s / peak, 4)}
    out["protocol_overhead_vs_plain"] = round(out["protocol_step"]["s_per_step"] / out["plain_step"]["s_per_step"] - 1, 4)
    out["finish_s"], out["payload_bytes"] = round(finish_s, 3), len(payload)
    return out


def replay(cfg: GPTConfig, dev: torch.device, rows: int, seq: int, corpus: Any) -> dict[str, Any]:
    inner = InnerConfig(lr=3e-4, warmup_steps=2, total_steps=1000)
    xs = [batch(corpus, 1, 0, 0, k, rows, seq) for k in range(3)]

    def run(device: torch.device, n: int) -> dict[str, torch.Tensor]:
        s = init_state(cfg, 0, device=str(device))
        for x, y in xs[:n]:
            s, _, _ = blockwise_step(s, (x.to(device), y.to(device)), cfg, inner, 1)
        return s

    a, b = run(dev, 3), run(dev, 3)
    twice = state_digest(a) == state_digest(b)
    before = run(dev, 2)
    x, y = xs[2]
    after, _, ios = blockwise_step(before, (x.to(dev), y.to(dev)), cfg, inner, 1)
    groups = block_names(cfg)
    bi = len(groups) // 2
    names = groups[bi]
    got, _ = replay_block(restrict(before, names, (PARAM, MOM1, MOM2)), bi, (x.to(dev), y.to(dev)), cfg, inner, 1, ios[bi - 1].act, ios[bi + 1].grad_in,
                          [io.sq for io in ios])
    block_ok = all(torch.equal(got[p + n], after[p + n]) for p in (PARAM, MOM1, MOM2) for n in names)
    cpu_before = {k: v.cpu() for k, v in before.items()}
    cpu_after, _, _ = blockwise_step(cpu_before, (x, y), cfg, inner, 1)
    params = {k: v.cpu() for k, v in after.items() if k.startswith(PARAM)}
    vs_cpu = max_rel_error(params, {k: v for k, v in cpu_after.items() if k.startswith(PARAM)})
    return {"same_steps_twice_bitwise": twice, "block_replay_bitwise": block_ok, "replayed_block": bi,
            "one_step_max_rel_error_vs_cpu": vs_cpu, "cpu_calibrated_tolerance": CALIBRATED_TOLERANCE,
            "cpu_verifier_tolerant_ok": vs_cpu <= CALIBRATED_TOLERANCE}


def hashing(dev: torch.device, mb: float, repeats: int = 3) -> dict[str, Any]:
    """GB/s of BLAKE3 over one ``mb``-MB tensor on ``dev``: on the device, and copied to the host
    then hashed by the library; the median of ``repeats`` after one warm-up, and whether they agree."""
    from blake3 import blake3

    x = torch.randn(max(1, int(mb * 2**20) // 4), device=dev)
    nbytes = x.numel() * 4

    def on_device(_: int = 0) -> bytes:
        return blake3_tensor(x)

    def on_host(_: int = 0) -> bytes:
        return bytes(blake3(tensor_bytes(x)).digest())

    out: dict[str, Any] = {"bytes": nbytes}
    digests = {}
    for label, fn in (("device", on_device), ("host_copy_and_library", on_host)):
        digests[label] = fn()  # warm-up
        times = step_times(dev, fn, repeats)
        out[f"{label}_gb_per_s"] = float(f"{nbytes / statistics.median(times) / 1e9:.4g}")
    out["digests_agree"] = digests["device"] == digests["host_copy_and_library"]
    return out


def environment(dev: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {"device": str(dev), "device_class": device_class(dev), "torch": torch.__version__,
                           "python": platform.python_version(), "machine": platform.machine()}
    if dev.type == "cuda":
        env.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                   capability=".".join(map(str, torch.cuda.get_device_capability(dev))),
                   memory_gib=round(torch.cuda.get_device_properties(dev).total_memory / 2**30, 1),
                   peak_bf16_flops=peak_bf16(dev))
    return env


def markdown(r: dict[str, Any]) -> str:
    e = r["environment"]
    head = (f"{r['preset']} ({r['params'] / 1e6:.1f}M params), {r['rows']} x {r['seq']} tokens per step, "
            f"on {e['device_class']} (torch {e['torch']}" + (f", CUDA {e['cuda']}" if "cuda" in e else "") + ")")
    lines = [head, "", "| precision | step | s / step | tokens / s | MFU (bf16 peak) |", "|---|---|---:|---:|---:|"]
    for prec, m in r["precisions"].items():
        for label in ("plain_step", "blockwise_step", "protocol_step"):
            x = m["throughput"][label]
            mfu = "n/a" if x["mfu_vs_bf16_peak"] is None else f"{100 * x['mfu_vs_bf16_peak']:.1f}%"
            lines.append(f"| {prec} | {label} | {x['s_per_step']:.4f} | {x['tokens_per_s']:,.0f} | {mfu} |")
    if "hashing" in r:
        h = r["hashing"]
        lines += ["", (f"BLAKE3 of {h['bytes'] / 2**20:,.1f} MiB: {h['device_gb_per_s']} GB/s on the device, "
                       f"{h['host_copy_and_library_gb_per_s']} GB/s copied to the host and hashed there; "
                       f"digests agree: {h['digests_agree']}")]
    lines += ["", "| precision | same steps twice bitwise | one block replayed bitwise | one step vs CPU (max rel.) |",
              "|---|---|---|---:|"]
    for prec, m in r["precisions"].items():
        p = m["replay"]
        lines.append(f"| {prec} | {p['same_steps_twice_bitwise']} | {p['block_replay_bitwise']} | "
                     f"{p['one_step_max_rel_error_vs_cpu']:.2e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="gpt2-124m")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per measurement (after one warm-up)")
    ap.add_argument("--segment", type=int, default=8, help="steps per checkpoint and state leaf")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--hash-mb", type=float, default=256.0, help="size of the tensor the hashing figure hashes")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    configure_determinism(1, a.device)  # first: the cuBLAS workspace setting must precede CUDA's start
    dev = resolve_device(a.device)
    corpus = default_corpus(max(200_000, 2 * a.rows * a.seq * (a.steps + 2)))
    t0 = time.perf_counter()
    result: dict[str, Any] = {"preset": a.preset, "params": n_params(preset(a.preset)), "rows": a.rows, "seq": a.seq,
                              "steps": a.steps, "segment": a.segment, "environment": environment(dev),
                              "flops_per_token": flops_per_token(preset(a.preset), a.seq), "precisions": {}}
    for prec in a.precisions.split(","):
        cfg = build(a.preset, prec)
        result["precisions"][prec] = {"throughput": throughput(cfg, dev, a.rows, a.seq, a.steps, a.segment, corpus),
                                      "replay": replay(cfg, dev, a.rows, a.seq, corpus)}
        print(f"{prec}: {json.dumps(result['precisions'][prec])}", file=sys.stderr, flush=True)
    result["hashing"] = hashing(dev, a.hash_mb)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["markdown"] = markdown(result)
    print(result["markdown"])
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
