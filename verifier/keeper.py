"""A verifier's own copies of the payloads it passed, put back into the store until their epoch is over.

A pass verdict vouches that the payload is available: the coordinator may not leave a passing
trainer out (the contract's `PassingOmitted`) and cannot aggregate without its payload, so a trainer
that deletes or stops serving its payload once it has passed would otherwise stall the epoch until
it aborts, at no cost to itself. Each passing verifier therefore keeps the bytes it checked in its
work directory and re-publishes them whenever the store no longer has them; with a shared
LocalStore or with IPFS the payload stays available as long as one passing verifier is honest.

Layout: `<root>/epoch-<e>/<cid>`, one file per payload, written by atomic rename, so a restarted
verifier keeps the duty it took on before the crash.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from protocol.store.backends import Store, StoreError
from protocol.types import Cid


class Keeper:
    """Held payloads by epoch: `hold` before voting pass, `restore` while the epoch is open, `release` after."""

    def __init__(self, root: Path | str, store: Store) -> None:
        self.root, self.store = Path(root), store

    def _dir(self, epoch: int) -> Path:
        return self.root / f"epoch-{epoch}"

    def hold(self, epoch: int, cid: Cid, data: bytes) -> None:
        """Keep `data` (the verified bytes of `cid`) on disk and pinned in our store."""
        d = self._dir(epoch)
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, d / cid)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._put(cid, data)  # an IPFS put pins; a LocalStore put restores a deleted object

    def drop(self, epoch: int, cid: Cid) -> None:
        """Forget one payload (its verdict was a fail: nobody needs it from us)."""
        with contextlib.suppress(FileNotFoundError):
            (self._dir(epoch) / cid).unlink()

    def epochs(self) -> list[int]:
        """Epochs with held payloads, ascending."""
        if not self.root.is_dir():
            return []
        return sorted(int(p.name.split("-")[1]) for p in self.root.glob("epoch-*") if p.is_dir())

    def held(self, epoch: int) -> list[Cid]:
        d = self._dir(epoch)
        return sorted(Cid(p.name) for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else []

    def restore(self, epoch: int) -> list[Cid]:
        """Put back every held payload of `epoch` the store no longer has; the CIDs re-published."""
        back = []
        for cid in self.held(epoch):
            if self.store.has(cid):
                continue
            self._put(cid, (self._dir(epoch) / cid).read_bytes())
            back.append(cid)
        return back

    def release(self, epoch: int) -> None:
        """The epoch is over: drop every copy held for it."""
        shutil.rmtree(self._dir(epoch), ignore_errors=True)

    def _put(self, cid: Cid, data: bytes) -> None:
        got = self.store.put(data)
        if got != cid:  # our own disk changed the bytes: never publish something else under the name
            raise StoreError(f"kept copy of {cid} now hashes to {got}; it was not re-published")

