"""Where a node keeps its records of one run: keyed by chain id, contract address, run id and the run's birth block.

Chain id, contract address and run id alone do not name a run: a devnet started again has the same
chain id, deploys the contract from the same account at the same nonce (so at the same address) and
numbers runs from 1 again. A node that reused the old records would skip every epoch it finds
"closed" and every trainer it finds "judged". The hash of the block that created the run (the
`RunCreated` event's block) differs between such chains, so it completes the key:

    <workdir>/<chain id>-<contract>/run-<id>-<first 12 hex digits of the creation block hash>/

Each such directory holds `identity.json` naming all four, so a person can tell them apart.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from protocol.chain.binding import Chain
from protocol.errors import VerilocoError


class UnknownRunError(VerilocoError):
    """The run id does not name a run of this contract."""


@dataclass(frozen=True)
class RunIdentity:
    chain_id: int
    contract: str
    run_id: int
    created_block: int
    created_block_hash: str  # 0x-hex

    @property
    def dirname(self) -> str:
        return f"run-{self.run_id}-{self.created_block_hash[2:14]}"


def check_run(chain: Chain, run_id: int) -> None:
    """Raise UnknownRunError unless `run_id` is one of the contract's runs (ids are 1..runCount)."""
    count = chain.run_count()
    if not 1 <= run_id <= count:
        have = f"runs 1..{count}" if count else "no runs yet"
        raise UnknownRunError(
            f"run {run_id} does not exist on chain {chain.chain_id} at {chain.address} ({have}); "
            "list them with `veriloco runs`, create one with `veriloco run create`"
        )


def run_identity(chain: Chain, run_id: int) -> RunIdentity:
    """The run's full key, read from its RunCreated event."""
    check_run(chain, run_id)
    created = chain.events(["RunCreated"], run_id=run_id)
    if not created:
        raise UnknownRunError(
            f"run {run_id} exists on {chain.address} but its RunCreated event is not served by {chain.where}; "
            "use a node that keeps the chain's logs"
        )
    n = created[0].block_number
    block_hash = chain.block_hash(n)
    return RunIdentity(chain.chain_id, str(chain.address), run_id, n, "0x" + block_hash.hex())


def run_dir(chain: Chain, run_id: int, root: Path, log: Any = None) -> Path:
    """The node's directory for this run under `root` (created, with identity.json); logs where it is."""
    ident = run_identity(chain, run_id)
    base = Path(root)
    path = base / f"{ident.chain_id}-{ident.contract}" / ident.dirname
    path.mkdir(parents=True, exist_ok=True)
    marker = path / "identity.json"
    if not marker.exists():
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(ident), indent=1, sort_keys=True) + "\n")
        tmp.replace(marker)
    if log is not None:
        log("state", dir=str(path))
        legacy = base / f"run-{run_id}"
        if legacy.is_dir():
            log("legacy-state-ignored", dir=str(legacy),
                why="state written before it was keyed by chain and run; delete it once no run needs it")
    return path
