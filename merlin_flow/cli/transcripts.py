"""An attempt as `merlin logs` prints it: its conversation, its error, its exit command."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.text import Text

from merlin_flow.cli.render import ATTEMPT_STYLE

if TYPE_CHECKING:
    from merlin_flow.jobs.logs import LogEntry

LOG_TOOL_LINES = 20
"""Lines of a tool's answer `merlin logs` shows; the rest is counted."""


def attempt_log(entry: LogEntry) -> Group:
    """`merlin logs`: one attempt's conversation, then its exit command's output."""
    parts: list[Any] = [attempt_header(entry)]
    for message in entry["transcript"]:
        parts.extend(message_lines(message))
    parts.extend(attempt_footer(entry))
    return Group(*parts)


def attempt_header(entry: LogEntry) -> Text:
    """``── step fix · attempt 2 · fix@local · failed, exit code 1``."""
    code = "" if entry["exit_code"] is None else f", exit code {entry['exit_code']}"
    return Text(
        f"── step {entry['step']} · attempt {entry['number']} · {entry['kind']}@{entry['tier']}"
        f" · {entry['status']}{code}",
        style=f"bold {ATTEMPT_STYLE.get(entry['status'], '')}".strip(),
    )


def message_lines(message: dict[str, Any]) -> list[Text]:
    """One message of a conversation: the user's brief, a reply and its tool calls, a result."""
    role = message.get("role")
    content = (message.get("content") or "").rstrip()
    if role == "user":
        return [Text(f"user: {content}", style="cyan")]
    if role == "tool":
        return [Text(f"← {_clip(content, LOG_TOOL_LINES)}", style="dim")]
    if role != "assistant":
        return []
    lines = [Text(f"assistant: {content}")] if content else []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        arguments = str(function.get("arguments", ""))
        lines.append(Text(f"→ {function.get('name')} {arguments[:300]}", style="yellow"))
    return lines


def attempt_footer(entry: LogEntry) -> list[Text]:
    """The attempt's error, and its exit command with the output's tail."""
    lines = []
    if entry["error"]:
        lines.append(Text(f"error: {entry['error']}", style="red"))
    if entry["exit_code"] is not None:
        lines.append(Text(f"$ {entry['exit_command']}  (exit code {entry['exit_code']})"))
        lines.append(Text((entry["output_tail"] or "").rstrip(), style="dim"))
    return lines


def _clip(text: str, lines: int) -> str:
    kept = text.splitlines()
    if len(kept) <= lines:
        return text
    return "\n".join([*kept[:lines], f"[... {len(kept) - lines} more lines]"])
