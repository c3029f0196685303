"""The agent's tools, confined to one worktree (described in ``merlin_flow.tools.schemas``).

Every path argument is resolved (symlinks included) and must stay inside the worktree;
the repository's ``.git`` entry is off limits too. A refused or failing call returns an
``error: ...`` string to the model: a tool never raises into the agent loop.

The toolbox works in a ``Checkout`` (``merlin_flow.workspace.checkout``): its files are
the checkout's worktree, and ``run_command`` runs a shell command in the checkout's
sandbox: the worktree at ``/workspace``, the project's environment first on PATH, no
network, no home and no secret, killed whole at its timeout. ``finish`` ends the attempt: the loop
(``merlin_flow.agents.loop``) acts on it, the toolbox only answers "finished".

Seams for what plugs in from elsewhere: a ``gate`` sees every call (name and parsed
arguments) before it runs and may refuse it; ``readable`` hides files from ``grep`` and
``list_files``; ``extra`` adds ``ExternalTool`` objects (MCP servers' tools) after the
built-in ones. A repeated read of an unchanged file, a write of a file's own content and
an edit whose ``new`` is its ``old`` are answered without their effect
(``merlin_flow.tools.memo``). A failed edit is answered with the closest passages of the
file, or where a repeated ``old`` occurs (``merlin_flow.tools.views``).

Hostile arguments are answered, never raised: arguments longer than
``MAX_ARGUMENT_CHARS`` are refused before they are parsed, a write or edit whose file
would pass ``MAX_WRITE_BYTES`` (or ``[sandbox] max_file_size_mb``) is refused before it
touches the file, text that is not valid Unicode (a lone surrogate such as ``\udcff``)
is refused, and a file is encoded before it is opened (a refused write never truncates
it); NUL bytes are written faithfully. ``read_file``, ``edit_file`` and ``grep`` read
no file over ``MAX_FILE_BYTES``.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from merlin_flow.models.llm import MAX_ARGUMENT_CHARS
from merlin_flow.tools.memo import DEFAULT_WINDOW, ReadMemo
from merlin_flow.tools.schemas import FINISH as FINISH  # re-exported: the loop acts on it
from merlin_flow.tools.schemas import TOOL_SCHEMAS as TOOL_SCHEMAS  # re-exported
from merlin_flow.tools.views import RangeError, closest, line_number, numbered_range, occurrences
from merlin_flow.workspace.checkout import Checkout

MAX_READ_CHARS = 100_000
MAX_WRITE_BYTES = 4 * 2**20
"""Largest file (UTF-8 bytes) a write or edit may leave, or `[sandbox] max_file_size_mb`."""
MAX_FILE_BYTES = 16 * 2**20
"""Largest file `read_file`, `edit_file` and `grep` read into memory."""
MAX_NAME_CHARS = 100  # how much of an unknown tool's name its error reply repeats
MAX_LIST_ENTRIES = 500
MAX_GREP_MATCHES = 50
"""Most matches grep answers with (SWE-agent's cap); then it asks for a narrower query."""

GREP_STOPPED = (
    f"[stopped at {MAX_GREP_MATCHES} matches: narrow the query (a more specific pattern, "
    "or a path) to see the others]"
)
READ_ONLY_TOOLS = ("read_file", "list_files", "grep")
"""The tools of a question's agent: it reads, lists and greps, and changes nothing."""
FINISHED = "finished"
"""The toolbox's answer to a well-formed ``finish`` call."""

Gate = Callable[[str, dict[str, Any]], str | None]
"""Called with a tool's name and parsed arguments before it runs; a text refuses it."""
Readable = Callable[[str], bool]
"""Whether a file (path relative to the worktree, posix) may be shown by grep and list."""


class ExternalTool(Protocol):
    """A tool from elsewhere (an MCP server's), offered after the built-in ones."""

    @property
    def name(self) -> str:
        """The name the model calls it by (unique among the toolbox's tools)."""

    @property
    def schema(self) -> dict[str, Any]:
        """Its description in OpenAI function-call format, like ``TOOL_SCHEMAS`` entries."""

    def call(self, arguments: dict[str, Any]) -> str:
        """Run it; any exception is turned into an ``error:`` reply by the toolbox."""


class ToolRefused(Exception):
    """A tool call asked for something outside its bounds (turned into an error reply)."""


def parse_arguments(name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
    """A call's arguments as a dict; ToolRefused saying why when they are not an object."""
    if isinstance(arguments, str) and len(arguments) > MAX_ARGUMENT_CHARS:
        raise ToolRefused(
            f"arguments of {name} are {len(arguments)} characters long; the most a tool "
            f"call may carry is {MAX_ARGUMENT_CHARS} (write a large file in parts, or "
            "generate it with run_command)"
        )
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError as exc:
        raise ToolRefused(f"arguments of {name} are not valid JSON: {exc}") from None
    except RecursionError:
        raise ToolRefused(f"arguments of {name} are nested too deeply") from None
    if not isinstance(args, dict):
        raise ToolRefused(f"arguments of {name} must be a JSON object")
    return dict(args)


def encoded(text: str, what: str) -> bytes:
    """``text`` as UTF-8; ToolRefused when it holds a lone surrogate (not Unicode text)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolRefused(
            f"{what} is not valid Unicode text: {exc.object[exc.start]!r} at character "
            f"{exc.start} is a lone surrogate; nothing was written"
        ) from None


class Toolbox:
    """The tools of one attempt, bound to its worktree."""

    def __init__(
        self,
        checkout: Checkout | Path,
        command_timeout: float = 120.0,
        only: tuple[str, ...] | None = None,
        *,
        gate: Gate | None = None,
        readable: Readable | None = None,
        extra: Sequence[ExternalTool] = (),
        offer_finish: bool = True,
        memo_window: int = DEFAULT_WINDOW,
    ) -> None:
        """Bind the tools to ``checkout``; ``command_timeout`` caps `run_command`.

        The checkout says where files are and where `run_command` runs; a plain folder
        is a checkout of its own (``Checkout.folder``: the bubblewrap sandbox, merlin's
        own interpreter first on PATH). ``only`` keeps these tools (built-in or
        ``extra``) and no other (``READ_ONLY_TOOLS``); `finish` is offered whatever
        ``only`` says, unless ``offer_finish`` is False. ``gate`` may refuse any call but
        `finish`; ``readable`` hides files from walks. ``memo_window``: turns a repeated
        read of an unchanged file is suppressed for.
        """
        self.checkout = checkout if isinstance(checkout, Checkout) else Checkout.folder(checkout)
        self.root = self.checkout.worktree.resolve()
        self.command_timeout = command_timeout
        self.gate = gate
        self.readable = readable
        self._memo = ReadMemo(memo_window)
        self._turn = 0
        self.read_chars = MAX_READ_CHARS
        """Longest text one read answers with; a longer file is read in numbered windows."""
        self._tools: dict[str, Callable[..., str]] = {
            "read_file": self.read_file,
            "write_file": self.write_file,
            "edit_file": self.edit_file,
            "list_files": self.list_files,
            "grep": self.grep,
            "run_command": self.run_command,
        }
        self._extra: dict[str, ExternalTool] = {}
        for tool in extra:
            if tool.name in self._tools or tool.name in self._extra or tool.name == FINISH:
                raise ValueError(f"two tools are named {tool.name!r}")
            self._extra[tool.name] = tool
        if only is not None:
            self._tools = {name: tool for name, tool in self._tools.items() if name in only}
            self._extra = {name: tool for name, tool in self._extra.items() if name in only}
        if offer_finish:
            self._tools[FINISH] = self.finish

    def add(self, tools: Sequence[ExternalTool]) -> None:
        """Offer ``tools`` too (the conversation's own: ``read_output``, ``todo``)."""
        for tool in tools:
            if tool.name not in self._tools and tool.name != FINISH:
                self._extra.setdefault(tool.name, tool)

    def forget_reads(self) -> None:
        """Send the next read of any file whole (earlier copies left the conversation)."""
        self._memo = ReadMemo(self._memo.window)

    @property
    def names(self) -> list[str]:
        """Names of the available tools: built-in ones, `finish`, then the extra ones."""
        return [*self._tools, *self._extra]

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The available tools in function-call format, as the model is offered them."""
        own = [s for s in TOOL_SCHEMAS if s["function"]["name"] in self._tools]
        return own + [tool.schema for tool in self._extra.values()]

    def call(self, name: str, arguments: str | dict[str, Any], turn: int = 0) -> str:
        """Run one tool call made at ``turn``; return its reply text (errors included)."""
        if not isinstance(name, str):
            return f"error: a tool name is a string; available: {', '.join(self.names)}"
        tool = self._tools.get(name)
        if tool is None and name not in self._extra:
            shown = name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS] + "..."
            return f"error: unknown tool {shown!r}; available: {', '.join(self.names)}"
        try:
            args = parse_arguments(name, arguments)
        except ToolRefused as exc:
            return f"error: {exc}"
        if self.gate is not None and name != FINISH:
            try:
                refusal = self.gate(name, args)
            except Exception as exc:  # a broken check refuses: it never lets a call through
                refusal = f"{name} refused: the permission check failed: {exc}"
            if refusal is not None:
                return f"error: {refusal}"
        if tool is None:
            try:
                return self._extra[name].call(args)
            except Exception as exc:  # another program's failure is the model's to read
                return f"error: {name} failed: {exc}"
        self._turn = turn
        try:
            return tool(**args)
        except UnicodeDecodeError as exc:
            return f"error: {name} failed: the file is not UTF-8 text ({exc.reason})"
        except (TypeError, ValueError) as exc:
            return f"error: bad arguments for {name}: {exc}"
        except (ToolRefused, RangeError) as exc:
            return f"error: {exc}"
        except (OSError, re.error) as exc:
            return f"error: {name} failed: {exc}"

    def resolve(self, path: str) -> Path:
        """The absolute path for ``path``; ToolRefused if it leaves the worktree."""
        if not isinstance(path, str) or "\x00" in path:
            raise ToolRefused("path must be a string")
        target = (self.root / path).resolve()
        if target != self.root and not target.is_relative_to(self.root):
            raise ToolRefused(f"path {path!r} is outside the repository")
        relative = target.relative_to(self.root)
        if relative.parts and relative.parts[0] == ".git":
            raise ToolRefused(f"path {path!r} is inside .git, which tools may not touch")
        return target

    def read_file(
        self, path: str, start_line: int | None = None, end_line: int | None = None
    ) -> str:
        """The file's text (truncated past MAX_READ_CHARS), or numbered lines of a range."""
        target = self.resolve(path)
        if not target.is_file():
            raise ToolRefused(f"{path!r} is not a file")
        first, last = line_number(start_line, "start_line"), line_number(end_line, "end_line")
        text = self._read_text(target, path)
        rel = self._rel(target)
        if first is None and last is None:
            reply, part = text, ""
            if len(text) > self.read_chars:  # a window of it, numbered, that says so
                reply = numbered_range(rel, text.splitlines(), 1, None, self.read_chars)
        else:
            reply = numbered_range(rel, text.splitlines(), first or 1, last, self.read_chars)
            part = f" (lines {first or 1}-{last or 'end'})"
        since = self._memo.unchanged_since((rel, first, last), text, self._turn)
        if since is not None:
            return f"unchanged since turn {since}: {rel}{part} is as you read it then"
        return reply

    def write_file(self, path: str, content: str) -> str:
        """Write ``content`` to the file, creating folders as needed."""
        target = self.resolve(path)
        if target == self.root or target.is_dir():
            raise ToolRefused(f"{path!r} is a folder")
        if not isinstance(content, str):
            raise TypeError("content must be a string")
        data = self._writable(encoded(content, "content"), path)
        if target.is_file() and target.stat().st_size == len(data) and target.read_bytes() == data:
            return f"unchanged: {self._rel(target)} already holds this content; nothing written"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        self._memo.forget(self._rel(target))
        return f"wrote {len(content)} characters to {self._rel(target)}"

    def edit_file(self, path: str, old: str, new: str) -> str:
        """Replace the single exact occurrence of ``old`` with ``new``."""
        target = self.resolve(path)
        if not target.is_file():
            raise ToolRefused(f"{path!r} is not a file")
        if not isinstance(old, str) or not isinstance(new, str):
            raise TypeError("old and new must be strings")
        encoded(old, "old"), encoded(new, "new")
        text = self._read_text(target, path)
        count = text.count(old) if old else 0
        if count == 0:
            hint = f"; {closest(text.splitlines(), old)}" if old else ""
            raise ToolRefused(f"`old` must occur exactly once in {path!r}; not found{hint}")
        if count > 1:
            at = occurrences(text, old)
            raise ToolRefused(
                f"`old` must occur exactly once in {path!r}; found {count} times, at lines "
                f"{at}: add neighbouring lines to `old` to pick one"
            )
        if new == old:
            return f"unchanged: `new` is the same as `old`; {self._rel(target)} not edited"
        target.write_bytes(self._writable(text.replace(old, new, 1).encode("utf-8"), path))
        self._memo.forget(self._rel(target))
        return f"edited {self._rel(target)}"

    def list_files(self, path: str = ".", pattern: str | None = None) -> str:
        """List the files below ``path``, relative to the root, sorted."""
        base = self.resolve(path)
        if not base.is_dir():
            raise ToolRefused(f"{path!r} is not a folder")
        entries = []
        for item in sorted(self._walk(base)):
            rel = self._rel(item)
            if pattern and not (
                fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(item.name, pattern)
            ):
                continue
            entries.append(rel)
            if len(entries) >= MAX_LIST_ENTRIES:
                entries.append(f"[stopped at {MAX_LIST_ENTRIES} entries]")
                break
        return "\n".join(entries) if entries else "(no files)"

    def grep(self, pattern: str, path: str = ".") -> str:
        """Lines matching the regular expression, as ``path:line: text``."""
        regex = re.compile(pattern)
        base = self.resolve(path)
        files = [base] if base.is_file() else sorted(self._walk(base))
        matches: list[str] = []
        for file in filter(self._shown, files):
            try:
                if file.stat().st_size > MAX_FILE_BYTES:
                    continue
                lines = file.read_text(encoding="utf-8").splitlines()
            except (UnicodeDecodeError, OSError):
                continue
            for number, line in enumerate(lines, 1):
                if regex.search(line):
                    matches.append(f"{self._rel(file)}:{number}: {line}")
                    if len(matches) >= MAX_GREP_MATCHES:
                        return "\n".join([*matches, GREP_STOPPED])
        return "\n".join(matches) if matches else "(no matches)"

    def run_command(self, command: str, timeout: float | None = None) -> str:
        """Run ``command`` with /bin/sh in the sandbox; report exit code and output."""
        limit = min(float(timeout), self.command_timeout) if timeout else self.command_timeout
        argv = ["/bin/sh", "-c", command]
        result = self.checkout.run(argv, limit)
        return f"exit code: {result.exit_code}\n{result.output_tail}"

    def finish(self, summary: str) -> str:
        """Acknowledge the end of the attempt (the loop reads ``summary`` and stops)."""
        if not isinstance(summary, str):
            raise TypeError("summary must be a string")
        return FINISHED

    def _read_text(self, target: Path, path: str) -> str:
        """The file's text; ToolRefused when it is too large to read whole."""
        size = target.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ToolRefused(
                f"{path!r} is {size} bytes, over the {MAX_FILE_BYTES} a file tool reads "
                "whole: look into it with run_command (head, sed -n, grep)"
            )
        return target.read_text(encoding="utf-8")

    def _writable(self, data: bytes, path: str) -> bytes:
        """``data`` if a file may hold it; ToolRefused naming the limit otherwise."""
        limit, name = MAX_WRITE_BYTES, "merlin_flow.tools.toolbox.MAX_WRITE_BYTES"
        most = self.checkout.sandbox.max_file_size_mb
        if most and most * 2**20 < limit:
            limit, name = most * 2**20, "[sandbox] max_file_size_mb"
        if len(data) > limit:
            raise ToolRefused(
                f"{path!r} would be {len(data)} bytes, over the {limit} a tool may write "
                f"({name}); nothing was written"
            )
        return data

    def _walk(self, base: Path) -> list[Path]:
        found = []
        for item in base.rglob("*"):
            rel = item.relative_to(self.root)
            if rel.parts and rel.parts[0] == ".git":
                continue
            if item.is_file() and item.resolve().is_relative_to(self.root) and self._shown(item):
                found.append(item)
        return found

    def _shown(self, file: Path) -> bool:
        return self.readable is None or self.readable(self._rel(file))

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()
