"""`veriloco earnings` on a py-evm devnet: every reward, bounty and slash of an account, from events alone.

One quorum-3 epoch is played through the contract-test helpers (no training): a trainer passes
unanimously, one passes with a dissenting verifier (outvoted: slashed), one fails (slashed, its
stake shared among the verifiers that failed it). Each account's report is read through the CLI,
and its totals are checked against the contract's own `credits` (rewards + bounties - claimed).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fixtures.chain import DevnetNet, Run, make_run
from tests.fixtures.cli import run_cli as cli

pytestmark = pytest.mark.integration

COORD, TRAINERS, VERIFIERS = 0, [1, 2, 3], [4, 5, 6]
R_T, R_V = 10**15, 10**14  # trainer reward, verifier reward per majority verdict



@pytest.fixture(scope="module")
def played(devnet: Any) -> tuple[DevnetNet, Run, str]:
    """The epoch above, finalized; returns the net, the run and the dissenting verifier."""
    net = DevnetNet(devnet)
    r = make_run(net, TRAINERS, VERIFIERS, COORD, reward_pool=10**18, quorum=3, test_run=False,
                 trainer_reward=R_T, verifier_reward=R_V)
    r.open_epoch(0)
    t0, t1, t2 = r.trainers
    r.judge(0, t0, [True, True, True])
    r.judge(0, t1, [True, True, False])
    r.judge(0, t2, [False, False, False])
    dissenter = str(r.assigned(0, t1)[2].sender)
    r.reveal_verdicts(0)
    r.coord.finalize(r.run_id, 0, "bafkreimodel", b"\x11" * 32, [t0.address, t1.address])
    return net, r, dissenter


def report(capsys: pytest.CaptureFixture[str], devnet: Any, *argv: str) -> dict[str, Any]:
    code, out, err = cli(capsys, "earnings", "--devnet", str(devnet.config.devnet_file), "--json", *argv)
    assert code == 0, err
    got: dict[str, Any] = json.loads(out)
    t = got["totals"]
    assert t["rewards_wei"] + t["bounties_wei"] - t["claimed_wei"] == t["claimable_wei"], got  # the contract agrees
    assert t["net_wei"] == t["rewards_wei"] + t["bounties_wei"] - t["slashed_wei"]
    return got


def kinds(r: dict[str, Any]) -> list[tuple[int, str, int, str]]:
    return [(e["epoch"], e["kind"], e["amount_wei"], e["why"]) for e in r["entries"]]


def test_rewards_bounties_and_slashes_by_account(played: tuple[DevnetNet, Run, str], devnet: Any,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    net, r, dissenter = played
    t0, t1, t2 = r.trainers
    slash_t2 = next(e.args["amount"] for e in r.coord.events(["Slashed"], run_id=r.run_id) if e.args["trainer"] == t2.address)
    vslash = next(e.args["amount"] for e in r.coord.events(["VerifierSlashed"], run_id=r.run_id))

    # a trainer that passed: its reward, with the finalize transaction's hash
    mine = report(capsys, devnet, "--account", str(TRAINERS[0]))
    assert mine["account"] == t0.address
    assert kinds(mine) == [(0, "reward", R_T, "passed its audit (trainer reward)")]
    fin = r.coord.events(["EpochFinalized"], run_id=r.run_id)[0].tx_hash
    assert mine["entries"][0]["tx"] == fin

    # the failed trainer: slashed for its failed audit, by name
    failed = report(capsys, devnet, "--address", t2.address, "--run", str(r.run_id))
    assert kinds(failed) == [(0, "slash", -slash_t2, "failed audit")] and failed["totals"]["net_wei"] == -slash_t2

    # the dissenting verifier: rewards for its two majority verdicts, a bounty, and its slash
    index = net.accounts.index(dissenter)
    d = report(capsys, devnet, "--account", str(index))
    assert sorted(kinds(d)) == sorted([
        (0, "reward", 2 * R_V, "verdicts with the majority (verifier reward)"),
        (0, "bounty", slash_t2 // 3, f"share of {t2.address}'s slash (failed audit)"),
        (0, "slash", -vslash, f"voted against the majority on {t1.address}"),
    ])
    assert d["totals"] == {"rewards_wei": 2 * R_V, "bounties_wei": slash_t2 // 3, "slashed_wei": vslash,
                           "net_wei": 2 * R_V + slash_t2 // 3 - vslash, "claimed_wei": 0,
                           "claimable_wei": 2 * R_V + slash_t2 // 3}

    # an agreeing verifier claims: the report keeps its history and says what was claimed
    other = next(i for i in VERIFIERS if net.accounts[i] != dissenter)
    code, out, err = cli(capsys, "claim", "--devnet", str(devnet.config.devnet_file), "--account", str(other))
    assert code == 0 and out.startswith("claimed"), err
    after = report(capsys, devnet, "--account", str(other))
    assert after["totals"]["claimed_wei"] == 3 * R_V + slash_t2 // 3 and after["totals"]["claimable_wei"] == 0

    # the readable table: one line per entry with its transaction, the reasons by name, the totals
    code, out, err = cli(capsys, "earnings", "--devnet", str(devnet.config.devnet_file), "--account", str(index))
    assert code == 0, err
    assert f"earnings of {dissenter}" in out and fin in out and "(failed audit)" in out
    assert "voted against the majority" in out and "totals: rewards" in out and "claimable now" in out

    # nobody's account: no entries, zero totals; the coordinator earns nothing from the pool
    nothing = report(capsys, devnet, "--account", str(COORD))
    assert nothing["entries"] == [] and nothing["totals"]["net_wei"] == 0


def test_a_late_verifier_pays_the_trainer_it_did_not_judge(devnet: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 46 item 4 as the accounts read it: two of an honest trainer's three verifiers cast no verdict by
    the deadline; the trainer's report shows its reward paid by them, each of theirs the share it lost."""
    net = DevnetNet(devnet)
    r = make_run(net, [7], VERIFIERS, COORD, reward_pool=10**18, quorum=3, test_run=False,
                 trainer_reward=R_T, verifier_reward=R_V)
    r.open_epoch(0)
    (t,) = r.trainers
    r.judge(0, t, [True])
    late = [str(v.sender) for v in r.assigned(0, t)[1:]]
    r.reveal_verdicts(0)
    deadline = r.coord.epoch_times(r.run_id, 0).verdict_deadline
    while r.coord.now() < deadline:  # the devnet's clock moves by about what it is asked to
        net.advance(deadline - r.coord.now() + 1)
    r.coord.finalize(r.run_id, 0, "bafkreimodel", b"\x11" * 32, [])
    mine = report(capsys, devnet, "--address", t.address, "--run", str(r.run_id))
    assert sorted(kinds(mine)) == sorted(
        (0, "reward", R_T // 2, f"trainer reward paid by {v}, which cast no verdict on it in time") for v in late)
    for v in late:  # (their claimable credits include the first run's rewards: read without `report`'s check)
        code, out, err = cli(capsys, "earnings", "--devnet", str(devnet.config.devnet_file), "--json", "--address", v,
                             "--run", str(r.run_id))
        theirs = json.loads(out)
        assert code == 0 and theirs["totals"]["slashed_wei"] == R_T // 2, err
        assert kinds(theirs) == [(0, "slash", -(R_T // 2), f"no verdict on {t.address} by the deadline: paid its trainer reward")]


def test_refusals_are_one_line(devnet: Any, capsys: pytest.CaptureFixture[str], tmp_path: Any,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VERILOCO_KEY", raising=False)
    base = ["earnings", "--devnet", str(devnet.config.devnet_file)]
    for argv, phrase in [
        ([*base], "no account"),
        ([*base, "--address", "0x12"], "not an Ethereum address"),
        ([*base, "--account", "0", "--run", "99"], "run 99 does not exist"),
    ]:
        code, _, err = cli(capsys, *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and phrase in err, (argv, err)


def test_the_dashboard_links_every_member_to_its_earnings(played: tuple[DevnetNet, Run, str], devnet: Any,
                                                          capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    """Issue 32: the dashboard's page links each account of the run (coordinator, trainers, verifiers) to
    its earnings in the run, which the dashboard serves as `veriloco earnings --run` reports them, table and
    JSON alike (veriloco/earnings.py computes both)."""
    import html
    import threading
    import urllib.error
    import urllib.request

    from protocol.chain.binding import Chain
    from protocol.store.backends import LocalStore
    from veriloco.dashweb import run_view, serve

    net, r, dissenter = played
    store = LocalStore(tmp_path)  # the fixture run's config is not in a store: the page shows what the chain has
    server = serve(run_view(Chain(devnet.info.rpc_url, devnet.info.contract), store, r.run_id, 60, eval_rows=0), store)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def get(path: str) -> str:
        return urllib.request.urlopen(base + path, timeout=60).read().decode()

    try:
        assert "Reading the run" in get("/")  # served at once, the run still being read
        json.loads(get("/api/run.json"))  # the API waits for the first gather; the page then has it
        page = get("/")
        for account in [net.accounts[COORD], *(net.accounts[i] for i in TRAINERS + VERIFIERS)]:
            assert f'href="/earnings/{account}"' in page, account
        failed = r.trainers[2].address
        code, text, err = cli(capsys, "earnings", "--devnet", str(devnet.config.devnet_file), "--run", str(r.run_id),
                              "--address", failed)
        assert code == 0, err
        assert html.escape(text.strip()) in get(f"/earnings/{failed}")  # the CLI's own table
        code, out, err = cli(capsys, "earnings", "--devnet", str(devnet.config.devnet_file), "--run", str(r.run_id),
                             "--address", dissenter.lower(), "--json")
        assert code == 0, err
        assert json.loads(get(f"/api/earnings/{dissenter.lower()}.json")) == json.loads(out)
        with pytest.raises(urllib.error.HTTPError, match="404"):
            get("/earnings/0x12")
    finally:
        server.shutdown()
        server.server_close()
