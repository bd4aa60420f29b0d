"""Names for the opaque values that cross layer boundaries (DESIGN.md §5: NewType, not bare str/bytes)."""

from typing import NewType

Cid = NewType("Cid", str)
Digest = NewType("Digest", bytes)  # 32 bytes
Wei = NewType("Wei", int)
RunId = NewType("RunId", int)
Address = NewType("Address", str)  # checksummed 0x-hex
