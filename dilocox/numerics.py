"""The numerics fingerprint: one small replay at the run's shapes whose digest every node must match.

A run's config records the digest of this *canary* under its numerics class
(``protocol.numerics``): blocks 0, 1, 2 and B − 1 of the run's model (the embeddings, an attention
half, an MLP half and the head, at the model's own shapes) each take one group's forward, backward
and AdamW step from a synthetic state and boundaries, exactly as ``replay_block`` runs them in an
audit. Every trainer and verifier computes it before it stakes and ``veriloco doctor`` computes it
for the operator; a node whose digest differs would disagree with its peers' bits, so it refuses,
naming what differs, instead of being slashed or slashing an honest trainer.

The inputs are integer patterns turned to floats exactly (no random generator, whose kernels are
themselves vectorised), so only the arithmetic under test decides the digest.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch

from dilocox.blockstep import replay_block
from dilocox.inner import (
    MOM1,
    MOM2,
    PARAM,
    RNG,
    STEP,
    InnerConfig,
    TrainerError,
    configure_determinism,
)
from protocol.config import RunConfig
from protocol.digest import state_digest
from protocol.leaf import block_count, block_names
from protocol.model import GPTConfig, param_shapes
from protocol.numerics import NumericsError, environment_mismatch

CANARY_ROWS, CANARY_MICRO = 2, 2  # one row per group, two groups: the running sum is exercised too


def _pattern(shape: tuple[int, ...], salt: int, scale: float = 0.04) -> torch.Tensor:
    """A deterministic tensor in [-scale/2, scale/2): integer hashing, then an exact int→float map."""
    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, dtype=torch.int64)
    bits = (i * 2654435761 + salt * 40503) % 65536  # < 2^24: exactly representable in float32
    return ((bits.to(torch.float32) / 65536.0 - 0.5) * scale).reshape(shape)


@contextmanager
def _runtime(threads: int) -> Iterator[None]:
    """``configure_determinism`` at ``threads`` for the canary, then what was there (a creator's
    process computes the fingerprint without having configured itself for a node)."""
    before = (torch.get_num_threads(), torch.backends.mkldnn.enabled, torch.are_deterministic_algorithms_enabled())
    configure_determinism(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        torch.backends.mkldnn.enabled = before[1]  # type: ignore[assignment]
        torch.use_deterministic_algorithms(before[2])


def canary(cfg: GPTConfig, threads: int = 1) -> str:
    """0x-hex digest of the canary replay at ``cfg``'s shapes on ``threads`` torch threads (see the
    module docstring)."""
    with _runtime(threads):
        return _canary(cfg)


def _canary(cfg: GPTConfig) -> str:
    inner = InnerConfig(lr=1e-3, warmup_steps=1, total_steps=10)
    groups, shapes = block_names(cfg), param_shapes(cfg)
    B = block_count(cfg)
    T = min(cfg.seq_len, 64)
    x = (torch.arange(CANARY_ROWS * T, dtype=torch.int64).reshape(CANARY_ROWS, T) * 7 + 3) % cfg.vocab_size
    y = (x * 5 + 1) % cfg.vocab_size
    act = (CANARY_ROWS, T, cfg.d_model)
    sqs = [torch.tensor(1.0)] * B
    out: dict[str, torch.Tensor] = {}
    for b in sorted({0, min(1, B - 1), min(2, B - 1), B - 1}):
        state: dict[str, torch.Tensor] = {STEP: torch.tensor([3], dtype=torch.int64), RNG: torch.tensor([0], dtype=torch.int64)}
        for j, n in enumerate(groups[b]):
            state[PARAM + n] = _pattern(shapes[n], 3 * j + b)
            state[MOM1 + n] = _pattern(shapes[n], 3 * j + b + 1, 1e-3)
            state[MOM2 + n] = _pattern(shapes[n], 3 * j + b + 2, 1e-6).abs()
        inp = _pattern(act, 100 + b, 2.0) if b > 0 else None
        g_out = _pattern(act, 200 + b, 1e-3) if b < B - 1 else None
        new, io = replay_block(state, b, (x, y), cfg, inner, CANARY_MICRO, inp, g_out, sqs)
        out |= {f"{b}/{k}": v for k, v in new.items()}
        for name, t in (("act", io.act), ("grad_in", io.grad_in), ("sq", io.sq)):
            if t is not None:
                out[f"{b}/io/{name}"] = t.detach().reshape(-1) if t.dim() == 0 else t.detach()
    return "0x" + state_digest(out).hex()


def fingerprint(config: RunConfig) -> str:
    """The canary of a run's model: what ``protocol.run.publish_run`` records in its config. Refuses
    in a process that does not compute in the run's class: a fingerprint of the host's own kernels
    would make every pinned node refuse the run."""
    why = environment_mismatch(config.audit.numerics, os.environ, torch.backends.cpu.get_cpu_capability())
    if why is not None:
        raise NumericsError(f"cannot record run's numerics fingerprint: {why} (in a script, call "
                            "protocol.numerics.pin_environment() before torch computes)")
    return canary(config.model_config(), config.audit.threads)


def host() -> dict[str, str]:
    """What decides a CPU's bits besides the code, in words: for a refusal to name what differs."""
    return {"torch": torch.__version__, "machine": platform.machine(), "capability": torch.backends.cpu.get_cpu_capability(),
            "MKL_CBWR": os.environ.get("MKL_CBWR", "(unset)"), "threads": str(torch.get_num_threads())}


def numerics_problem(config: RunConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """Why this process cannot compute ``config``'s exact CPU run (its numerics class, thread count
    and fingerprint), in words; None when it can. Call after ``configure_determinism``."""
    a, cfg = config.audit, config.model_config()
    cls, digest = a.numerics, a.numerics_digest
    why = environment_mismatch(cls, os.environ if environ is None else environ, torch.backends.cpu.get_cpu_capability())
    if why is None and torch.backends.mkldnn.enabled:
        why = "oneDNN is on in this process (configure_determinism turns it off for the CPU class)"
    if why is None and torch.get_num_threads() != a.threads:
        why = (f"this node computes on {torch.get_num_threads()} torch thread(s) and the run on {a.threads} "
               f"(audit.threads: reductions split across threads round differently); start it with --threads {a.threads}")
    if why is not None or not digest:
        return why
    mine = canary(cfg, a.threads)
    if mine != digest:
        h = host()
        return (f"this host's numerics fingerprint {mine[:18]}… differs from the run's {digest[:18]}… under class {cls} "
                f"(torch {h['torch']}, {h['machine']}, {h['capability']} kernels, MKL_CBWR={h['MKL_CBWR']}, "
                f"{h['threads']} thread(s)); its replays would not match its peers' bits: use the torch build the "
                "run was created with, or another host")
    return None


def check_numerics(config: RunConfig, run_id: int) -> None:
    """Refuse (TrainerError) before staking when this process would compute other bits than the run:
    an exact run on the CPU, in another numerics class or with another fingerprint."""
    a = config.audit
    if a.mode != "exact" or a.device != "cpu":
        return  # tolerant runs compare within a bound; GPU runs pin the GPU model (dilocox/device.py)
    why = numerics_problem(config)
    if why is not None:
        raise TrainerError(f"run {run_id} replays bit for bit in numerics class {a.numerics}: {why}")


__all__ = ["canary", "check_numerics", "fingerprint", "host", "numerics_problem"]
