"""load_config: shipped defaults, overlays, and every way a configuration is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_flow.config import MerlinConfig, Tier, load_config
from merlin_flow.errors import ConfigError
from merlin_flow.tasklist import StepType
from merlin_flow.tool_config import SandboxMode


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def scripted_overlay(folder: Path, name: str = "local", script: str = "local.yaml") -> str:
    write(folder / script, "rules: []\n")
    return f'[[tiers]]\nname = "{name}"\nmodel = "scripted/{script}"\n'


def test_shipped_defaults_load() -> None:
    config = load_config()
    assert [t.name for t in config.tiers] == ["local", "fast", "premium"]
    assert config.tiers[0].model == "ollama_chat/qwen2.5-coder:7b"
    assert config.tiers[0].price_in == 0.0
    assert config.tiers[1].price_in is None
    assert not any(t.is_scripted for t in config.tiers)
    assert config.exit_commands == {}
    assert config.shell is False
    assert config.limits.fix_attempts == 1
    assert config.limits.max_turns == 20
    assert config.limits.max_recoveries == 3
    assert config.limits.lease_seconds == 60
    assert config.source is None


def test_repo_without_merlin_toml_uses_defaults(tmp_path: Path) -> None:
    assert load_config(tmp_path) == load_config()


def test_repo_overlay_replaces_tiers_and_merges_limits(tmp_path: Path) -> None:
    write(
        tmp_path / "merlin.toml",
        scripted_overlay(tmp_path)
        + '\n[exit_commands]\nTest = "make test"\n\n[limits]\nmax_turns = 5\n',
    )
    config = load_config(tmp_path)
    assert [t.name for t in config.tiers] == ["local"]
    assert config.tiers[0].is_scripted
    # limits merge key by key: the overlaid key changes, the others keep the defaults
    assert config.limits.max_turns == 5
    assert config.limits.fix_attempts == 1
    assert config.limits.max_recoveries == 3
    assert config.exit_commands == {StepType.TEST: "make test"}
    assert config.source == str((tmp_path / "merlin.toml").resolve())


def test_overlay_without_tiers_keeps_default_tiers(tmp_path: Path) -> None:
    write(tmp_path / "merlin.toml", "shell = true\n[limits]\nfix_attempts = 0\n")
    config = load_config(tmp_path)
    assert [t.name for t in config.tiers] == ["local", "fast", "premium"]
    assert config.shell is True
    assert config.limits.fix_attempts == 0
    assert config.limits.max_turns == 20


def test_config_path_wins_over_repo_file(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write(repo / "merlin.toml", scripted_overlay(repo, name="from-repo"))
    other = tmp_path / "elsewhere"
    chosen = write(other / "custom.toml", scripted_overlay(other, name="from-flag"))
    config = load_config(repo, chosen)
    assert [t.name for t in config.tiers] == ["from-flag"]
    assert config.source == str(chosen.resolve())


def test_missing_config_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path, tmp_path / "absent.toml")


def test_unknown_tier_lists_configured_tiers() -> None:
    config = load_config()
    assert config.tier_index("fast") == 1
    with pytest.raises(
        ConfigError, match=r"unknown tier 'nope'; configured tiers: local, fast, premium"
    ):
        config.tier_index("nope")


@pytest.mark.parametrize("field", ["price_in", "price_out"])
def test_negative_price(tmp_path: Path, field: str) -> None:
    path = write(
        tmp_path / "m.toml", f'[[tiers]]\nname = "x"\nmodel = "openai/gpt-4o"\n{field} = -1.0\n'
    )
    with pytest.raises(ConfigError, match=rf"tiers\.0\.{field}") as info:
        load_config(config_path=path)
    assert str(path.resolve()) in str(info.value)


def test_empty_tier_list(tmp_path: Path) -> None:
    path = write(tmp_path / "m.toml", "tiers = []\n")
    with pytest.raises(ConfigError, match=r"tiers: .*at least 1"):
        load_config(config_path=path)


def test_duplicate_tier_names(tmp_path: Path) -> None:
    text = '[[tiers]]\nname = "a"\nmodel = "m/1"\n\n[[tiers]]\nname = "a"\nmodel = "m/2"\n'
    with pytest.raises(ConfigError, match="tier names must be unique; repeated: a"):
        load_config(config_path=write(tmp_path / "m.toml", text))


def test_unknown_limit_key(tmp_path: Path) -> None:
    path = write(tmp_path / "m.toml", "[limits]\nmax_turn = 3\n")
    with pytest.raises(ConfigError, match=r"limits\.max_turn"):
        load_config(config_path=path)


def test_unknown_step_type_in_exit_commands(tmp_path: Path) -> None:
    path = write(tmp_path / "m.toml", '[exit_commands]\nDebugg = "true"\n')
    with pytest.raises(ConfigError, match="exit_commands"):
        load_config(config_path=path)


def test_malformed_toml(tmp_path: Path) -> None:
    path = write(tmp_path / "m.toml", "[[tiers]\nname = \n")
    with pytest.raises(ConfigError, match="malformed TOML") as info:
        load_config(config_path=path)
    assert str(path.resolve()) in str(info.value)


def test_malformed_repo_toml(tmp_path: Path) -> None:
    write(tmp_path / "merlin.toml", "limits = {\n")
    with pytest.raises(ConfigError, match="malformed TOML"):
        load_config(tmp_path)


def test_scripted_tier_with_missing_script(tmp_path: Path) -> None:
    path = write(tmp_path / "m.toml", '[[tiers]]\nname = "robot"\nmodel = "scripted/gone.yaml"\n')
    with pytest.raises(ConfigError) as info:
        load_config(config_path=path)
    message = str(info.value)
    assert "tier 'robot'" in message
    assert str(tmp_path.resolve() / "gone.yaml") in message
    assert "does not exist" in message


def test_scripted_tier_with_invalid_script(tmp_path: Path) -> None:
    write(tmp_path / "bad.yaml", "rules:\n  - reply: {}\n    colour: red\n")
    path = write(tmp_path / "m.toml", '[[tiers]]\nname = "robot"\nmodel = "scripted/bad.yaml"\n')
    with pytest.raises(ConfigError, match=r"tier 'robot': invalid scripted model file"):
        load_config(config_path=path)


def test_relative_script_path_is_relative_to_the_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "conf" / "sub"
    path = write(folder / "m.toml", scripted_overlay(folder, script="scripts/s.yaml"))
    # the working directory must not matter
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    config = load_config(config_path=path)
    assert config.tiers[0].model == "scripted/" + str((folder / "scripts" / "s.yaml").resolve())


def test_absolute_script_path_is_kept(tmp_path: Path) -> None:
    script = write(tmp_path / "abs" / "s.yaml", "rules: []\n")
    path = write(
        tmp_path / "conf" / "m.toml", f'[[tiers]]\nname = "a"\nmodel = "scripted/{script}"\n'
    )
    assert load_config(config_path=path).tiers[0].model == f"scripted/{script.resolve()}"


def test_tier_and_config_models_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="greater than 0"):
        Tier(name="a", model="m", max_tokens=0)
    with pytest.raises(ValueError, match="at least 1"):
        MerlinConfig(tiers=[])
    assert Tier(name="a", model="scripted/x.yaml").is_scripted
    assert not Tier(name="a", model="openai/scripted").is_scripted


def test_a_repositorys_own_merlin_toml_may_not_loosen_the_sandbox(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for loosening in ('mode = "none"', "network = true", 'pass_env = ["LANG"]'):
        (repo / "merlin.toml").write_text(f"[sandbox]\n{loosening}\n")
        with pytest.raises(ConfigError, match=r"would loosen the sandbox.*--config"):
            load_config(repo)
    (repo / "merlin.toml").write_text("[sandbox]\nmax_memory_mb = 2048\n")
    assert load_config(repo).sandbox.max_memory_mb == 2048  # tightening is fine
    chosen = tmp_path / "mine.toml"
    chosen.write_text('[sandbox]\nmode = "none"\n')
    assert load_config(repo, chosen).sandbox.mode is SandboxMode.NONE


def test_a_repositorys_merlin_toml_names_the_paths_allowed_key_formats(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    assert load_config(repo).secrets.allow == []
    (repo / "merlin.toml").write_text('[secrets]\nallow = ["tests/fixtures/**", "*.pem"]\n')
    config = load_config(repo)
    assert config.secrets.allow == ["tests/fixtures/**", "*.pem"]
    assert MerlinConfig.model_validate(config.model_dump()).secrets == config.secrets  # stored
    (repo / "merlin.toml").write_text('[secrets]\nallow = ["tests/../keys/**"]\n')
    with pytest.raises(ConfigError, match=r"secrets\.allow: path glob 'tests/\.\./keys/\*\*'"):
        load_config(repo)


def test_the_planning_tier_is_named_or_the_first() -> None:
    from merlin_flow.config import MerlinConfig

    tiers = [{"name": "local", "model": "ollama/x"}, {"name": "premium", "model": "openai/y"}]
    assert MerlinConfig.model_validate({"tiers": tiers}).planning_tier().name == "local"
    chosen = MerlinConfig.model_validate({"tiers": tiers, "planning": {"tier": "premium"}})
    assert chosen.planning_tier().name == "premium"
    assert chosen.planning.max_steps == 8
    with pytest.raises(ValueError, match=r"planning\.tier names unknown tier 'gold'"):
        MerlinConfig.model_validate({"tiers": tiers, "planning": {"tier": "gold"}})
