"""Users' own tokenized corpora: the token file formats the field uses, and a corpus directory.

Two input formats, both little-endian:

- **flat** (nanoGPT's prepare scripts: ``np.array(ids, dtype=np.uint16).tofile("train.bin")``): bare
  tokens, no header; the width (uint16 or uint32) is not in the file and must be given.
- **llm.c shards**: a header of 256 int32 (``[0]`` magic, ``[1]`` version, ``[2]`` token count, the
  rest zero), then the tokens: magic 20240520 version 1 holds uint16 (GPT-2 vocabularies), magic
  20240801 version 7 holds uint32 (Llama 3). The header is checked against the file size.

Either way the run trains on one canonical token file: the tokens of all inputs, concatenated in the
order given, headerless (``protocol.data.Corpus``). A corpus directory, what ``veriloco data
prepare`` / ``import`` write and ``veriloco run create --corpus`` reads, holds that file
(``tokens.bin``), ``corpus.json`` (digest, width, vocabulary) and the tokenizer (``tokenizer.json``)
when there is one.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from protocol.data import META_FILE, TOKEN_DTYPES, TOKENS_FILE, Corpus, DataError
from protocol.digest import keccak

TOKENIZER_FILE = "tokenizer.json"
TOKENIZED_FORMAT = "veriloco.corpus.tokens.v1"
LLMC_HEADER_BYTES = 256 * 4
# magic -> (version, token dtype), as llm.c's dev/data/data_common.py writes them
LLMC_MAGIC: dict[int, tuple[int, str]] = {20240520: (1, "uint16"), 20240801: (7, "uint32")}


def llmc_header(path: Path, head: bytes, size: int) -> tuple[int, str] | None:
    """(token count, dtype) when ``head`` is a consistent llm.c header for a file of ``size`` bytes."""
    if len(head) < LLMC_HEADER_BYTES:
        return None
    magic, version, count = struct.unpack_from("<3i", head)
    if magic not in LLMC_MAGIC:
        return None
    want_version, dtype = LLMC_MAGIC[magic]
    width = TOKEN_DTYPES[dtype][0]
    if version != want_version or count < 0 or size != LLMC_HEADER_BYTES + count * width:
        raise DataError(
            f"{path} has llm.c magic {magic} but version {version} / token count {count} do not "
            f"match its {size} bytes (expected version {want_version}, {LLMC_HEADER_BYTES} + "
            f"count * {width} bytes); the shard is truncated or not an llm.c file"
        )
    return count, dtype


def read_token_files(paths: Sequence[Path], dtype: str | None = None, fmt: str = "auto") -> tuple[bytes, str]:
    """Concatenate token files into one canonical (headerless) token string; returns (bytes, dtype).

    ``fmt`` is ``auto`` (llm.c when the file starts with a valid llm.c header, else flat),
    ``llmc`` or ``flat``. Flat files need ``dtype``; all inputs must share one width.
    """
    if fmt not in ("auto", "llmc", "flat"):
        raise DataError(f"token file format must be auto, llmc or flat, got {fmt!r}")
    if dtype is not None and dtype not in ("uint16", "uint32"):
        raise DataError(f"a tokenized corpus is uint16 or uint32, got {dtype!r}")
    if not paths:
        raise DataError("no token files given")
    out, widths = bytearray(), set()
    for p in paths:
        try:
            raw = p.read_bytes()
        except OSError as exc:
            raise DataError(f"cannot read token file {p}: {exc}") from exc
        hdr = llmc_header(p, raw[:LLMC_HEADER_BYTES], len(raw)) if fmt != "flat" else None
        if hdr is not None:
            widths.add(hdr[1])
            out += raw[LLMC_HEADER_BYTES:]
            continue
        if fmt == "llmc":
            raise DataError(f"{p} does not start with an llm.c header (magic {sorted(LLMC_MAGIC)})")
        if dtype is None:
            raise DataError(f"{p} is a flat token file: say its width with --dtype uint16 or uint32")
        if len(raw) % TOKEN_DTYPES[dtype][0]:
            raise DataError(f"{p} has {len(raw)} bytes, not a whole number of {dtype} tokens")
        widths.add(dtype)
        out += raw
    if len(widths) != 1:
        raise DataError(f"token files mix widths {sorted(widths)}; convert them to one width first")
    return bytes(out), widths.pop()


def write_llmc(path: Path, tokens: bytes, dtype: str) -> None:
    """Write tokens as one llm.c shard (the format ``read_token_files`` reads back)."""
    magic = next(m for m, (_, d) in LLMC_MAGIC.items() if d == dtype)
    n = len(tokens) // TOKEN_DTYPES[dtype][0]
    header = struct.pack("<3i", magic, LLMC_MAGIC[magic][0], n) + bytes(LLMC_HEADER_BYTES - 12)
    path.write_bytes(header + tokens)


def tokenizer_vocab_size(raw: bytes) -> int:
    """1 + the largest id a Hugging Face ``tokenizers`` JSON assigns (model vocab and added tokens)."""
    try:
        doc = json.loads(raw)
        ids = list(doc["model"]["vocab"].values()) + [t["id"] for t in doc.get("added_tokens") or []]
        return 1 + max(int(i) for i in ids)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"not a tokenizers JSON file with a vocabulary: {exc}") from None


@dataclass(frozen=True)
class CorpusDir:
    """A corpus directory as loaded: the corpus, its tokenizer JSON (or None) and vocabulary size."""

    corpus: Corpus
    tokenizer: bytes | None
    vocab_size: int
    meta: dict[str, object]


def write_corpus_dir(out: Path, tokens: bytes, dtype: str, tokenizer: bytes | None,
                     vocab_size: int, extra: dict[str, object] | None = None) -> CorpusDir:
    """Write tokens.bin, tokenizer.json (when given) and corpus.json; checks ids against the vocabulary."""
    corpus = Corpus(tokens, dtype=dtype)
    if corpus.val.numel() == 0:
        raise DataError(
            f"{corpus.n_tokens} tokens leave no validation block; a corpus needs at least "
            f"{corpus.block * corpus.val_every} tokens (give more text)"
        )
    if corpus.max_token >= vocab_size:
        raise DataError(f"token id {corpus.max_token} is outside the vocabulary of {vocab_size}")
    out.mkdir(parents=True, exist_ok=True)
    (out / TOKENS_FILE).write_bytes(tokens)
    meta: dict[str, object] = {
        "format": TOKENIZED_FORMAT,
        "digest": "0x" + corpus.digest.hex(),
        "token_dtype": dtype,
        "n_tokens": corpus.n_tokens,
        "n_train": int(corpus.train.numel()),
        "n_val": int(corpus.val.numel()),
        "vocab_size": vocab_size,
        "tokenizer_digest": "0x" + keccak(tokenizer).hex() if tokenizer is not None else "",
        **(extra or {}),
    }
    if tokenizer is not None:
        (out / TOKENIZER_FILE).write_bytes(tokenizer)
    (out / META_FILE).write_text(json.dumps(meta, sort_keys=True, indent=1) + "\n")
    return CorpusDir(corpus, tokenizer, vocab_size, meta)


def load_corpus_dir(path: Path) -> CorpusDir:
    """Read a corpus directory; tokens and tokenizer are checked against corpus.json's digests."""
    try:
        meta = json.loads((path / META_FILE).read_text())
        tokens = (path / TOKENS_FILE).read_bytes()
    except (OSError, ValueError) as exc:
        raise DataError(
            f"{path} is not a corpus directory ({TOKENS_FILE} + {META_FILE}): {exc}; "
            "make one with `veriloco data prepare` or `veriloco data import`"
        ) from None
    corpus = Corpus(tokens, dtype=str(meta.get("token_dtype", "uint8")))
    if meta.get("digest") != "0x" + corpus.digest.hex():
        raise DataError(f"{path / TOKENS_FILE} does not match the digest in {META_FILE}; rebuild the directory")
    tok_path = path / TOKENIZER_FILE
    tokenizer = tok_path.read_bytes() if tok_path.exists() else None
    if tokenizer is not None and meta.get("tokenizer_digest") != "0x" + keccak(tokenizer).hex():
        raise DataError(f"{tok_path} does not match the tokenizer digest in {META_FILE}")
    vocab = int(meta.get("vocab_size") or 256)
    return CorpusDir(corpus, tokenizer, vocab, meta)
