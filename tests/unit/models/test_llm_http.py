"""Model calls over real HTTP, through litellm, to an OpenAI-compatible server on 127.0.0.1.

The server (tests/model_server.py) counts every request it receives, so these tests see
what merlin really sends: how many requests a failing call costs, what a follow-up turn
carries, where each tier's requests go and which key they hold.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.agents.loop import StepBrief, run_agent
from merlin_flow.config import DEFAULT_MAX_TOKENS, Limits, MerlinConfig, Tier
from merlin_flow.errors import AgentError, ModelUnreachable
from merlin_flow.failures import FailureKind
from merlin_flow.models.diagnosis import examine, retry_after
from merlin_flow.models.endpoints import NO_KEY, pin_endpoints
from merlin_flow.models.llm import Completion, complete, litellm_module, outgoing
from merlin_flow.models.window import FLOOR_TOKENS
from merlin_flow.tools.toolbox import Toolbox
from tests.model_server import ModelServer, error, text, tool_call

BRIEF = StepBrief("s1", "Feature", "write hello.txt", "it exists", "true")
ENDPOINT_VARIABLES = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY")


class Journal:
    """The agent's on_call hook: one entry per request, as the journal records them."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, Completion | None, BaseException | None]] = []

    def __call__(self, turn: int, reply: Completion | None, exc: BaseException | None) -> None:
        self.calls.append((turn, reply, exc))


@pytest.fixture(autouse=True)
def _no_endpoint_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose environment names no endpoint and holds no OpenAI key."""
    for name in ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Any:
    with ModelServer() as running:
        yield running


def tier_at(url: str, **extra: Any) -> Tier:
    return Tier(name=extra.pop("name", "local"), model="openai/tiny-model", api_base=url, **extra)


def agent(
    tier: Tier, workdir: Path, journal: Journal, limits: Limits | None = None, **kwargs: Any
) -> Any:
    return run_agent(
        tier,
        BRIEF,
        Toolbox(workdir),
        None,
        journal,
        limits=limits or Limits(retry_base_delay=0.0),
        **kwargs,
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_failing_call_sends_one_request_per_documented_retry(
    server: ModelServer, tmp_path: Path
) -> None:
    limits = Limits(max_retry_attempts=2, retry_base_delay=0.0)
    server.queue(*(error(503, f"overloaded, try {n}") for n in range(10)))
    journal = Journal()
    with pytest.raises(AgentError, match="after 2 retries: HTTP 503: server error"):
        agent(tier_at(server.url), tmp_path, journal, limits)
    # 1 + max_retry_attempts requests, no more: the provider client never retries.
    assert len(server.requests) == 1 + limits.max_retry_attempts
    assert len(journal.calls) == len(server.requests)  # each request journaled


def test_a_server_error_that_recurs_alike_is_not_retried_again(
    server: ModelServer, tmp_path: Path
) -> None:
    server.queue(*(error(500, "template failed at token 12") for _ in range(5)))
    with pytest.raises(AgentError, match="twice alike: template failed at token 12"):
        agent(tier_at(server.url), tmp_path, Journal(), Limits(max_retry_attempts=5))
    assert len(server.requests) == 2


def test_a_tool_call_round_trip_with_a_follow_up_turn(server: ModelServer, tmp_path: Path) -> None:
    server.queue(tool_call("write_file", {"path": "hello.txt", "content": "hi\n"}), text("done"))
    journal = Journal()
    result = agent(tier_at(server.url), tmp_path, journal)
    assert (result.summary, result.turns) == ("done", 2)
    assert (tmp_path / "hello.txt").read_text() == "hi\n"
    assert len(server.requests) == 2
    follow_up = server.requests[1].body["messages"]
    assistant = next(m for m in follow_up if m["role"] == "assistant")
    assert assistant["content"] == ""  # a string: the server's chat template needs one
    assert assistant["tool_calls"][0]["function"]["name"] == "write_file"
    assert follow_up[-1]["role"] == "tool"
    assert "hello.txt" in follow_up[-1]["content"]
    # The journal keeps the reply as the model sent it (null content, as OpenAI does).
    assert journal.calls[0][1] is not None
    assert journal.calls[0][1].message["content"] is None


def test_requests_carry_max_tokens_temperature_and_no_retries(
    server: ModelServer, tmp_path: Path
) -> None:
    agent(tier_at(server.url), tmp_path, Journal())
    body = server.requests[0].body
    # The tier's 4,096 is capped to a quarter of the window (an unmapped model: 8,192).
    assert body["max_tokens"] == min(DEFAULT_MAX_TOKENS, FLOOR_TOKENS // 4) == 2048
    assert body["temperature"] == 0
    assert {tool["function"]["name"] for tool in body["tools"]} >= {"read_file", "write_file"}


def test_a_wrong_port_fails_in_one_call_naming_the_endpoint(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    journal = Journal()
    with pytest.raises(ModelUnreachable) as caught:
        agent(tier_at(url), tmp_path, journal, Limits(max_retry_attempts=5))
    assert len(journal.calls) == 1
    message = str(caught.value)
    assert url in message
    assert "'local'" in message
    assert "openai/tiny-model" in message
    assert "no server answers" in message
    assert "Connection refused" in message


def test_a_missing_key_fails_in_one_call_naming_the_endpoint(tmp_path: Path) -> None:
    with ModelServer(api_key="s3cret") as guarded:
        journal = Journal()
        with pytest.raises(ModelUnreachable, match=r"HTTP 401: authentication failed") as caught:
            agent(tier_at(guarded.url), tmp_path, journal, Limits(max_retry_attempts=5))
        assert len(guarded.requests) == len(journal.calls) == 1
        assert guarded.url in str(caught.value)


def test_the_key_comes_from_the_variable_the_tier_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MERLIN_TEST_LOCAL_KEY", "s3cret")
    with ModelServer(api_key="s3cret") as guarded:
        result = agent(
            tier_at(guarded.url, api_key_env="MERLIN_TEST_LOCAL_KEY"), tmp_path, Journal()
        )
        assert result.summary == "done"
        assert guarded.requests[0].headers["authorization"] == "Bearer s3cret"


def test_a_key_variable_missing_on_the_worker_fails_with_no_request(
    server: ModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MERLIN_TEST_ABSENT_KEY", raising=False)
    tier = tier_at(server.url, api_key_env="MERLIN_TEST_ABSENT_KEY")
    with pytest.raises(ModelUnreachable, match="MERLIN_TEST_ABSENT_KEY, which is not set"):
        agent(tier, tmp_path, Journal())
    assert server.requests == []


def test_a_providers_key_is_never_sent_to_a_tiers_own_endpoint(
    server: ModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-real-openai-key")
    agent(tier_at(server.url), tmp_path, Journal())
    assert server.requests[0].headers["authorization"] == f"Bearer {NO_KEY}"


def test_two_tiers_of_one_provider_each_call_their_own_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ModelServer(model="small") as first, ModelServer(model="large") as second:
        # A worker's own endpoint variable does not move a tier that names its endpoint.
        monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{closed_port()}/v1")
        for tier in (tier_at(first.url, name="small"), tier_at(second.url, name="large")):
            complete(tier, [{"role": "user", "content": f"hello {tier.name}"}], [])
        assert [r.body["messages"][0]["content"] for r in first.requests] == ["hello small"]
        assert [r.body["messages"][0]["content"] for r in second.requests] == ["hello large"]


def test_a_turn_is_bounded_whatever_the_tier_timeout(server: ModelServer, tmp_path: Path) -> None:
    server.queue(*(text("late") for _ in range(3)))
    for reply in server.replies:
        reply.delay = 3.0
    limits = Limits(turn_timeout=1.0, max_retry_attempts=5, retry_base_delay=0.0)
    started = time.monotonic()
    with pytest.raises(AgentError, match=r"took over 1 s \(limits.turn_timeout\)"):
        agent(tier_at(server.url, timeout=600), tmp_path, Journal(), limits)
    assert time.monotonic() - started < 2.9  # the request was cut at the turn's end


def test_endpoints_from_the_submitters_environment_are_pinned_to_the_job() -> None:
    config = MerlinConfig(
        tiers=[
            Tier(name="local", model="openai/tiny"),
            Tier(name="own", model="openai/big", api_base="http://10.0.0.2:8000/v1"),
            Tier(name="ollama", model="ollama_chat/qwen"),
            Tier(name="claude", model="anthropic/claude-sonnet-4-5"),
        ]
    )
    environ = {"OPENAI_BASE_URL": "http://127.0.0.1:8080/v1", "OPENAI_API_KEY": "sk-x"}
    pinned = {tier.name: tier for tier in pin_endpoints(config, environ).tiers}
    assert pinned["local"].api_base == "http://127.0.0.1:8080/v1"
    assert pinned["local"].api_key_env == "OPENAI_API_KEY"  # the name, never the key
    assert "sk-x" not in str(pin_endpoints(config, environ).model_dump())
    assert pinned["own"].api_base == "http://10.0.0.2:8000/v1"
    assert pinned["own"].api_key_env is None
    assert pinned["ollama"].api_base == "http://localhost:11434"
    assert pinned["claude"].api_base is None


def test_what_happened_decides_the_kind_of_failure(server: ModelServer) -> None:
    litellm = litellm_module()

    def failure_of(reply: Any) -> Any:
        server.queue(reply)
        try:
            complete(tier_at(server.url), [{"role": "user", "content": "x"}], [])
        except Exception as exc:
            return examine(exc)
        raise AssertionError("the call did not fail")

    assert failure_of(error(401)).kind is FailureKind.ACCESS
    assert failure_of(error(404, "model 'x' not found")).kind is FailureKind.ACCESS
    assert failure_of(error(429, "slow down")).kind is FailureKind.TRANSIENT
    assert failure_of(error(502)).kind is FailureKind.TRANSIENT
    refused = failure_of(error(400, "this model's maximum context length is 2048 tokens"))
    assert (refused.kind, refused.what) == (FailureKind.CAPABILITY, "context window exceeded")
    assert failure_of(error(400, "bad tool schema")).kind is FailureKind.CAPABILITY
    budget = litellm.BudgetExceededError(current_cost=2.0, max_budget=1.0)
    assert examine(budget).kind is FailureKind.BUDGET


def test_retry_after_is_read_from_the_response() -> None:
    import httpx

    litellm = litellm_module()
    response = httpx.Response(
        429, headers={"retry-after": "7"}, request=httpx.Request("POST", "http://x")
    )
    exc = litellm.RateLimitError(message="m", model="x", llm_provider="openai", response=response)
    assert retry_after(exc) == 7.0


def test_assistant_tool_call_messages_suit_each_providers_shape() -> None:
    from litellm.llms.anthropic.chat.transformation import AnthropicConfig
    from litellm.llms.vertex_ai.gemini.transformation import (
        _gemini_convert_messages_with_history,
    )

    litellm_module()
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    openai = outgoing(messages, Tier(name="o", model="openai/gpt-4o-mini"))
    assert openai[1]["content"] == ""
    assert messages[1]["content"] is None
    claude = AnthropicConfig().transform_request(
        model="claude-sonnet-4-5",
        messages=outgoing(messages, Tier(name="a", model="anthropic/claude-sonnet-4-5")),
        optional_params={"max_tokens": 10},
        litellm_params={},
        headers={},
    )
    blocks = [block for message in claude["messages"] for block in message["content"]]
    assert not [b for b in blocks if b.get("type") == "text" and not b.get("text")]
    gemini = _gemini_convert_messages_with_history(
        messages=outgoing(messages, Tier(name="g", model="gemini/gemini-2.5-flash"))
    )
    parts = [part for content in gemini for part in content["parts"]]
    assert not [p for p in parts if "text" in p and not p["text"]]  # Gemini refuses empty text


@pytest.mark.skipif(
    not os.environ.get("MERLIN_TEST_LLAMA_URL"),
    reason="set MERLIN_TEST_LLAMA_URL to a llama.cpp server (docs/models.md) to run",
)
def test_a_real_llama_cpp_server_answers_a_follow_up_turn(tmp_path: Path) -> None:
    url = os.environ["MERLIN_TEST_LLAMA_URL"]
    tier = Tier(name="smol", model="openai/smollm2", api_base=url, max_tokens=64)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Say hi."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "hello.txt: hi"},
    ]
    reply = complete(tier, messages, [])
    assert reply.prompt_tokens > 0
    assert reply.cost_usd is None
