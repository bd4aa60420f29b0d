"""Issue 49, Stage B (benchmarks/long_budget.py): the long-budget plan, its locally built corpus and
its CPU dry run, end to end (the device run itself needs a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import long_budget as lb
from benchmarks.convergence import main as convergence
from benchmarks.headline import SHIPPED, flag_values
from protocol.data import DataError, load_corpus
from protocol.model import PRESETS, n_params, param_shapes
from veriloco.simulate import shipped_budget

pytestmark = pytest.mark.unit


def test_the_plan_is_six_tokens_a_parameter_and_about_400x_at_h_32_and_64() -> None:
    h = lb.plan(lb.SEEDS, lb.CORPUS_DIR, "cuda", dry=False)
    assert len(h.pieces) == len(lb.ARMS) * len(lb.SEEDS) and h.pieces[0].methods == ("allreduce",)
    f = flag_values(h.pieces[0].args("x.json"))
    tokens = int(f["--steps"]) * int(f["--batch-size"]) * 64 * 4  # K = 4 workers of 128 rows x 64 tokens
    assert f["--device"] == "cuda" and f["--corpus"] == lb.CORPUS_DIR and tokens / n_params(PRESETS["small"]) > 6
    shapes, dense = param_shapes(PRESETS["small"]), 4 * n_params(PRESETS["small"])
    for arm in lb.ARMS:
        if arm.method == SHIPPED and arm.h in (32, 64):  # all-gather to 3 peers every H steps vs a ring every step
            assert 380 < arm.h * 0.5 * dense / shipped_budget(shapes, arm.rank) < 420


def test_the_corpus_is_built_from_this_machine_deterministically_and_checked(tmp_path: Path) -> None:
    a = lb.build_corpus(tmp_path / "a", 1 << 20)
    b = lb.build_corpus(tmp_path / "b", 1 << 20)
    assert a["digest"] == b["digest"] and a["n_tokens"] == 1 << 20 and a["source"] == "python-stdlib+torch"
    names = [n for n, _ in lb.corpus_sources()]
    assert names == sorted(names) and any(n.startswith("torch/") for n in names) and not any("site-packages" in n for n in names)
    assert load_corpus(tmp_path / "a", bytes.fromhex(str(a["digest"])[2:])).n_tokens == 1 << 20
    tok = tmp_path / "a" / "tokens.bin"  # one byte changed: every run on it refuses, naming the digests
    data = bytearray(tok.read_bytes())
    data[100] ^= 1
    tok.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as e:
        convergence(["--preset", "ci", "--steps", "2", "--methods", "allreduce", "--corpus", str(tmp_path / "a"),
                     "--out", str(tmp_path / "x.json"), "--quiet"])
    assert e.value.code == 2


def test_a_corpus_larger_than_the_sources_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "one.py"
    src.write_text("x = 1\n" * 1000)
    monkeypatch.setattr(lb, "corpus_sources", lambda: [("python/one.py", src)])
    with pytest.raises(DataError, match="fewer than the"):
        lb.build_corpus(tmp_path / "c", 1 << 20)


def test_the_dry_run_runs_every_arm_and_merges_them_on_its_corpus(tmp_path: Path) -> None:
    assert lb.main(["--dry-run", "--seeds", "0", "--work", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "convergence-small-long.json").read_text())
    corpus = json.loads((tmp_path / "corpus" / "corpus.json").read_text())
    assert out["config"]["corpus_digest"] == corpus["digest"] and out["K"] == 2 and out["seeds"] == [0]
    assert list(out["methods"]) == ["allreduce", "diloco", SHIPPED, f"{SHIPPED}_r163_h4", f"{SHIPPED}_r20_h1"]
    assert out["dilocox_method"] == SHIPPED and len(list((tmp_path / "work").glob("*.json"))) == len(lb.ARMS)
    # resumable: a second call runs nothing again and merges the same file
    before = (tmp_path / "convergence-small-long.json").read_text()
    assert lb.main(["--dry-run", "--seeds", "0", "--work", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "convergence-small-long.json").read_text())["per_seed"] == json.loads(before)["per_seed"]
