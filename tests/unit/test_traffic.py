"""Byte accounting for the demo's summary and benchmarks/protocol.py (veriloco/traffic.py), the
store meter trainers count with, and where the demo's loss plot puts its points."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.digest import keccak
from protocol.store.backends import IntegrityError, LocalStore, Metered, TooLarge
from veriloco.netdemo import _print_summary, eval_steps, loss_curve
from veriloco.traffic import TrainerTraffic, allreduce_bytes, compare, headline, trainer_traffic


def test_the_meter_counts_every_byte_put_and_got(tmp_path: Path) -> None:
    store = Metered(LocalStore(tmp_path / "s"))
    a = store.put(b"x" * 1000)
    b = store.put_stream([b"y" * 300, memoryview(b"z" * 200)])
    assert (store.sent, store.received) == (1500, 0)
    assert store.get(a) == b"x" * 1000
    assert store.get_to_file(b, tmp_path / "out") == 500
    assert (store.sent, store.received) == (1500, 1500)
    assert store.has(a) and store.where == store.inner.where


def test_a_cached_meter_moves_each_object_once_and_still_checks_what_it_answers(tmp_path: Path) -> None:
    shared = LocalStore(tmp_path / "s")
    other = LocalStore(tmp_path / "s").put(b"p" * 600)  # another trainer's payload
    store = Metered(shared, cache_bytes=2000)
    own = store.put_stream([b"o" * 400, b"o" * 100])
    assert store.get(own) == b"o" * 500 and store.received == 0  # its own payload is never fetched back
    assert store.get(other, digest=keccak(b"p" * 600)) == b"p" * 600
    assert store.get(other) == b"p" * 600 and store.received == 600  # read twice (model, schedule), fetched once
    assert store.cache is not None and store.cache.hits == 2
    assert store.get(other, fresh=True) == b"p" * 600 and store.received == 1200  # an availability vote asks the store
    store.received = 600
    with pytest.raises(IntegrityError, match="keccak digest"):
        store.get(other, digest=keccak(b"q"))  # a hit is checked as a fetch would be
    with pytest.raises(TooLarge):
        store.get(other, max_size=599)
    big = store.put(b"b" * 1001)  # over half the budget: passed through, never held
    store.get(big)
    assert store.received == 1601
    for i in range(4):  # least recently used out first, within the budget
        store.put(bytes([i]) * 600)
    store.get(other)
    assert store.received == 2201


def test_traffic_adds_up_processes_and_counts_an_epoch_once() -> None:
    events = [
        {"event": "started"},
        {"event": "trained", "epoch": 0, "steps": 24, "sent_bytes": 0, "received_bytes": 5000},
        {"event": "committed", "epoch": 0, "sent_bytes": 700, "received_bytes": 5000},
        {"event": "responded", "epoch": 0, "sent_bytes": 10_700, "received_bytes": 5000},
        # crashed, restarted: the new process counts from zero, and trains epoch 1 twice over the crash
        {"event": "started"},
        {"event": "trained", "epoch": 1, "steps": 30, "sent_bytes": 0, "received_bytes": 6000},
        {"event": "trained", "epoch": 1, "steps": 30, "sent_bytes": 0, "received_bytes": 6500},
        {"event": "finished", "sent_bytes": 900, "received_bytes": 6500},
    ]
    t = trainer_traffic(events)
    assert t == TrainerTraffic(sent=11_600, received=11_500, steps=54, epochs=2)
    assert t.total == 23_100


def test_allreduce_baseline_is_the_ring_formula_over_the_steps_trained() -> None:
    params = 1000
    assert allreduce_bytes(4, params, 54) == round(2 * 3 / 4 * 4 * params * 54)
    c = compare([TrainerTraffic(100_000, 20_000, 54, 2), TrainerTraffic(140_000, 40_000, 66, 2)], 4, params)
    assert c["bytes_per_trainer"] == 150_000
    assert (c["bytes_sent_per_trainer"], c["bytes_received_per_trainer"]) == (120_000, 30_000)
    assert c["steps_per_trainer"] == 60 and c["epochs_per_trainer"] == 2
    assert c["allreduce_bytes_equivalent"] == 2 * 3 * 4 * params * 60 // 4 == 360_000
    assert c["reduction_vs_allreduce"] == 2.4
    moved, baseline = headline(c)
    assert moved == "150,000 (120,000 sent, 30,000 received)"
    assert baseline == "AllReduce would send 360,000 for the same 60 steps: 2.4x more"
    # more traffic than AllReduce is said as such, not as "0.4x more"
    c = compare([TrainerTraffic(900_000, 0, 60, 2)], 4, params)
    assert headline(c)[1].endswith(": 2.5x less")


def test_one_trainer_has_no_allreduce_baseline() -> None:
    c = compare([TrainerTraffic(5000, 3000, 48, 2)], 1, 1000)
    assert c["allreduce_bytes_equivalent"] is None and c["reduction_vs_allreduce"] is None
    assert headline(c) == ("8,000 (5,000 sent, 3,000 received)", "no AllReduce baseline with one trainer")


def _summary(trainers: int) -> dict:
    c = compare([TrainerTraffic(5000, 3000, 48, 2)], trainers, 1000)
    return {
        "epochs_finalized": 2, "epochs": 2, "seconds": 10.0, "initial_eval_loss": 5.5, "final_eval_loss": 4.0,
        "verdicts": {"pass": 2, "fail": 0}, "slashed": [], "rewards_paid_wei": 0, "reward_pool_left_wei": 0,
        "cheaters": {}, "gas_used": 1234, "final_model_cid": "QmModel", "final_model_epoch": 1,
        "fetch_model": "veriloco store get QmModel --store-dir s -o model.safetensors",
        "export_model": "veriloco store get QmConfig --store-dir s -o run.json && veriloco export ...", **c,
    }


def test_the_summary_names_the_model_and_never_prints_a_zero_baseline() -> None:
    lines: list[str] = []
    _print_summary(_summary(1), lines.append)
    text = "\n".join(lines)
    assert "no AllReduce baseline with one trainer" in text
    assert " 0x" not in text and "would send 0" not in text
    assert "QmModel (finalized in epoch 1)" in text
    assert "veriloco store get QmModel --store-dir s -o model.safetensors" in text
    lines.clear()
    _print_summary(_summary(4), lines.append)
    assert any(line.endswith("288,000 for the same 48 steps: 36.0x more") for line in lines), lines


def test_global_points_sit_at_the_steps_trainers_actually_trained() -> None:
    # H adapts: 24 then 12 then 30 steps; the second trainer trained only epochs 0 and 2
    a = {0: 24, 1: 12, 2: 30}
    b = {0: 24, 2: 30}
    assert eval_steps([-1, 0, 1, 2], [a]) == [0, 24, 36, 66]
    assert eval_steps([-1, 0, 1, 2], [a, b]) == [0, 24, 30, 60]


def test_a_trainer_curve_counts_its_own_steps_and_a_resumed_step_once() -> None:
    ev = [{"event": "step", "epoch": 0, "step": k, "of": 2, "loss": 5.0 - k} for k in (1, 2)]
    ev += [{"event": "step", "epoch": 1, "step": 1, "of": 3, "loss": 3.5},
           {"event": "step", "epoch": 1, "step": 1, "of": 3, "loss": 3.4},  # replayed after a resume
           {"event": "step", "epoch": 1, "step": 2, "of": 3, "loss": 3.0},
           {"event": "step", "epoch": 1, "step": 3, "of": 3, "loss": 2.9}]
    assert loss_curve(ev) == ([1, 2, 3, 4, 5], [4.0, 3.0, 3.4, 3.0, 2.9])


def test_the_fetch_command_names_the_store_folder_from_where_the_user_stands(tmp_path: Path, monkeypatch) -> None:
    from veriloco.netdemo import _store_args

    monkeypatch.chdir(tmp_path)
    assert _store_args(LocalStore(tmp_path / "demo" / "store")) == "--store-dir demo/store"
    assert _store_args(LocalStore(tmp_path.parent / "elsewhere store")) == f"--store-dir '{tmp_path.parent}/elsewhere store'"
