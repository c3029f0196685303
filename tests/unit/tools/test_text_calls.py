"""Tool calls written as text: every format models produce, read back or left alone."""

from __future__ import annotations

import json
from typing import Any

import pytest

from merlin_flow.tools.text_calls import text_tool_calls

KNOWN = ("read_file", "write_file", "edit_file", "list_files", "grep", "run_command", "finish")
READ = {"path": "app.py"}

# id -> (reply text, expected [(name, arguments)])
FORMATS: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    "fenced-json": (
        'I will read it.\n```json\n{"name": "read_file", "arguments": {"path": "app.py"}}\n```',
        [("read_file", READ)],
    ),
    "fenced-plain": (
        '```\n{"name": "read_file", "arguments": {"path": "app.py"}}\n```',
        [("read_file", READ)],
    ),
    "fenced-tool_call": (
        '```tool_call\n{"name": "read_file", "parameters": {"path": "app.py"}}\n```',
        [("read_file", READ)],
    ),
    "fenced-list": (
        '```json\n[{"name": "read_file", "arguments": {"path": "app.py"}},\n'
        ' {"name": "grep", "arguments": {"pattern": "def "}}]\n```',
        [("read_file", READ), ("grep", {"pattern": "def "})],
    ),
    "fenced-two-blocks": (
        '```json\n{"name": "read_file", "arguments": {"path": "app.py"}}\n```\nthen\n'
        '```json\n{"name": "list_files", "arguments": {}}\n```',
        [("read_file", READ), ("list_files", {})],
    ),
    "fenced-openai-shape": (
        '```json\n{"type": "function", "function": {"name": "read_file", '
        '"arguments": "{\\"path\\": \\"app.py\\"}"}}\n```',
        [("read_file", READ)],
    ),
    "hermes": (
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "app.py"}}\n</tool_call>',
        [("read_file", READ)],
    ),
    "hermes-several": (
        'Reading both.\n<tool_call>{"name": "read_file", "arguments": {"path": "app.py"}}'
        '</tool_call>\n<tool_call>{"name": "read_file", "arguments": {"path": "b.py"}}'
        "</tool_call>",
        [("read_file", READ), ("read_file", {"path": "b.py"})],
    ),
    "hermes-left-open": (
        '<tool_call>\n{"name": "list_files", "arguments": {"pattern": "*.py"}}',
        [("list_files", {"pattern": "*.py"})],
    ),
    "hermes-after-thinking": (
        '<think>maybe <tool_call>{"name": "read_file", "arguments": {"path": "x"}}'
        '</tool_call>?</think>\n<tool_call>{"name": "read_file", "arguments": '
        '{"path": "app.py"}}</tool_call>',
        [("read_file", READ)],
    ),
    "qwen3-coder": (
        "<tool_call>\n<function=edit_file>\n<parameter=path>\napp.py\n</parameter>\n"
        "<parameter=old>\n    return 41\n</parameter>\n<parameter=new>\n    return 42\n"
        "</parameter>\n</function>\n</tool_call>",
        [("edit_file", {"path": "app.py", "old": "    return 41", "new": "    return 42"})],
    ),
    "qwen3-coder-unwrapped": (
        "<function=read_file>\n<parameter=path>\napp.py\n</parameter>\n"
        "<parameter=start_line>\n3\n</parameter>\n</function>\n</tool_call>",
        [("read_file", {"path": "app.py", "start_line": "3"})],
    ),
    "qwen3-coder-no-parameters": ("<function=list_files>\n</function>", [("list_files", {})]),
    "llama-function-tag": (
        '<function=read_file>{"path": "app.py"}</function>',
        [("read_file", READ)],
    ),
    "mistral": (
        '[TOOL_CALLS] [{"name": "read_file", "arguments": {"path": "app.py"}}, '
        '{"name": "finish", "arguments": {"summary": "done"}}]',
        [("read_file", READ), ("finish", {"summary": "done"})],
    ),
    "mistral-named": (
        '[TOOL_CALLS]read_file[ARGS]{"path": "app.py"}[TOOL_CALLS]list_files[ARGS]{}',
        [("read_file", READ), ("list_files", {})],
    ),
    "llama-bare-json": (
        '{"name": "read_file", "parameters": {"path": "app.py"}}',
        [("read_file", READ)],
    ),
    "llama-bare-json-semicolons": (
        '{"name": "read_file", "parameters": {"path": "app.py"}}; '
        '{"name": "grep", "parameters": {"pattern": "x"}}',
        [("read_file", READ), ("grep", {"pattern": "x"})],
    ),
    "llama-python-tag": (
        '<|python_tag|>{"name": "read_file", "parameters": {"path": "app.py"}}',
        [("read_file", READ)],
    ),
    "arguments-as-string": (
        '<tool_call>{"name": "read_file", "arguments": "{\\"path\\": \\"app.py\\"}"}</tool_call>',
        [("read_file", READ)],
    ),
    "arguments-as-non-json-string": (
        '<tool_call>{"name": "read_file", "arguments": "app.py"}</tool_call>',
        [("read_file", "app.py")],  # passed on: the toolbox answers that it is not JSON
    ),
    "trailing-commas": (
        '```json\n{"name": "read_file", "arguments": {"path": "app.py",},}\n```',
        [("read_file", READ)],
    ),
    "raw-newline-in-string": (
        '<tool_call>{"name": "write_file", "arguments": {"path": "a.txt", "content": "one\ntwo\n"}}'
        "</tool_call>",
        [("write_file", {"path": "a.txt", "content": "one\ntwo\n"})],
    ),
    "unknown-name-skipped-known-kept": (
        '<tool_call>{"name": "delete_repo", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "read_file", "arguments": {"path": "app.py"}}</tool_call>',
        [("read_file", READ)],
    ),
    "malformed-skipped-good-kept": (
        '<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>'
        '<tool_call>{"name": "grep", "arguments": {"pattern": "x"}}</tool_call>',
        [("grep", {"pattern": "x"})],
    ),
}

# id -> a reply with no call in it
NO_CALLS: dict[str, str] = {
    "prose": "I changed answer() to return 42 and the tests pass.",
    "prose-with-braces": 'The config maps {"name": "read_file"} to a reader; see {x: 1}.',
    "prose-with-json-object": 'Here is the user: {"name": "Ada", "parameters": {"age": 3}}.',
    "bare-json-without-arguments": '{"name": "read_file"}',
    "bare-json-then-prose": '{"name": "read_file", "parameters": {"path": "a"}} and more',
    "unknown-tool": '<tool_call>{"name": "rm_rf", "arguments": {"path": "/"}}</tool_call>',
    "unknown-tool-bare": '{"name": "rm_rf", "parameters": {}}',
    "malformed-json": '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"</tool_call>',
    "malformed-fence": '```json\n{"name": "read_file", "arguments": \n```',
    "fenced-code": "```python\nprint({'name': 'read_file'})\n```",
    "fenced-other-json": '```json\n{"name": "my-package", "version": "1.0.0"}\n```',
    "function-tag-with-prose": "<function=read_file>please read app.py</function>",
    "only-thinking": '<think><tool_call>{"name": "read_file", "arguments": {}}</tool_call>',
    "empty": "",
    "whitespace": "  \n ",
}


def named(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    out = []
    for call in calls:
        text = call["function"]["arguments"]
        try:
            arguments = json.loads(text)
        except json.JSONDecodeError:
            arguments = text
        out.append((call["function"]["name"], arguments))
    return out


@pytest.mark.parametrize(("content", "expected"), list(FORMATS.values()), ids=list(FORMATS))
def test_formats(content: str, expected: list[tuple[str, Any]]) -> None:
    calls = text_tool_calls(content, KNOWN)
    assert named(calls) == expected
    for number, call in enumerate(calls, 1):
        assert call["id"] == f"text-{number}"
        assert call["type"] == "function"
        assert isinstance(call["function"]["arguments"], str)


@pytest.mark.parametrize("content", list(NO_CALLS.values()), ids=list(NO_CALLS))
def test_no_call(content: str) -> None:
    assert text_tool_calls(content, KNOWN) == []


def test_only_known_names_are_calls() -> None:
    content = '<tool_call>{"name": "run_command", "arguments": {"command": "ls"}}</tool_call>'
    assert text_tool_calls(content, ("read_file", "grep", "list_files")) == []
    assert named(text_tool_calls(content, {"run_command"})) == [("run_command", {"command": "ls"})]


def test_the_first_format_found_wins() -> None:
    # A <tool_call> block written inside a fence is read once, not twice.
    content = '```\n<tool_call>{"name": "grep", "arguments": {"pattern": "x"}}</tool_call>\n```'
    assert named(text_tool_calls(content, KNOWN)) == [("grep", {"pattern": "x"})]


def test_ids_take_the_prefix() -> None:
    calls = text_tool_calls('{"name": "list_files", "arguments": {}}', KNOWN, prefix="text-4")
    assert [call["id"] for call in calls] == ["text-4-1"]


@pytest.mark.parametrize(
    "content",
    [
        None,
        "<tool_call>" * 50,
        "[TOOL_CALLS]" * 20 + "[",
        "```json\n" + "[" * 5000 + "\n```",
        '<tool_call>{"name": ' + '"a' * 1000,
        "{" * 10_000,
        "<function=read_file><parameter=path>",
    ],
    ids=["none", "tags", "markers", "deep-nesting", "unterminated", "braces", "open-tags"],
)
def test_never_raises(content: Any) -> None:
    assert isinstance(text_tool_calls(content, KNOWN), list)
