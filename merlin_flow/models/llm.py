"""One completion call through litellm, with its usage, cost and latency.

litellm is imported lazily (it takes seconds and ~160 MiB), with its price map read from
the local copy rather than the network, and the scripted provider registered.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from merlin_flow.config import Tier
from merlin_flow.errors import ModelRefused, ModelUnreachable
from merlin_flow.models.endpoints import KEYED_AT_ANY_ENDPOINT, api_key

_lock = threading.Lock()
READ_ONLY_WARNING = r".*using the `ReadOnly` qualifier"
_litellm: Any = None


def litellm_module() -> Any:
    """Import and set up litellm once per process."""
    global _litellm
    with _lock:
        if _litellm is None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            import litellm

            # litellm builds pydantic adapters lazily, on calls, for TypedDicts with ReadOnly
            # fields; pydantic warns about each. Noise for merlin's users.
            warnings.filterwarnings("ignore", READ_ONLY_WARNING, UserWarning)

            from merlin_flow.models.scripted import PROVIDER, make_provider

            litellm.suppress_debug_info = True
            logging.getLogger("LiteLLM").setLevel(logging.WARNING)
            litellm.telemetry = False
            if not any(p.get("provider") == PROVIDER for p in litellm.custom_provider_map):
                litellm.custom_provider_map = [
                    *litellm.custom_provider_map,
                    {"provider": PROVIDER, "custom_handler": make_provider()},
                ]
            _litellm = litellm
    return _litellm


# litellm imports its MCP handler (about 1.4 s) inside the first completion with tools.
# Measured with cProfile on a worker's first step (tests/bench/overhead.py's job).
LAZY_IMPORTS = (
    "litellm.responses.mcp.chat_completions_handler",
    "litellm.responses.mcp.litellm_proxy_mcp_handler",
)


def preload() -> None:
    """Import litellm and what it imports lazily, so that no first call pays for it.

    Workers call this before forking their pool. A module litellm has moved is skipped.
    """
    import importlib

    litellm = litellm_module()
    for name in LAZY_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    getattr(litellm, "encoding", None)  # its default tokenizer loads on first use (0.3 s)


@dataclass
class Completion:
    """A model's reply in OpenAI message form, with what it cost."""

    message: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    """USD paid for the call; None when its price is unknown (see ``call_price``)."""
    latency_ms: float
    request_hash: str
    raw: dict[str, Any] = field(default_factory=dict)
    replayed: bool = False
    """Answered from the journal: nothing was paid for it this time."""
    cached: bool = False
    """Answered by the response cache from another request: nothing was paid for it."""

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls in the reply (empty when the model answered in text)."""
        calls = self.message.get("tool_calls") if isinstance(self.message, dict) else None
        return list(calls) if isinstance(calls, list) else []  # a damaged record: no calls


CONTENT_FILTERED = "the provider's content filter stopped the reply (finish_reason content_filter)"


def refusal(choice: Any) -> str | None:
    """Why a reply's ``choice`` refuses the request, or None when it answers it.

    OpenAI says so in ``message.refusal``; litellm puts Anthropic's ``stop_details``
    explanation there too. Anthropic's ``stop_reason: "refusal"``, Gemini's SAFETY (and
    other blocking) finish reasons and its blocked prompts reach litellm's
    ``finish_reason`` as "content_filter", mostly with no reason given.
    """
    text = getattr(choice.message, "refusal", None)
    if isinstance(text, str) and text.strip():
        return text.strip()
    if getattr(choice, "finish_reason", None) == "content_filter":
        return CONTENT_FILTERED
    return None


def request_hash(model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """A stable hash of a request: same model, messages and tools give the same hash."""
    body = json.dumps({"model": model, "messages": messages, "tools": tools}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


NULL_CONTENT_PROVIDERS = frozenset({"gemini", "vertex_ai", "vertex_ai_beta"})
"""Providers to which an assistant message with tool calls and no text is sent with null
content: litellm turns an empty string into an empty text part, which Gemini refuses.
Everyone else gets "": litellm drops a null content key, and OpenAI-compatible servers'
chat templates (llama.cpp's) fail without one. Anthropic's conversion skips "" either way."""


ModelCall = Callable[[Tier, list[dict[str, Any]], list[dict[str, Any]]], Completion]
"""How a model is called: ``complete``, or a journal's replay or the response cache."""


def complete(tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
    """Ask ``tier``'s model for the next message, in exactly one HTTP request.

    The provider client never retries (merlin's retry decision is the only one, and every
    request is journaled); the tier's endpoint, key variable and version are used as the
    job stored them. litellm's exceptions propagate (``diagnosis.examine`` reads them);
    a reply that refuses the request raises ModelRefused.
    """
    litellm = litellm_module()
    kwargs: dict[str, Any] = {
        "timeout": tier.timeout,
        "temperature": 0,
        "max_tokens": tier.max_tokens,
        "max_retries": 0,
        "num_retries": 0,
    }
    if tier.api_base is not None:
        kwargs["api_base"] = tier.api_base
    if tier.api_version is not None:
        kwargs["api_version"] = tier.api_version
    try:
        key = api_key(tier)
    except KeyError as exc:
        raise ModelUnreachable(
            f"api_key_env names {exc.args[0]}, which is not set on this worker"
        ) from None
    if key is not None:
        kwargs["api_key"] = key
    started = time.monotonic()
    response = litellm.completion(
        model=tier.model, messages=outgoing(messages, tier), tools=tools, **kwargs
    )
    latency_ms = (time.monotonic() - started) * 1000
    choice = response.choices[0]
    message = _message_dict(choice.message)
    usage = getattr(response, "usage", None)
    prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
    completion = Completion(
        message=message,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cost_usd=_cost(litellm, tier, response, prompt_tokens, completion_tokens),
        latency_ms=latency_ms,
        request_hash=request_hash(tier.model, messages, tools),
        raw=response.model_dump(mode="json"),
    )
    reason = refusal(choice)
    if reason is not None:
        raise ModelRefused(reason, completion)
    return completion


def outgoing(messages: list[dict[str, Any]], tier: Tier) -> list[dict[str, Any]]:
    """``messages`` as ``tier``'s provider accepts them (see NULL_CONTENT_PROVIDERS)."""
    if tier.provider in NULL_CONTENT_PROVIDERS:
        return messages
    return [
        {**message, "content": ""}
        if message.get("role") == "assistant" and message.get("content") is None
        else message
        for message in messages
    ]


MAX_REPLY_CHARS = 2**20
"""A reply's text is cut here (the agent keeps far less of it in its context)."""
REPLY_CUT = "\n[merlin: the reply was cut at {} characters]"
MAX_ARGUMENT_CHARS = 8 * 2**20
"""Longest arguments text (JSON) a tool call may carry; the toolbox parses no longer one."""


def _message_dict(message: Any) -> dict[str, Any]:
    """The reply as an OpenAI message, bounded before anything (the journal) keeps it.

    Text past ``MAX_REPLY_CHARS`` is cut; tool-call arguments past the most a call may
    carry (``MAX_ARGUMENT_CHARS``) are cut one character beyond it, so the tool refuses
    them exactly as it would have refused the whole.
    """
    content = message.content
    if isinstance(content, str) and len(content) > MAX_REPLY_CHARS:
        content = content[:MAX_REPLY_CHARS] + REPLY_CUT.format(MAX_REPLY_CHARS)
    result: dict[str, Any] = {"role": "assistant", "content": content}
    calls = getattr(message, "tool_calls", None) or []
    if calls:
        result["tool_calls"] = []
        for call in calls:
            arguments = call.function.arguments
            if isinstance(arguments, str) and len(arguments) > MAX_ARGUMENT_CHARS:
                arguments = arguments[: MAX_ARGUMENT_CHARS + 1]
            function = {"name": call.function.name, "arguments": arguments}
            result["tool_calls"].append({"id": call.id, "type": "function", "function": function})
    return result


def tier_price(tier: Tier, prompt: int, completion: int) -> float | None:
    """USD for these tokens at the tier's own prices; None when it sets none."""
    if tier.price_in is None and tier.price_out is None:
        return None
    return (prompt * (tier.price_in or 0.0) + completion * (tier.price_out or 0.0)) / 1e6


def map_priced(tier: Tier) -> bool:
    """True when litellm's price map may price ``tier``: it is served where that price holds.

    A tier at its own `api_base` may be anything: a local server behind the `openai/`
    prefix is not gpt-4o-mini, whatever its model name says.
    """
    return tier.api_base is None or tier.provider in KEYED_AT_ANY_ENDPOINT


def call_price(tier: Tier, prompt: int, completion: int) -> float | None:
    """USD for a call of ``prompt`` and ``completion`` tokens on ``tier``; None: unknown.

    The tier's own `price_in`/`price_out` win; the scripted model is free; otherwise
    litellm's price map, where it applies (``map_priced``) and knows the model.
    """
    own = tier_price(tier, prompt, completion)
    if own is not None:
        return own
    if tier.is_scripted:
        return 0.0
    if not map_priced(tier):
        return None
    try:
        cost_in, cost_out = litellm_module().cost_per_token(
            model=tier.model, prompt_tokens=prompt, completion_tokens=completion
        )
    except Exception:  # litellm raises assorted errors for models missing from its map
        return None
    return float(cost_in) + float(cost_out)


def is_priced(tier: Tier) -> bool:
    """True when a call on ``tier`` has a known price."""
    return call_price(tier, 1000, 1000) is not None


def _cost(litellm: Any, tier: Tier, response: Any, prompt: int, completion: int) -> float | None:
    own = tier_price(tier, prompt, completion)
    if own is not None:
        return own
    if tier.is_scripted:
        return 0.0
    if not map_priced(tier):
        return None
    try:
        return float(litellm.completion_cost(completion_response=response, model=tier.model))
    except Exception:  # litellm raises assorted errors for models missing from its map
        return None
