"""Use what was trained: a global model as a Hugging Face checkpoint, and text sampled from it.

``export_model`` writes ``model.safetensors`` and ``config.json`` in the layout of ``transformers``'
``GPT2LMHeadModel`` (gpt2 presets) or ``LlamaForCausalLM`` (llama presets), plus the run's
``tokenizer.json`` when it has one and ``veriloco.json`` (the model config, so ``sample`` needs no
``transformers``). The shapes map one to one, with these conversions:

- GPT-2: HF's Conv1D stores weights as (in, out), so every block matrix is transposed; veriloco's
  norms and linears have no biases, HF's GPT-2 has them, so they are written as zeros; the MLP uses
  exact GELU (``activation_function = "gelu"``); the LM head is untied from the embedding.
- Llama: names only (``blocks.i.attn_q`` -> ``model.layers.i.self_attn.q_proj``, ...); rotary
  embeddings use the same half-split layout as HF, so q/k need no permutation; untied LM head.

Loading in ``transformers``: ``AutoModelForCausalLM.from_pretrained(DIR)`` and
``AutoTokenizer.from_pretrained(DIR)`` (``tokenizer_config.json`` names ``PreTrainedTokenizerFast``).
A byte-level run gets a byte tokenizer JSON (id = byte value, ``protocol.tokenizer.byte_tokenizer``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from protocol.chain.binding import Chain, Phase
from protocol.config import RunConfig, from_json
from protocol.digest import keccak
from protocol.errors import VerilocoError
from protocol.model import GPTConfig, check_params, forward, param_shapes
from protocol.run import MAX_CONFIG_BYTES, RunError, load_model, params_of, tokenizer_for
from protocol.store.backends import Store
from protocol.tokenizer import EOT, Tokenizer, byte_tokenizer

WEIGHTS, HF_CONFIG, OWN_CONFIG, TOKENIZER = "model.safetensors", "config.json", "veriloco.json", "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"


class ExportError(VerilocoError):
    """An export directory or model that cannot be written or read back."""


def _gpt2_map(cfg: GPTConfig) -> dict[str, tuple[str, bool]]:
    """veriloco name -> (HF GPT-2 name, transposed)."""
    m = {"wte.weight": ("transformer.wte.weight", False), "wpe.weight": ("transformer.wpe.weight", False),
         "ln_f.weight": ("transformer.ln_f.weight", False), "lm_head.weight": ("lm_head.weight", False)}
    for i in range(cfg.n_layer):
        b, h = f"blocks.{i}.", f"transformer.h.{i}."
        m |= {b + "ln_1.weight": (h + "ln_1.weight", False), b + "ln_2.weight": (h + "ln_2.weight", False),
              b + "attn_qkv.weight": (h + "attn.c_attn.weight", True),
              b + "attn_proj.weight": (h + "attn.c_proj.weight", True),
              b + "mlp_fc.weight": (h + "mlp.c_fc.weight", True), b + "mlp_proj.weight": (h + "mlp.c_proj.weight", True)}
    return m


def _llama_map(cfg: GPTConfig) -> dict[str, tuple[str, bool]]:
    m = {"wte.weight": ("model.embed_tokens.weight", False), "ln_f.weight": ("model.norm.weight", False),
         "lm_head.weight": ("lm_head.weight", False)}
    parts = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_proj": "self_attn.o_proj",
             "mlp_gate": "mlp.gate_proj", "mlp_up": "mlp.up_proj", "mlp_proj": "mlp.down_proj"}
    for i in range(cfg.n_layer):
        m |= {f"blocks.{i}.{a}.weight": (f"model.layers.{i}.{b}.weight", False) for a, b in parts.items()}
    return m


def name_map(cfg: GPTConfig) -> dict[str, tuple[str, bool]]:
    return _llama_map(cfg) if cfg.arch == "llama" else _gpt2_map(cfg)


def hf_tensors(cfg: GPTConfig, params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The parameters under transformers' names and layouts (GPT-2's absent biases as zeros)."""
    check_params(cfg, dict(params))
    out = {hf: (params[n].t() if tr else params[n]).contiguous().clone() for n, (hf, tr) in name_map(cfg).items()}
    if cfg.arch == "gpt2":
        d = cfg.d_model
        sizes = {"ln_1": d, "ln_2": d, "attn.c_attn": 3 * d, "attn.c_proj": d, "mlp.c_fc": cfg.ffn, "mlp.c_proj": d}
        for i in range(cfg.n_layer):
            out |= {f"transformer.h.{i}.{k}.bias": torch.zeros(n) for k, n in sizes.items()}
        out["transformer.ln_f.bias"] = torch.zeros(d)
    return out


def hf_config(cfg: GPTConfig, eot: int | None = None) -> dict[str, object]:
    """config.json for transformers' GPT2LMHeadModel or LlamaForCausalLM."""
    common: dict[str, object] = {"vocab_size": cfg.vocab_size, "tie_word_embeddings": False, "torch_dtype": "float32"}
    if eot is not None:
        common |= {"bos_token_id": eot, "eos_token_id": eot}
    if cfg.arch == "llama":
        return common | {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg.d_model,
            "intermediate_size": cfg.ffn, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "max_position_embeddings": cfg.seq_len,
            "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        }
    return common | {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": cfg.d_model, "n_layer": cfg.n_layer,
        "n_head": cfg.n_head, "n_inner": cfg.ffn, "n_positions": cfg.seq_len, "n_ctx": cfg.seq_len,
        "activation_function": "gelu", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "attn_pdrop": 0.0, "scale_attn_weights": True,
    }


def export_model(cfg: GPTConfig, params: Mapping[str, Tensor], out: Path, tokenizer: bytes | None = None,
                 meta: Mapping[str, object] | None = None) -> Path:
    """Write the export directory (a byte-level run, ``tokenizer=None``, gets the byte tokenizer); returns it."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer if tokenizer is not None else byte_tokenizer()
    eot = Tokenizer(tokenizer).eot()
    save_file(hf_tensors(cfg, params), str(out / WEIGHTS), metadata={"format": "pt"})
    (out / HF_CONFIG).write_text(json.dumps(hf_config(cfg, eot), indent=1, sort_keys=True) + "\n")
    (out / OWN_CONFIG).write_text(json.dumps({"model": asdict(cfg), **(meta or {})}, indent=1, sort_keys=True) + "\n")
    (out / TOKENIZER).write_bytes(tokenizer)
    tc: dict[str, object] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.seq_len}
    if eot is not None:
        tc |= {"eos_token": EOT, "bos_token": EOT}
    (out / TOKENIZER_CONFIG).write_text(json.dumps(tc, indent=1, sort_keys=True) + "\n")
    return out


def load_export(path: Path) -> tuple[GPTConfig, dict[str, Tensor], Tokenizer | None]:
    """Read an export directory back into veriloco's config and parameter names."""
    try:
        own = json.loads((path / OWN_CONFIG).read_text())
        cfg = GPTConfig(**own["model"])
        hf = load_file(str(path / WEIGHTS))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ExportError(f"{path} is not a veriloco export ({WEIGHTS} + {OWN_CONFIG}): {exc}") from None
    try:
        params = {n: (hf[h].t() if tr else hf[h]).contiguous() for n, (h, tr) in name_map(cfg).items()}
    except KeyError as exc:
        raise ExportError(f"{path / WEIGHTS} lacks tensor {exc}") from None
    check_params(cfg, params)
    tok_path = path / TOKENIZER
    return cfg, params, Tokenizer(tok_path.read_bytes()) if tok_path.exists() else None


def finalized_model(chain: Chain, store: Store, run_id: int, epoch: int | None = None
                    ) -> tuple[RunConfig, dict[str, Tensor], bytes | None, dict[str, object]]:
    """(run config, params, tokenizer JSON or None, provenance) of the model ``epoch`` finalized (default:
    the newest finalized one); config, model and tokenizer are each checked against their digests."""
    info = chain.run_info(run_id)
    raw = store.get(info.params.config_cid, max_size=MAX_CONFIG_BYTES)
    if keccak(raw) != info.params.config_digest:
        raise RunError(f"run {run_id}'s config does not hash to the on-chain digest")
    cfg = from_json(raw)
    for ep in [epoch] if epoch is not None else range(info.next_epoch - 1, -1, -1):
        st = chain.epoch_status(run_id, ep)
        if st.phase is Phase.FINALIZED:
            digest = chain.epoch_times(run_id, ep).model_digest
            state = load_model(store, st.model_cid, digest, param_shapes(cfg.model_config()))
            tok = tokenizer_for(cfg, store).raw if cfg.data.tokenizer_cid else None
            prov: dict[str, object] = {
                "run": run_id, "epoch": ep, "model_cid": st.model_cid, "model_digest": "0x" + bytes(digest).hex(),
                "config_digest": "0x" + bytes(info.params.config_digest).hex(), "contract": chain.address,
            }
            return cfg, params_of(state), tok, prov
    raise RunError(f"run {run_id} has no finalized model" + (f" for epoch {epoch}" if epoch is not None else " yet"))


@torch.no_grad()
def sample(cfg: GPTConfig, params: Mapping[str, Tensor], prompt: list[int], n_tokens: int,
           temperature: float = 0.8, top_k: int = 40, seed: int = 0, stop: int | None = None) -> list[int]:
    """Autoregressive sampling (temperature, top-k; greedy at temperature 0), reproducible from ``seed``."""
    if not prompt:
        raise ExportError("sampling needs a prompt of at least one token")
    g = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    p = dict(params)
    for _ in range(n_tokens):
        ctx = torch.tensor([ids[-cfg.seq_len:]])
        logits = forward(cfg, p, ctx)[0, -1]  # (V,)
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if 0 < top_k < logits.numel():
                kth = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(logits.softmax(-1), 1, generator=g))
        ids.append(nxt)
        if stop is not None and nxt == stop:
            break
    return ids[len(prompt):]


def encode_prompt(text: str, tok: Tokenizer | None) -> list[int]:
    return tok.encode(text) if tok is not None else list(text.encode())


def decode_ids(ids: list[int], tok: Tokenizer | None) -> str:
    return tok.decode(ids) if tok is not None else bytes(i for i in ids if i < 256).decode("utf-8", "replace")

