"""The scripted model: an offline, deterministic LLM for tests, the demo and benchmarks.

It is a real litellm provider, selected with ``model = "scripted/<path to script.yaml>"``,
so everything above it (the agent loop, tools, journal, escalation) runs the real code.
It is a pure function of the conversation: the first rule of the script
(``merlin_flow.scripts``) that fits gives the reply, and no cursor is kept anywhere.

No rule fits: the call fails with ``litellm.BadRequestError`` (a capability failure, so
the step escalates). ``reply: {error: RateLimitError}`` raises that litellm exception
instead, to rehearse failure paths. Token usage is counted from the text (4 characters a
token).
"""

from __future__ import annotations

import re
import time
from typing import Any

from merlin_flow.errors import ConfigError
from merlin_flow.models.tokens import conversation_text, count_tokens
from merlin_flow.scripts import Script, ScriptedReply, load_script

PROVIDER = "scripted"
CONDENSED_NOTE = (
    "[merlin: {replies} earlier replies of this attempt were condensed to fit the model's context]"
)
"""How a condensed conversation starts its summary (``merlin_flow.agents.condense``)."""
_CONDENSED = re.compile(r"^\[merlin: (\d+) earlier replies of this attempt were condensed")


def replies_condensed(message: dict[str, Any]) -> int:
    """How many replies ``message`` (a condensation's note) stands for; 0 for any other."""
    content = message.get("content")
    found = _CONDENSED.match(content) if isinstance(content, str) else None
    return int(found.group(1)) if found else 0


def turn_of(messages: list[dict[str, Any]]) -> int:
    """The conversation's turn: its replies, those a condensation summarised included."""
    return sum(1 if m.get("role") == "assistant" else replies_condensed(m) for m in messages)


def reply_for(script: Script, messages: list[dict[str, Any]]) -> ScriptedReply | None:
    """The reply of the first rule of ``script`` that fits the conversation, or None.

    A rule's ``turn`` counts the replies a condensation summarised too, so a script
    goes on where it was after its conversation is condensed.
    """
    text = conversation_text(messages)
    return next((rule.reply for rule in script.rules if rule.fits(text, turn_of(messages))), None)


def make_provider() -> Any:
    """Build the litellm custom provider (imports litellm; call from merlin_flow.models.llm)."""
    import litellm
    from litellm import CustomLLM, ModelResponse

    class ScriptedLLM(CustomLLM):  # type: ignore[misc]
        """litellm handler for ``scripted/<script path>`` models."""

        def completion(self, model: str, messages: list[dict[str, Any]], *_: Any, **__: Any) -> Any:
            try:
                script = load_script(model)
            except ConfigError as exc:
                raise litellm.BadRequestError(
                    message=str(exc), model=f"{PROVIDER}/{model}", llm_provider=PROVIDER
                ) from None
            reply = reply_for(script, messages)
            if reply is None:
                turn = turn_of(messages)
                raise litellm.BadRequestError(
                    message=f"scripted model {model}: no rule fits the conversation at turn {turn}",
                    model=f"{PROVIDER}/{model}",
                    llm_provider=PROVIDER,
                )
            if reply.delay:
                time.sleep(reply.delay)
            if reply.error is not None:
                error_class = getattr(litellm, reply.error)
                raise error_class(
                    message=f"scripted {reply.error}",
                    model=f"{PROVIDER}/{model}",
                    llm_provider=PROVIDER,
                )
            tool_calls = [
                {
                    "id": f"call_{len(messages)}_{index}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_json()},
                }
                for index, call in enumerate(reply.tool_calls)
            ]
            message: dict[str, Any] = {"role": "assistant", "content": reply.content}
            if tool_calls:
                message["tool_calls"] = tool_calls
            prompt_tokens = count_tokens(conversation_text(messages))
            completion_tokens = count_tokens(conversation_text([message]))
            return ModelResponse(
                model=f"{PROVIDER}/{model}",
                choices=[
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if tool_calls else "stop",
                    }
                ],
                usage={
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            )

        async def acompletion(self, *args: Any, **kwargs: Any) -> Any:
            return self.completion(*args, **kwargs)

    return ScriptedLLM()
