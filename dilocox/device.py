"""Where a node computes, and whether that device may take part in a run's exact replay.

Bitwise replay holds only between runs on the same kind of processor with the same kernels: a CPU
and a GPU, or two GPU models, sum in different orders. So an exact-mode run pins the device class
its trainers and verifiers compute on (``audit.device``: ``"cpu"`` or ``"cuda:<GPU name as torch
reports it>"``), and a node on another class refuses to start instead of training something its
verifiers would reject (or rejecting what an honest trainer sent). Tolerant-mode runs compare within a
relative bound and accept any device; the bound is calibrated on CPUs only so far
(docs/results-verification.md).
"""

from __future__ import annotations

import torch

from dilocox.inner import TrainerError


def resolve_device(name: str) -> torch.device:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"`` as a device this process can use, else a clear error."""
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise TrainerError(f"--device {name!r} is not a device name; use cpu, cuda or cuda:N ({exc})") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise TrainerError(f"--device {name!r}: only cpu and cuda are supported")
    if not torch.cuda.is_available():
        raise TrainerError(
            f"--device {name!r}: this torch build ({torch.__version__}) sees no CUDA GPU; "
            "install a CUDA build of torch on a GPU machine, or use --device cpu"
        )
    index = dev.index or 0  # not current_device(): that would start CUDA before configure_determinism
    if index >= torch.cuda.device_count():
        raise TrainerError(f"--device {name!r}: this machine has {torch.cuda.device_count()} GPU(s)")
    return torch.device("cuda", index)


def device_class(dev: torch.device) -> str:
    """What exact replay needs two nodes to share: ``"cpu"`` or ``"cuda:<GPU model name>"``."""
    if dev.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(dev)}"
    return dev.type


def check_device(dev: torch.device, pinned: str, mode: str, unit: str, run_id: int) -> None:
    """Refuse a device the run's replay cannot match (see the module docstring), and a GPU in a run
    that audits whole states (those replay on the CPU)."""
    have = device_class(dev)
    if mode == "exact" and have != pinned:
        raise TrainerError(
            f"run {run_id} replays bit for bit on {pinned!r} (audit.device), but this node computes on {have!r}; "
            f"run it on {pinned!r} hardware with the matching --device, or join a run pinned to {have!r}"
        )
    if dev.type != "cpu" and unit != "shard":
        raise TrainerError(f"--device {dev}: run {run_id} audits whole states (audit.unit = {unit!r}), "
                           "which are computed and replayed on the CPU; use --device cpu")


__all__ = ["check_device", "device_class", "resolve_device"]
