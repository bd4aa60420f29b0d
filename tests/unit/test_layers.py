"""The rooms import downward only (docs/architecture.md, Layers): a new arrow up is a test failure, not a review note."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
# each room and the rooms it may import besides itself; function-level imports count too
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "devnet": {"protocol"},
    "dilocox": {"protocol"},
    "public": {"dilocox", "protocol"},
    # the roles are peers over the public room: none imports another (issue 50)
    "coordinator": {"public", "dilocox", "protocol"},
    "trainer": {"public", "dilocox", "protocol"},
    "verifier": {"public", "dilocox", "protocol"},
    "veriloco": {"devnet", "verifier", "trainer", "coordinator", "public", "dilocox", "protocol"},
}
# dilocox/ is the math every role replays: of protocol/ it may read shapes, digests and formats, never
# the chain, the store or a run (those are what public/ reads)
DILOCOX_FORBIDDEN = ("protocol.chain", "protocol.store", "protocol.run")


def imported_rooms(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(ALLOWED)


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_a_room_imports_only_the_rooms_below_it(room: str) -> None:
    files = sorted((ROOT / room).rglob("*.py"))
    assert files, f"{room}/ has no modules"
    upward = {f"{f.relative_to(ROOT)} imports {r}" for f in files for r in imported_rooms(f) - ALLOWED[room] - {room}}
    assert not upward, sorted(upward)


def test_the_allowed_graph_has_no_circle() -> None:
    def reaches(a: str, b: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(n == b or (n not in seen and reaches(n, b, seen | {n})) for n in ALLOWED[a])

    assert not [r for r in ALLOWED if reaches(r, r)]


def test_dilocox_reads_no_chain_store_or_run() -> None:
    found = []
    for f in sorted((ROOT / "dilocox").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            found += [f"{f.relative_to(ROOT)} imports {n}" for n in names
                      if any(n == m or n.startswith(m + ".") for m in DILOCOX_FORBIDDEN)]
    assert not found, found
