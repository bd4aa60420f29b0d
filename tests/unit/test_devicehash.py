"""protocol.devicehash: torch's BLAKE3 is the library's, byte for byte, at every size that changes
the tree (empty, one partial block, block and chunk edges, odd and even chunk counts, more than one
batch of chunks), for every dtype a state holds and for views; and a part digest is the same whichever
side hashes it."""

from __future__ import annotations

import os

import pytest
import torch
from blake3 import blake3

from protocol import devicehash
from protocol.devicehash import blake3_bytes, blake3_tensor
from protocol.digest import part_digest, tensor_bytes

pytestmark = pytest.mark.unit

SIZES = [0, 1, 63, 64, 65, 1023, 1024, 1025, 2047, 2048, 2049, 3072, 3073, 4096, 4097, 5 * 1024, 7 * 1024 + 5,
         8 * 1024, 9 * 1024 + 1, (1 << 16) + 3]


@pytest.mark.parametrize("n", SIZES)
def test_bytes_hash_as_the_library_does(n: int) -> None:
    data = os.urandom(n)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if n else torch.zeros(0, dtype=torch.uint8)
    assert blake3_bytes(t) == blake3(data).digest()


def test_more_chunks_than_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks are compressed in batches; the chunk counter runs on across them."""
    monkeypatch.setattr(devicehash, "BATCH_CHUNKS", 3)
    data = os.urandom(11 * 1024 + 17)
    assert blake3_bytes(torch.frombuffer(bytearray(data), dtype=torch.uint8)) == blake3(data).digest()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8])
def test_tensors_hash_their_storage_as_the_host_does(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(37, 29, generator=g) * 100).to(dtype)
    assert blake3_tensor(x) == blake3(tensor_bytes(x)).digest()
    view = x.t()[3:, ::2]  # not contiguous: both sides hash the contiguous copy
    assert blake3_tensor(view) == blake3(tensor_bytes(view)).digest()
    assert blake3_tensor(x[:0]) == blake3(b"").digest()


def test_a_part_digest_is_the_same_whichever_side_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a trainer on a GPU commits (hashed on its device) is what a CPU verifier recomputes: the
    digest's tensor hash, routed through the device code, gives the same part digest."""
    from protocol import digest

    g = torch.Generator().manual_seed(4)
    state = {"inp": torch.randn(4, 8, 16, generator=g), "g_out": torch.randn(4, 8, 16, generator=g).bfloat16()}
    host = part_digest(state)
    monkeypatch.setattr(digest, "_blake3", blake3_tensor)
    assert part_digest(state) == host


def test_rejects_what_it_cannot_hash() -> None:
    with pytest.raises(ValueError, match="1-D uint8"):
        blake3_bytes(torch.zeros(4, dtype=torch.float32))


def test_many_tensors_of_mixed_sizes_hash_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's boundaries cut into groups: many tensors, few sizes, one pass per size (its chunk
    batches crossing from one tensor into the next), each digest its own tensor's in the order given."""
    from protocol.devicehash import blake3_many

    monkeypatch.setattr(devicehash, "BATCH_CHUNKS", 2)
    g = torch.Generator().manual_seed(5)
    ts = [torch.randn(n, generator=g) for n in (900, 900, 7, 1, 900, 0, 2000)]
    assert blake3_many(ts) == [blake3(tensor_bytes(t)).digest() for t in ts]


def test_a_state_with_device_tensors_digests_as_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """part_digests sends a device's tensors through one batched device pass and the rest through the
    library; here a 'device' tensor is a CPU tensor that reports another device type."""
    from protocol import digest
    from protocol.digest import part_digests

    g = torch.Generator().manual_seed(6)
    states = [{"x": torch.randn(64, 33, generator=g), "y": torch.randn(5, generator=g)} for _ in range(3)]
    host = part_digests(states, parallel=False)
    calls: list[int] = []
    real = devicehash.blake3_many

    def spy(tensors: list[torch.Tensor]) -> list[bytes]:
        calls.append(len(tensors))
        return real(tensors)

    monkeypatch.setattr(devicehash, "blake3_many", spy)
    monkeypatch.setattr(digest, "_on_device", lambda t: t.numel() > 10)  # the big ones "on a device"
    assert part_digests(states, parallel=False) == host
    assert calls == [3]  # one call for the three device tensors; the small ones hashed by the library
