"""The configuration path: which files are read, in which order, and what each may do."""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_flow.config import load_config
from merlin_flow.config_files import Layer, config_files, merge_tables, read_toml
from merlin_flow.errors import ConfigError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def tiers(folder: Path, *names: str) -> str:
    """``[[tiers]]`` of scripted models, their script written next to the file."""
    write(folder / "s.yaml", "rules: []\n")
    return "".join(f'[[tiers]]\nname = "{n}"\nmodel = "scripted/s.yaml"\n' for n in names)


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    return {
        "system": tmp_path / "etc" / "merlin.toml",
        "home": tmp_path / "home",
        "repo": tmp_path / "repo",
        "config": tmp_path / "ci" / "merlin.toml",
    }


def test_every_place_is_listed_lowest_precedence_first(places: dict[str, Path]) -> None:
    write(places["system"], "")
    write(places["repo"] / "merlin.toml", "")
    files = config_files(places["repo"], None, places["home"], places["system"])
    assert [(f.layer, f.read) for f in files] == [
        (Layer.DEFAULTS, True),
        (Layer.SYSTEM, True),
        (Layer.USER, False),
        (Layer.REPOSITORY, True),
    ]
    assert files[2].describe() == f"user {places['home'] / 'merlin.toml'} (absent)"


def test_config_replaces_the_repositorys_file_and_says_so(places: dict[str, Path]) -> None:
    write(places["repo"] / "merlin.toml", "")
    write(places["config"], "")
    files = config_files(places["repo"], places["config"], places["home"], places["system"])
    assert [(f.layer, f.read, f.note) for f in files[-2:]] == [
        (Layer.CONFIG, True, ""),
        (Layer.REPOSITORY, False, "--config replaces it"),
    ]


def test_a_folder_where_a_file_should_be_is_not_read(places: dict[str, Path]) -> None:
    places["system"].mkdir(parents=True)
    files = config_files(None, None, None, places["system"])
    assert [(f.layer, f.read, f.note) for f in files][-1] == (Layer.SYSTEM, False, "not a file")


def test_the_system_file_sets_the_tiers_under_the_repositorys_limits(
    places: dict[str, Path],
) -> None:
    write(places["system"], tiers(places["system"].parent, "site") + "[limits]\nmax_turns = 7\n")
    write(places["repo"] / "merlin.toml", "[limits]\nfix_attempts = 2\n")
    config = load_config(places["repo"], None, places["home"], places["system"])
    assert [t.name for t in config.tiers] == ["site"]
    assert config.tiers[0].model == f"scripted/{places['system'].parent / 's.yaml'}"
    assert (config.limits.max_turns, config.limits.fix_attempts) == (7, 2)
    assert config.source == str(places["repo"] / "merlin.toml")


def test_the_repositorys_tiers_win_over_the_systems(places: dict[str, Path]) -> None:
    write(places["system"], tiers(places["system"].parent, "site"))
    write(places["repo"] / "merlin.toml", tiers(places["repo"], "mine"))
    config = load_config(places["repo"], None, places["home"], places["system"])
    assert [t.name for t in config.tiers] == ["mine"]


def test_no_system_file_given_reads_none(places: dict[str, Path]) -> None:
    write(places["system"], tiers(places["system"].parent, "site"))
    assert "site" not in [t.name for t in load_config(places["repo"], None, places["home"]).tiers]


def test_the_systems_deny_rules_always_apply(places: dict[str, Path]) -> None:
    write(places["system"], '[permissions]\ndeny = ["Bash(curl:*)"]\n')
    write(places["home"] / "merlin.toml", '[permissions]\ndeny = ["Read(secrets/**)"]\n')
    write(places["config"], '[permissions]\nallow = ["Bash(curl:*)"]\n')
    config = load_config(places["repo"], places["config"], places["home"], places["system"])
    assert config.permissions.deny == ["Bash(curl:*)", "Read(secrets/**)"]
    assert config.permissions.allow == ["Bash(curl:*)"]


def test_a_system_default_deny_refuses_a_repositorys_allow(places: dict[str, Path]) -> None:
    write(places["system"], '[permissions]\ndefault = "deny"\n')
    write(places["repo"] / "merlin.toml", '[permissions]\nallow = ["Read"]\n')
    with pytest.raises(ConfigError, match=r"\[permissions\] allow"):
        load_config(places["repo"], None, places["home"], places["system"])
    write(places["config"], '[permissions]\nallow = ["Read"]\n')  # trusted: allowed
    config = load_config(places["repo"], places["config"], places["home"], places["system"])
    assert (config.permissions.default, config.permissions.allow) == ("deny", ["Read"])


def test_the_system_file_may_loosen_what_a_repositorys_may_not(places: dict[str, Path]) -> None:
    write(places["system"], "[sandbox]\nnetwork = true\n")
    assert load_config(places["repo"], None, places["home"], places["system"]).sandbox.network
    write(places["repo"] / "merlin.toml", "[sandbox]\nnetwork = true\n")
    with pytest.raises(ConfigError, match=r"\[sandbox\] network"):
        load_config(places["repo"], None, places["home"], places["system"])


def test_the_user_file_still_holds_only_its_sections(places: dict[str, Path]) -> None:
    write(places["home"] / "merlin.toml", "[limits]\nmax_turns = 3\n")
    with pytest.raises(ConfigError, match="holds only permissions, agents, mcp_servers"):
        load_config(places["repo"], None, places["home"], places["system"])


@pytest.mark.parametrize("culprit", ["system", "repo"])
def test_an_invalid_section_names_the_file_that_set_it(
    places: dict[str, Path], culprit: str
) -> None:
    write(places["system"], "[limits]\nmax_turns = 5\n")
    write(places["repo"] / "merlin.toml", "[limits]\nfix_attempts = 2\n")
    bad = places["system"] if culprit == "system" else places["repo"] / "merlin.toml"
    write(bad, "[routing]\nbogus = 1\n")
    with pytest.raises(ConfigError) as refused:
        load_config(places["repo"], None, places["home"], places["system"])
    assert str(refused.value).startswith(f"{bad.resolve()}: invalid configuration")
    assert "routing.bogus" in str(refused.value)


def test_a_malformed_system_file_is_named(places: dict[str, Path]) -> None:
    write(places["system"], "[limits\n")
    with pytest.raises(ConfigError, match=f"{places['system']}: malformed TOML"):
        load_config(None, None, None, places["system"])


def test_tables_merge_key_by_key_and_the_rest_replaces(tmp_path: Path) -> None:
    merged = merge_tables({"limits": {"a": 1, "b": 2}, "tiers": [1]}, {"limits": {"b": 3}})
    assert merged == {"limits": {"a": 1, "b": 3}, "tiers": [1]}
    assert merge_tables({"tiers": [1, 2]}, {"tiers": [3]}) == {"tiers": [3]}
    assert read_toml(write(tmp_path / "a.toml", "x = 1\n")) == {"x": 1}


def test_a_repositorys_tier_providers_are_those_whose_endpoint_merlin_knows() -> None:
    from merlin_flow.config_files import REPOSITORY_PROVIDERS
    from merlin_flow.models.endpoints import BASE_VARIABLES

    assert frozenset(BASE_VARIABLES) == REPOSITORY_PROVIDERS


def test_the_systems_deny_rules_survive_a_repositorys_permissions(places: dict[str, Path]) -> None:
    write(places["system"], '[permissions]\ndeny = ["Bash(curl:*)"]\ndefault = "deny"\n')
    write(places["repo"] / "merlin.toml", '[permissions]\ndeny = []\ndefault = "allow"\n')
    config = load_config(places["repo"], None, places["home"], places["system"])
    assert (config.permissions.deny, config.permissions.default) == (["Bash(curl:*)"], "deny")


def test_each_refusal_says_what_it_would_do_in_one_message(places: dict[str, Path]) -> None:
    """The sandbox's refusals read as they always did (docs/agents.md shows one); the
    others are said after them, and may come from the system file too."""
    own = write(places["repo"] / "merlin.toml", '[sandbox]\nnetwork = true\npass_env = ["A"]\n')
    with pytest.raises(ConfigError) as refused:
        load_config(places["repo"], None, places["home"], places["system"])
    assert str(refused.value) == (
        f"{own.resolve()}: [sandbox] network, pass_env would loosen the sandbox, and a "
        "repository's own merlin.toml may not (its content is untrusted, like its code): put "
        "these settings in a file you pass with --config"
    )
    own.write_text(
        '[sandbox]\nnetwork = true\n\n[secrets]\nallow = ["**"]\n\n'
        '[[tiers]]\nname = "t"\nmodel = "scripted//etc/x.yaml"\napi_key_env = "GITHUB_TOKEN"\n'
    )
    with pytest.raises(ConfigError) as refused:
        load_config(places["repo"], None, places["home"], places["system"])
    assert str(refused.value) == (
        f"{own.resolve()}: [sandbox] network would loosen the sandbox; [[tiers]] api_key_env "
        "(tier 't') would choose where the worker sends model requests and its keys; "
        "[[tiers]] model 'scripted//etc/x.yaml' (tier 't') would read a script outside the "
        "repository; [secrets] allow (**) would exempt paths from the scan for key formats, "
        "and a repository's own merlin.toml may not (its content is untrusted, like its "
        "code): put these settings in a file you pass with --config, or in the system file"
    )
