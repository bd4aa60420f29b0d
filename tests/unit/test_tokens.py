"""Users' own data: nanoGPT and llm.c token files read exactly, a locally trained BPE corpus committed
in the run config, and training on it replayed bit for bit."""

from __future__ import annotations

import struct
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from dilocox.inner import PARAM, configure_determinism
from dilocox.round import RoundSpec, start_state, train_epoch
from protocol.config import RunConfig
from protocol.data import Corpus, DataError, batch
from protocol.digest import keccak
from protocol.model import init_params
from protocol.run import RunError, bind_corpus, corpus_for, tokenizer_for
from protocol.store.backends import LocalStore
from protocol.tokenizer import EOT, Tokenizer
from protocol.tokens import LLMC_HEADER_BYTES, load_corpus_dir, read_token_files, write_llmc
from verifier.replay import check_step
from veriloco.datacmd import prepare_corpus

pytestmark = pytest.mark.unit

IDS = np.arange(0, 70_000, 7, dtype=np.int64)  # crosses 2^16 for the uint32 case


def test_flat_and_llmc_files_give_the_same_canonical_tokens(tmp_path: Path) -> None:
    ids16 = (IDS % 50_257).astype("<u2")
    (tmp_path / "train.bin").write_bytes(ids16.tobytes())  # nanoGPT: np.array(..., uint16).tofile
    write_llmc(tmp_path / "shard_000.bin", ids16[:4000].tobytes(), "uint16")
    write_llmc(tmp_path / "shard_001.bin", ids16[4000:].tobytes(), "uint16")
    flat, dt = read_token_files([tmp_path / "train.bin"], "uint16")
    shards, dt2 = read_token_files([tmp_path / "shard_000.bin", tmp_path / "shard_001.bin"])
    assert (dt, dt2) == ("uint16", "uint16") and flat == shards == ids16.tobytes()
    header = (tmp_path / "shard_000.bin").read_bytes()[:LLMC_HEADER_BYTES]
    assert struct.unpack_from("<3i", header) == (20240520, 1, 4000) and header[12:] == bytes(LLMC_HEADER_BYTES - 12)
    c = Corpus(flat, dtype="uint16")
    assert torch.equal(c.ids.long(), torch.from_numpy(IDS % 50_257))

    ids32 = IDS.astype("<u4")
    write_llmc(tmp_path / "llama.bin", ids32.tobytes(), "uint32")
    raw, dt = read_token_files([tmp_path / "llama.bin"])
    assert dt == "uint32" and struct.unpack_from("<2i", (tmp_path / "llama.bin").read_bytes()) == (20240801, 7)
    assert Corpus(raw, dtype="uint32").max_token == int(IDS.max()) > 65_535


def test_bad_token_files_are_named(tmp_path: Path) -> None:
    write_llmc(tmp_path / "s.bin", np.arange(100, dtype="<u2").tobytes(), "uint16")
    cut = tmp_path / "cut.bin"
    cut.write_bytes((tmp_path / "s.bin").read_bytes()[:-2])
    with pytest.raises(DataError, match="truncated"):
        read_token_files([cut])
    (tmp_path / "flat.bin").write_bytes(np.arange(100, dtype="<u2").tobytes())
    with pytest.raises(DataError, match="--dtype"):
        read_token_files([tmp_path / "flat.bin"])
    with pytest.raises(DataError, match="llm.c header"):
        read_token_files([tmp_path / "flat.bin"], "uint16", fmt="llmc")
    write_llmc(tmp_path / "w.bin", np.arange(100, dtype="<u4").tobytes(), "uint32")
    with pytest.raises(DataError, match="mix widths"):
        read_token_files([tmp_path / "s.bin", tmp_path / "w.bin"])
    with pytest.raises(DataError, match="whole number"):
        Corpus(b"\x00\x01\x02", dtype="uint16")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory):
    """A BPE corpus made here from local text (stdlib json + email sources), nothing downloaded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((root / "json").glob("*.py")) + sorted((root / "email").glob("*.py"))
    out = tmp_path_factory.mktemp("corpus")
    cd = prepare_corpus([f.read_text() for f in files], 384, out)
    return out, cd


def test_prepared_corpus_is_content_addressed_and_round_trips(prepared) -> None:
    out, cd = prepared
    again = load_corpus_dir(out)
    assert again.corpus.digest == cd.corpus.digest and again.tokenizer == cd.tokenizer
    assert again.corpus.dtype == "uint16" and again.vocab_size == 384
    tok = Tokenizer(again.tokenizer)
    assert tok.vocab_size == 384 and tok.eot() == 0 and 255 < again.corpus.max_token < 384
    text = 'def f(x):\n    return {"k": x}  # ünïcode\n'
    assert tok.decode(tok.encode(text)) == text  # byte-level: any text round-trips
    n_docs = again.meta["documents"]
    assert int((again.corpus.ids == 0).sum()) == n_docs  # one EOT after every document
    assert len(tok.encode(text)) < len(text.encode()) / 1.5  # merges compress below bytes
    (out / "tokens.bin").write_bytes(again.corpus.tokens[:-2] + b"\x01\x00")
    with pytest.raises(DataError, match="digest"):
        load_corpus_dir(out)
    (out / "tokens.bin").write_bytes(again.corpus.tokens)


def test_run_config_commits_corpus_and_tokenizer(prepared, tmp_path: Path) -> None:
    _, cd = prepared
    store = LocalStore(tmp_path / "store")
    cfg = bind_corpus(RunConfig().replace(model={"preset": "llama-tiny"}), store, cd.corpus, cd.tokenizer, cd.vocab_size)
    assert cfg.data.token_dtype == "uint16" and cfg.model.vocab_size == 384
    assert cfg.data.tokenizer_digest == "0x" + keccak(cd.tokenizer).hex()
    assert cfg.model_config().vocab_size == 384
    assert corpus_for(cfg, store).digest == cd.corpus.digest
    assert tokenizer_for(cfg, store).raw == cd.tokenizer
    with pytest.raises(RunError, match="outside the model's vocabulary"):
        corpus_for(cfg.replace(model={"vocab_size": 300}), store)
    with pytest.raises(RunError, match="no tokenizer"):
        tokenizer_for(RunConfig(), store)


@pytest.mark.parametrize("preset_name", ["tiny", "llama-tiny"])
def test_training_on_a_tokenizers_corpus_replays_bitwise(prepared, tmp_path: Path, preset_name: str) -> None:
    _, cd = prepared
    configure_determinism(1)
    store = LocalStore(tmp_path / "store")
    cfg = bind_corpus(RunConfig().replace(model={"preset": preset_name}), store, cd.corpus, cd.tokenizer)
    corpus = corpus_for(cfg, store)
    spec = RoundSpec.from_config(cfg)
    x, _ = batch(corpus, spec.run_seed, 0, 1, 0, spec.batch_size, spec.seq_len)
    assert int(x.max()) > 255  # BPE ids beyond the byte range are in play
    s0 = start_state(spec, init_params(spec.model, 0), None, None)
    assert s0[PARAM + "wte.weight"].shape == (384, spec.model.d_model)
    trace = train_epoch(s0, spec, corpus, epoch=0, slot=1, steps=3)
    assert trace.losses[-1] < trace.losses[0]
    f = check_step(s0, 0, trace.digests[1], spec, corpus, 0, 1)
    assert f.passed, f.detail
    assert not check_step(s0, 0, trace.digests[1], spec, corpus, 0, slot=2).passed  # another shard


def test_eot_constant_is_the_documented_separator() -> None:
    assert EOT == "<|endoftext|>"


def test_cli_import_of_llmc_shards_with_their_tokenizer(prepared, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`veriloco data import` turns llm.c shards + tokenizer into the same corpus `prepare` made."""
    import json

    from veriloco.cli import main

    out, cd = prepared
    half = (cd.corpus.n_tokens // 2) * 2
    write_llmc(tmp_path / "a.bin", cd.corpus.tokens[:half], "uint16")
    write_llmc(tmp_path / "b.bin", cd.corpus.tokens[half:], "uint16")
    args = ["data", "import", str(tmp_path / "a.bin"), str(tmp_path / "b.bin"),
            "--tokenizer", str(out / "tokenizer.json"), "--out", str(tmp_path / "imp")]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["digest"] == "0x" + cd.corpus.digest.hex()
    again = load_corpus_dir(tmp_path / "imp")
    assert again.corpus.tokens == cd.corpus.tokens and again.tokenizer == cd.tokenizer and again.vocab_size == 384
    assert main(["data", "import", str(tmp_path / "a.bin"), "--out", str(tmp_path / "x")]) == 2
    assert "say the vocabulary" in capsys.readouterr().err
    assert main(["data", "import", str(tmp_path / "a.bin"), "--vocab", "300", "--out", str(tmp_path / "y")]) == 2
    assert "outside the vocabulary of 300" in capsys.readouterr().err
    with pytest.raises(DataError, match="tokenizers JSON"):
        Tokenizer(b'{"not": "a tokenizer"}').encode("x")
