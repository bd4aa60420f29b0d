"""A run's tokenizer: a Hugging Face ``tokenizers`` JSON file, trained locally and content-addressed.

The JSON bytes are what the run commits to (``data.tokenizer_digest``); whoever holds them encodes
and decodes exactly as the corpus was made. ``train_bpe`` builds a byte-level BPE (GPT-2 style: any
text round-trips, no unknown token) from local text only; nothing is downloaded. ``tokenizers`` is
imported on use, so nodes of byte-level runs never load it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from protocol.data import DataError
from protocol.digest import keccak
from protocol.types import Digest

EOT = "<|endoftext|>"  # separates documents; id 0 in a tokenizer made by train_bpe
MIN_VOCAB = 257  # the 256 byte symbols and EOT


def _lib() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise DataError("the `tokenizers` package is needed for tokenized corpora; pip install tokenizers") from None
    return tokenizers


def train_bpe(texts: Iterable[str], vocab_size: int) -> bytes:
    """Train a byte-level BPE with ``vocab_size`` entries (EOT included) on ``texts``; the JSON bytes."""
    if vocab_size < MIN_VOCAB:
        raise DataError(f"vocabulary of {vocab_size} is too small; byte-level BPE needs at least {MIN_VOCAB}")
    tk = _lib()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok.to_str().encode()  # type: ignore[no-any-return]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, the alphabet of ``tokenizers``' ByteLevel."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


def byte_tokenizer() -> bytes:
    """The byte-level runs' tokenizer as a ``tokenizers`` JSON: id = byte value, no merges.

    Written into exports of byte-level runs, so their users load a tokenizer like any other.
    """
    tk = _lib()
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = tk.decoders.ByteLevel()
    return tok.to_str().encode()  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Tokenizer:
    """A tokenizer JSON file, identified by ``keccak`` of its bytes."""

    raw: bytes

    @cached_property
    def digest(self) -> Digest:
        return keccak(self.raw)

    @cached_property
    def _tok(self) -> Any:
        try:
            return _lib().Tokenizer.from_str(self.raw.decode())
        except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for bad JSON
            raise DataError(f"not a usable tokenizers JSON file: {exc}") from None

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def eot(self) -> int | None:
        """The id of the document separator, if the tokenizer has one."""
        return self._tok.token_to_id(EOT)  # type: ignore[no-any-return]

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def encode_documents(self, docs: Sequence[str]) -> list[int]:
        """Documents encoded in order, each followed by EOT (when the tokenizer has one)."""
        eot = self.eot()
        out: list[int] = []
        for enc in self._tok.encode_batch(list(docs)):
            out += enc.ids
            if eot is not None:
                out.append(eot)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))


def load_tokenizer(raw: bytes, expected_digest: bytes | None = None) -> Tokenizer:
    """A tokenizer from its JSON bytes, checked against the digest the run committed to."""
    t = Tokenizer(raw)
    if expected_digest is not None and t.digest != expected_digest:
        raise DataError(
            f"tokenizer has digest 0x{t.digest.hex()}, the run expects 0x{bytes(expected_digest).hex()}"
        )
    return t
