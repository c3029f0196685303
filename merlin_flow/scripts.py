"""The scripted model's script files: their format, read and validated.

A script is YAML (documented for users in docs/scripted-model.md)::

    rules:
      - match: "regex"      # optional: searched in the text of all messages so far
        turn: 0             # optional: number of assistant messages already present
        reply:
          content: "text"
          delay: 2.5          # optional: seconds to wait before answering
          tool_calls:
            - name: write_file
              arguments: {path: "calc.py", content: "..."}

A configuration naming a ``scripted/<path>`` tier has its script read when it is loaded
(``merlin_flow.config.load_config``), so a broken script is an input error before any
job starts. The model that answers from a script is ``merlin_flow.models.scripted``.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from merlin_flow.errors import ConfigError
from merlin_flow.tasklist import YAML_TAG_ERRORS, load_yaml


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
