"""Export: the checkpoint reads back exactly, transformers computes the same logits from it (where
transformers is installed), and sampling is reproducible."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from protocol.model import PRESETS, GPTConfig, forward, init_params
from veriloco.export import ExportError, export_model, hf_config, load_export, sample

pytestmark = pytest.mark.unit

GQA = GPTConfig(n_layer=2, n_head=4, d_model=32, seq_len=16, arch="llama", n_kv_head=2, d_ff=64, vocab_size=300)
CFGS = pytest.mark.parametrize("cfg", [PRESETS["tiny"], PRESETS["llama-tiny"], GQA], ids=["gpt2", "llama", "llama-gqa"])


def _params(cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """Init plus noise everywhere (norm weights too), so a wrong mapping cannot hide behind ones."""
    g = torch.Generator().manual_seed(1)
    return {n: t + 0.05 * torch.randn(t.shape, generator=g) for n, t in init_params(cfg, 0).items()}


@CFGS
def test_export_reads_back_bit_for_bit(cfg: GPTConfig, tmp_path: Path) -> None:
    p = _params(cfg)
    export_model(cfg, p, tmp_path, meta={"run": 1})
    cfg2, p2, tok = load_export(tmp_path)
    assert cfg2 == cfg and p2.keys() == p.keys()
    assert tok is not None and tok.encode("héllo\x00") == list("héllo\x00".encode())  # the byte tokenizer
    assert all(torch.equal(p[n], p2[n]) for n in p)
    assert json.loads((tmp_path / "config.json").read_text()) == hf_config(cfg)
    (tmp_path / "veriloco.json").unlink()
    with pytest.raises(ExportError, match="not a veriloco export"):
        load_export(tmp_path)


@CFGS
def test_transformers_computes_the_same_logits(cfg: GPTConfig, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    p = _params(cfg)
    export_model(cfg, p, tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), torch_dtype=torch.float32)
    model.eval()
    want = "LlamaForCausalLM" if cfg.arch == "llama" else "GPT2LMHeadModel"
    assert type(model).__name__ == want
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = model(x).logits
    ours = forward(cfg, p, x)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf_tok("héllo wörld\n")["input_ids"] == list("héllo wörld\n".encode())


def test_sampling_is_reproducible_and_respects_the_context() -> None:
    cfg = PRESETS["llama-tiny"]
    p = _params(cfg)
    a = sample(cfg, p, [1, 2, 3], 80, seed=5)
    assert a == sample(cfg, p, [1, 2, 3], 80, seed=5) and len(a) == 80  # 83 > seq_len 64: context is cropped
    assert a != sample(cfg, p, [1, 2, 3], 80, seed=6)
    greedy = sample(cfg, p, [1, 2, 3], 5, temperature=0)
    assert greedy == sample(cfg, p, [1, 2, 3], 5, temperature=0, seed=9)
    assert all(0 <= t < cfg.vocab_size for t in a)


def test_cli_prepare_train_export_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The user's path: text files -> BPE corpus -> a few Llama steps -> export -> sample text."""
    import sysconfig

    from dilocox.inner import configure_determinism
    from dilocox.round import RoundSpec, start_state, train_epoch
    from protocol.config import RunConfig
    from protocol.formats.codec import save_state
    from protocol.run import bind_corpus, corpus_for
    from protocol.store.backends import LocalStore
    from protocol.tokens import load_corpus_dir
    from veriloco.cli import main

    files = sorted((Path(sysconfig.get_paths()["stdlib"]) / "json").glob("*.py"))
    files += sorted((Path(sysconfig.get_paths()["stdlib"]) / "email").glob("*.py"))
    assert main(["data", "prepare", *map(str, files), "--vocab", "320", "--out", str(tmp_path / "c")]) == 0
    made = json.loads(capsys.readouterr().out)
    cd = load_corpus_dir(tmp_path / "c")
    assert made["digest"] == "0x" + cd.corpus.digest.hex() and made["vocab_size"] == 320

    configure_determinism(1)
    store = LocalStore(tmp_path / "store")
    cfg = bind_corpus(RunConfig().replace(model={"preset": "llama-tiny"}), store, cd.corpus, cd.tokenizer)
    spec = RoundSpec.from_config(cfg)
    s0 = start_state(spec, init_params(spec.model, 0), None, None)
    end = train_epoch(s0, spec, corpus_for(cfg, store), epoch=0, slot=0, steps=2).end
    (tmp_path / "state.safetensors").write_bytes(save_state(end))
    (tmp_path / "run.json").write_bytes(cfg.to_json())

    assert main(["export", "--state", str(tmp_path / "state.safetensors"), "--config", str(tmp_path / "run.json"),
                 "--tokenizer", str(tmp_path / "c" / "tokenizer.json"), "--out", str(tmp_path / "m")]) == 0
    assert json.loads(capsys.readouterr().out)["class"] == "LlamaForCausalLM"
    cfg2, params, tok = load_export(tmp_path / "m")
    assert cfg2.vocab_size == 320 and tok is not None and tok.raw == cd.tokenizer
    assert torch.equal(params["wte.weight"], end["param/wte.weight"])
    try:
        from transformers import AutoTokenizer
    except ImportError:
        pass
    else:  # transformers reads the run's BPE as the run does
        text = 'import json\nprint(json.dumps({"a": 1}))\n'
        assert AutoTokenizer.from_pretrained(str(tmp_path / "m"))(text)["input_ids"] == tok.encode(text)
    assert main(["sample", str(tmp_path / "m"), "--prompt", "import json", "--tokens", "12", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("import json") and len(text) > len("import json\n")
    assert main(["export", "--state", str(tmp_path / "state.safetensors"), "--out", str(tmp_path / "x")]) == 2
    assert "needs --config" in capsys.readouterr().err
