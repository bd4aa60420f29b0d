"""The whole network as processes: honest runs finalize and learn; every cheat is caught and slashed.

Each test runs `veriloco.netdemo.run_demo`, which starts a devnet, creates a run and launches the
trainer, verifier and coordinator processes with the same CLI a user types. After the nodes stop,
the aggregate of every finalized epoch is recomputed from the chain and the store: it must equal
the model the coordinator finalized, and no cheater may be among the included trainers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from dilocox.aggregate import aggregate
from dilocox.inner import configure_determinism
from protocol.chain.binding import Chain, Phase
from protocol.digest import state_digest
from protocol.run import open_run
from public.globals import build_global
from tests.fixtures.network import run_network, skip_killed_commits, skip_unrevealed
from veriloco.logs import level
from veriloco.netdemo import Control, DemoOptions
from veriloco.simulate import from_run_config, run_local

pytestmark = pytest.mark.e2e


def _run(tmp_path: Path, on_tick: Any = None, config_changes: dict[str, Any] | None = None, seen: dict[str, Any] | None = None,
         **kw: Any) -> tuple[dict[str, Any], dict[int, list[str]]]:
    """``seen``: filled with the run's context (``ctx``) and each finalized epoch's model digest (``models``)."""
    included: dict[int, list[str]] = {}

    def inspect(chain: Chain, store: Any, run_id: int) -> None:
        ctx = open_run(chain, store, run_id)
        if seen is not None:
            seen.update(ctx=ctx, models={e: chain.epoch_times(run_id, e).model_digest for e in range(ctx.config.schedule.epochs)
                                         if chain.epoch_status(run_id, e).phase is Phase.FINALIZED})
        for e in range(ctx.config.schedule.epochs):
            if chain.epoch_status(run_id, e).phase is not Phase.FINALIZED:
                continue
            _, inc, digest = build_global(chain, store, ctx, e)
            assert digest == chain.epoch_times(run_id, e).model_digest, f"epoch {e}: finalized model is not the aggregate"
            revealed = {ev.args["trainer"] for ev in chain.revealed(run_id, e)}
            by_contract = sorted((t for t in revealed if chain.submission(run_id, e, t).passed), key=lambda a: int(a, 16))
            assert inc == by_contract  # the event-derived passing set is the contract's
            included[e] = inc

    for key, value in (("trainers", 3), ("epochs", 2), ("steps", 8)):
        kw.setdefault(key, value)
    opts = DemoOptions(verifiers=2, quorum=1, workdir=tmp_path / "demo", report=tmp_path / "report", timeout_s=600, **kw)
    config = opts.config().replace(**config_changes) if config_changes else None
    summary, _ = run_network(opts, inspect=inspect, on_tick=on_tick, config=config)
    return summary, included


def _events(tmp_path: Path, event: str) -> list[dict[str, Any]]:
    return [json.loads(line) for log in (tmp_path / "demo" / "logs").glob("trainer*.jsonl")
            for line in log.read_text().splitlines() if f'"{event}"' in line]


@pytest.mark.integration
def test_honest_network_on_anvil_and_ipfs_learns_and_nobody_is_slashed(tmp_path: Path) -> None:
    """The honest network on the real chain and store (anvil, a js-ipfs node); the embedded py-evm
    chain and the LocalStore carry the cheaters', the merging, the killed and the pipelined networks.
    trainer2 runs with no room for a boundary log (`--boundary-log-ram 0 --boundary-log-disk 0`, what a
    large batch comes to): it logs no step, says so each epoch, and answers by replaying whole steps.
    The nodes start as on hosts of three kernel classes (ATen's default, AVX2 and AVX-512 levels, and
    oneMKL's AVX-512 branch), which give three sets of bits unpinned (issue 51): each pins the run's
    numerics class, so every verifier replays every trainer bit for bit and nobody is slashed."""
    restarted: list[str] = []
    levels = [{"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512"}, {"ATEN_CPU_CAPABILITY": "default"},
              {"ATEN_CPU_CAPABILITY": "avx2"}]
    hosts = {f"trainer{i}": levels[i] for i in range(3)} | {"verifier0": levels[1], "verifier1": levels[0]}

    def no_log_room(control: Control) -> None:
        if not restarted:
            n = control.node("trainer2")
            control.kill("trainer2")
            n.cmd = [*n.cmd, "--boundary-log-ram", "0", "--boundary-log-disk", "0"]
            control.restart("trainer2")
            restarted.append("trainer2")

    seen: dict[str, Any] = {}
    s, included = _run(tmp_path, chain="anvil", store="ipfs", on_tick=no_log_room, host_env=hosts, seen=seen)
    assert s["epochs_finalized"] == 2
    assert s["verdicts"]["fail"] == 0 and s["verdicts"]["pass"] >= 6
    assert s["slashed"] == []
    assert s["final_eval_loss"] < s["initial_eval_loss"] - 0.5
    assert all(len(v) == 3 for v in included.values())
    # the network trains what the benchmark measures (issue 47): the simulation of the run's config
    # (veriloco.simulate.from_run_config, what benchmarks/operating_point.py runs beside the network)
    # computes every finalized model bit for bit
    sim, method = from_run_config(seen["ctx"].config, trainers=3)
    configure_determinism(seen["ctx"].config.audit.threads)  # the nodes' threads: reductions split by thread count
    simulated: list[bytes] = []

    def record(epoch: int, g: Any, deltas: Any, outer: Any) -> Any:
        out = aggregate(g, deltas, outer)
        simulated.append(state_digest(out))
        return out

    run_local(method, sim, seen["ctx"].corpus, lambda _: None, aggregator=record)
    assert [bytes(seen["models"][e]) for e in sorted(seen["models"])] == simulated
    # the demo's pool pays 0.001 ETH per included trainer and 0.0001 ETH per (quorum-1, so decisive) verdict
    paid = sum(len(v) for v in included.values()) * 10**15 + s["verdicts"]["pass"] * 10**14
    assert s["rewards_paid_wei"] == paid and s["reward_pool_left_wei"] == 10**17 - paid
    assert (tmp_path / "report" / "summary.json").exists() and (tmp_path / "report" / "loss.png").exists()
    answers = [json.loads(line) for log in (tmp_path / "demo" / "logs").glob("trainer*.jsonl")
               for line in log.read_text().splitlines() if '"responded"' in line]
    assert answers and all(a["answer_cpu_s"] > 0 and a["answer_s"] > 0 for a in answers)  # replaying a segment costs
    assert all(a["beside_training"] for a in answers)  # built on the answer worker, not in the node's loop
    logs = tmp_path / "demo" / "logs"
    trained = [json.loads(line) for name in ("trainer0", "trainer1") for line in (logs / f"{name}.jsonl").read_text().splitlines()
               if '"trained"' in line]
    # every step's boundaries kept, in memory (a tiny model's log fits the default budget: no copy, ~0 CPU)
    assert trained and all(t["boundary_log_bytes"] == t["boundary_log_ram_bytes"] > 0 for t in trained)
    assert all(t["boundary_log_unlogged_steps"] == 0 for t in trained)
    assert not list((tmp_path / "demo").rglob("bounds/step-*"))  # nothing spilled to disk
    roomless = [json.loads(line) for line in (logs / "trainer2.jsonl").read_text().splitlines() if line.startswith("{")]
    kept = [ev for ev in roomless if ev.get("event") == "trained"]
    assert kept and all(t["boundary_log_bytes"] == 0 and t["boundary_log_unlogged_steps"] == t["steps"] for t in kept)
    full = [ev for ev in roomless if ev.get("event") == "boundary-log-full"]
    assert sorted(ev["epoch"] for ev in full) == sorted(t["epoch"] for t in kept) and all(ev["level"] == "INFO" for ev in full)
    assert any(ev.get("event") == "responded" for ev in roomless)  # and it answered (whole steps), every verdict a pass
    # quiet when healthy: an expected retry (a reveal before the others have judged, a finalize before
    # every reveal is in) is no error. Warnings are not asserted: a loaded machine can raise real ones
    # (an RPC outage waited out, content not yet served)
    loud = [(log.stem, ev["event"]) for log in (tmp_path / "demo" / "logs").glob("*.jsonl")
            for line in log.read_text().splitlines() if line.startswith("{")
            for ev in [json.loads(line)] if level(ev["event"], ev) == "ERROR"]
    assert loud == [], loud


def test_merging_trainers_fold_each_global_model_in_and_a_skipped_merge_is_slashed(tmp_path: Path) -> None:
    """schedule.merge_step = 1 (docs/protocol.md §8), shard audits: each epoch continues the trainer's
    own end state and folds in the new global model after one step. Segments are aligned to state
    leaves and 8 steps long, longer than H, so every challenge replays step 1, merge included; the
    final check measures Δ from G_e. One trainer skips the merge: harmless in epoch 0, where
    G_0 − S_0 = 0, slashed in epoch 1. The run keeps its error feedback in the parameters
    (compression.error_feedback = "params"): the merge adds the public offset, verifiers fetch each
    trainer's e-1 payload for it, and no continued start publishes a start file."""
    s, included = _run(tmp_path, steps=4, merge_step=1, trainers=4, cheats=(("skip-merge", 1),),
                       config_changes={"audit": {"segment": 8, "steps": 1},
                                       "compression": {"error_feedback": "params"}})
    cheater = set(s["cheaters"])
    assert s["epochs_finalized"] == 2 and set(s["slashed"]) == cheater
    assert len(included[0]) == 4 and len(included[1]) == 3 and not cheater & set(included[1])
    merged = _events(tmp_path, "merged")
    assert {(m["epoch"], m["step"]) for m in merged} == {(0, 1), (1, 1)}
    # epoch 1 held its honest trainers at step 1 until epoch 0 was final, its model recomputed
    assert sum("epoch 0 to finalize (epoch 1 merges" in w["what"] for w in _events(tmp_path, "waited")) >= 3


def test_merging_trainers_pass_whole_state_audits(tmp_path: Path) -> None:
    """The merge rule with whole-state audits: a challenge at k replays k..k+8 (not aligned), so which
    challenges cover the merge follows the seed; honest trainers pass either way, and the final check
    measures Δ from G_e in every audit. (A skipped merge in this mode: tests/unit/test_merge_replay.py.)
    With schedule.first_merge_step = 0, epoch 1 waits for G_1 before its first step and merges there."""
    s, included = _run(tmp_path, steps=4, audit="state", merge_step=1,
                       config_changes={"audit": {"segment": 8, "steps": 2}, "schedule": {"first_merge_step": 0}})
    assert s["epochs_finalized"] == 2 and s["slashed"] == [] and s["verdicts"]["fail"] == 0
    assert all(len(inc) == 3 for inc in included.values())
    assert {(m["epoch"], m["step"]) for m in _events(tmp_path, "merged")} == {(0, 1), (1, 0)}
    steps_before = [[json.loads(line) for line in log.read_text().splitlines()] for log in
                    (tmp_path / "demo" / "logs").glob("trainer*.jsonl")]
    for events in steps_before:  # no step of epoch 1 ran before its trainer merged G_1
        merged_at = next(i for i, ev in enumerate(events) if ev.get("event") == "merged" and ev["epoch"] == 1)
        assert not any(ev.get("event") == "step" and ev["epoch"] == 1 for ev in events[:merged_at])


def test_every_cheater_is_slashed_and_never_aggregated(tmp_path: Path) -> None:
    """One network, one cheater of each kind among two honest trainers."""
    # the copier cannot reveal: skip the rest of the reveal window it leaves open
    s, included = _run(tmp_path, on_tick=skip_unrevealed(2), trainers=5, cheats=(("lazy", 1), ("noise", 1), ("copy", 1)))
    cheaters = set(s["cheaters"])
    assert sorted(s["cheaters"].values()) == ["copy", "lazy", "noise"]
    assert s["epochs_finalized"] == 2
    assert set(s["slashed"]) == cheaters  # every cheater, and no honest trainer
    assert included and all(not cheaters & set(inc) and len(inc) == 2 for inc in included.values())
    assert s["final_eval_loss"] < s["initial_eval_loss"] - 0.5


def test_killed_nodes_resume_and_the_run_goes_on(tmp_path: Path) -> None:
    """SIGKILL a trainer mid-epoch (restarted at once: it resumes from its checkpoint), another one
    for a whole epoch (the epoch finalizes without it after the commit window, it rejoins the next),
    and the coordinator and a verifier (both resume). Nobody honest is slashed."""
    done: set[str] = set()

    def events(n: Any, kind: str, epoch: int | None = None) -> list[dict[str, Any]]:
        return [ev for ev in n.events if ev.get("event") == kind and (epoch is None or ev.get("epoch") == epoch)]

    def on_tick(c: Any) -> None:
        t0, t1 = c.node("trainer0"), c.node("trainer1")
        if "t0" not in done and events(t0, "step", 0):
            c.kill("trainer0")
            c.restart("trainer0")
            done.add("t0")
        if "t1" not in done and events(t1, "step", 1) and events(t1, "responded", 0):
            c.kill("trainer1")
            done.add("t1")
        if "t1" in done and "t1-back" not in done and c.chain.epoch_status(c.run_id, 1).phase >= Phase.AUDITING:
            c.restart("trainer1")
            done.add("t1-back")
        if "coord" not in done and c.chain.epoch_status(c.run_id, 0).phase is Phase.FINALIZED:
            for name in ("coordinator0", "verifier0"):
                c.kill(name)
                c.restart(name)
            done.add("coord")

    skip = skip_killed_commits(3)  # epoch 1's commit window, once only the killed trainer is missing

    def kill_and_skip(c: Any) -> None:
        on_tick(c)
        skip(c)

    s, included = _run(tmp_path, epochs=3, steps=24, windows_s=45, on_tick=kill_and_skip)
    assert done == {"t0", "t1", "t1-back", "coord"}
    assert s["epochs_finalized"] == 3 and s["slashed"] == []
    assert [len(included[e]) for e in range(3)] == [3, 2, 3]
    log = (tmp_path / "demo" / "logs" / "trainer0.jsonl").read_text()
    assert '"event": "resumed"' in log
    assert '"event": "waited"' in log  # each announced wait ends with how long the protocol held the trainer


@pytest.mark.integration
def test_nodes_reconnect_to_anvil_restarted_from_saved_state(tmp_path: Path) -> None:
    """Stop anvil as epoch 1 leaves its commit phase, while reveals and audit responses are in
    flight (it dumps its state), start it again from that state: every node rides out the outage, a
    transaction cut off by it is sent again, and the run finalizes with nobody slashed."""
    done: set[str] = set()

    def on_tick(c: Any) -> None:
        if "restart" not in done and c.chain.epoch_status(c.run_id, 1).phase >= Phase.REVEALING:
            done.add("restart")
            c.restart_chain()

    s, _ = _run(tmp_path, chain="anvil", on_tick=on_tick)
    assert done == {"restart"}
    assert s["epochs_finalized"] == 2 and s["slashed"] == []
    logs = "".join(p.read_text() for p in (tmp_path / "demo" / "logs").glob("*.jsonl"))
    assert '"event": "recovered"' in logs or '"event": "outage"' not in logs


@pytest.mark.integration
def test_chaos_kills_and_an_ipfs_restart(tmp_path: Path) -> None:
    """Seeded random SIGKILLs of trainers, a verifier and the coordinator (each restarted after a
    random pause), and a crash-restart of the IPFS node, during a 3-epoch run on the real IPFS
    store: every epoch finalizes, no honest node is slashed, no state is lost."""
    import random

    rng = random.Random(20261130)
    pending: list[tuple[float, str]] = []  # (restart at, node)
    fired: list[str] = []

    def phase(c: Any, e: int) -> Phase:
        return c.chain.epoch_status(c.run_id, e).phase

    plan = [  # (name, trigger, victims)
        ("trainer-after-commit", lambda c: phase(c, 0) >= Phase.COMMITTING, ["trainer0", "trainer1", "trainer2"]),
        ("verifier-in-audit", lambda c: phase(c, 0) >= Phase.AUDITING, ["verifier0", "verifier1"]),
        ("ipfs", lambda c: phase(c, 1) >= Phase.REVEALING, ["ipfs"]),
        ("coordinator", lambda c: phase(c, 1) >= Phase.AUDITING, ["coordinator0"]),
        ("trainer-late", lambda c: phase(c, 2) >= Phase.COMMITTING, ["trainer0", "trainer1", "trainer2"]),
    ]

    def on_tick(c: Any) -> None:
        now = time.monotonic()
        for when, name in list(pending):
            if now >= when:
                c.restart(name)
                pending.remove((when, name))
        for name, trigger, victims in plan:
            if name in fired or not trigger(c):
                continue
            fired.append(name)
            victim = rng.choice(victims)
            if victim == "ipfs":
                c.restart_store()
            else:
                c.kill(victim)
                pending.append((now + rng.uniform(0.5, 5.0), victim))

    s, included = _run(tmp_path, store="ipfs", epochs=3, steps=16, windows_s=60, on_tick=on_tick)
    assert [name for name, _, _ in plan] == fired and not pending
    assert s["epochs_finalized"] == 3 and s["slashed"] == [] and s["verdicts"]["fail"] == 0
    assert all(included[e] for e in range(3))


def test_pipelined_trainers_pass_exact_shard_audits(tmp_path: Path) -> None:
    """`veriloco trainer --stages 2`: each trainer's state lives in two gloo stage processes that own
    their blocks (trainer/stages.py) and each keeps a gradient log of them, from which the trainer
    answers; a verifier's single-block replay matches the answers bit for bit."""
    s, included = _run(tmp_path, trainers=2, stages=2)
    assert s["epochs_finalized"] == 2 and s["slashed"] == [] and s["verdicts"]["fail"] == 0
    assert all(len(inc) == 2 for inc in included.values())
    log = (tmp_path / "demo" / "logs" / "trainer0.jsonl").read_text()
    assert '"stages": 2' in log
    assert '"answer_log": "gradients"' in log and '"what": "boundary log"' not in log
    # an attestation landing after the committee's majority finalized the model is routine, not an error
    verifiers = "".join(p.read_text() for p in (tmp_path / "demo" / "logs").glob("verifier*.jsonl"))
    assert '"attest-failed"' not in verifiers


def test_a_windowed_run_draws_each_windows_steps_from_its_post_through_the_coordinators_relay(tmp_path: Path) -> None:
    """audit.window = 4 (docs/protocol.md §5.4): trainers sign each window's root to the coordinator's relay
    while they train, the relay posts one aggregate per window, the contract draws no step, and every
    verifier derives each trainer's draws from the window posts: every epoch finalizes, the answers named
    the window roots and opened the window-drawn steps, and only the cheaters are slashed: the lazy one by
    its audit (each of its 16 steps is drawn at 0.5: it escapes both epochs with probability 2^-16), the
    one that walks away from its epoch (never commits what it forged, so nothing is audited) by the
    coordinator's report of the window roots it signed (docs/security.md §20 item 25)."""
    from protocol import shard_audit, windows
    from protocol.leaf import block_count
    from public.windowaudit import chain_windows

    drawn: dict[tuple[int, str], list[int]] = {}

    def inspect(chain: Chain, store: Any, run_id: int) -> None:
        ctx = open_run(chain, store, run_id)
        n = block_count(ctx.config.model_config())
        for e in range(2):
            for ev in chain.events(["Responded"], run_id=run_id, epoch=e):
                t = ev.args["trainer"]
                m = shard_audit.decode_manifest(store.get(ev.args["manifestCid"]), n, max_bytes=1 << 26)
                sub = chain.submission(run_id, e, t)
                wa = chain_windows(chain, store, run_id=run_id, epoch=e, trainer=t, slot=chain.member(run_id, t).slot,
                                   claimed=m.window_roots, trace_root=sub.trace_root, leaf_count=sub.leaf_count, W=4,
                                   depth=2)
                assert m.window_width == 4 and wa.findings == [] and not wa.post_hoc
                assert len(m.window_roots) == windows.window_count(sub.leaf_count, 4)
                assert chain.assignment(run_id, e, t).transitions == ()  # nothing drawn on chain
                drawn[(e, t)] = wa.drawn
                assert {c.start for c in m.challenges} == {k - k % ctx.config.audit.segment for k in wa.drawn}

    # a chain that makes blocks on its own (every 1.5 s), as a real one does: a window's seed needs blocks
    # after its post while the trainer trains on
    # (its commit window is what the walk-away costs the others: 25 s, not the demo's 60; an epoch's
    # commits, answers and verdicts took under 6 s each here)
    opts = DemoOptions(trainers=4, verifiers=2, quorum=1, epochs=2, steps=8, window=4, audit_rate=0.5,
                       cheats=(("lazy", 1), ("abandon", 1)), workdir=tmp_path / "demo", report=tmp_path / "report",
                       timeout_s=600, block_time_s=1.5, windows_s=25)
    s, _ = run_network(opts, inspect=inspect)
    assert s["epochs_finalized"] == 2 and set(s["slashed"]) == set(s["cheaters"]) and len(s["cheaters"]) == 2
    walked = next(a for a, k in s["cheaters"].items() if k == "abandon")
    assert [(x["epoch"], x["reason"]) for x in s["slashes"] if x["account"] == walked] == [(0, 6)]
    assert len(drawn) >= 5 and any(drawn.values())  # 3 answered epoch 0 (one walked away), 2 epoch 1
    coord = (tmp_path / "demo" / "logs" / "coordinator0.jsonl").read_text()
    assert coord.count('"window-posted"') == 2 * 3 and '"relay": "http://127.0.0.1:' in coord
    reporters = [(tmp_path / "demo" / "logs" / f"{n}.jsonl").read_text() for n in ("coordinator0", "verifier0", "verifier1")]
    assert sum(r.count('"abandon-reported"') for r in reporters) == 1  # the first of them; the others are refused
    trainers = "".join(p.read_text() for p in (tmp_path / "demo" / "logs").glob("trainer*.jsonl"))
    # a trainer whose root came after the relay's wait (2 s here) posts it itself, and only then
    own = [json.loads(x) for x in trainers.splitlines() if '"window-posted-own"' in x]
    assert all("no post holds the root" in o["why"] for o in own) and len(own) < 2 * 3 * 4 / 2
    # whether a window is drawn before the reveal here depends on how fast 8 tiny steps run against 1.5 s
    # blocks (0.05 s a step: usually not): the memory it saves is measured, not asserted, by
    # `benchmarks/protocol.py --windows` (docs/results-windowed.md)
