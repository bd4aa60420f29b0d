"""`veriloco data prepare|import`, `export`, `sample`: users' own data in, the trained model out.

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

    veriloco export --run 1 --out model/               # newest finalized global model, as HF checkpoint
    veriloco export --state g.safetensors --config run.toml --out model/   # a state file you hold
    veriloco sample model/ --prompt "def main(" --tokens 200

`export` writes model.safetensors + config.json that transformers loads as GPT2LMHeadModel or
LlamaForCausalLM (veriloco/export.py says how the tensors map), with the run's tokenizer.json.
`sample` generates from such a directory with veriloco's own forward pass.
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

    from veriloco.settings import add_connection_args

    e = sub.add_parser("export", help="write a global model as a Hugging Face (transformers) checkpoint")
    src = e.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", type=int, help="run id: export its newest finalized model (needs chain + store)")
    src.add_argument("--state", type=Path, help="a model or training state file (safetensors) instead")
    e.add_argument("--epoch", type=int, help="with --run: the model epoch E finalized (default: the newest)")
    e.add_argument("--config", type=Path, help="with --state: the run config (run.toml or its canonical JSON)")
    e.add_argument("--tokenizer", type=Path, help="with --state: the run's tokenizer JSON, if it has one")
    e.add_argument("--out", type=Path, required=True, help="directory to write")
    add_connection_args(e, signing=False)
    e.set_defaults(func=cmd_export)
    sm = sub.add_parser("sample", help="generate text from an exported model with the run's tokenizer")
    sm.add_argument("model", type=Path, help="directory written by `veriloco export`")
    sm.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    sm.add_argument("--tokens", type=int, default=200, help="tokens to generate")
    sm.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    sm.add_argument("--top-k", type=int, default=40, help="sample among the k likeliest (0: all)")
    sm.add_argument("--seed", type=int, default=0, help="sampling seed (same seed, same text)")
    sm.set_defaults(func=cmd_sample)


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


def _run_model(args: argparse.Namespace) -> tuple[Any, dict[str, Any], bytes | None, dict[str, object]]:
    from protocol.chain.binding import Chain
    from veriloco.export import finalized_model
    from veriloco.settings import open_store, resolve

    s = resolve(args, need_key=False, need_contract=True)
    return finalized_model(Chain(s.rpc_url, str(s.contract)), open_store(s), args.run, args.epoch)


def _state_model(args: argparse.Namespace) -> tuple[Any, dict[str, Any], bytes | None, dict[str, object]]:
    from protocol.config import ConfigError, from_json, load_toml
    from protocol.formats.codec import load_state_file
    from protocol.run import params_of

    if args.config is None:
        raise ConfigError("--state needs --config (the run config the state was trained under)")
    cfg = load_toml(args.config) if args.config.suffix == ".toml" else from_json(args.config.read_bytes())
    state = load_state_file(args.state)
    params = params_of(state) or dict(state)
    tok = args.tokenizer.read_bytes() if args.tokenizer else None
    return cfg, params, tok, {"state": args.state.name}


def cmd_export(args: argparse.Namespace) -> int:
    from veriloco.export import export_model

    cfg, params, tok, prov = _run_model(args) if args.run is not None else _state_model(args)
    model = cfg.model_config()
    export_model(model, params, args.out, tok, {"source": prov, "preset": cfg.model.preset})
    arch = "LlamaForCausalLM" if model.arch == "llama" else "GPT2LMHeadModel"
    print(json.dumps({"out": str(args.out), "class": arch, "preset": cfg.model.preset, **prov}))
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    from veriloco.export import decode_ids, encode_prompt, load_export, sample

    cfg, params, tok = load_export(args.model)
    prompt = encode_prompt(args.prompt, tok)
    out = sample(cfg, params, prompt, args.tokens, args.temperature, args.top_k, args.seed,
                 stop=tok.eot() if tok is not None else None)
    print(args.prompt + decode_ids(out, tok))
    return 0
