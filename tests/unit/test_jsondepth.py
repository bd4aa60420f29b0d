"""Deeply nested JSON from a peer is refused before parsing, never a crash of the reading node."""

import pytest
import web3  # noqa: F401  (importing it raises the recursion limit: the condition under test)

from protocol.config import ConfigError, from_json
from protocol.formats.codec import FormatError, decode_canonical_json, decode_manifest
from protocol.formats.jsondepth import json_depth

pytestmark = pytest.mark.unit

BOMB = b"[" * 99_000 + b"]" * 99_000


def test_depth_ignores_brackets_inside_strings() -> None:
    assert json_depth(b'{"a": [1, {"b": "[[[[\\"]]{{"}]}') == 3
    assert json_depth(b'"[[[["') == 0
    assert json_depth(b"[" * 500) == 65  # stops counting just past the limit
    assert json_depth(b"[[]][[[]]]") == 3


@pytest.mark.parametrize("reader", [decode_canonical_json, decode_manifest])
def test_nesting_bomb_is_a_format_error(reader) -> None:
    with pytest.raises(FormatError, match="nested deeper"):
        reader(BOMB)


def test_nesting_bomb_as_run_config() -> None:
    with pytest.raises(ConfigError, match="nested deeper"):
        from_json(BOMB)
