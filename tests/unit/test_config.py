"""Run configs: TOML in, canonical JSON out, digest stable, bad input named precisely."""

from pathlib import Path

import pytest

from protocol.config import ConfigError, ConfigWarning, RunConfig, from_json, load_toml, to_dict

pytestmark = pytest.mark.unit


def test_toml_round_trips_through_canonical_json(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('name = "t"\n[inner]\nlr = 3e-4\n[schedule]\nepochs = 5\nh_initial = 12\n')
    cfg = load_toml(path)
    assert cfg.inner.lr == 3e-4 and cfg.schedule.epochs == 5
    raw = cfg.to_json()
    assert b'"lr":"0.0003"' in raw and b" " not in raw
    again = from_json(raw)
    assert again == cfg and again.digest() == cfg.digest()


def test_replace_changes_digest() -> None:
    cfg = RunConfig()
    assert cfg.replace(schedule={"epochs": 9}).digest() != cfg.digest()


@pytest.mark.parametrize(
    "toml, message",
    [
        ("[inner]\nlr = true\n", "inner.lr must be a number"),
        ("[schedule]\nepochs = 0\n", "schedule.epochs must be at least 1"),
        ("[audit]\nmode = 'fuzzy'\n", "audit.mode"),
        ("[inner]\nlearning_rate = 1\n", "unknown key(s) inner.learning_rate"),
        ("[inner\n", "not valid TOML"),
        ("[audit]\nnumerics = 'arm64'\n", "audit.numerics must be one of"),
        ("[audit]\nnumerics_digest = '0x12'\n", "audit.numerics_digest must be 0x and 64 lowercase hex digits"),
        ("[audit]\nthreads = 0\n", "audit.threads must be within 1..256, got 0"),
        ("[audit]\nrate = 1.5\n", "audit.rate is a probability in whole parts per million"),
        ("[audit]\nquorum = 9\n", "1 <= audit.quorum <= 7"),
        ("[audit]\nrate = 0.01\nchallenges = 64\n[schedule]\nh_max = 5000\n", "audit.rate draws among the first 4096 steps"),
        ("[stakes]\nmax_verifiers = 6\n", "stakes.max_verifiers = 6 leaves no availability committee at audit.quorum = 3"),
        ("[audit]\nrate = 0.0000001\n", "audit.rate is a probability in whole parts per million"),
        ("[audit]\nrate = 0.1\nchallenges = 4\n[schedule]\nh_max = 64\nh_initial = 8\n",
         ("audit.challenges = 4 caps the challenges an epoch of up to schedule.h_max = 64 steps draws at audit.rate = 0.1, "
          "and the cap would bind with probability")),
    ],
)
def test_bad_config_is_named(tmp_path, toml: str, message: str) -> None:
    path = tmp_path / "run.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_toml(path)


def test_non_canonical_json_rejected() -> None:
    raw = RunConfig().to_json().replace(b'{"', b'{ "', 1)
    with pytest.raises(ConfigError, match="canonical"):
        from_json(raw)


@pytest.mark.parametrize("name, preset", [("run", "tiny"), ("small", "small")])
def test_example_run_configs_load(name: str, preset: str) -> None:
    from pathlib import Path

    cfg = load_toml(Path(__file__).resolve().parents[2] / "examples" / f"{name}.toml")
    # segments of about 4,096 tokens, groups of 2,048 where a step has more (docs/results-protocol.md)
    segment, groups, steps, rate = {"run": (4, 1, 4, 0.0), "small": (1, 4, 8, 0.0165)}[name]
    assert cfg.model.preset == preset and (cfg.audit.unit, cfg.audit.challenges, cfg.audit.segment) == ("shard", steps, segment)
    assert (cfg.audit.rate, cfg.to_run_params("c", "m", bytes(32), "0x" + "11" * 20).audit_rate) == (rate, round(rate * 1e6))
    assert cfg.inner.microbatches == groups
    if name == "small":  # the measured winner (convergence-small.json): 128 rows, rank 128 and H 8 held, epoch 1 waits
        from dilocox.compress import h_for_rank
        from dilocox.round import RoundSpec

        spec = RoundSpec.from_config(cfg)
        c = spec.compression  # adapt() clamps to [rank_min, rank_max] (test_compress), so the rank holds
        assert (spec.batch_size, spec.merge_step, c.rank_min, c.rank_max, c.rank_initial) == (128, 1, 128, 128, 128)
        assert [spec.merge_step_in(e) for e in range(3)] == [1, 0, 1]
        assert h_for_rank(128, c) == 8


def test_tolerant_mode_stays_in_the_calibrated_range() -> None:
    from verifier.calibrate import CALIBRATED_TOLERANCE

    assert RunConfig().audit.tolerance == CALIBRATED_TOLERANCE  # the default is the measured bound
    RunConfig().replace(audit={"mode": "tolerant", "segment": 16})
    with pytest.raises(ConfigError, match="calibrated range"):
        RunConfig().replace(audit={"mode": "tolerant", "segment": 32})


def test_rewards_section_reaches_run_params_and_canonical_json(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[rewards]\ntrainer_wei = 1000\nverifier_wei = 100\npool_wei = 1000000000000000000000\n")
    cfg = load_toml(path)
    raw = cfg.to_json()
    assert b'"rewards":{"pool_wei":1000000000000000000000,"trainer_wei":1000,"verifier_wei":100}' in raw
    assert from_json(raw) == cfg and cfg.digest() != RunConfig().digest()
    p = cfg.to_run_params("bafyc", "bafym", b"\x00" * 32, "0x" + "11" * 20)
    assert (p.trainer_reward, p.verifier_reward) == (1000, 100)
    # no [rewards] table: nothing is paid, the run needs no pool
    d = RunConfig().to_run_params("bafyc", "bafym", b"\x00" * 32, "0x" + "11" * 20)
    assert (d.trainer_reward, d.verifier_reward, RunConfig().rewards.pool_wei) == (0, 0, 0)


@pytest.mark.parametrize(
    "rewards, message",
    [
        ({"trainer_wei": 2**96}, "rewards.trainer_wei and rewards.verifier_wei must be within 0..2^96-1"),
        ({"verifier_wei": -1}, "rewards.trainer_wei and rewards.verifier_wei must be within 0..2^96-1"),
        ({"trainer_wei": 1, "pool_wei": 2**128}, "rewards.pool_wei must be within 0..2^128-1"),
        ({"pool_wei": 10}, "the pool would never pay out"),
        ({"pool_wei": "10"}, "rewards.pool_wei must be an integer"),
    ],
)
def test_bad_rewards_are_named(rewards: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("^", r"\^").replace(".", r"\.")):
        RunConfig().replace(rewards=rewards)


def test_model_and_data_fields_for_own_data_and_llama() -> None:
    """New fields stay out of the canonical JSON at their defaults (old configs keep their digest);
    set, they round-trip and select the architecture and vocabulary every node builds."""
    raw = RunConfig().to_json()
    assert b"vocab_size" not in raw and b"token_dtype" not in raw and b"tokenizer" not in raw
    cfg = RunConfig().replace(
        model={"preset": "llama-tiny", "vocab_size": 512},
        data={"token_dtype": "uint16", "tokenizer_digest": "0x" + "ab" * 32, "tokenizer_cid": "bafyt"},
    )
    assert from_json(cfg.to_json()) == cfg and cfg.digest() != RunConfig().digest()
    m = cfg.model_config()
    assert (m.arch, m.vocab_size, m.d_model) == ("llama", 512, 64)
    assert RunConfig().model_config().vocab_size == 256
    with pytest.raises(ConfigError, match="needs model.vocab_size"):
        RunConfig().replace(data={"token_dtype": "uint16"})
    with pytest.raises(ConfigError, match="token_dtype must be"):
        RunConfig().replace(data={"token_dtype": "int8"}, model={"vocab_size": 100})


def test_shard_audits_need_exact_mode_and_dividing_microbatches() -> None:
    with pytest.raises(ConfigError, match="needs audit.mode = 'exact'"):
        RunConfig().replace(audit={"unit": "shard", "mode": "tolerant"})
    with pytest.raises(ConfigError, match="audit.unit must be"):
        RunConfig().replace(audit={"unit": "blocks"})
    with pytest.raises(ConfigError, match="inner.microbatches must divide"):
        RunConfig().replace(inner={"microbatches": 3})
    assert b"unit" not in RunConfig().to_json() and b"microbatches" not in RunConfig().to_json()  # old digests hold


def test_outer_aggregate_is_new_and_checked() -> None:
    """outer.aggregate / outer.trim stay out of the canonical JSON at their defaults ("mean", 1), so
    every published config keeps its digest; set, they round-trip and are checked."""
    raw = RunConfig().to_json()
    assert b'"aggregate"' not in raw and b'"trim"' not in raw
    cfg = RunConfig().replace(outer={"aggregate": "trimmed", "trim": 2})
    assert b'"aggregate":"trimmed"' in cfg.to_json() and from_json(cfg.to_json()) == cfg
    assert cfg.digest() != RunConfig().digest() != RunConfig().replace(outer={"aggregate": "median"}).digest()
    with pytest.raises(ConfigError, match="outer.aggregate must be one of mean, trimmed, median"):
        RunConfig().replace(outer={"aggregate": "krum"})
    with pytest.raises(ConfigError, match="outer.trim must be at least 1"):
        RunConfig().replace(outer={"trim": 0})


def test_a_run_whose_on_chain_audit_policy_is_not_its_configs_is_named() -> None:
    """A creator who passes createRun other audit fields than the published config's (a lower rate, a cap of
    one, no final check) is caught by every node's open_run before it stakes."""
    from dataclasses import replace as dc_replace

    from protocol.run import audit_mismatch

    cfg = RunConfig().replace(audit={"rate": 0.0165, "steps": 9})
    p = cfg.to_run_params("bafyc", "bafym", bytes(32), "0x" + "11" * 20)
    assert audit_mismatch(p, cfg) == ""
    bad = dc_replace(p, audit_rate=100, final_check_bps=0)
    assert audit_mismatch(bad, cfg) == "audit_rate 100 != 16500, final_check_bps 0 != 5000"


def test_a_windowed_run_draws_no_step_on_chain_and_needs_shard_audits_at_a_rate() -> None:
    """audit.window (docs/protocol.md §5.4): new (old digests hold), a power of two with the shard unit and
    a per-step rate; the contract then gets auditSteps 0, and open_run's audit check still matches it."""
    from protocol.run import audit_mismatch

    assert b"\"window\":" not in RunConfig().to_json() and b"window_depth" not in RunConfig().to_json()
    cfg = RunConfig().replace(audit={"unit": "shard", "rate": 0.0165, "steps": 9, "window": 16, "quorum": 3})
    p = cfg.to_run_params("bafyc", "bafym", bytes(32), "0x" + "11" * 20)
    assert (p.audit_steps, p.audit_rate) == (0, 16_500) and audit_mismatch(p, cfg) == ""
    assert from_json(cfg.to_json()) == cfg and b'"window":16' in cfg.to_json()
    for bad in ({"unit": "shard", "rate": 0.0165, "window": 12}, {"unit": "state", "rate": 0.0165, "window": 16},
                {"unit": "shard", "window": 16}, {"unit": "shard", "rate": 0.0165, "window": 8192}):
        with pytest.raises(ConfigError, match="audit.window must be 0"):
            RunConfig().replace(audit=bad)
    with pytest.raises(ConfigError, match="audit.window_depth"):
        RunConfig().replace(audit={"window_depth": 0})
    # a production run may use windows: walking away from an epoch whose windows were posted is slashed
    # (`reportAbandoned`, docs/security.md §20 item 25)
    assert RunConfig().replace(audit={"unit": "shard", "rate": 0.0165, "window": 16}).audit.window == 16


def test_audit_challenges_is_published_as_steps_and_the_old_key_still_reads_with_a_warning(tmp_path: Path) -> None:
    """Issue 50, one name per idea: `audit.challenges` (the count of challenges, not H) is the key; the
    canonical JSON keeps the first name, `steps`, so no published digest moves; a run.toml's `steps`
    reads with a warning naming the new key; both at once is refused."""
    import warnings

    cfg = RunConfig().replace(audit={"challenges": 7})
    assert cfg.audit.challenges == 7 and b'"steps":7' in cfg.to_json() and b"challenges" not in cfg.to_json()
    assert from_json(cfg.to_json()) == cfg and RunConfig().replace(audit={"steps": 7}) == cfg
    assert to_dict(cfg)["audit"]["challenges"] == 7
    old, new = tmp_path / "old.toml", tmp_path / "new.toml"
    old.write_text("[audit]\nsteps = 7\n")
    new.write_text("[audit]\nchallenges = 7\n")
    with pytest.warns(ConfigWarning, match=r"audit.steps is now audit.challenges"):
        assert load_toml(old) == cfg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_toml(new) == cfg and load_toml(new).digest() == cfg.digest()
    both = tmp_path / "both.toml"
    both.write_text("[audit]\nsteps = 7\nchallenges = 7\n")
    with pytest.raises(ConfigError, match="audit.steps and audit.challenges are one setting"):
        load_toml(both)
