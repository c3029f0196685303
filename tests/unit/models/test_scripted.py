"""The scripted model: rule matching, token counting, script loading, and litellm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from merlin_flow.config import Tier
from merlin_flow.models.scripted import reply_for
from merlin_flow.models.tokens import conversation_text, count_tokens
from merlin_flow.scripts import Script


def script(*rules: dict[str, Any]) -> Script:
    return Script.model_validate({"rules": list(rules)})


def reply(content: str) -> dict[str, Any]:
    return {"reply": {"content": content}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def content_of(s: Script, messages: list[dict[str, Any]]) -> str | None:
    found = reply_for(s, messages)
    return None if found is None else found.content


# --- reply_for -------------------------------------------------------------------------


def test_first_fitting_rule_wins() -> None:
    s = script(
        {"match": "absent", **reply("never")},
        {"match": "div", **reply("first")},
        {"match": "divide", **reply("second")},
        reply("catch-all"),
    )
    assert content_of(s, [user("please fix divide()")]) == "first"
    assert content_of(s, [user("something else")]) == "catch-all"


def test_match_is_a_regex_search_over_all_messages() -> None:
    s = script({"match": r"exit code \d+", **reply("saw failure")})
    messages = [
        {"role": "system", "content": "you are an agent"},
        user("fix it"),
        assistant(
            None,
            tool_calls=[
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "run_command", "arguments": '{"command": "pytest"}'},
                }
            ],
        ),
        {"role": "tool", "tool_call_id": "c1", "content": "exit code 1\nFAILED test_x"},
    ]
    # the match is only in the tool message, and not at the start of it
    assert content_of(s, messages) == "saw failure"
    assert content_of(s, messages[:3]) is None


def test_match_sees_tool_call_arguments_and_list_content() -> None:
    s = script({"match": "calc\\.py", **reply("args")}, {"match": "PART2", **reply("list")})
    call = {"function": {"name": "write_file", "arguments": '{"path": "calc.py"}'}}
    assert content_of(s, [assistant(None, tool_calls=[call])]) == "args"
    parts = [{"type": "text", "text": "PART1"}, {"type": "text", "text": "PART2"}]
    assert content_of(s, [{"role": "user", "content": parts}]) == "list"


def test_turn_counts_assistant_messages() -> None:
    s = script(
        {"turn": 0, **reply("t0")},
        {"turn": 1, **reply("t1")},
        {"turn": 2, "match": "tests pass", **reply("t2-pass")},
    )
    convo = [{"role": "system", "content": "sys"}, user("go")]
    assert content_of(s, convo) == "t0"
    # tool and user messages do not count as turns
    convo += [assistant("a"), {"role": "tool", "tool_call_id": "x", "content": "out"}, user("u")]
    assert content_of(s, convo) == "t1"
    convo += [assistant("b")]
    assert content_of(s, convo) is None
    convo += [user("tests pass")]
    assert content_of(s, convo) == "t2-pass"


def test_no_rule_fits_gives_none() -> None:
    assert reply_for(script(), [user("x")]) is None
    assert reply_for(script({"match": "^zzz$", **reply("z")}), [user("x")]) is None


def test_reply_for_is_pure() -> None:
    s = script({"turn": 0, **reply("once")})
    messages = [user("x")]
    assert content_of(s, messages) == "once"
    assert content_of(s, messages) == "once"


# --- through litellm -------------------------------------------------------------------


def test_completion_through_litellm(tmp_path: Path) -> None:
    import litellm

    from merlin_flow.models.llm import complete
    from merlin_flow.tools.toolbox import TOOL_SCHEMAS

    path = tmp_path / "model.yaml"
    rule = {
        "match": "divide",
        "turn": 0,
        "reply": {
            "content": "writing the fix",
            "tool_calls": [
                {
                    "name": "write_file",
                    "arguments": {
                        "path": "calc.py",
                        "content": "def divide(a, b):\n    return a / b\n",
                    },
                },
                # arguments may also be given as a ready JSON string
                {"name": "run_command", "arguments": '{"command": "pytest -q"}'},
            ],
        },
    }
    path.write_text(yaml.safe_dump({"rules": [rule]}))
    tier = Tier(name="t", model=f"scripted/{path}", price_in=1.0, price_out=2.0)
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix divide() in calc.py"},
    ]
    first = complete(tier, messages, TOOL_SCHEMAS)
    second = complete(tier, messages, TOOL_SCHEMAS)

    assert first.message["role"] == "assistant"
    assert first.message["content"] == "writing the fix"
    calls = first.tool_calls
    assert [c["type"] for c in calls] == ["function", "function"]
    assert [c["function"]["name"] for c in calls] == ["write_file", "run_command"]
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "path": "calc.py",
        "content": "def divide(a, b):\n    return a / b\n",
    }
    assert json.loads(calls[1]["function"]["arguments"]) == {"command": "pytest -q"}
    assert all(isinstance(c["id"], str) and c["id"] for c in calls)
    assert len({c["id"] for c in calls}) == 2

    expected_prompt = count_tokens(conversation_text(messages))
    expected_completion = count_tokens(conversation_text([first.message]))
    assert first.prompt_tokens == expected_prompt > 0
    assert first.completion_tokens == expected_completion > 0
    assert first.cost_usd == pytest.approx(
        (expected_prompt * 1.0 + expected_completion * 2.0) / 1e6
    )
    # deterministic: the same conversation gives the same reply, usage and hash
    assert second.message == first.message
    assert (second.prompt_tokens, second.completion_tokens) == (
        first.prompt_tokens,
        first.completion_tokens,
    )
    assert second.request_hash == first.request_hash

    # one assistant turn later the turn-0 rule no longer fits, and nothing else does
    follow_up = [*messages, first.message, {"role": "user", "content": "and now?"}]
    with pytest.raises(litellm.BadRequestError, match="no rule fits the conversation at turn 1"):
        complete(tier, follow_up, TOOL_SCHEMAS)
