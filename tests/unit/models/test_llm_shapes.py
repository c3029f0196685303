"""The agent through litellm's real request and response handling, for three providers.

Each provider's recorded exchanges (tests/fixtures/providers/<provider>/, sources in its
README) are served over real HTTP by tests/provider_server.py, at the path litellm
uses for that provider: OpenAI's ``/v1/chat/completions``, Anthropic's ``/v1/messages``,
Gemini's ``/v1beta/models/<model>:generateContent``. Nothing of litellm or merlin is
mocked: the tests read the bytes litellm sent and what merlin made of the answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.agents.loop import StepBrief, run_agent
from merlin_flow.config import Limits, Tier
from merlin_flow.errors import AgentError, ModelRefused, ModelUnreachable
from merlin_flow.failures import FailureKind
from merlin_flow.models.diagnosis import examine
from merlin_flow.models.llm import Completion, complete, litellm_module
from merlin_flow.tools.toolbox import Toolbox
from tests.provider_server import FIXTURES, ProviderServer, load

PROVIDERS = ("openai", "anthropic", "gemini")
KEY_VARIABLE = "MERLIN_TEST_PROVIDER_KEY"
KEY = "test-provider-key"
MODELS = {
    "openai": "openai/gpt-4o",
    "anthropic": "anthropic/claude-sonnet-4-5",
    "gemini": "gemini/gemini-2.5-flash",
}
BASE_PATHS = {"openai": "/v1", "anthropic": "", "gemini": "/v1beta"}
"""What each tier's `api_base` adds to the server's root (litellm adds the rest)."""
WORKER_VARIABLES = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_API_BASE",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_API_BASE",
    "GEMINI_API_KEY",
    "GEMINI_API_BASE",
    "GOOGLE_API_KEY",
)
BRIEF = StepBrief("s1", "Feature", "write hello.txt and read it back", "it exists", "true")
CONTENT = "hello from the provider test\n"


class Journal:
    """The agent's on_call hook: one entry per request, as the journal records them."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, Completion | None, BaseException | None]] = []

    def __call__(self, turn: int, reply: Completion | None, exc: BaseException | None) -> None:
        self.calls.append((turn, reply, exc))


@pytest.fixture(autouse=True)
def _only_the_tiers_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose environment holds no provider's key or endpoint, only the tiers'."""
    for name in WORKER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(KEY_VARIABLE, KEY)


@pytest.fixture
def server() -> Any:
    with ProviderServer() as running:
        yield running


def tier_for(provider: str, server: ProviderServer) -> Tier:
    return Tier(
        name=provider,
        model=MODELS[provider],
        api_base=server.url + BASE_PATHS[provider],
        api_key_env=KEY_VARIABLE,
    )


def agent(provider: str, server: ProviderServer, workdir: Path, journal: Journal) -> Any:
    return run_agent(
        tier_for(provider, server),
        BRIEF,
        Toolbox(workdir),
        None,
        journal,
        limits=Limits(max_retry_attempts=3, retry_base_delay=0.0),
    )


def tool_names(provider: str, body: dict[str, Any]) -> set[str]:
    """The names of the tools a request offers, read in the provider's own shape."""
    if provider == "openai":
        return {tool["function"]["name"] for tool in body["tools"]}
    if provider == "anthropic":
        assert all("input_schema" in tool for tool in body["tools"])
        return {tool["name"] for tool in body["tools"]}
    return {d["name"] for tool in body["tools"] for d in tool["function_declarations"]}


def empty_texts(document: Any) -> list[Any]:
    """Every empty text block or part in a request body (Anthropic and Gemini refuse them)."""
    found = []
    if isinstance(document, dict):
        if "text" in document and not document["text"]:
            found.append(document)
        for value in document.values():
            found += empty_texts(value)
    elif isinstance(document, list):
        for item in document:
            found += empty_texts(item)
    return found


@pytest.mark.parametrize("provider", PROVIDERS)
def test_two_tool_calls_in_one_reply_run_and_are_answered_by_id(
    provider: str, server: ProviderServer, tmp_path: Path
) -> None:
    server.play(load(provider, "tool_calls"))
    journal = Journal()
    result = agent(provider, server, tmp_path, journal)

    assert (result.summary, result.turns) == ("Wrote hello.txt and read it back.", 2)
    assert (tmp_path / "hello.txt").read_text() == CONTENT
    assert len(server.requests) == 2
    # Path, key header, and the follow-up carrying both results matched to their calls
    # in the provider's own form (the facts are in the fixture).
    assert server.check() == []
    assert tool_names(provider, server.requests[0].body) >= {"write_file", "read_file"}
    first = journal.calls[0][1]
    assert first is not None
    assert [call["function"]["name"] for call in first.tool_calls] == ["write_file", "read_file"]
    assert json.loads(first.tool_calls[0]["function"]["arguments"])["content"] == CONTENT
    assert len({call["id"] for call in first.tool_calls}) == 2


def test_gemini_thought_signature_survives_the_round_trip(
    server: ProviderServer, tmp_path: Path
) -> None:
    # Gemini 3 refuses a follow-up without the signature; litellm keeps it in the call id.
    recording = load("gemini", "tool_calls")
    server.play(recording)
    journal = Journal()
    agent("gemini", server, tmp_path, journal)
    signature = recording.exchanges[0].body["candidates"][0]["content"]["parts"][0]
    model_turn = server.requests[1].body["contents"][-2]
    assert model_turn["parts"][0]["thoughtSignature"] == signature["thoughtSignature"]
    assert "thoughtSignature" not in model_turn["parts"][1]


REFUSALS = [
    ("openai", "refusal", "I'm sorry, I cannot assist with that request."),
    ("anthropic", "refusal", "This request was declined because it could enable cyber harm."),
    ("gemini", "refusal", "content filter"),
    ("gemini", "blocked_prompt", "content filter"),
]


@pytest.mark.parametrize(("provider", "name", "reason"), REFUSALS)
def test_a_refusal_ends_the_attempt_with_its_reason(
    provider: str, name: str, reason: str, server: ProviderServer, tmp_path: Path
) -> None:
    server.play(load(provider, name))
    journal = Journal()
    with pytest.raises(AgentError, match="the model refused") as caught:
        agent(provider, server, tmp_path, journal)

    assert not isinstance(caught.value, ModelUnreachable)  # the next tier may well answer
    assert reason in str(caught.value)
    assert len(server.requests) == 1  # a refusal is the answer: never retried
    assert server.check() == []
    assert list(tmp_path.iterdir()) == []
    [(turn, reply, exc)] = journal.calls
    assert (turn, reply) == (0, None)
    assert isinstance(exc, ModelRefused)
    assert examine(exc).kind is FailureKind.CAPABILITY
    assert exc.completion.prompt_tokens > 0  # the refused call was paid for


@pytest.mark.parametrize(
    ("provider", "words"),
    [
        ("openai", "maximum context length is 128000 tokens"),
        ("anthropic", "prompt is too long: 214850 tokens > 200000 maximum"),
        ("gemini", "exceeds the maximum number of tokens allowed (1048576)"),
    ],
)
def test_a_context_length_error_is_condensed_once_then_a_capability_failure(
    provider: str, words: str, server: ProviderServer, tmp_path: Path
) -> None:
    server.play(load(provider, "context_length"))
    server.play(load(provider, "context_length"))  # the condensed request, refused again
    journal = Journal()
    with pytest.raises(AgentError, match="context window exceeded") as caught:
        agent(provider, server, tmp_path, journal)

    assert not isinstance(caught.value, ModelUnreachable)
    assert words in str(caught.value)
    # max_retry_attempts=3, yet the request is sent again once only: condensed.
    assert len(server.requests) == 2
    assert server.check() == []
    [(_, _, first), (_, _, exc)] = journal.calls
    assert first is not None
    assert exc is not None
    failure = examine(exc)
    assert (failure.kind, failure.what) == (FailureKind.CAPABILITY, "context window exceeded")
    assert words in failure.detail


@pytest.mark.parametrize(
    ("provider", "prompt", "completion"),
    [
        ("openai", 2310, 57),  # prompt_tokens already counts the 2048 cached ones
        ("anthropic", 2310, 57),  # input_tokens 262 + cache_read_input_tokens 2048
        ("gemini", 2310, 369),  # candidatesTokenCount 57 + thoughtsTokenCount 312
    ],
)
def test_usage_tokens_are_read_from_each_providers_usage_shape(
    provider: str, prompt: int, completion: int, server: ProviderServer
) -> None:
    server.play(load(provider, "usage"))
    reply = complete(
        tier_for(provider, server), [{"role": "user", "content": "Are the tests green?"}], []
    )
    assert server.check() == []
    assert reply.message == {"role": "assistant", "content": "The tests pass now."}
    assert (reply.prompt_tokens, reply.completion_tokens) == (prompt, completion)
    assert reply.cost_usd is None  # a tier at its own endpoint: the price map does not apply


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_assistant_turn_of_tool_calls_only_is_sent_as_the_provider_accepts(
    provider: str, server: ProviderServer
) -> None:
    recording = load(provider, "tool_call_history")
    server.play(recording)
    reply = complete(tier_for(provider, server), recording.conversation, [])

    assert reply.message["content"] == "Done."
    assert server.check() == []  # OpenAI: content "", Anthropic and Gemini: the call alone
    assert empty_texts(server.requests[0].body) == []
    assert recording.conversation[1]["content"] is None  # merlin's own copy is untouched


def test_a_request_off_the_recorded_path_gets_the_providers_404(server: ProviderServer) -> None:
    # An Anthropic tier given Gemini's base path: litellm asks for /v1beta/v1/messages.
    server.play(load("anthropic", "usage"))
    tier = tier_for("anthropic", server).model_copy(update={"api_base": server.url + "/v1beta"})
    with pytest.raises(litellm_module().NotFoundError) as caught:
        complete(tier, [{"role": "user", "content": "Are the tests green?"}], [])
    assert examine(caught.value).what == "HTTP 404: no such model or endpoint"
    assert server.check() == ["request 1: path '/v1beta/v1/messages', expected '/v1/messages'"]


def test_every_recording_names_its_source_in_the_readme() -> None:
    readme = (FIXTURES / "README.md").read_text()
    files = sorted(FIXTURES.glob("*/*.json"))
    assert {path.parent.name for path in files} == set(PROVIDERS)
    for path in files:
        recording = load(path.parent.name, path.stem)
        assert recording.source
        assert recording.exchanges
        assert f"{path.parent.name}/{path.name}" in readme
    for provider in PROVIDERS:
        for name in ("tool_calls", "refusal", "context_length", "usage", "tool_call_history"):
            assert (FIXTURES / provider / f"{name}.json").is_file()
