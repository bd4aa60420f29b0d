"""The training corpus and the shard function (docs/protocol.md §7).

The default corpus is byte-level text, the Python standard library sources of the running
interpreter: real text that ships everywhere, so nothing is downloaded. It is stored as one canonical
token file (the raw bytes, i.e. uint8 tokens) plus JSON metadata; ``keccak(token file)`` identifies
it. A tokenized corpus (``protocol.tokens``: nanoGPT / llm.c files, or ``veriloco data prepare``)
has the same form with uint16 or uint32 little-endian tokens; the run config names the width. The split is deterministic: the token stream is cut into fixed blocks and every
``val_every``-th block goes to validation.

``batch(corpus, run_seed, epoch, slot, step, ...)`` is the shard function: anyone holding the corpus
recomputes exactly the batch a trainer had to train on, which is what makes replay possible.

Build the default corpus with ``python -m protocol.data OUT_DIR``.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from eth_abi import encode as abi_encode
from torch import Tensor

from protocol.digest import keccak
from protocol.errors import VerilocoError
from protocol.types import Digest

BATCH_TAG = "veriloco.batch.v1"
CORPUS_FORMAT = "veriloco.corpus.v1"
TOKENS_FILE = "tokens.bin"
META_FILE = "corpus.json"
DEFAULT_MAX_BYTES = 4 << 20
BLOCK = 4096  # split granularity (bytes)
VAL_EVERY = 20  # every 20th block is validation: 5%


LossFn = Callable[[Tensor, Tensor], Tensor]


class DataError(VerilocoError):
    """A corpus or batch request that cannot be served."""


# token width -> (bytes per token, numpy little-endian dtype, tensor dtype that holds every value)
TOKEN_DTYPES: dict[str, tuple[int, str, torch.dtype]] = {
    "uint8": (1, "u1", torch.uint8),
    "uint16": (2, "<u2", torch.int32),
    "uint32": (4, "<u4", torch.int64),
}


@dataclass(frozen=True)
class Corpus:
    """Tokens in memory; ``tokens`` is the canonical token file: headerless little-endian ``dtype``
    values (for the default byte corpus, one byte = one token). ``block`` counts tokens."""

    tokens: bytes
    block: int = BLOCK
    val_every: int = VAL_EVERY
    dtype: str = "uint8"

    def __post_init__(self) -> None:
        if self.dtype not in TOKEN_DTYPES:
            raise DataError(f"token dtype {self.dtype!r} is not one of {sorted(TOKEN_DTYPES)}")
        if len(self.tokens) % TOKEN_DTYPES[self.dtype][0]:
            raise DataError(
                f"token file of {len(self.tokens)} bytes is not a whole number of {self.dtype} tokens; "
                "is the token width right?"
            )

    @cached_property
    def digest(self) -> Digest:
        return keccak(self.tokens)

    @cached_property
    def ids(self) -> Tensor:
        """Every token as one tensor (uint8 for bytes, else int32 / int64 wide enough for the values)."""
        if self.dtype == "uint8":
            return torch.frombuffer(bytearray(self.tokens), dtype=torch.uint8)
        _, np_dtype, t_dtype = TOKEN_DTYPES[self.dtype]
        arr = np.frombuffer(self.tokens, dtype=np_dtype).astype(np.int64 if t_dtype == torch.int64 else np.int32)
        return torch.from_numpy(arr)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) // TOKEN_DTYPES[self.dtype][0]

    @cached_property
    def max_token(self) -> int:
        """The largest token id (-1 when empty): a model's vocabulary must exceed it."""
        return int(self.ids.max()) if self.n_tokens else -1

    @cached_property
    def _split(self) -> tuple[Tensor, Tensor]:
        all_ = self.ids
        blocks = all_.split(self.block)
        train = [b for i, b in enumerate(blocks) if i % self.val_every != self.val_every - 1]
        val = [b for i, b in enumerate(blocks) if i % self.val_every == self.val_every - 1]
        empty = torch.empty(0, dtype=all_.dtype)
        return (torch.cat(train) if train else empty, torch.cat(val) if val else empty)

    @property
    def train(self) -> Tensor:
        """Training tokens, all blocks but every ``val_every``-th."""
        return self._split[0]

    @property
    def val(self) -> Tensor:
        """Validation tokens, every ``val_every``-th block."""
        return self._split[1]


# ---- building (the only part that reads files) -------------------------------------------------


def stdlib_sources() -> list[Path]:
    """The running interpreter's standard-library ``.py`` files, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__")
    files = [
        p for p in root.rglob("*.py") if not any(part in skip for part in p.relative_to(root).parts)
    ]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _order_key(rel: str) -> bytes:
    # A fixed pseudo-random file order, so a size cap samples the whole library, not just "a*".
    return keccak(rel.encode())


def build_tokens(
    texts: Iterable[tuple[str, bytes]], max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[bytes, list[str]]:
    """Concatenate (name, content) documents in a fixed order until ``max_bytes``; pure.

    Documents are ordered by keccak(name) and separated by a NUL byte; the last one is truncated to
    fit the cap exactly. Returns the token bytes and the names used.
    """
    docs = sorted(texts, key=lambda nt: _order_key(nt[0]))
    out = bytearray()
    used: list[str] = []
    for name, content in docs:
        if len(out) >= max_bytes:
            break
        out += content.replace(b"\x00", b"") + b"\x00"
        used.append(name)
    return bytes(out[:max_bytes]), used


def build_corpus(
    files: Sequence[Path] | None = None, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[Corpus, dict[str, object]]:
    """Read text files (default: the stdlib sources) into a Corpus and its metadata."""
    if max_bytes < 2 * BLOCK * VAL_EVERY:
        raise DataError(f"max_bytes={max_bytes} is too small; use at least {2 * BLOCK * VAL_EVERY}")
    paths = list(files) if files is not None else stdlib_sources()
    if not paths:
        raise DataError("no source files found for the corpus; pass some text files")
    root = Path(sysconfig.get_paths()["stdlib"]) if files is None else None
    texts = []
    for p in paths:
        rel = p.relative_to(root).as_posix() if root else p.as_posix()
        texts.append((rel, p.read_bytes()))
    tokens, used = build_tokens(texts, max_bytes)
    corpus = Corpus(tokens)
    meta: dict[str, object] = {
        "format": CORPUS_FORMAT,
        "digest": "0x" + corpus.digest.hex(),
        "n_tokens": len(tokens),
        "n_train": int(corpus.train.numel()),
        "n_val": int(corpus.val.numel()),
        "block": BLOCK,
        "val_every": VAL_EVERY,
        "source": "python-stdlib" if files is None else "files",
        "python": sys.version.split()[0],
        "documents": len(used),
    }
    return corpus, meta


def write_corpus(corpus: Corpus, meta: dict[str, object], out_dir: Path) -> Path:
    """Write tokens.bin and corpus.json into ``out_dir``; returns the token file path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = out_dir / TOKENS_FILE
    tok.write_bytes(corpus.tokens)
    (out_dir / META_FILE).write_text(json.dumps(meta, sort_keys=True, indent=1) + "\n")
    return tok


def load_corpus(path: Path, expected_digest: bytes | None = None, dtype: str = "uint8") -> Corpus:
    """Load a token file (or a directory holding tokens.bin), checking its digest when given."""
    tok = path / TOKENS_FILE if path.is_dir() else path
    try:
        data = tok.read_bytes()
    except OSError as exc:
        raise DataError(
            f"cannot read corpus tokens at {tok}: {exc}; build it with `python -m protocol.data DIR`"
        ) from exc
    corpus = Corpus(data, dtype=dtype)
    if expected_digest is not None and corpus.digest != expected_digest:
        raise DataError(
            f"corpus at {tok} has digest 0x{corpus.digest.hex()}, expected 0x{bytes(expected_digest).hex()}; "
            "it is a different dataset than the run uses"
        )
    return corpus


_DEFAULT: dict[int, Corpus] = {}


def default_corpus(max_bytes: int = DEFAULT_MAX_BYTES) -> Corpus:
    """The stdlib corpus, built once per process and size."""
    if max_bytes not in _DEFAULT:
        _DEFAULT[max_bytes] = build_corpus(max_bytes=max_bytes)[0]
    return _DEFAULT[max_bytes]


# ---- shard function and evaluation (pure) ------------------------------------------------------


def batch_seed(run_seed: int, epoch: int, slot: int, step: int) -> int:
    """Generator seed of docs/protocol.md §7."""
    for name, v in (("run_seed", run_seed), ("epoch", epoch), ("slot", slot), ("step", step)):
        if not 0 <= v < 2**256:
            raise DataError(f"{name}={v} must be a uint256")
    enc = abi_encode(
        ["string", "uint256", "uint256", "uint256", "uint256"],
        [BATCH_TAG, run_seed, epoch, slot, step],
    )
    return int.from_bytes(keccak(enc)[:8], "little")


def batch(
    corpus: Corpus, run_seed: int, epoch: int, slot: int, step: int, batch_size: int, seq_len: int
) -> tuple[Tensor, Tensor]:
    """The batch trainer ``slot`` trains on at inner ``step`` of ``epoch``: (x, y) int64 (B, T)."""
    train = corpus.train
    hi = train.numel() - seq_len  # offsets o with o + seq_len + 1 <= n
    if hi <= 0 or batch_size <= 0:
        raise DataError(
            f"training split of {train.numel()} tokens cannot serve rows of {seq_len + 1}"
        )
    g = torch.Generator().manual_seed(batch_seed(run_seed, epoch, slot, step))
    offs = torch.randint(0, hi, (batch_size,), generator=g)  # (B,)
    idx = offs[:, None] + torch.arange(seq_len + 1)[None, :]  # (B, T+1)
    rows = train[idx].long()
    return rows[:, :-1], rows[:, 1:]


EVAL_SPLITS = ("selection", "heldout")


def val_batches(
    corpus: Corpus, seq_len: int, n_rows: int, batch_size: int = 16, split: str = "selection"
) -> list[tuple[Tensor, Tensor]]:
    """A fixed validation set: ``n_rows`` evenly spaced windows of the validation split.

    ``split = "heldout"`` takes the ``n_rows − 1`` windows halfway between those instead: a set
    disjoint from the default one, for confirming a choice made on it (issue 33)."""
    if split not in EVAL_SPLITS:
        raise DataError(f"eval split must be one of {', '.join(EVAL_SPLITS)}, got {split!r}")
    val = corpus.val
    hi = val.numel() - seq_len - 1
    if hi < 0:
        raise DataError(f"validation split of {val.numel()} tokens is shorter than one row")
    offs = torch.linspace(0, hi, n_rows)
    if split == "heldout":
        if n_rows < 2 or hi / (n_rows - 1) < 2 * (seq_len + 1):
            raise DataError(f"validation split of {val.numel()} tokens cannot hold held-out rows of {seq_len + 1} tokens "
                            f"between {n_rows} selection rows: use fewer eval rows (at least 2) or a larger corpus")
        offs = (offs[:-1] + offs[1:]) / 2
    return _windows(val, offs.long(), seq_len, batch_size)


def _windows(val: Tensor, offs: Tensor, seq_len: int, batch_size: int) -> list[tuple[Tensor, Tensor]]:
    idx = offs[:, None] + torch.arange(seq_len + 1)[None, :]
    rows = val[idx].long()
    return [(r[:, :-1], r[:, 1:]) for r in rows.split(batch_size)]


def eval_loss(loss: LossFn, batches: Sequence[tuple[Tensor, Tensor]]) -> float:
    """Mean loss over fixed batches, weighting each by its row count; ``loss(x, y)`` is the model."""
    total, rows = 0.0, 0
    with torch.no_grad():
        for x, y in batches:
            total += float(loss(x, y)) * x.shape[0]
            rows += x.shape[0]
    return total / max(rows, 1)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Build the default byte corpus (stdlib sources).")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    a = ap.parse_args()
    c, m = build_corpus(max_bytes=a.max_bytes)
    print(write_corpus(c, m, a.out_dir), json.dumps(m))
