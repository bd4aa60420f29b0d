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
