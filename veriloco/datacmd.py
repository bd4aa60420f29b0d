"""`veriloco data prepare|import`: users' own data as a corpus directory a run can publish.

    veriloco data prepare notes/*.txt --vocab 8192 --out corpus/      # train a BPE here, tokenize
    veriloco data import train.bin --dtype uint16 --tokenizer tok.json --out corpus/   # nanoGPT file
    veriloco data import fineweb_train_*.bin --tokenizer tok.json --out corpus/        # llm.c shards
    veriloco run create --config run.toml --corpus corpus/ --account 0

`prepare` trains a byte-level BPE with `tokenizers` on the given text files only (nothing is
downloaded), encodes every file as one document followed by <|endoftext|>, and writes tokens.bin
(uint16, or uint32 past 65,536 entries), tokenizer.json and corpus.json. `import` takes token
files the field already has (headerless nanoGPT files, llm.c shards, detected by their header) and
the tokenizer JSON that made them. `run create --corpus` publishes both and commits their digests,
width and vocabulary in the run config. Without --corpus a run trains on the stdlib byte corpus.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from protocol.data import DataError
from protocol.tokenizer import Tokenizer, train_bpe
from protocol.tokens import CorpusDir, read_token_files, tokenizer_vocab_size, write_corpus_dir


def register(sub: Any) -> None:
    d = sub.add_parser("data", help="turn your own text or token files into a run corpus", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    dsub = d.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    p = dsub.add_parser("prepare", help="train a BPE tokenizer on text files and tokenize them")
    p.add_argument("files", type=Path, nargs="+", help="UTF-8 text files, one document each, in this order")
    p.add_argument("--vocab", type=int, required=True, help="vocabulary size, <|endoftext|> included (>= 257)")
    p.add_argument("--out", type=Path, required=True, help="corpus directory to write")
    p.set_defaults(func=cmd_prepare)
    i = dsub.add_parser("import", help="make a corpus directory from nanoGPT / llm.c token files")
    i.add_argument("files", type=Path, nargs="+", help="token files, concatenated in this order")
    i.add_argument("--format", dest="fmt", choices=["auto", "flat", "llmc"], default="auto",
                   help="auto: llm.c when the file has its header, else flat")
    i.add_argument("--dtype", choices=["uint16", "uint32"], help="width of flat (headerless) files")
    i.add_argument("--tokenizer", type=Path, help="the tokenizers JSON that produced the tokens")
    i.add_argument("--vocab", type=int, help="vocabulary size (default: the tokenizer's)")
    i.add_argument("--out", type=Path, required=True, help="corpus directory to write")
    i.set_defaults(func=cmd_import)


def prepare_corpus(docs: Sequence[str], vocab: int, out: Path, sources: Sequence[str] = ()) -> CorpusDir:
    """Train a BPE on ``docs``, encode them (each followed by EOT) and write the corpus directory."""
    if not docs:
        raise DataError("no text to prepare a corpus from")
    raw = train_bpe(docs, vocab)
    tok = Tokenizer(raw)
    ids = tok.encode_documents(docs)
    dtype = "uint16" if tok.vocab_size <= 1 << 16 else "uint32"
    import numpy as np

    tokens = np.asarray(ids, dtype="<u2" if dtype == "uint16" else "<u4").tobytes()
    extra: dict[str, object] = {"source": "veriloco data prepare", "documents": len(docs)}
    if sources:
        extra["files"] = list(sources)
    return write_corpus_dir(out, tokens, dtype, raw, tok.vocab_size, extra)


def _read_texts(files: Sequence[Path]) -> list[str]:
    texts = []
    for f in files:
        try:
            texts.append(f.read_bytes().decode("utf-8", errors="replace"))
        except OSError as exc:
            raise DataError(f"cannot read {f}: {exc}") from exc
    return texts


def _report(cd: CorpusDir, out: Path) -> None:
    m = cd.meta
    print(json.dumps({"out": str(out), **{k: m[k] for k in ("digest", "token_dtype", "n_tokens", "vocab_size",
                                                                 "tokenizer_digest")}}))


def cmd_prepare(args: argparse.Namespace) -> int:
    cd = prepare_corpus(_read_texts(args.files), args.vocab, args.out, [f.name for f in args.files])
    _report(cd, args.out)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    tokens, dtype = read_token_files(args.files, args.dtype, args.fmt)
    raw = args.tokenizer.read_bytes() if args.tokenizer else None
    vocab = args.vocab or (tokenizer_vocab_size(raw) if raw is not None else 0)
    if not vocab:
        raise DataError("say the vocabulary: --tokenizer tok.json (preferred) or --vocab N")
    cd = write_corpus_dir(args.out, tokens, dtype, raw, vocab,
                          {"source": "veriloco data import", "files": [f.name for f in args.files]})
    _report(cd, args.out)
    return 0
