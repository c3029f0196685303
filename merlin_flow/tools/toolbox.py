"""The agent's tools, confined to one worktree (described in ``merlin_flow.tools.schemas``).

No path is opened by its name: each is walked a name at a time from the worktree's
descriptor (``merlin_flow.workspace.beneath``), so a process swapping a folder for a
symlink mid-call cannot lead a tool out. Symlinks are followed while they stay inside.
Where a path leads is judged before it is opened (the ``gate`` is asked again when it
is not the path given). No file tool enters a ``.git`` folder at any depth (a nested
repository merlin's git would honour); walks skip them. A refused or failing call
returns an ``error: ...`` string: a tool never raises into the agent loop.

The toolbox works in a ``Checkout`` (``merlin_flow.workspace.checkout``): its files are
the checkout's worktree, and ``run_command`` runs a shell command in the checkout's
sandbox: the worktree at ``/workspace``, the project's environment first on PATH, no
network, no home and no secret, killed whole at its timeout. ``finish`` ends the attempt:
the loop (``merlin_flow.agents.loop``) acts on it, the toolbox only answers "finished".

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
no file over ``MAX_FILE_BYTES``. A path too deep, too long or through a symlink loop is
answered so.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
import posixpath
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from merlin_flow.models.llm import MAX_ARGUMENT_CHARS
from merlin_flow.tools.memo import DEFAULT_WINDOW, ReadMemo
from merlin_flow.tools.schemas import FINISH as FINISH  # re-exported: the loop acts on it
from merlin_flow.tools.schemas import TOOL_SCHEMAS as TOOL_SCHEMAS  # re-exported
from merlin_flow.tools.views import RangeError, closest, line_number, numbered_range, occurrences
from merlin_flow.workspace import beneath
from merlin_flow.workspace.beneath import Opened, Top, overwrite, read_at_most, shown_files
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
WRITING = ("write_file", "edit_file")
GIT_WRITES = (
    "merlin keeps files, not nested git repositories: paths inside a .git folder cannot be "
    "written (use /tmp for scratch repositories)"
)

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
            return f"error: unknown tool {_cut(name)!r}; available: {', '.join(self.names)}"
        try:
            args = parse_arguments(name, arguments)
        except ToolRefused as exc:
            return f"error: {exc}"
        refusal = self._ask(name, args) if name != FINISH else None
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

    def read_file(
        self, path: str, start_line: int | None = None, end_line: int | None = None
    ) -> str:
        """The file's text (truncated past MAX_READ_CHARS), or numbered lines of a range."""
        first, last = line_number(start_line, "start_line"), line_number(end_line, "end_line")
        with self._opened("read_file", path, os.O_RDONLY) as (_, opened):
            text, rel = self._read_text(opened.fd, path), opened.rel
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
        if not isinstance(content, str):
            raise TypeError("content must be a string")
        data = self._writable(encoded(content, "content"), path)
        with self._opened("write_file", path, os.O_RDWR, create=True) as (_, opened):
            same = not opened.created and os.fstat(opened.fd).st_size == len(data)
            if same and read_at_most(opened.fd, len(data)) == data:
                return f"unchanged: {opened.rel} already holds this content; nothing written"
            overwrite(opened.fd, data)
        self._memo.forget(opened.rel)
        return f"wrote {len(content)} characters to {opened.rel}"

    def edit_file(self, path: str, old: str, new: str) -> str:
        """Replace the single exact occurrence of ``old`` with ``new``."""
        if not isinstance(old, str) or not isinstance(new, str):
            raise TypeError("old and new must be strings")
        encoded(old, "old"), encoded(new, "new")
        with self._opened("edit_file", path, os.O_RDWR) as (_, opened):
            text = self._read_text(opened.fd, path)
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
                return f"unchanged: `new` is the same as `old`; {opened.rel} not edited"
            overwrite(opened.fd, self._writable(text.replace(old, new, 1).encode(), path))
        self._memo.forget(opened.rel)
        return f"edited {opened.rel}"

    def list_files(self, path: str = ".", pattern: str | None = None) -> str:
        """List the files below ``path``, relative to the root, sorted."""
        entries = []
        with self._opened("list_files", path, beneath.FOLDER, kind="folder") as (top, base):
            for rel, _ in shown_files(top, base, self._shown, read=False):
                names = (rel, rel.rsplit("/", 1)[-1])
                if pattern and not any(fnmatch.fnmatch(name, pattern) for name in names):
                    continue
                entries.append(rel)
                if len(entries) >= MAX_LIST_ENTRIES:
                    entries.append(f"[stopped at {MAX_LIST_ENTRIES} entries]")
                    break
        return "\n".join(entries) if entries else "(no files)"

    def grep(self, pattern: str, path: str = ".") -> str:
        """Lines matching the regular expression, as ``path:line: text``."""
        regex = re.compile(pattern)
        matches: list[str] = []
        with self._opened("grep", path, os.O_RDONLY, kind="file or folder") as (top, base):
            for rel, fd in shown_files(top, base, self._shown, read=True):
                with contextlib.suppress(ToolRefused, UnicodeDecodeError):  # too large, binary
                    for number, line in enumerate(self._read_text(fd, rel).splitlines(), 1):
                        if regex.search(line):
                            matches.append(f"{rel}:{number}: {line}")
                            if len(matches) >= MAX_GREP_MATCHES:
                                return "\n".join([*matches, GREP_STOPPED])
        return "\n".join(matches) if matches else "(no matches)"

    def run_command(self, command: str, timeout: float | None = None) -> str:
        """Run ``command`` with /bin/sh in the sandbox; report exit code and output."""
        limit = min(float(timeout), self.command_timeout) if timeout else self.command_timeout
        result = self.checkout.run(["/bin/sh", "-c", command], limit)
        return f"exit code: {result.exit_code}\n{result.output_tail}"

    def finish(self, summary: str) -> str:
        """Acknowledge the end of the attempt (the loop reads ``summary`` and stops)."""
        if not isinstance(summary, str):
            raise TypeError("summary must be a string")
        return FINISHED

    def _read_text(self, fd: int, path: str) -> str:
        """The open file's text; ToolRefused when it is too large to read whole."""
        size = os.fstat(fd).st_size
        data = read_at_most(fd, MAX_FILE_BYTES) if size <= MAX_FILE_BYTES else b""
        if size > MAX_FILE_BYTES or len(data) > MAX_FILE_BYTES:
            raise ToolRefused(
                f"{path!r} is {max(size, len(data))} bytes, over the {MAX_FILE_BYTES} a file "
                "tool reads whole: look into it with run_command (head, sed -n, grep)"
            )
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")

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

    @contextlib.contextmanager
    def _opened(
        self, tool: str, path: str, flags: int, create: bool = False, kind: str = "file"
    ) -> Iterator[tuple[Top, Opened]]:
        """``path`` opened beneath the worktree, judged where it leads; ToolRefused if not."""
        if not isinstance(path, str) or "\x00" in path:
            raise ToolRefused("path must be a string")
        judge = functools.partial(self._judge, tool, path)
        with Top(self.root) as top:
            try:
                at = beneath.open_beneath(top, path, flags, kind=kind, create=create, judge=judge)
            except OSError as exc:
                if exc.errno not in beneath.REFUSALS:
                    raise
                raise ToolRefused(f"path {_cut(path)!r} {exc.strerror}") from None
            with at:
                yield top, at

    def _judge(self, tool: str, path: str, rel: str) -> None:
        """Refuse ``rel``, where ``path`` leads, inside .git or when the gate refuses it."""
        if beneath.in_git(rel) or beneath.in_git(path):
            why = f": {GIT_WRITES}" if tool in WRITING else ", which tools may not touch"
            raise ToolRefused(f"path {_cut(path)!r} is inside .git{why}")
        refusal = self._ask(tool, {"path": rel or "."}) if rel != posixpath.normpath(path) else None
        if refusal is not None:
            raise ToolRefused(refusal)

    def _ask(self, name: str, args: dict[str, Any]) -> str | None:
        """The gate's refusal of the call, or None; a broken gate refuses."""
        try:
            return None if self.gate is None else self.gate(name, args)
        except Exception as exc:  # a broken check refuses: it never lets a call through
            return f"{name} refused: the permission check failed: {exc}"

    def _shown(self, rel: str) -> bool:
        return self.readable is None or self.readable(rel)


def _cut(path: str) -> str:
    return path if len(path) <= MAX_NAME_CHARS else path[:MAX_NAME_CHARS] + "..."
