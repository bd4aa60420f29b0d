"""Devnet RPC benchmark: py-evm served over JSON-RPC against anvil and against in-process eth-tester.

The same web3 8 client code runs the same workload on each backend, side by side in one run:
- raw tx: sign locally, eth_sendRawTransaction, eth_getTransactionReceipt (what nodes do);
- transact: an unlocked account's `transact()`, which adds eth_estimateGas first;
- call: one eth_call of a view;
- getLogs: eth_getLogs over the whole chain with a topic filter;
- concurrent: 4 client threads, each with its own key, sending raw transactions (transactions/s).

Backends: "eth-tester (in-process)" is web3's EthereumTesterProvider with no transport (the floor
for py-evm); "py-evm JSON-RPC" is devnet.evmserver over HTTP on loopback, once on a thread of the
benchmark process (sharing its GIL, as start_devnet runs it) and once in its own process (as
`veriloco devnet` serves other nodes); "anvil JSON-RPC" is the
npm anvil binary (skipped if absent). Ratios are against anvil.

    .venv/bin/python -m benchmarks.devnet_rpc --out benchmarks/results/devnet_rpc.json

Prints a Markdown table and writes JSON (machine, versions, settings, per-backend numbers, ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

from eth_account import Account
from web3 import Web3

from devnet.anvil import Anvil, AnvilConfig, AnvilError, anvil_binary
from devnet.evmserver import DEV_HD_PATH, DEV_MNEMONIC, EvmConfig, EvmServer
from devnet.launch import dev_accounts
from tests.fixtures.devnet import load_probe

THREADS = 4


@contextmanager
def in_process() -> Iterator[Web3]:
    from eth_tester import EthereumTester, PyEVMBackend
    from web3 import EthereumTesterProvider

    backend = PyEVMBackend.from_mnemonic(
        DEV_MNEMONIC, num_accounts=THREADS + 2, hd_path=DEV_HD_PATH
    )
    yield Web3(EthereumTesterProvider(EthereumTester(backend)))


@contextmanager
def evmserver() -> Iterator[Web3]:
    with EvmServer(EvmConfig(accounts=THREADS + 2)) as server:
        yield Web3(Web3.HTTPProvider(server.url, request_kwargs={"timeout": 60}))


@contextmanager
def evmserver_process() -> Iterator[Web3]:
    """The same server in its own process, as `veriloco devnet` serves other nodes (no shared GIL)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "devnet.evmserver", "--port", "0", "--accounts", str(THREADS + 2)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "py-evm JSON-RPC on http://127.0.0.1:PORT (chain id ...)"
        url = line.split(" on ", 1)[1].split()[0]
        yield Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": 60}))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


@contextmanager
def anvil() -> Iterator[Web3]:
    with Anvil(AnvilConfig(accounts=THREADS + 2)) as node:
        yield Web3(Web3.HTTPProvider(node.url, request_kwargs={"timeout": 60}))


def _receipt(w3: Web3, tx_hash: Any) -> Any:
    """Poll tightly: anvil may answer eth_sendRawTransaction before the block is sealed."""
    return w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60, poll_latency=0.002)


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000, 2),
    }


def _timed(n: int, fn: Callable[[int], None]) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def measure(w3: Web3, n: int, concurrent: bool) -> dict[str, Any]:
    art = load_probe()
    keys = [a.key for a in dev_accounts(THREADS + 2)]
    owner = w3.eth.accounts[0]
    factory = w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
    receipt = w3.eth.wait_for_transaction_receipt(factory.constructor().transact({"from": owner}))
    probe = w3.eth.contract(address=receipt["contractAddress"], abi=art["abi"])
    chain_id = w3.eth.chain_id
    signer = Account.from_key(keys[1])
    base: dict[str, Any] = dict(
        probe.functions.store(1, "bench").build_transaction(
            {"from": signer.address, "nonce": 0, "gas": 100_000, "chainId": chain_id}  # type: ignore[arg-type]
        )
    )

    def raw_tx(i: int) -> None:
        signed = signer.sign_transaction({**base, "nonce": i})
        h = w3.eth.send_raw_transaction(signed.raw_transaction)
        assert _receipt(w3, h)["status"] == 1

    def transact(i: int) -> None:
        h = probe.functions.store(i % 1000, "bench").transact({"from": owner})
        assert _receipt(w3, h)["status"] == 1

    result: dict[str, Any] = {
        "raw_tx": _ms(_timed(n, raw_tx)),
        "transact": _ms(_timed(n, transact)),
        "call": _ms(_timed(n, lambda i: probe.functions.value().call() and None)),
    }
    topic = probe.events.Stored().topic
    logs: list[int] = []

    def get_logs(i: int) -> None:
        logs.append(len(w3.eth.get_logs({"fromBlock": 0, "toBlock": "latest", "topics": [topic]})))

    result["get_logs"] = _ms(_timed(max(3, n // 10), get_logs))
    result["get_logs"]["logs_returned"] = logs[-1]
    if concurrent:
        per_thread = n
        errors: list[BaseException] = []

        def worker(key: str) -> None:
            acct = Account.from_key(key)
            try:
                for i in range(per_thread):
                    tx = {**base, "from": acct.address, "nonce": i}
                    h = w3.eth.send_raw_transaction(acct.sign_transaction(tx).raw_transaction)
                    assert _receipt(w3, h)["status"] == 1
            except BaseException as exc:  # noqa: BLE001 -- reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in keys[2 : 2 + THREADS]]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"concurrent workload failed: {errors[0]!r}")
        result["concurrent_tx_per_s"] = round(THREADS * per_thread / elapsed, 1)
    return result


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),  # other work on the machine skews it
    }


def versions() -> dict[str, str]:
    out = {k: version(k) for k in ("web3", "py-evm", "eth-tester", "eth-account")}
    try:
        out["anvil"] = str(anvil_binary().parent.parent.name) + " 1.7.1 (npm @foundry-rs/anvil)"
    except AnvilError:
        out["anvil"] = "absent"
    return out


def markdown(result: dict[str, Any]) -> str:
    rows = [
        (
            "| backend | raw tx + receipt (median / p95 ms) | transact + estimate (ms) "
            "| eth_call (ms) | getLogs (ms) | 4 clients (tx/s) | raw tx vs anvil |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in result["backends"].items():
        ratio = result["ratios_vs_anvil"].get(name, {}).get("raw_tx")
        rows.append(
            f"| {name} | {r['raw_tx']['median_ms']} / {r['raw_tx']['p95_ms']} "
            f"| {r['transact']['median_ms']} | {r['call']['median_ms']} "
            f"| {r['get_logs']['median_ms']} ({r['get_logs']['logs_returned']} logs) "
            f"| {r.get('concurrent_tx_per_s', 'n/a')} | {f'{ratio:.2f}x' if ratio else 'n/a'} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100, help="transactions per workload")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    backends: list[tuple[str, Callable[[], Any], bool]] = [
        ("eth-tester (in-process)", in_process, False),
        ("py-evm JSON-RPC (thread of the client process)", evmserver, True),
        ("py-evm JSON-RPC (own process)", evmserver_process, True),
    ]
    try:
        anvil_binary()
        backends.append(("anvil JSON-RPC", anvil, True))
    except AnvilError:
        print("anvil not installed: skipped")
    host = machine()
    numbers: dict[str, Any] = {}
    for name, start, concurrent in backends:
        with start() as w3:
            numbers[name] = measure(w3, args.n, concurrent)
        print(f"{name}: done", flush=True)
    ratios: dict[str, dict[str, float]] = {}
    ref = numbers.get("anvil JSON-RPC")
    if ref is not None:
        for name, r in numbers.items():
            ratios[name] = {
                k: round(r[k]["median_ms"] / ref[k]["median_ms"], 2)
                for k in ("raw_tx", "transact", "call", "get_logs")
            }
    load_end = round(os.getloadavg()[0], 2)
    result: dict[str, Any] = {
        "benchmark": "devnet_rpc",
        "machine": {**host, "loadavg_1m_at_end": load_end},
        "versions": versions(),
        "settings": {"n": args.n, "threads": THREADS},
        "backends": numbers,
        "ratios_vs_anvil": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(f"\nload average {host['loadavg_1m_at_start']} -> {load_end} on {host['cpus']} CPUs")


if __name__ == "__main__":
    main()
