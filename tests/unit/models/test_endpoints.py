"""Where a tier's requests go: pinned at submission, the key sent, the tier described."""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_flow.config import MerlinConfig, Tier, load_config
from merlin_flow.models.endpoints import NO_KEY, api_key, describe, pin_endpoints


def test_a_scripted_tier_is_described_by_its_script_with_one_slash(tmp_path: Path) -> None:
    (tmp_path / "local.yaml").write_text("rules: []\n")
    config_file = tmp_path / "merlin.toml"
    config_file.write_text('[[tiers]]\nname = "local"\nmodel = "scripted/local.yaml"\n')
    tier = load_config(None, config_file, tmp_path / "home").tiers[0]
    assert tier.model == f"scripted/{tmp_path}/local.yaml"  # the path made absolute
    described = describe(tier)
    assert described == f"tier 'local' (scripted model {tmp_path}/local.yaml)"
    assert "//" not in described


def test_a_hosted_tier_is_described_with_its_endpoint() -> None:
    hosted = Tier(name="premium", model="anthropic/claude-sonnet-4-5")
    assert describe(hosted) == (
        "tier 'premium' (anthropic/claude-sonnet-4-5 at the provider's default endpoint)"
    )
    served = Tier(name="local", model="openai/qwen", api_base="http://127.0.0.1:8080/v1")
    assert describe(served) == "tier 'local' (openai/qwen at http://127.0.0.1:8080/v1)"


def test_pinning_writes_down_the_submitters_endpoint_and_its_paired_key_variable() -> None:
    config = MerlinConfig(
        tiers=[
            Tier(name="gpt", model="openai/gpt-4o-mini"),
            Tier(name="own", model="openai/qwen", api_base="http://10.0.0.2:8000/v1"),
            Tier(name="llama", model="ollama_chat/qwen"),
        ]
    )
    environ = {"OPENAI_BASE_URL": "https://proxy.example/v1", "OPENAI_API_KEY": "sk-test"}
    gpt, own, llama = pin_endpoints(config, environ).tiers
    assert (gpt.api_base, gpt.api_key_env) == ("https://proxy.example/v1", "OPENAI_API_KEY")
    assert (own.api_base, own.api_key_env) == ("http://10.0.0.2:8000/v1", None)  # its own
    assert llama.api_base == "http://localhost:11434"  # a local server's default


def test_the_key_sent_is_the_named_variables_or_none_for_a_tiers_own_endpoint() -> None:
    named = Tier(name="a", model="openai/x", api_key_env="MY_KEY")
    assert api_key(named, {"MY_KEY": "secret"}) == "secret"
    with pytest.raises(KeyError, match="MY_KEY"):
        api_key(named, {})
    own = Tier(name="b", model="openai/x", api_base="http://127.0.0.1:8080/v1")
    assert api_key(own, {"OPENAI_API_KEY": "sk-not-for-this-server"}) == NO_KEY
    assert api_key(Tier(name="c", model="openai/x"), {}) is None
