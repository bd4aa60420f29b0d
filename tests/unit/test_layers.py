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
    "coordinator": {"dilocox", "protocol"},
    "trainer": {"coordinator", "dilocox", "protocol"},
    "verifier": {"coordinator", "dilocox", "protocol"},
    "veriloco": {"devnet", "verifier", "trainer", "coordinator", "dilocox", "protocol"},
}


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
