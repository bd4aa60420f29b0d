"""A trainer's traffic against AllReduce: the one definition the demo's summary and
benchmarks/protocol.py both report.

A trainer's traffic is every byte it puts into or gets from the content store, as its node counts
them at the store (`sent_bytes`, `received_bytes` on its log events, trainer/node.py): the
payloads, audit states and manifests it publishes; the config, corpus, initial model and the other
trainers' payloads (it recomputes every global model it builds on) it downloads. Chain
transactions (a few hundred bytes each) are not counted.

The baseline is a ring AllReduce of fp32 gradients after every inner step the trainer actually
trained: 2 (K-1)/K x 4 bytes x parameters per step and worker, over the sum of the epochs' H (H
adapts per epoch). With one trainer AllReduce sends nothing, so there is no baseline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainerTraffic:
    """What one trainer moved through the store, and the inner steps it trained, over a run."""

    sent: int
    received: int
    steps: int
    epochs: int

    @property
    def total(self) -> int:
        return self.sent + self.received


def trainer_traffic(events: Iterable[Mapping[str, Any]]) -> TrainerTraffic:
    """Add up one trainer's log events (JSON lines, in order, possibly over several processes).

    The counters are cumulative within a process; a node restarted after a crash logs `started`
    and counts from zero again, so each process's last counters are banked at the next `started`.
    An epoch trained twice (a crash between training and its record) counts once.
    """
    sent = received = 0
    cur_sent = cur_received = 0
    steps: dict[int, int] = {}
    for ev in events:
        kind = ev.get("event")
        if kind == "started":
            sent, received, cur_sent, cur_received = sent + cur_sent, received + cur_received, 0, 0
        cur_sent = max(cur_sent, int(ev.get("sent_bytes", 0)))
        cur_received = max(cur_received, int(ev.get("received_bytes", 0)))
        if kind == "trained":
            steps[int(ev["epoch"])] = int(ev["steps"])
    return TrainerTraffic(sent + cur_sent, received + cur_received, sum(steps.values()), len(steps))


def ring_allreduce_bytes(nbytes: int, k: int) -> int:
    """Bytes one of `k` workers sends in a ring AllReduce of `nbytes` (here, not in veriloco/simulate.py,
    so that the dashboard counts traffic without importing torch)."""
    return 0 if k <= 1 else (2 * (k - 1) * nbytes) // k


def allreduce_bytes(trainers: int, params: int, steps: float) -> int:
    """Bytes one worker sends in a ring AllReduce of fp32 gradients over `steps` inner steps."""
    return round(ring_allreduce_bytes(4 * params, trainers) * steps)


def compare(traffic: Sequence[TrainerTraffic], trainers: int, params: int) -> dict[str, Any]:
    """Mean traffic per trainer (over `traffic`, e.g. the honest trainers) against AllReduce.

    `trainers` is K, the run's trainer count; `allreduce_bytes_equivalent` and
    `reduction_vs_allreduce` are None when K = 1. Per-epoch figures divide by `epochs_per_trainer`.
    """
    n = max(1, len(traffic))
    sent = sum(t.sent for t in traffic) / n
    received = sum(t.received for t in traffic) / n
    steps = sum(t.steps for t in traffic) / n
    epochs = sum(t.epochs for t in traffic) / n
    total = sent + received
    baseline = allreduce_bytes(trainers, params, steps) if trainers > 1 else None
    return {
        "bytes_per_trainer": round(total),
        "bytes_sent_per_trainer": round(sent),
        "bytes_received_per_trainer": round(received),
        "steps_per_trainer": round(steps, 1),
        "epochs_per_trainer": round(epochs, 2),
        "allreduce_bytes_equivalent": baseline,
        "reduction_vs_allreduce": round(baseline / total, 2) if baseline is not None and total > 0 else None,
    }


def headline(c: Mapping[str, Any]) -> tuple[str, str]:
    """`compare`'s result as two summary lines: what a trainer moved, and AllReduce for the same steps."""
    moved = (f"{c['bytes_per_trainer']:,} ({c['bytes_sent_per_trainer']:,} sent, "
             f"{c['bytes_received_per_trainer']:,} received)")
    if c["allreduce_bytes_equivalent"] is None:
        return moved, "no AllReduce baseline with one trainer"
    baseline = f"AllReduce would send {c['allreduce_bytes_equivalent']:,} for the same {c['steps_per_trainer']:g} steps"
    ratio = c["reduction_vs_allreduce"]
    if ratio is None:
        return moved, baseline
    return moved, f"{baseline}: {ratio:.1f}x more" if ratio >= 1 else f"{baseline}: {1 / ratio:.1f}x less"
