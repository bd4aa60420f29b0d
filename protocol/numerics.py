"""The numerics class an exact-mode CPU run computes in (docs/protocol.md §11): what decides the bits.

Exact audits compare bits, and on a CPU the bits depend on more than the code: ATen picks its
vectorised kernels by the host's instruction set (default, AVX2, AVX-512), oneMKL picks its GEMM
code path by the processor (and, on other vendors' processors, ignores a requested Intel branch),
oneDNN does the same for the layers it serves, and an OpenMP runtime may change its thread count
as it goes. Two honest nodes on an AVX-512 and an AVX2 host then disagree in the last bits, and the
verifier slashes the trainer. So an exact CPU run names one *class* whose settings every node
applies before torch computes anything:

- ``x86-64-v3-cnr``: ATen's AVX2 kernels (``ATEN_CPU_CAPABILITY=avx2``: any x86-64 host with
  AVX2 and FMA, Intel since 2013 and AMD since 2015, computes them, and an AVX-512 host is held to
  them), oneMKL's ``COMPATIBLE`` reproducibility branch (the one its vendor documents as equal on
  Intel and other x86 processors), no dynamic thread counts, and oneDNN off
  (``dilocox.inner.configure_determinism``). Hosts without AVX2 and ARM hosts (other kernels, another
  BLAS) cannot join; a tolerant-mode run accepts them.

This module touches no torch: ``pin_environment`` must run before torch's first kernel (the
``veriloco`` command calls it before it imports a command module), and ``environment_mismatch``
says what a process did not pin.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from protocol.errors import VerilocoError

CPU_CLASS = "x86-64-v3-cnr"
# each class: the environment it sets, and the ATen capability torch must then report
CLASSES: dict[str, tuple[dict[str, str], str]] = {
    CPU_CLASS: ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "MKL_DYNAMIC": "FALSE",
                 "OMP_DYNAMIC": "FALSE"}, "AVX2"),
}


class NumericsError(VerilocoError):
    """A process whose CPU numerics are not the run's class: it would disagree with its peers' bits."""


def pin_environment(cls: str = CPU_CLASS, environ: MutableMapping[str, str] | None = None) -> None:
    """Set ``cls``'s variables in ``environ`` (default: this process's), over whatever the host had:
    the host's own choice is what must not leak into the bits."""
    env = os.environ if environ is None else environ
    env.update(settings(cls))


def settings(cls: str) -> dict[str, str]:
    if cls not in CLASSES:
        raise NumericsError(f"unknown numerics class {cls!r}; this build knows {sorted(CLASSES)}")
    return dict(CLASSES[cls][0])


def environment_mismatch(cls: str, environ: Mapping[str, str], capability: str) -> str | None:
    """What this process does not have of ``cls`` (its environment, and the ATen capability torch
    reports), in words; None when it has all of it."""
    want, level = CLASSES.get(cls, ({}, ""))
    if not want:
        return f"the run pins numerics class {cls!r}, which this build does not know (it knows {sorted(CLASSES)})"
    off = [f"{k}={environ.get(k, '(unset)')} (the class needs {v})" for k, v in want.items() if environ.get(k) != v]
    if off:
        return ("this process was started without the run's numerics pin: " + ", ".join(off)
                + "; start nodes with the `veriloco` command, which sets them before torch loads")
    if capability != level:
        return (f"torch computes with {capability} kernels where class {cls} needs {level}: this CPU lacks AVX2 "
                f"(x86-64-v3) or is not x86-64 (ARM hosts use other kernels); join a tolerant-mode run instead")
    return None


__all__ = ["CLASSES", "CPU_CLASS", "NumericsError", "environment_mismatch", "pin_environment", "settings"]
