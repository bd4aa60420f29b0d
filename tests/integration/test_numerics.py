"""Exact replay across hosts (issue 51): the run's CPU numerics class decides the bits, not the host's
kernels. Every `veriloco` process pins it before torch computes, so the same work under two host
capability levels gives the same bits; a process that did not pin it, or computes on another thread
count or fingerprint, is told so before it stakes."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dilocox.inner import configure_determinism
from dilocox.numerics import canary, fingerprint, numerics_problem
from protocol.config import RunConfig
from protocol.model import preset
from protocol.numerics import CPU_CLASS, environment_mismatch, settings

pytestmark = pytest.mark.integration

# what a host's own defaults may be: the bits must not follow them
HOSTS = {"default kernels": {"ATEN_CPU_CAPABILITY": "default"},
         "AVX-512 kernels, MKL's AVX-512 branch": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512"}}
SIMULATE = ["simulate", "--trainers", "2", "--epochs", "2", "--h", "4", "--methods", "dilocox,diloco"]
UNPINNED = "import sys, veriloco.cli as c; c.pin_environment = lambda: None; sys.exit(c.main(sys.argv[1:]))"


def _losses(tmp: Path, name: str, host: dict[str, str], pinned: bool) -> dict[str, tuple[float, float]]:
    """Each method's final and unsent eval loss from `veriloco simulate` run under ``host``'s environment."""
    report = tmp / name
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")} | host
    code = ["-m", "veriloco.cli"] if pinned else ["-c", UNPINNED]
    subprocess.run([sys.executable, *code, *SIMULATE, "--report", str(report)], env=env, check=True,
                   capture_output=True, timeout=300)
    doc = json.loads((report / "demo.json").read_text())
    return {m: (r["final_eval_loss"], r["unsent_eval_loss"]) for m, r in doc.items()}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the numerics class is x86-64's")
def test_the_same_training_under_two_host_capability_levels_gives_the_same_bits(tmp_path: Path) -> None:
    (a, ha), (b, hb) = HOSTS.items()
    pinned = [_losses(tmp_path, f"pinned-{i}", h, True) for i, h in enumerate((ha, hb))]
    assert pinned[0] == pinned[1], f"{a}: {pinned[0]}; {b}: {pinned[1]}"
    # the same code with the pin taken out follows the host: what the pin is for
    unpinned = [_losses(tmp_path, f"unpinned-{i}", h, False) for i, h in enumerate((ha, hb))]
    assert unpinned[0] != unpinned[1], unpinned


def test_the_fingerprint_tells_the_class_apart_from_the_hosts_kernels() -> None:
    """The canary under the class (this process: tests/conftest.py pins it) against the same canary
    with ATen's kernels at the host's other levels, in a fresh process each."""
    cfg = preset("tiny")
    here = canary(cfg)
    assert canary(cfg) == here  # repeatable
    prog = ("import sys; from dilocox.inner import configure_determinism; configure_determinism(1); "
            "from dilocox.numerics import canary; from protocol.model import preset; print(canary(preset('tiny')))")
    seen = set()
    for level in ("default", "avx2", "avx512"):
        env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"} | {"ATEN_CPU_CAPABILITY": level}
        out = subprocess.run([sys.executable, "-c", prog], env=env, check=True, capture_output=True, text=True, timeout=120)
        seen.add(out.stdout.strip())
    assert here not in seen or len(seen) == 1, "the class's fingerprint is one of the unpinned levels'"
    assert len(seen) > 1 or platform.machine() != "x86_64", seen  # the host's levels differ among themselves


def test_a_process_without_the_pin_is_told_what_to_set() -> None:
    want = settings(CPU_CLASS)
    assert environment_mismatch(CPU_CLASS, want, "AVX2") is None
    why = environment_mismatch(CPU_CLASS, {**want, "MKL_CBWR": "AVX512"}, "AVX2")
    assert why is not None and "MKL_CBWR=AVX512 (the class needs COMPATIBLE)" in why and "`veriloco` command" in why
    why = environment_mismatch(CPU_CLASS, want, "DEFAULT")  # a host without AVX2: ATen falls back
    assert why is not None and "lacks AVX2" in why and "tolerant-mode run" in why
    assert "does not know" in (environment_mismatch("arm64-sve", want, "AVX2") or "")


def test_a_node_on_another_fingerprint_or_thread_count_refuses_naming_it() -> None:
    configure_determinism(1)  # as a node does before the check
    cfg = RunConfig().replace(audit={"unit": "shard"})
    cfg = cfg.replace(audit={"numerics_digest": fingerprint(cfg)})
    assert numerics_problem(cfg) is None  # this process: pinned, one thread, oneDNN off (configure_determinism)
    other = cfg.replace(audit={"numerics_digest": "0x" + "ab" * 32})
    why = numerics_problem(other)
    assert why is not None and "0xabababab" in why and "differs from the run's" in why and "AVX2 kernels" in why
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        why = numerics_problem(cfg)
        assert why is not None and f"start it with --threads {cfg.audit.threads}" in why
    finally:
        torch.set_num_threads(threads)
