"""Token counts without a tokenizer: the scripted model's usage, and the budget's fallback."""

from __future__ import annotations

import math
from typing import Any

CHARS_PER_TOKEN = 4


def conversation_text(messages: list[dict[str, Any]]) -> str:
    """All message contents and tool-call arguments, one message per paragraph."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if content:
            parts.append(str(content))
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            function = function if isinstance(function, dict) else {}
            parts.append(f"{function.get('name', '')} {function.get('arguments', '')}")
    return "\n\n".join(parts)


def count_tokens(text: str) -> int:
    """A deterministic estimate: one token per 4 characters (the scripted model's usage)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)
