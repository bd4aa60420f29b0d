"""Device selection: what a node may compute on, and the exact-mode pin that keeps honest nodes apart
from hardware their verifiers cannot match. (The CUDA path itself runs on the device machine:
benchmarks/gpu.py.)"""

from __future__ import annotations

import pytest
import torch

from dilocox.device import check_device, device_class, resolve_device
from dilocox.inner import TrainerError
from protocol.config import ConfigError, RunConfig, to_dict


def test_cpu_resolves_and_is_its_own_class() -> None:
    dev = resolve_device("cpu")
    assert dev == torch.device("cpu") and device_class(dev) == "cpu"


@pytest.mark.parametrize("name,phrase", [("xla", "only cpu and cuda"), ("tpu", "not a device name"), ("gpu!", "not a device name")])
def test_unknown_devices_are_named(name: str, phrase: str) -> None:
    with pytest.raises(TrainerError, match=phrase):
        resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_says_what_to_do() -> None:
    with pytest.raises(TrainerError, match="sees no CUDA GPU.*--device cpu"):
        resolve_device("cuda")


def test_exact_runs_admit_only_their_pinned_class() -> None:
    cpu = torch.device("cpu")
    check_device(cpu, "cpu", "exact", "shard", 1)
    check_device(cpu, "cpu", "exact", "state", 1)
    with pytest.raises(TrainerError, match="replays bit for bit on 'cuda:NVIDIA H200'.*computes on 'cpu'"):
        check_device(cpu, "cuda:NVIDIA H200", "exact", "shard", 1)
    check_device(cpu, "cuda:NVIDIA H200", "tolerant", "shard", 1)  # a relative bound: any device


def test_the_pin_is_a_run_setting_that_keeps_old_digests() -> None:
    base = RunConfig()
    assert "device" not in to_dict(base)["audit"]
    pinned = base.replace(audit={"device": "cuda:NVIDIA H200"})
    assert pinned.digest() != base.digest()
    for bad in ("gpu", "cuda:", "cuda"):
        with pytest.raises(ConfigError, match="audit.device"):
            base.replace(audit={"device": bad})


def test_whole_state_runs_stay_on_the_cpu() -> None:
    other = torch.device("meta")  # any non-CPU device (no GPU needed to check the rule)
    with pytest.raises(TrainerError, match="audits whole states.*use --device cpu"):
        check_device(other, "cpu", "tolerant", "state", 1)
    check_device(other, "cpu", "tolerant", "shard", 1)
