"""Run configs: TOML in, canonical JSON out, digest stable, bad input named precisely."""

import pytest

from protocol.config import ConfigError, RunConfig, from_json, load_toml

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


def test_example_run_config_loads() -> None:
    from pathlib import Path

    cfg = load_toml(Path(__file__).resolve().parents[2] / "examples" / "run.toml")
    assert cfg.model.preset == "tiny" and cfg.audit.steps == 3


def test_tolerant_mode_stays_in_the_calibrated_range() -> None:
    from verifier.calibrate import CALIBRATED_TOLERANCE

    assert RunConfig().audit.tolerance == CALIBRATED_TOLERANCE  # the default is the measured bound
    RunConfig().replace(audit={"mode": "tolerant", "segment": 16})
    with pytest.raises(ConfigError, match="calibrated range"):
        RunConfig().replace(audit={"mode": "tolerant", "segment": 32})
