"""The scripted model: an offline, deterministic LLM for tests, the demo and benchmarks.

It is a real litellm provider, selected with ``model = "scripted/<path to script.yaml>"``,
so everything above it (the agent loop, tools, journal, escalation) runs the real code.
It is a pure function of the conversation: the first rule that fits gives the reply, and
no cursor is kept anywhere. Script format (documented for users in docs/scripted-model.md)::

    rules:
      - match: "regex"      # optional: searched in the text of all messages so far
        turn: 0             # optional: number of assistant messages already present
        reply:
          content: "text"
          delay: 2.5          # optional: seconds to wait before answering
          tool_calls:
            - name: write_file
              arguments: {path: "calc.py", content: "..."}

No rule fits: the call fails with ``litellm.BadRequestError`` (a capability failure, so
the step escalates). ``reply: {error: RateLimitError}`` raises that litellm exception
instead, to rehearse failure paths. Token usage is counted from the text (4 characters a
token).
"""

from __future__ import annotations

import json
import re
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from merlin_flow.errors import ConfigError
from merlin_flow.models.tokens import conversation_text, count_tokens
from merlin_flow.tasklist import YAML_TAG_ERRORS, load_yaml

PROVIDER = "scripted"


class ScriptedToolCall(BaseModel):
    """A tool call the scripted model makes."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)

    def arguments_json(self) -> str:
        """The arguments as the JSON string OpenAI-style replies carry."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


RAISABLE_ERRORS = (
    "RateLimitError",
    "Timeout",
    "APIConnectionError",
    "InternalServerError",
    "ServiceUnavailableError",
    "BadGatewayError",
    "BadRequestError",
    "AuthenticationError",
    "ContextWindowExceededError",
)


class ScriptedReply(BaseModel):
    """What the model answers: text, tool calls, or both; or an error it raises."""

    model_config = ConfigDict(extra="forbid")

    content: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    error: str | None = None
    """Name of a litellm exception to raise instead of answering (see RAISABLE_ERRORS)."""
    delay: float = Field(default=0.0, ge=0, le=600)
    """Seconds to wait before answering, as a real model takes time to think."""

    @field_validator("error")
    @classmethod
    def _known_error(cls, value: str | None) -> str | None:
        if value is not None and value not in RAISABLE_ERRORS:
            raise ValueError(f"unknown error {value!r}; one of: {', '.join(RAISABLE_ERRORS)}")
        return value


class Rule(BaseModel):
    """One rule: when it fits the conversation, its reply is the answer."""

    model_config = ConfigDict(extra="forbid")

    match: str | None = None
    turn: int | None = Field(default=None, ge=0)
    reply: ScriptedReply

    @field_validator("match")
    @classmethod
    def _valid_regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
        return value

    def fits(self, text: str, turn: int) -> bool:
        """True when this rule applies to a conversation with ``text`` at ``turn``."""
        if self.turn is not None and self.turn != turn:
            return False
        return self.match is None or re.search(self.match, text) is not None


class Script(BaseModel):
    """A whole script: rules tried in order."""

    model_config = ConfigDict(extra="forbid")

    rules: list[Rule]

    def reply_for(self, messages: list[dict[str, Any]]) -> ScriptedReply | None:
        """The reply of the first rule that fits, or None."""
        text = conversation_text(messages)
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        return next((rule.reply for rule in self.rules if rule.fits(text, turn)), None)


def load_script(path: str | Path) -> Script:
    """Read and validate a script; ConfigError names the file and the problem."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        raise ConfigError(f"scripted model file does not exist: {path}") from None
    return _load_script(str(path), stat.st_mtime_ns)


@lru_cache(maxsize=64)
def _load_script(path: str, _mtime_ns: int) -> Script:
    try:
        data = load_yaml(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, *YAML_TAG_ERRORS) as exc:
        raise ConfigError(f"cannot read scripted model file {path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"scripted model file {path}: nested too deeply") from None
    try:
        return Script.model_validate(data)
    except RecursionError:
        raise ConfigError(f"scripted model file {path}: nested too deeply") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid scripted model file {path}: {problems}") from None


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
            reply = script.reply_for(messages)
            if reply is None:
                turn = sum(1 for m in messages if m.get("role") == "assistant")
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
