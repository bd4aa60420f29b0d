"""The state digest is canonical: order-free, sensitive to every byte, name, dtype and shape."""

import pytest
import torch

from protocol.digest import keccak, state_digest

pytestmark = pytest.mark.unit


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "param/w": torch.randn(4, 3, generator=g),
        "adam.m/w": torch.zeros(4, 3),
        "meta/step": torch.tensor([7], dtype=torch.int64),
    }


def test_keccak_matches_evm_reference() -> None:
    assert keccak(b"").hex() == "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470"


def test_digest_ignores_insertion_order_and_storage() -> None:
    s = _state()
    reordered = {k: s[k] for k in reversed(list(s))}
    reordered["param/w"] = s["param/w"].t().contiguous().t()  # same values, other strides
    assert state_digest(s) == state_digest(reordered)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["param/w"].view(-1).__setitem__(5, s["param/w"].view(-1)[5] + 1e-7),
        lambda s: s.__setitem__("param/w", s["param/w"].reshape(3, 4)),
        lambda s: s.__setitem__("param/w", s["param/w"].double()),
        lambda s: s.__setitem__("param/v", s.pop("param/w")),
        lambda s: s["meta/step"].add_(1),
    ],
)
def test_digest_changes_with_any_field(change) -> None:
    s = _state()
    before = state_digest(s)
    change(s)
    assert state_digest(s) != before


def test_unsupported_dtype_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unsupported dtype"):
        state_digest({"x": torch.zeros(2, dtype=torch.complex64)})


def test_part_digest_has_the_state_layout_under_its_own_tag_and_hash() -> None:
    import hashlib

    from blake3 import blake3

    from protocol.digest import (
        _named_digests,
        part_digest,
        part_digests,
        state_digest,
        tensor_bytes,
    )

    s = {"b": torch.arange(6, dtype=torch.float32).reshape(2, 3), "a": torch.ones(1, dtype=torch.int64)}
    assert part_digest(s) == part_digest(dict(reversed(list(s.items()))))  # independent of dict order
    assert part_digest(s) != state_digest(s)
    assert [part_digest(s)] == _named_digests([s], b"veriloco.part.v1", lambda t: blake3(tensor_bytes(t)).digest())
    assert [state_digest(s)] == _named_digests([s], b"veriloco.state.v1", lambda t: hashlib.sha256(tensor_bytes(t)).digest())
    # hashed together (over the pool when large) or one by one: the same digests, in order
    many = [{"x": torch.full((600, 512), float(i))} for i in range(4)] + [s, {}]
    assert part_digests(many) == [part_digest(m) for m in many]



def test_part_digests_are_the_same_on_the_pool_and_on_one_thread() -> None:
    """Where the bytes are hashed is the node's choice (its torch thread count), never the digest's."""
    from protocol.digest import part_digests

    g = torch.Generator().manual_seed(3)
    states = [{"a": torch.randn(300_000, generator=g), "b": torch.randn(7, generator=g)}, {"x": torch.randn(90_000, generator=g)}]
    pooled = part_digests(states, parallel=True)  # over a megabyte: the pool hashes it
    assert pooled == part_digests(states, parallel=False)
    torch.set_num_threads(1)
    assert part_digests(states) == pooled
