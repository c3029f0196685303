"""`[permissions]`: which tools a step's agent is offered, and what each call may touch.

A rule is ``Tool`` or ``Tool(specifier)``, as coding agents write them (``parse_rule``).
Kinds: ``Bash`` (``run_command``), ``Read`` (every tool that reads: ``read_file``,
``list_files``, ``grep``), ``Edit`` (every tool that edits: ``edit_file``,
``write_file``), ``Write`` (``write_file``), ``Grep``, ``Glob`` (``list_files``), a
built-in tool's own name, and ``mcp__<server>`` or ``mcp__<server>__<tool>``. Without a
specifier a rule covers the whole tool: denied (or ask) whole, the tool is not offered.
Deny beats ask, ask beats allow; nobody answers ``ask`` in a job, so it refuses, saying
so. With ``default = "deny"`` only what an allow rule matches may run.

Commands are held to the generic kinds: ``Bash`` rules are tried on the command's words
before it runs (``check_command``); ``Read`` deny/ask paths are hidden in the sandbox and
``Edit``/``Write`` ones bound read-only (``masks``), and a changed path they cover is
dropped afterwards (``denied_writes``: a new file no mount could protect). Rules naming
one tool (``read_file(...)``, ``Grep(...)``) hold for that tool only.

Paths, gitignore-like: ``./x/**`` and ``/x/**`` are anchored at the worktree's root (so
is a pattern with a slash inside, ``src/*.py``); ``*.lock`` or ``.env`` (no slash) match
at any depth; ``**`` spans folders; a pattern that matches a folder covers all it holds.
``~/...`` and ``//abs`` name host paths: accepted, they never match inside a worktree.
``[...]`` is literal (``app/[id]/page.tsx``).

The ``Bash`` check reads words (``merlin_flow.tools.shell_commands``: compound commands,
substitutions, wrappers and ``sh -c`` scripts are seen through), and that is its limit:
what variables hold (``$CMD``), what scripts (``./deploy.sh``) or other interpreters
(``python -c``) run is beyond it. A deny rule is a guard rail; ``default = "deny"`` is
stronger (every part must match an allow rule). The wall is the sandbox: no network, no
git directory, masked paths.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from merlin_flow.tool_config import PermissionRules
from merlin_flow.tools.shell_commands import split_command
from merlin_flow.workspace.sandbox import SandboxMasks

FILE_TOOLS = ("read_file", "write_file", "edit_file", "list_files", "grep")
FOLDER_TOOLS = ("list_files", "grep")
KIND_TOOLS: dict[str, tuple[str, ...]] = {
    "Bash": ("run_command",),
    "Read": ("read_file", "list_files", "grep"),
    "Edit": ("edit_file", "write_file"),
    "Write": ("write_file",),
    "Grep": ("grep",),
    "Glob": ("list_files",),
    **{name: (name,) for name in (*FILE_TOOLS, "run_command")},
}
"""The built-in tools each rule kind covers (MCP kinds cover their server's tools)."""
ASK_NOTE = "(nobody can answer in a job, so it is refused)"
_MCP = re.compile(r"^mcp__[A-Za-z0-9_-]+?(?:__\*)?$")
_PROBES = ("\x00", "\x00" * 9)  # names no literal pattern matches: wildcards only


@dataclass(frozen=True)
class Rule:
    """One rule: the tool kind it names and its specifier (None: the whole tool)."""

    text: str
    kind: str
    specifier: str | None = None
    command: re.Pattern[str] | None = None
    """For ``Bash``: the command words it matches, joined by spaces."""
    path: re.Pattern[str] | None = None
    """For the file kinds: the relative paths it matches (None with a host path)."""

    def applies_to(self, tool: str) -> bool:
        """Whether this rule speaks of ``tool`` at all."""
        if self.kind.startswith("mcp__"):
            return tool == self.kind or tool.startswith(self.kind + "__")
        return tool in KIND_TOOLS[self.kind]

    def matches_command(self, words: Iterable[str]) -> bool:
        """Whether a simple command (its words) is one this rule names."""
        found = self.command and self.command.fullmatch(" ".join(words))
        return self.specifier is None or bool(found)

    def matches_path(self, rel: str) -> bool:
        """Whether ``rel`` (relative, posix) or a folder holding it matches the pattern."""
        if self.specifier is None:
            return True
        parts = rel.split("/") if rel else []
        return any(self._full(parts[:end]) for end in range(1, len(parts) + 1))

    def covers_folder(self, rel: str) -> bool:
        """Whether every path in the folder ``rel`` ("" is the root) is matched."""
        if self.specifier is None or (rel and self.matches_path(rel)):
            return True
        return all(self._full([*([rel] if rel else []), probe]) for probe in _PROBES)

    def _full(self, parts: list[str]) -> bool:
        return bool(self.path and self.path.fullmatch("/".join(parts)))


def parse_rule(text: str) -> Rule:
    """Read one rule; ValueError names the rule and what is wrong with it."""
    text = text.strip()
    kind, paren, rest = text.partition("(")
    if (not paren and ")" in text) or (paren and not _balanced(rest)):
        raise ValueError(f"permission rule {_quoted(text)}: unbalanced parentheses")
    spec = rest[:-1].strip() if paren else None
    if _MCP.match(kind):
        if paren:
            raise ValueError(f"permission rule {_quoted(text)}: MCP tools take no specifier")
        return Rule(text, kind.removesuffix("__*"))
    if kind not in KIND_TOOLS:
        hint = next((f" (did you mean {k}?)" for k in KIND_TOOLS if k.lower() == kind.lower()), "")
        raise ValueError(
            f"permission rule {_quoted(text)}: unknown tool {_quoted(kind)}{hint}; rules name "
            f"{', '.join(KIND_TOOLS)}, "
            "mcp__<server> or mcp__<server>__<tool>"
        )
    if spec is None or (spec == "*" and KIND_TOOLS[kind] == ("run_command",)):
        return Rule(text, kind)
    if not spec or "\x00" in spec:
        problem = "a NUL character" if spec else f"empty specifier ({kind} alone: the whole tool)"
        raise ValueError(f"permission rule {_quoted(text)}: {problem}")
    if KIND_TOOLS[kind] == ("run_command",):
        return Rule(text, kind, spec, command=_command_pattern(text, spec))
    return Rule(text, kind, spec, path=_path_pattern(text, spec))


def _quoted(text: str) -> str:
    """A rule as its error shows it: quoted, cut short when it is long."""
    return repr(text) if len(text) <= 80 else f"{text[:80]!r}... ({len(text):,} characters)"


def _balanced(rest: str) -> bool:
    depth = 1
    for index, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return index == len(rest) - 1
    return False


def _command_pattern(text: str, spec: str) -> re.Pattern[str]:
    """The words a ``Bash`` specifier matches, joined by spaces.

    ``a b:*`` and ``a b *``: the words ``a b``, alone or followed by more; ``*`` within:
    any characters; anything else: exactly these words.
    """
    spec = " ".join(spec.split())
    prefix = spec.endswith((":*", " *"))
    base = spec[:-2].strip() if prefix else spec
    if ":*" in base or not base:
        raise ValueError(f"permission rule {_quoted(text)}: `:*` goes at the end, after a command")
    try:
        words = base if "*" in base else " ".join(shlex.split(base))
    except ValueError as exc:
        raise ValueError(f"permission rule {_quoted(text)}: {exc}") from None
    body = ".*".join(re.escape(part) for part in words.split("*"))
    return re.compile(body + ("(?: .*)?" if prefix else ""), re.DOTALL)


def _path_pattern(text: str, spec: str) -> re.Pattern[str] | None:
    if spec.startswith(("~", "//")):
        return None  # a host path: never inside a worktree
    anchored = spec.startswith(("./", "/")) or "/" in spec.strip("/")
    body = spec.removeprefix("./").strip("/")
    segments = body.split("/") if body else ["**"]
    if any(seg in ("", ".", "..") for seg in segments):
        raise ValueError(f"permission rule {_quoted(text)}: `.`, `..` or `//` inside the path")
    out = "" if anchored else "(?:.*/)?"
    for index, seg in enumerate(segments):
        last = index == len(segments) - 1
        if seg == "**":
            out += ".*" if last else "(?:.*/)?"
            continue
        out += "".join({"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c)) for c in seg)
        out += "" if last else "/"
    return re.compile(out, re.DOTALL)


class Permissions:
    """The rules of one step, asked before each tool call and each command.

    ``root`` (the worktree) lets path checks see where a symlink leads, as the tools do
    when they resolve a path; without it paths are judged as written.
    """

    def __init__(self, rules: PermissionRules, root: Path | None = None) -> None:
        """Parse ``rules`` (a merged `[permissions]`) for the worktree ``root``."""
        self.rules = rules
        self.root = root.resolve() if root is not None else None
        self.lists = {name: [parse_rule(t) for t in getattr(rules, name)] for name in LISTS}
        self.default_deny = rules.default == "deny"

    def tool_offered(self, name: str) -> bool:
        """Whether the model is offered the tool ``name`` at all.

        Not when a whole-tool deny or ask covers it (``Edit``, ``mcp__github``), nor
        with ``default = "deny"`` when no allow rule speaks of it.
        """
        if any(r.applies_to(name) and r.specifier is None for r in self._refusing()):
            return False
        return not self.default_deny or any(r.applies_to(name) for r in self.lists["allow"])

    def check_call(self, tool: str, arguments: dict[str, Any]) -> str | None:
        """Why this call is refused, or None when it may run.

        File tools are judged by their ``path``: the file for ``read_file``,
        ``write_file``, ``edit_file``; the folder searched for ``list_files`` and
        ``grep``, refused only when a rule covers it whole (``Read(./secrets/**)`` refuses
        ``secrets``). A search over a folder a rule covers in part runs, and the tool
        must skip each file ``path_readable`` refuses. ``edit_file`` reads the file it
        edits, so ``Read`` deny/ask rules refuse it too. ``run_command`` is judged by
        ``check_command``; other tools (MCP) by name.
        """
        if tool == "run_command" and isinstance(arguments.get("command"), str):
            return self.check_command(arguments["command"])
        path = arguments.get("path", "." if tool in FOLDER_TOOLS else None)
        if tool not in FILE_TOOLS or not isinstance(path, str):
            return self._check(tool, tool, lambda rule: False)
        paths = self._relative(path)
        if tool in FOLDER_TOOLS:
            return self._check(
                tool,
                paths[0] or ".",
                lambda rule: any(rule.covers_folder(p) for p in paths),
                allow=lambda rule: True,  # the files found are checked one by one
            )
        refused = self._check(tool, paths[0], lambda r: any(map(r.matches_path, paths)))
        reads = [
            r for r in self._refusing() if r.kind == "Read" and any(map(r.matches_path, paths))
        ]
        if refused is None and tool == "edit_file" and reads:  # its replies tell what it read
            name = "deny" if reads[0] in self.lists["deny"] else "ask"
            return _refusal(name, reads[0], paths[0])
        return refused

    def path_readable(self, rel: str, tool: str = "read_file") -> bool:
        """Whether ``tool`` may read the file ``rel``: searches skip the files it may not."""
        paths = self._relative(rel)
        return self._check(tool, rel, lambda r: any(r.matches_path(p) for p in paths)) is None

    def check_command(self, command: str) -> str | None:
        """Why the shell ``command`` may not run, or None (``run_command``, exit commands).

        A deny or ask rule refuses when it matches any simple command in it
        (``merlin_flow.tools.shell_commands``); with ``default = "deny"`` every simple command
        needs an allow rule. A command that cannot be read is refused when rules would
        have to read it.
        """
        tool, subject = "run_command", " ".join(command.split())
        refused = self._check(tool, subject, lambda rule: False, allow=lambda rule: True)
        rules = [*self._refusing(), *self.lists["allow"]]
        if refused or not any(r.applies_to(tool) and r.specifier for r in rules):
            return refused
        try:
            commands = split_command(command)
        except ValueError as exc:
            return (
                "refused: [permissions] has command rules and this command cannot be "
                f"read ({exc}): {subject}"
            )
        for name in ("deny", "ask"):
            for part in commands:
                for rule in self.lists[name]:
                    if rule.applies_to(tool) and any(map(rule.matches_command, part.readings)):
                        return _refusal(name, rule, " ".join(part.words))
        allowing = [r for r in self.lists["allow"] if r.applies_to(tool)]
        for part in commands if self.default_deny else []:
            if not part.script_runner and not any(r.matches_command(part.words) for r in allowing):
                return _not_allowed(" ".join(part.words))
        return None

    def masks(self, worktree: Path) -> SandboxMasks:
        """The existing paths of ``worktree`` that commands must not read, or change.

        Hidden: what ``Read`` deny/ask rules cover; read-only: what ``Edit``/``Write``
        deny/ask rules cover. Each is as few paths as can be: a folder covered whole
        stands for what it holds (the root itself when a rule covers everything). The
        walk skips ``.git`` and follows no symlink; a covered link stands for its target
        when that is inside the worktree.
        """
        reading = [r for r in self._refusing() if r.kind == "Read"]
        writing = [r for r in self._refusing() if r.kind in ("Edit", "Write")]
        root = worktree.resolve()
        return SandboxMasks(hidden=_covered(root, reading), read_only=_covered(root, writing))

    def denied_writes(self, paths: Iterable[str]) -> list[tuple[str, str]]:
        """Of changed ``paths`` (relative), those that may not be written, with the rule.

        ``Edit``/``Write`` deny and ask rules forbid; with ``default = "deny"``, so does
        the lack of an ``Edit``/``Write`` allow rule (given as ``default = "deny"``).
        merlin drops these changes after an attempt: a command may have made a new file
        that no mount could protect.
        """
        writing = [r for r in self._refusing() if r.kind in ("Edit", "Write")]
        allowing = [r for r in self.lists["allow"] if r.kind in ("Edit", "Write")]
        denied = []
        for path in paths:
            rel = self._relative(path)
            rule = next((r for r in writing if any(map(r.matches_path, rel))), None)
            if rule is not None:
                denied.append((path, rule.text))
            elif self.default_deny and not any(any(map(r.matches_path, rel)) for r in allowing):
                denied.append((path, 'default = "deny"'))
        return denied

    def _check(
        self,
        tool: str,
        subject: str,
        match: Callable[[Rule], bool],
        allow: Callable[[Rule], bool] | None = None,
    ) -> str | None:
        for name in ("deny", "ask"):
            for rule in self.lists[name]:
                if rule.applies_to(tool) and (rule.specifier is None or match(rule)):
                    return _refusal(name, rule, subject)
        allowed = allow or match
        if self.default_deny and not any(
            r.applies_to(tool) and (r.specifier is None or allowed(r)) for r in self.lists["allow"]
        ):
            return _not_allowed(subject)
        return None

    def _relative(self, path: str) -> list[str]:
        """``path`` as rules see it (relative, posix, "" for the root), and its target.

        The target is where it leads when ``root`` is known and a symlink takes it
        elsewhere inside the worktree.
        """
        lexical = posixpath.normpath(path or ".")
        if self.root and posixpath.isabs(lexical) and Path(lexical).is_relative_to(self.root):
            lexical = posixpath.relpath(lexical, self.root)
        found = [lexical]
        if self.root is not None and "\x00" not in path:
            target = (self.root / path).resolve()
            if target.is_relative_to(self.root):
                found.append(target.relative_to(self.root).as_posix())
        return list(dict.fromkeys("" if p == "." else p for p in found))

    def _refusing(self) -> list[Rule]:
        return [*self.lists["deny"], *self.lists["ask"]]


LISTS = ("deny", "ask", "allow")


def _refusal(name: str, rule: Rule, subject: str) -> str:
    note = f" {ASK_NOTE}" if name == "ask" else ""
    return f"refused by [permissions] {name} rule {rule.text}{note}: {subject}"


def _not_allowed(subject: str) -> str:
    return f'not allowed: [permissions] default = "deny" and no allow rule matches {subject}'


def _covered(root: Path, rules: list[Rule]) -> tuple[Path, ...]:
    """The fewest existing paths under ``root`` that hold every path ``rules`` cover."""
    if not rules:
        return ()
    if any(r.covers_folder("") for r in rules):
        return (root,)
    found: set[Path] = set()
    folders = [root]
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            path = Path(entry.path)
            rel = path.relative_to(root).as_posix()
            if rel == ".git":
                continue
            whole = any(r.covers_folder(rel) for r in rules)
            if entry.is_symlink():
                target = path.resolve()
                if whole and target != root and target.is_relative_to(root) and target.exists():
                    found.add(target)
            elif entry.is_dir(follow_symlinks=False):
                if whole:
                    found.add(path)
                else:
                    folders.append(path)
            elif any(r.matches_path(rel) for r in rules):
                found.add(path)
    return tuple(sorted(p for p in found if not any(a in found for a in p.parents)))


def merge_rules(user: PermissionRules, project: PermissionRules) -> PermissionRules:
    """The rules of ``project`` over ``user``: every list kept whole, stricter default.

    A user's deny is never lost; ``default = "deny"`` if either says so.
    """
    return PermissionRules(
        allow=[*user.allow, *project.allow],
        deny=[*user.deny, *project.deny],
        ask=[*user.ask, *project.ask],
        default="deny" if "deny" in (user.default, project.default) else "allow",
    )
