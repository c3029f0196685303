"""Bounded observations: every tool answer fits a budget, the whole of it stays reachable.

A tool's answer is sent again with every later request of the attempt, so one huge test
log can fill a model's window by itself. ``Observations.bound`` keeps an answer whole
when it is within budget: at most ``MAX_CHARS`` characters, ``MAX_LINES`` lines and
``SHARE`` of the tier's window in tokens (whichever is least). A longer one keeps its
head and its tail (a test log's first error and its summary), and the whole answer is
saved in the attempt's memory, where the ``read_output`` tool pages through it in
numbered windows that fit the same budget. Nothing is written to the worktree, so
nothing can reach the commit.

``TodoList`` is the agent's own plan (the ``todo`` tool): its items live here, outside
the conversation, so condensation (``merlin_flow.agents.condense``) cannot lose them and
pins them into every condensed prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from merlin_flow.tools.views import line_number, numbered

MAX_CHARS = 10 * 1024
"""Longest answer (characters) kept whole, whatever the window."""
MAX_LINES = 256
"""Most lines of an answer kept whole."""
SHARE = 0.05
"""Largest share of the window one answer may take."""
MAX_SAVED_CHARS = 64 * 2**20
"""Saved answers past this total are dropped, the oldest first."""
READ_OUTPUT = "read_output"
TODO = "todo"
REPO_MAP = "repo_map"
TODO_STATES = ("pending", "in_progress", "done")


def _fit(lines: list[str], chars: int, most: int, reverse: bool = False) -> list[str]:
    """As many of ``lines`` (from the end when ``reverse``) as fit ``chars`` and ``most``."""
    kept: list[str] = []
    used = 0
    for line in reversed(lines) if reverse else lines:
        if len(kept) >= most or used + len(line) + 1 > chars:
            break
        kept.append(line)
        used += len(line) + 1
    if not kept and lines and chars > 0 and most > 0:  # one line longer than the budget
        line = lines[-1] if reverse else lines[0]
        kept = [line[-chars:] if reverse else line[:chars]]
    return kept[::-1] if reverse else kept


class Observations:
    """The attempt's tool answers: bounded for the conversation, saved whole for paging."""

    def __init__(self, window_tokens: int, count: Callable[[str], int]) -> None:
        self.tokens = max(64, int(window_tokens * SHARE))
        """Most tokens one answer may take."""
        self.count = count
        self.chars = min(MAX_CHARS, self.tokens * 4)
        self._saved: dict[int, str] = {}

    def bound(self, output: str, tool: str) -> str:
        """``output`` as the conversation keeps it (see the module doc)."""
        lines = output.splitlines()
        short = len(output) <= self.chars and len(lines) <= MAX_LINES
        if short and self.count(output) <= self.tokens:
            return output
        number = self._save(output)
        chars, most = self.chars, MAX_LINES
        while True:
            head = _fit(lines, chars // 2, most // 2)
            tail = _fit(lines[len(head) :], chars // 2, most // 2, reverse=True)
            first_tail = len(lines) - len(tail) + 1
            note = (
                f"[merlin: {tool}'s output cut to fit the context: lines 1-{len(head)} and "
                f"{first_tail}-{len(lines)} of {len(lines)} shown ({len(output)} characters). "
                f"The whole output is output {number}: "
                f'read_output {{"output": {number}, "start_line": {len(head) + 1}}} pages '
                "through it.]"
            )
            text = "\n".join([*head, note, *tail])
            if self.count(text) <= self.tokens or chars < 64:
                return text
            chars, most = chars // 2, max(2, most // 2)

    def read_output(
        self, output: int, start_line: int | None = None, end_line: int | None = None
    ) -> str:
        """Numbered lines of a saved answer, as many as fit the budget from ``start_line``."""
        text = self._saved.get(line_number(output, "output") or 0)
        if text is None:
            saved = ", ".join(map(str, self._saved)) or "none"
            return f"error: no output {output}; saved outputs: {saved}"
        lines = text.splitlines()
        first = line_number(start_line, "start_line") or 1
        last = min(line_number(end_line, "end_line") or len(lines), len(lines))
        if first > len(lines):
            return (
                f"error: start_line {first} is past the end: output {output} has {len(lines)} lines"
            )
        chars = self.chars
        while True:
            shown = _fit(lines[first - 1 : last], chars, MAX_LINES)
            end = first + len(shown) - 1
            more = f"; start_line {end + 1} goes on" if end < len(lines) else ""
            body = numbered(shown, first)
            reply = f"output {output}: lines {first}-{end} of {len(lines)}{more}\n{body}"
            if self.count(reply) <= self.tokens or chars < 64:
                return reply
            chars //= 2

    def _save(self, output: str) -> int:
        number = max(self._saved, default=0) + 1
        self._saved[number] = output
        while sum(map(len, self._saved.values())) > MAX_SAVED_CHARS and len(self._saved) > 1:
            del self._saved[min(self._saved)]
        return number

    @property
    def tools(self) -> list[Any]:
        """The ``read_output`` tool, for ``Toolbox.add``."""
        return [_Tool(READ_OUTPUT, READ_OUTPUT_SCHEMA, lambda args: self.read_output(**args))]


class TodoList:
    """The agent's plan: items with a state, replaced whole by each ``todo`` call."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def set(self, items: object) -> str:
        """Replace the list; its rendering (or an error naming the bad item)."""
        if not isinstance(items, list):
            return "error: items must be a list of {text, state} objects"
        parsed = []
        for index, item in enumerate(items, 1):
            item = {"text": item} if isinstance(item, str) else item
            text = item.get("text") if isinstance(item, dict) else None
            state = item.get("state", "pending") if isinstance(item, dict) else None
            if not isinstance(text, str) or not text.strip():
                return f"error: item {index} has no text"
            if state not in TODO_STATES:
                return f"error: item {index}'s state must be one of {', '.join(TODO_STATES)}"
            parsed.append((text.strip()[:500], str(state)))
        self.items = parsed[:50]
        return self.render() or "(the list is empty)"

    def render(self) -> str:
        """The list as the prompt shows it, one ``[x]`` / ``[~]`` / ``[ ]`` item a line."""
        marks = {"done": "[x]", "in_progress": "[~]", "pending": "[ ]"}
        return "\n".join(f"{marks[state]} {text}" for text, state in self.items)

    @property
    def tools(self) -> list[Any]:
        """The ``todo`` tool, for ``Toolbox.add``."""
        return [_Tool(TODO, TODO_SCHEMA, lambda args: self.set(args.get("items")))]


def observation_tool(
    name: str, schema: dict[str, Any], run: Callable[[dict[str, Any]], str]
) -> Any:
    """A tool the conversation itself offers, in the toolbox's ``ExternalTool`` shape."""
    return _Tool(name, schema, run)


class _Tool:
    """A tool of this module, in the toolbox's ``ExternalTool`` shape."""

    def __init__(self, name: str, schema: dict[str, Any], run: Callable[[dict[str, Any]], str]):
        self.name, self.schema, self._run = name, schema, run

    def call(self, arguments: dict[str, Any]) -> str:
        return self._run(arguments)


READ_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": READ_OUTPUT,
        "description": (
            "Page through a tool output that was cut to fit the context (its note names "
            'the output\'s number). Example: {"output": 2, "start_line": 120}'
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "output": {"type": "integer", "description": "the output's number"},
                "start_line": {"type": "integer", "description": "optional: first line (1)"},
                "end_line": {"type": "integer", "description": "optional: last line"},
            },
            "required": ["output"],
        },
    },
}
TODO_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TODO,
        "description": (
            "Keep your plan for the step: the whole list each time, each item pending, "
            "in_progress or done. It is shown to you again whenever older messages are "
            'condensed. Example: {"items": [{"text": "fix parse()", "state": "done"}, '
            '{"text": "run the tests", "state": "pending"}]}'
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "text": {"type": "string"},
                            "state": {"type": "string", "enum": list(TODO_STATES)},
                        },
                        "required": ["text"],
                    },
                }
            },
            "required": ["items"],
        },
    },
}
REPO_MAP_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": REPO_MAP,
        "description": (
            "The repository's map around a file or a name: the files that define, use or "
            "are used by it, best first, with their main definitions. Use it to find where "
            'to look before reading files. Example: {"target": "src/app/auth.py"} or '
            '{"target": "parse_rows"}'
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "target": {"type": "string", "description": "a file's path or a name"},
            },
            "required": ["target"],
        },
    },
}
