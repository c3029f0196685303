"""The agent's tools, confined to one worktree, in OpenAI function-call format.

Every path argument is resolved (symlinks included) and must stay inside the worktree;
the repository's ``.git`` entry is off limits too. A refused or failing call returns an
``error: ...`` string to the model: a tool never raises into the agent loop.

``run_command`` runs a shell command in the sandbox (``merlin_flow.sandbox``): the
worktree at ``/workspace``, the project's environment first on PATH, no network, no
home and no secret, killed whole at its timeout.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from merlin_flow.config import Sandbox
from merlin_flow.sandbox import Confinement, python_mounts, run_confined

MAX_READ_CHARS = 100_000
MAX_LIST_ENTRIES = 500
MAX_GREP_MATCHES = 200


READ_ONLY_TOOLS = ("read_file", "list_files", "grep")
"""The tools of a question's agent: it reads, lists and greps, and changes nothing."""


class ToolRefused(Exception):
    """A tool call asked for something outside its bounds (turned into an error reply)."""


def _schema(name: str, description: str, **params: tuple[str, str]) -> dict[str, Any]:
    required = [key for key, (_type, _doc) in params.items() if not _doc.startswith("optional")]
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    key: {"type": type_, "description": doc} for key, (type_, doc) in params.items()
                },
                "required": required,
            },
        },
    }


TOOL_SCHEMAS: list[dict[str, Any]] = [
    _schema("read_file", "Read a text file.", path=("string", "path relative to the repository")),
    _schema(
        "write_file",
        "Create or overwrite a file with the given content.",
        path=("string", "path relative to the repository"),
        content=("string", "the whole new content"),
    ),
    _schema(
        "edit_file",
        "Replace one exact occurrence of `old` with `new` in a file.",
        path=("string", "path relative to the repository"),
        old=("string", "exact text to find; must occur exactly once"),
        new=("string", "replacement text"),
    ),
    _schema(
        "list_files",
        "List files under a folder, optionally filtered by a glob pattern.",
        path=("string", "optional folder relative to the repository (default: the root)"),
        pattern=("string", "optional glob on the relative path, e.g. '*.py'"),
    ),
    _schema(
        "grep",
        "Search files for a regular expression; returns path:line: text matches.",
        pattern=("string", "Python regular expression"),
        path=("string", "optional file or folder to search (default: the root)"),
    ),
    _schema(
        "run_command",
        "Run a shell command in the repository root and return its exit code and output.",
        command=("string", "the shell command"),
        timeout=("number", "optional seconds before the command is killed"),
    ),
]


class Toolbox:
    """The tools of one attempt, bound to its worktree."""

    def __init__(
        self,
        root: Path,
        command_timeout: float = 120.0,
        confinement: Confinement | None = None,
        sandbox: Sandbox | None = None,
        only: tuple[str, ...] | None = None,
    ) -> None:
        """Bind the tools to ``root``; ``command_timeout`` caps `run_command`.

        ``confinement`` and ``sandbox`` say where `run_command` runs; by default in the
        bubblewrap sandbox with merlin's own interpreter first on PATH. ``only`` keeps
        these tools and no other (``READ_ONLY_TOOLS``).
        """
        self.root = root.resolve()
        self.command_timeout = command_timeout
        self.confinement = confinement or Confinement(
            worktree=self.root,
            read_only=python_mounts(None),
            path=(str(Path(sys.executable).parent),),
        )
        self.sandbox = sandbox or Sandbox()
        self._tools: dict[str, Callable[..., str]] = {
            "read_file": self.read_file,
            "write_file": self.write_file,
            "edit_file": self.edit_file,
            "list_files": self.list_files,
            "grep": self.grep,
            "run_command": self.run_command,
        }
        if only is not None:
            self._tools = {name: tool for name, tool in self._tools.items() if name in only}

    @property
    def names(self) -> list[str]:
        """Names of the available tools."""
        return list(self._tools)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The available tools in function-call format, as the model is offered them."""
        return [s for s in TOOL_SCHEMAS if s["function"]["name"] in self._tools]

    def call(self, name: str, arguments: str | dict[str, Any]) -> str:
        """Run one tool call and return its reply text (errors included)."""
        tool = self._tools.get(name)
        if tool is None:
            return f"error: unknown tool {name!r}; available: {', '.join(self._tools)}"
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
        except json.JSONDecodeError as exc:
            return f"error: arguments of {name} are not valid JSON: {exc}"
        if not isinstance(args, dict):
            return f"error: arguments of {name} must be a JSON object"
        try:
            return tool(**args)
        except (TypeError, ValueError) as exc:
            return f"error: bad arguments for {name}: {exc}"
        except ToolRefused as exc:
            return f"error: {exc}"
        except (OSError, UnicodeDecodeError, re.error) as exc:
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

    def read_file(self, path: str) -> str:
        """Return the file's text (truncated past MAX_READ_CHARS)."""
        target = self.resolve(path)
        if not target.is_file():
            raise ToolRefused(f"{path!r} is not a file")
        text = target.read_text(encoding="utf-8")
        if len(text) > MAX_READ_CHARS:
            return text[:MAX_READ_CHARS] + f"\n[truncated at {MAX_READ_CHARS} characters]"
        return text

    def write_file(self, path: str, content: str) -> str:
        """Write ``content`` to the file, creating folders as needed."""
        target = self.resolve(path)
        if target == self.root or target.is_dir():
            raise ToolRefused(f"{path!r} is a folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return f"wrote {len(content)} characters to {self._rel(target)}"

    def edit_file(self, path: str, old: str, new: str) -> str:
        """Replace the single exact occurrence of ``old`` with ``new``."""
        target = self.resolve(path)
        if not target.is_file():
            raise ToolRefused(f"{path!r} is not a file")
        text = target.read_text(encoding="utf-8")
        count = text.count(old) if old else 0
        if count != 1:
            found = "not found" if count == 0 else f"found {count} times"
            raise ToolRefused(f"`old` must occur exactly once in {path!r}; {found}")
        target.write_text(text.replace(old, new, 1), encoding="utf-8")
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
        for file in files:
            try:
                lines = file.read_text(encoding="utf-8").splitlines()
            except (UnicodeDecodeError, OSError):
                continue
            for number, line in enumerate(lines, 1):
                if regex.search(line):
                    matches.append(f"{self._rel(file)}:{number}: {line}")
                    if len(matches) >= MAX_GREP_MATCHES:
                        return "\n".join([*matches, f"[stopped at {MAX_GREP_MATCHES} matches]"])
        return "\n".join(matches) if matches else "(no matches)"

    def run_command(self, command: str, timeout: float | None = None) -> str:
        """Run ``command`` with /bin/sh in the sandbox; report exit code and output."""
        limit = min(float(timeout), self.command_timeout) if timeout else self.command_timeout
        argv = ["/bin/sh", "-c", command]
        result = run_confined(argv, self.confinement, self.sandbox, limit)
        return f"exit code: {result.exit_code}\n{result.output_tail}"

    def _walk(self, base: Path) -> list[Path]:
        found = []
        for item in base.rglob("*"):
            rel = item.relative_to(self.root)
            if rel.parts and rel.parts[0] == ".git":
                continue
            if item.is_file() and item.resolve().is_relative_to(self.root):
                found.append(item)
        return found

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()
