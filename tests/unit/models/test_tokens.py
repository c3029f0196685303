"""Token estimates: the scripted model's usage and the budget's fallback count."""

from __future__ import annotations

from typing import Any

import pytest

from merlin_flow.models.tokens import conversation_text, count_tokens


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_conversation_text_joins_messages_as_paragraphs() -> None:
    text = conversation_text([user("one"), user("two"), {"role": "assistant", "content": None}])
    assert text == "one\n\ntwo"


@pytest.mark.parametrize(
    ("text", "tokens"), [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("x" * 400, 100)]
)
def test_count_tokens(text: str, tokens: int) -> None:
    assert count_tokens(text) == tokens
    assert count_tokens(text) == tokens  # no hidden state between calls
