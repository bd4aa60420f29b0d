"""Nesting depth of a JSON text, checked before parsing anything a peer sent.

web3 and py-evm raise Python's recursion limit to 100000 when imported, after which `json.loads` on
a few hundred KB of `[[[[...` overflows the C stack and kills the process instead of raising
RecursionError. A verifier must not die on a trainer's manifest, so every untrusted JSON text is
measured first (strings removed, then brackets counted) and refused when nested too deep.
"""

from __future__ import annotations

import re

MAX_JSON_DEPTH = 64

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(text: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """Deepest [ / { nesting outside strings; stops counting once past `limit`."""
    depth = deepest = 0
    for char in _STRING.sub(b"", text).translate(None, _NOT_BRACKETS):
        if char in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest
