"""trainer/direct_io.py: the bytes of a state file are the same written past the page cache or
through it, at every size around the buffer's and the block's, and where a file system refuses
O_DIRECT the file is still written."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

import trainer.direct_io as dio
from protocol.formats.codec import iter_state, save_state

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("floats", [0, 1, dio.ALIGN // 4 - 40, dio.ALIGN // 4, dio.CHUNK // 4 - 30, dio.CHUNK // 4 + 5,
                                    2 * dio.CHUNK // 4 + dio.ALIGN])
@pytest.mark.parametrize("direct", [True, False])
def test_the_file_holds_the_canonical_bytes_at_any_size(tmp_path: Path, floats: int, direct: bool) -> None:
    state = {"a": torch.arange(floats, dtype=torch.float32), "b": torch.randn(3, 5), "c": torch.zeros(0)}
    n, used = dio.write_file(iter_state(state), tmp_path / "s", direct=direct)
    data = (tmp_path / "s").read_bytes()
    assert data == save_state(state) and n == len(data)
    assert used == (direct and bool(dio._O_DIRECT))


@pytest.mark.skipif(not dio._O_DIRECT, reason="this system has no O_DIRECT")
def test_a_file_system_that_refuses_o_direct_gets_the_same_bytes_buffered(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.open

    def refusing(path: str, flags: int, *args: int) -> int:
        if flags & dio._O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)
    state = {"w": torch.randn(1000)}
    assert dio.write_file(iter_state(state), tmp_path / "s") == (len(save_state(state)), False)
    assert (tmp_path / "s").read_bytes() == save_state(state)
