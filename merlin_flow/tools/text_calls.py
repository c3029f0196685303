"""Tool calls a model wrote as text, read back into OpenAI ``tool_calls``.

Local models often answer a request with tools by writing the call in their reply's text
instead of the API's ``tool_calls`` field (their server's chat template does not parse
it). ``text_tool_calls`` finds such calls, for tools the model was offered only:

=================  ===========================================================
Format             Written as
=================  ===========================================================
Hermes, Qwen 2/3   ``<tool_call>{"name": "read_file", "arguments": {...}}</tool_call>``
                   (one or several; a last one left open counts)
Qwen3-Coder        ``<function=read_file><parameter=path>a.py</parameter></function>``,
                   inside ``<tool_call>`` or not; values are strings
Llama 3.1 custom   ``<function=read_file>{"path": "a.py"}</function>``
Mistral            ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}]``, or the newer
                   ``[TOOL_CALLS]read_file[ARGS]{"path": "a.py"}``
Llama 3.x JSON     the whole reply is ``{"name": ..., "parameters": {...}}`` (or a list,
                   or ``;``-separated), perhaps after ``<|python_tag|>``
Fenced JSON        a ```` ```json ````, ```` ``` ```` or ```` ```tool_call ```` block holding
                   such an object, or a list of them
=================  ===========================================================

The first format (in that order) that yields a call wins; its calls are returned in the
order written. In every format the arguments may be under ``arguments`` or
``parameters``, an object or a JSON string; the OpenAI shape ``{"type": "function",
"function": {...}}`` is read too. A bare reply (no tag, marker or fence) counts only with
an ``arguments``/``parameters`` key, so prose such as ``{"name": "Ada"}`` is never a call.

Lenient where models slip: raw newlines inside strings, trailing commas (removed before a
second try when the JSON does not parse). Malformed JSON, unknown tool names and
anything else unreadable are skipped, never raised. ``<think>`` blocks are left out:
a call drafted while reasoning is not a call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator
from typing import Any

_DECODER = json.JSONDecoder(strict=False)
_THINKING = re.compile(r"<think>.*?(?:</think>|\Z)", re.S)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_TOOL_CALL_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_FUNCTION_TAG = re.compile(r"<function=([\w.:-]+)>(.*?)(?:</function>|\Z)", re.S)
_PARAMETER_TAG = re.compile(r"<parameter=([\w.:-]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.S)
_MISTRAL = "[TOOL_CALLS]"
_MISTRAL_NAMED = re.compile(r"\s*([\w.:-]+)\[ARGS\]")
_PYTHON_TAG = "<|python_tag|>"
_FENCE = re.compile(r"```[ \t]*(?:json|tool_call)?[ \t]*\n(.*?)```", re.S | re.I)

Found = tuple[str, Any]
"""A call as read: the tool's name and its arguments (any JSON value, or a string)."""


def text_tool_calls(
    content: str | None, known: Collection[str], prefix: str = "text"
) -> list[dict[str, Any]]:
    """The tool calls written in ``content``, for tools in ``known``, in OpenAI shape.

    Each is ``{"id": "<prefix>-<n>", "type": "function", "function": {"name": ...,
    "arguments": "<JSON text>"}}``, numbered from 1. Arguments written as a string that is
    not JSON are passed on as written, for the tool to answer that they are not.
    """
    if not isinstance(content, str) or not content.strip():
        return []
    content = _THINKING.sub("", content)
    for reader in (_tagged, _functions, _mistral, _llama, _fenced):
        try:
            found = [(name, args) for name, args in reader(content) if name in known]
        except (ValueError, TypeError, RecursionError):  # unreadable: try the next format
            found = []
        if found:
            return [
                {
                    "id": f"{prefix}-{number}",
                    "type": "function",
                    "function": {"name": name, "arguments": _arguments_text(args)},
                }
                for number, (name, args) in enumerate(found, 1)
            ]
    return []


def _tagged(content: str) -> Iterator[Found]:
    """Hermes / Qwen: ``<tool_call>`` blocks holding JSON, or Qwen3-Coder functions."""
    for block in _TOOL_CALL_TAG.finditer(content):
        body = block.group(1).strip()
        if body.startswith("<function="):
            yield from _functions(body)
        else:
            yield from _calls(_json_values(body), need_arguments=False)


def _functions(content: str) -> Iterator[Found]:
    """``<function=name>`` with a JSON body (Llama 3.1) or ``<parameter=k>`` tags."""
    for function in _FUNCTION_TAG.finditer(content):
        name, body = function.group(1), function.group(2).strip()
        if body.startswith("{"):
            values = _json_values(body)
            if len(values) == 1 and isinstance(values[0], dict):
                yield name, values[0]
            continue
        parameters = {
            match.group(1): _parameter_value(match.group(2))
            for match in _PARAMETER_TAG.finditer(body)
        }
        if parameters or not body:
            yield name, parameters


def _mistral(content: str) -> Iterator[Found]:
    """``[TOOL_CALLS]`` then a JSON list (or object), or ``name[ARGS]{...}`` each."""
    for segment in content.split(_MISTRAL)[1:]:
        named = _MISTRAL_NAMED.match(segment)
        if named:
            values = _json_values(segment[named.end() :], first_only=True)
            if values:
                yield named.group(1), values[0]
        else:
            yield from _calls(_json_values(segment, first_only=True), need_arguments=False)


def _llama(content: str) -> Iterator[Found]:
    """The whole reply is JSON call objects, perhaps after ``<|python_tag|>``."""
    text = content.strip()
    tagged = text.startswith(_PYTHON_TAG)
    text = text.removeprefix(_PYTHON_TAG).strip()
    if text.startswith(("{", "[")):
        yield from _calls(_json_values(text, whole=not tagged), need_arguments=not tagged)


def _fenced(content: str) -> Iterator[Found]:
    """Fenced code blocks whose whole body is a call object or a list of them."""
    for block in _FENCE.finditer(content):
        yield from _calls(_json_values(block.group(1).strip(), whole=True), need_arguments=False)


def _calls(values: list[Any], need_arguments: bool) -> Iterator[Found]:
    """The calls among JSON ``values`` (objects, or lists of objects)."""
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            call = _call(item, need_arguments)
            if call is not None:
                yield call


def _call(item: Any, need_arguments: bool) -> Found | None:
    """A call object's name and arguments; None when it is not one."""
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict):
        item = item["function"]  # the OpenAI shape
    name = item.get("name")
    key = "arguments" if "arguments" in item else "parameters"
    if not isinstance(name, str) or (need_arguments and key not in item):
        return None
    arguments = item.get(key)
    return name, {} if arguments is None else arguments


def _json_values(text: str, whole: bool = False, first_only: bool = False) -> list[Any]:
    """The JSON values at the start of ``text``, one after another (``;``, ``,`` between).

    ``whole``: nothing but JSON values may be in ``text``, else none are returned.
    ``first_only``: the first value and no more.
    """
    values = _decode_all(text, whole, first_only)
    if values is None and _TRAILING_COMMA.search(text):
        values = _decode_all(_TRAILING_COMMA.sub(r"\1", text), whole, first_only)
    return values or []


def _decode_all(text: str, whole: bool, first_only: bool) -> list[Any] | None:
    values: list[Any] = []
    index = _skip(text, 0)
    while index < len(text):
        try:
            value, index = _DECODER.raw_decode(text, index)
        except json.JSONDecodeError:
            return values if values and not whole else None
        values.append(value)
        if first_only:
            break
        index = _skip(text, index, separators=";,")
    return values or None


def _skip(text: str, index: int, separators: str = "") -> int:
    while index < len(text) and (text[index].isspace() or text[index] in separators):
        index += 1
    return index


def _parameter_value(raw: str) -> str:
    """A Qwen3-Coder parameter's value: its text, less one newline on either side."""
    return raw.removeprefix("\n").removesuffix("\n")


def _arguments_text(args: Any) -> str:
    """Arguments as the JSON text ``tool_calls`` carry; a non-JSON string as written."""
    if isinstance(args, str):
        written: str = args
        try:
            args = _DECODER.decode(written)
        except json.JSONDecodeError:
            return written
    return json.dumps(args)
