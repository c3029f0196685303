"""Can a tier be used: scripted always, hosted with its key, local with its server up."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.errors import NoModelAvailable
from merlin_flow.models.credentials import require_a_usable_tier, tier_access


@pytest.fixture
def local_server() -> Iterator[str]:
    """A tiny HTTP server on 127.0.0.1, standing in for ollama."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_scripted_tiers_are_always_usable() -> None:
    assert tier_access(Tier(name="s", model="scripted/any.yaml")) is None


def test_a_hosted_tier_without_its_key_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    problem = tier_access(Tier(name="premium", model="anthropic/claude-sonnet-4-5"))
    assert problem is not None
    assert "tier 'premium'" in problem
    assert "ANTHROPIC_API_KEY" in problem
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    assert tier_access(Tier(name="premium", model="anthropic/claude-sonnet-4-5")) is None


def test_a_key_variable_set_to_nothing_is_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """compose's `OPENAI_API_KEY: ${OPENAI_API_KEY:-}` sets it empty; litellm counts it."""
    tier = Tier(name="fast", model="openai/gpt-4o-mini")
    monkeypatch.setenv("OPENAI_API_KEY", "")
    problem = tier_access(tier)
    assert problem is not None
    assert "OPENAI_API_KEY is set but empty" in problem
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert tier_access(tier) is None


def test_a_local_tier_needs_its_server(monkeypatch: pytest.MonkeyPatch, local_server: str) -> None:
    monkeypatch.setenv("OLLAMA_API_BASE", "http://127.0.0.1:9")
    problem = tier_access(Tier(name="local", model="ollama_chat/qwen"))
    assert problem is not None
    assert "http://127.0.0.1:9" in problem
    assert "OLLAMA_API_BASE" in problem
    monkeypatch.setenv("OLLAMA_API_BASE", local_server)
    assert tier_access(Tier(name="local", model="ollama_chat/qwen")) is None


def test_a_tier_with_its_own_api_base_is_told_to_correct_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its api_base wins over OPENAI_BASE_URL, so the variable is no remedy to offer."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    tier = Tier(name="own", model="openai/smollm2", api_base="http://127.0.0.1:9/v1")
    problem = tier_access(tier)
    assert problem is not None
    assert "http://127.0.0.1:9/v1" in problem
    assert "correct the tier's api_base" in problem
    assert "OPENAI_BASE_URL" not in problem


def test_a_job_needs_one_usable_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("OLLAMA_API_BASE", "http://127.0.0.1:9")
    dead = [Tier(name="a", model="ollama/x"), Tier(name="b", model="anthropic/claude-sonnet-4-5")]
    with pytest.raises(NoModelAvailable) as refused:
        require_a_usable_tier(MerlinConfig(tiers=dead))
    assert "tier 'a'" in str(refused.value)
    assert "tier 'b'" in str(refused.value)
    assert refused.value.exit_code == 2
    require_a_usable_tier(MerlinConfig(tiers=[*dead, Tier(name="c", model="scripted/x.yaml")]))
