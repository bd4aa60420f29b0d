"""The corpus and the shard function: deterministic, identified by digest, exactly as the spec says."""

from pathlib import Path

import pytest
import torch
from eth_abi import encode

from protocol.data import (
    BATCH_TAG,
    Corpus,
    DataError,
    batch,
    batch_seed,
    build_corpus,
    build_tokens,
    default_corpus,
    eval_loss,
    load_corpus,
    val_batches,
    write_corpus,
)
from protocol.digest import keccak

pytestmark = pytest.mark.unit

SMALL = 200_000


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return default_corpus(SMALL)


def test_stdlib_corpus_is_deterministic_and_capped(corpus: Corpus) -> None:
    again, meta = build_corpus(max_bytes=SMALL)
    assert again.tokens == corpus.tokens and len(corpus.tokens) == SMALL
    assert meta["digest"] == "0x" + keccak(corpus.tokens).hex()
    assert b"def " in corpus.tokens  # it is Python source
    assert corpus.train.numel() + corpus.val.numel() == SMALL
    assert 0.03 < corpus.val.numel() / SMALL < 0.07


def test_split_is_disjoint_blocks() -> None:
    c = Corpus(bytes(i % 251 for i in range(4096 * 40)))
    val_blocks = c.val.split(4096)
    assert len(val_blocks) == 2
    assert bytes(val_blocks[0].tolist()) == c.tokens[19 * 4096 : 20 * 4096]


def test_build_tokens_order_is_name_keyed_not_input_keyed() -> None:
    docs = [("a.py", b"alpha"), ("b.py", b"beta\x00"), ("c.py", b"gamma")]
    t1, used1 = build_tokens(docs, 1000)
    t2, used2 = build_tokens(list(reversed(docs)), 1000)
    assert (t1, used1) == (t2, used2)
    assert t1.count(b"\x00") == 3  # separators only: NULs inside documents are dropped
    assert build_tokens(docs, 7)[0] == t1[:7]


def test_write_and_load_round_trip_checks_digest(tmp_path: Path, corpus: Corpus) -> None:
    _, meta = build_corpus(max_bytes=SMALL)
    write_corpus(corpus, meta, tmp_path)
    assert load_corpus(tmp_path, corpus.digest).tokens == corpus.tokens
    with pytest.raises(DataError, match="different dataset"):
        load_corpus(tmp_path, bytes(32))
    with pytest.raises(DataError, match="cannot read"):
        load_corpus(tmp_path / "missing")


def test_batch_seed_follows_spec() -> None:
    enc = encode(["string", "uint256", "uint256", "uint256", "uint256"], [BATCH_TAG, 7, 1, 2, 3])
    assert batch_seed(7, 1, 2, 3) == int.from_bytes(keccak(enc)[:8], "little")
    with pytest.raises(DataError, match="uint256"):
        batch_seed(-1, 0, 0, 0)


def test_batch_is_a_function_of_its_coordinates(corpus: Corpus) -> None:
    x, y = batch(corpus, 7, 1, 2, 3, batch_size=4, seq_len=32)
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    x2, y2 = batch(corpus, 7, 1, 2, 3, batch_size=4, seq_len=32)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    for other in [(8, 1, 2, 3), (7, 2, 2, 3), (7, 1, 3, 3), (7, 1, 2, 4)]:
        assert not torch.equal(batch(corpus, *other, batch_size=4, seq_len=32)[0], x)
    # rows are contiguous windows of the training split
    train = bytes(corpus.train.tolist())
    row = bytes(x[0].tolist()) + bytes(y[0, -1:].tolist())
    assert row in train


def test_batch_rejects_impossible_requests() -> None:
    with pytest.raises(DataError, match="cannot serve"):
        batch(Corpus(bytes(100)), 0, 0, 0, 0, batch_size=2, seq_len=200)


def test_val_batches_are_fixed_and_eval_loss_weights_rows(corpus: Corpus) -> None:
    vb = val_batches(corpus, 16, n_rows=10, batch_size=4)
    assert [b[0].shape[0] for b in vb] == [4, 4, 2]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(vb, val_batches(corpus, 16, 10, 4)))
    # a "loss" equal to the mean first token: eval_loss must be the row-weighted mean
    got = eval_loss(lambda x, y: x[:, 0].double().mean(), vb)
    want = torch.cat([b[0][:, 0] for b in vb]).double().mean().item()
    assert got == pytest.approx(want)


def test_the_held_out_eval_rows_are_disjoint_from_the_selection_rows(corpus: Corpus) -> None:
    """issue 33: the held-out rows sit halfway between the selection rows, so no token of one set is in
    the other; the selection rows are the ones every earlier result used."""
    n, t = 10, 16
    sel = torch.cat([x for x, _ in val_batches(corpus, t, n)])
    held = torch.cat([x for x, _ in val_batches(corpus, t, n, split="heldout")])
    assert sel.shape == (n, t) and held.shape == (n - 1, t)
    hi = corpus.val.numel() - t - 1
    starts = torch.linspace(0, hi, n).long()
    mids = ((torch.linspace(0, hi, n)[:-1] + torch.linspace(0, hi, n)[1:]) / 2).long()
    assert all(abs(int(m) - int(s)) > t for m in mids for s in starts)  # windows of t + 1 tokens never overlap
    assert torch.equal(held[0], corpus.val[int(mids[0]): int(mids[0]) + t].long())
    with pytest.raises(DataError, match="held-out rows"):
        val_batches(corpus, t, corpus.val.numel() // (t + 1), split="heldout")
    with pytest.raises(DataError, match="eval split"):
        val_batches(corpus, t, n, split="test")
