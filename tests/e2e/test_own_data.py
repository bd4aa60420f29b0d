"""A whole network on users' own data: a locally trained BPE corpus and the Llama preset, then the
finalized model exported for transformers and sampled with the run's tokenizer."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import pytest
import torch

from protocol.chain.binding import Chain
from tests.fixtures.network import run_network
from veriloco.datacmd import prepare_corpus
from veriloco.export import decode_ids, export_model, finalized_model, load_export, sample
from veriloco.netdemo import DemoOptions

pytestmark = pytest.mark.e2e


def test_llama_on_a_bpe_corpus_trains_verifies_exports_and_samples(tmp_path: Path) -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((root / "json").glob("*.py")) + sorted((root / "email").glob("*.py"))
    cd = prepare_corpus([f.read_text() for f in files], 512, tmp_path / "corpus")
    seen: dict[str, Any] = {}

    def inspect(chain: Chain, store: Any, run_id: int) -> None:
        cfg, params, tok, prov = finalized_model(chain, store, run_id)
        assert cfg.model.preset == "llama-tiny" and cfg.model.vocab_size == 512
        assert cfg.data.token_dtype == "uint16" and tok == cd.tokenizer
        assert cfg.data.corpus_digest == "0x" + cd.corpus.digest.hex()
        export_model(cfg.model_config(), params, tmp_path / "model", tok, {"source": prov})
        seen["prov"], seen["params"] = prov, params

    opts = DemoOptions(trainers=2, verifiers=2, quorum=1, epochs=2, steps=8, preset="llama-tiny",
                       corpus=tmp_path / "corpus", workdir=tmp_path / "demo", report=tmp_path / "report",
                       timeout_s=600)
    s, _ = run_network(opts, inspect=inspect)
    assert s["epochs_finalized"] == 2 and s["verdicts"]["fail"] == 0 and s["slashed"] == []
    assert s["final_eval_loss"] < s["initial_eval_loss"] - 0.3
    assert seen["prov"]["epoch"] == 1
    cfg, params, tok = load_export(tmp_path / "model")
    assert all(torch.equal(params[n], seen["params"][n]) for n in params)
    assert tok is not None
    text = decode_ids(sample(cfg, params, tok.encode("import "), 20, seed=1), tok)
    assert isinstance(text, str) and text
