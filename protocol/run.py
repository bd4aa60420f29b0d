"""A run as every node sees it: config, corpus and global models, fetched by CID and checked by digest.

`publish_run` is the creator's side (publish corpus, initial model and config, then createRun);
`open_run` is every node's side (read the run from the contract, fetch and verify what it names).
Nothing here trusts the store: the config must hash to the on-chain digest, the corpus to the
config's digest, and each global model to the digest its epoch finalized with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from protocol.chain.binding import Chain, Phase, RunInfo, RunParams
from protocol.config import RunConfig, from_json
from protocol.data import Corpus, build_corpus
from protocol.digest import keccak, state_digest
from protocol.errors import VerilocoError
from protocol.formats.codec import load_state, save_state
from protocol.model import init_params, param_shapes
from protocol.store.backends import Store
from protocol.tokenizer import Tokenizer, load_tokenizer
from protocol.tokens import tokenizer_vocab_size
from protocol.types import Address, Cid, Digest, RunId

PARAM = "param/"
MAX_CONFIG_BYTES = 1 << 20
MAX_PAYLOAD_BYTES = 256 << 20  # a published payload is a compressed sketch: far below this


class RunError(VerilocoError):
    """A run whose published pieces are missing or do not match what the contract says."""


@dataclass(frozen=True)
class RunContext:
    run_id: RunId
    info: RunInfo
    config: RunConfig
    corpus: Corpus

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return param_shapes(self.config.model_config())


def initial_model(cfg: RunConfig) -> dict[str, Tensor]:
    """G_0 as a state: `param/*` only, from the config's preset and init seed."""
    return {PARAM + n: t for n, t in init_params(cfg.model_config(), cfg.model.init_seed).items()}


def corpus_for(cfg: RunConfig, store: Store) -> Corpus:
    """The run's corpus: fetched by CID when the config names one, else built locally; digest-checked."""
    want = bytes.fromhex(cfg.data.corpus_digest.removeprefix("0x")) if cfg.data.corpus_digest else None
    if cfg.data.corpus_cid:
        corpus = Corpus(store.get(cfg.data.corpus_cid, digest=want), dtype=cfg.data.token_dtype)
    elif cfg.data.token_dtype != "uint8":
        raise RunError("a tokenized corpus cannot be built locally: the config must name data.corpus_cid")
    else:
        corpus = build_corpus(max_bytes=cfg.data.corpus_bytes)[0]
    if want is not None and corpus.digest != want:
        raise RunError(
            f"the locally built corpus has digest 0x{corpus.digest.hex()}, the run expects "
            f"{cfg.data.corpus_digest}; fetch the run's corpus (data.corpus_cid) instead"
        )
    vocab = cfg.model_config().vocab_size
    if corpus.max_token >= vocab:
        raise RunError(
            f"the corpus holds token id {corpus.max_token}, outside the model's vocabulary of {vocab}; "
            "set model.vocab_size to the tokenizer's vocabulary"
        )
    return corpus


def tokenizer_for(cfg: RunConfig, store: Store) -> Tokenizer:
    """The run's tokenizer, fetched and digest-checked; raises RunError for a byte-level run."""
    if not cfg.data.tokenizer_cid:
        raise RunError("this run has no tokenizer (it trains on bytes)")
    want = bytes.fromhex(cfg.data.tokenizer_digest.removeprefix("0x"))
    return load_tokenizer(store.get(cfg.data.tokenizer_cid, digest=want), want)


def bind_corpus(cfg: RunConfig, store: Store, corpus: Corpus, tokenizer: bytes | None = None,
                vocab_size: int = 0) -> RunConfig:
    """Publish a corpus (and its tokenizer) and commit both in the config.

    ``model.vocab_size`` defaults to ``vocab_size`` (the corpus directory's), else the tokenizer's.
    """
    data: dict[str, Any] = {"corpus_cid": store.put(corpus.tokens), "corpus_digest": "0x" + corpus.digest.hex(),
                            "token_dtype": corpus.dtype}
    model: dict[str, Any] = {}
    if tokenizer is not None:
        data |= {"tokenizer_cid": store.put(tokenizer), "tokenizer_digest": "0x" + keccak(tokenizer).hex()}
        vocab_size = vocab_size or tokenizer_vocab_size(tokenizer)
    if vocab_size and not cfg.model.vocab_size and (corpus.dtype != "uint8" or tokenizer is not None):
        model["vocab_size"] = vocab_size
    return cfg.replace(data=data, model=model)


def publish_run(chain: Chain, store: Store, cfg: RunConfig, coordinator: str | None = None,
                corpus: Corpus | None = None, tokenizer: bytes | None = None,
                vocab_size: int = 0, fingerprint: Callable[[RunConfig], str] | None = None) -> tuple[RunId, RunConfig]:
    """Publish the corpus, initial model and config, then create the run; returns (run id, final config).

    ``fingerprint`` (``dilocox.numerics.fingerprint``; injected: it replays blocks, a layer above) records
    the numerics fingerprint of an exact CPU run that has none, at the shapes the corpus settles."""
    corpus = corpus or corpus_for(cfg, store)
    cfg = bind_corpus(cfg, store, corpus, tokenizer, vocab_size)
    a = cfg.audit
    if fingerprint is not None and a.mode == "exact" and a.device == "cpu" and not a.numerics_digest:
        cfg = cfg.replace(audit={"numerics_digest": fingerprint(cfg)})
    corpus_for(cfg, store)  # the published corpus must be servable: fetchable, in the vocabulary
    g0 = initial_model(cfg)
    g0_cid = store.put(save_state(g0))
    config_cid = store.put(cfg.to_json())
    who = coordinator or chain.sender
    if who is None:
        raise RunError("creating a run needs a coordinator address or a signing key")
    params = cfg.to_run_params(config_cid, g0_cid, state_digest(g0), who)
    return chain.create_run(params, reward_pool=cfg.rewards.pool_wei), cfg


def open_run(chain: Chain, store: Store, run_id: int) -> RunContext:
    """Everything a node needs about a run, verified against the contract."""
    info = chain.run_info(run_id)
    raw = store.get(info.params.config_cid, max_size=MAX_CONFIG_BYTES)
    if keccak(raw) != info.params.config_digest:
        raise RunError(f"run {run_id}'s config {info.params.config_cid} does not hash to the on-chain digest")
    cfg = from_json(raw)
    mismatch = audit_mismatch(info.params, cfg)
    if mismatch:
        raise RunError(f"run {run_id}'s on-chain audit policy is not its config's ({mismatch}): the creator set the "
                       "contract's parameters by hand; a node does not stake in a run whose audits are not the ones it read")
    return RunContext(RunId(run_id), info, cfg, corpus_for(cfg, store))


AUDIT_FIELDS = ("audit_steps", "audit_rate", "final_check_bps", "quorum", "test_run")


def audit_mismatch(params: RunParams, cfg: RunConfig) -> str:
    """The audit fields the contract enforces that differ from the config's, as ``name chain != config``;
    empty when they agree. The draw (steps, rate), the final check and the quorum decide what a trainer is
    judged on: a run created with other values than its published config says would judge by other rules."""
    mine = cfg.to_run_params(params.config_cid, params.init_model_cid, params.init_model_digest, params.coordinator)
    return ", ".join(f"{f} {getattr(params, f)} != {getattr(mine, f)}" for f in AUDIT_FIELDS
                     if getattr(params, f) != getattr(mine, f))


def load_model(store: Store, cid: str, digest: bytes, shapes: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, Tensor]:
    """A global model state, fetched and checked against the digest its epoch finalized with."""
    state = load_state(store.get(cid))
    if state_digest(state) != digest:
        raise RunError(f"model {cid} does not match its on-chain digest 0x{bytes(digest).hex()}")
    if shapes is not None:
        got = {n[len(PARAM):]: tuple(t.shape) for n, t in state.items() if n.startswith(PARAM)}
        if got != dict(shapes):
            raise RunError(f"model {cid} does not have the run's parameter shapes")
    return state


def latest_model(chain: Chain, ctx: RunContext, before_epoch: int) -> tuple[Cid, Digest, int]:
    """(cid, digest, epoch) of the newest model finalized by an epoch < before_epoch; epoch -1 is G_0.

    An aborted epoch leaves the model unchanged, so the search skips it.
    """
    for e in range(before_epoch - 1, -1, -1):
        status = chain.epoch_status(ctx.run_id, e)
        if status.phase is Phase.FINALIZED:
            return status.model_cid, chain.epoch_times(ctx.run_id, e).model_digest, e
    return ctx.info.params.init_model_cid, ctx.info.params.init_model_digest, -1


def revealed_payload(store: Store, reveal: Mapping[str, Any], *, fresh: bool = False) -> bytes:
    """The publication a `Revealed` event names, checked against its CID and the revealed digest (``fresh``:
    from the store itself, as ``Store.get`` says)."""
    return store.get(reveal["payloadCid"], max_size=MAX_PAYLOAD_BYTES, digest=bytes(reveal["payloadDigest"]), fresh=fresh)


def passing_trainers(chain: Chain, run_id: int, epoch: int, quorum: int | None = None) -> list[Address]:
    """Trainers with a passing verdict majority in `epoch`, ascending by address (finalize's order).

    Read from events, not from `submission()`: the contract recycles a trainer's submission slot
    three epochs later, and a node that joins or restarts late must still see old epochs as the
    others did. The rule is the contract's: pass votes from more than half of the
    q = min(quorum, verifiers at scheduling) assigned verifiers, and not judged unavailable.
    """
    started = chain.events(["AuditStarted"], run_id=run_id, epoch=epoch)
    if not started:
        return []
    if quorum is None:
        quorum = chain.run_info(run_id).params.quorum
    q = min(quorum, int(started[0].args["verifierCount"]))
    passes: dict[str, int] = {}
    for ev in chain.events(["VerdictSubmitted"], run_id=run_id, epoch=epoch):
        if ev.args["passed"]:
            passes[ev.args["trainer"]] = passes.get(ev.args["trainer"], 0) + 1
    # a passing trainer whose payload its availability committee could not fetch is out (§10.2)
    unavailable = {ev.args["trainer"] for ev in chain.events(["AvailabilityDecided"], run_id=run_id, epoch=epoch)
                   if not ev.args["available"]}
    ok = [Address(t) for t, n in passes.items() if q > 0 and n > q // 2 and t not in unavailable]
    return sorted(ok, key=lambda a: int(a, 16))


def params_of(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Bare-named parameters of a model or training state."""
    return {n[len(PARAM):]: t for n, t in state.items() if n.startswith(PARAM)}


def eval_model(ctx: RunContext, params: Mapping[str, Tensor], rows: int = 64) -> float:
    """Validation loss of a model on the run's fixed validation rows."""
    from protocol.data import eval_loss, val_batches
    from protocol.model import loss_fn

    cfg = ctx.config.model_config()
    batches = val_batches(ctx.corpus, ctx.config.data.seq_len, rows)
    with torch.no_grad():
        return eval_loss(lambda x, y: loss_fn(cfg, dict(params), x, y), batches)

