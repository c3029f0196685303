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
``Edit``/``Write`` ones bound read-only (``merlin_flow.workspace.checkout`` mounts them),
and a changed path they cover is dropped afterwards (``denied_writes``: a new file no
mount could protect). Rules naming one tool (``read_file(...)``, ``Grep(...)``) hold for
that tool only. The rules' grammar is ``merlin_flow.tool_config.parse_rule``.

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

import contextlib
import posixpath
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from merlin_flow.tool_config import FILE_TOOLS, FOLDER_TOOLS, PermissionRules, Rule, parse_rule
from merlin_flow.tools.shell_commands import split_command

ASK_NOTE = "(nobody can answer in a job, so it is refused)"


class Permissions:
    """The rules of one step, asked before each tool call and each command.

    ``root`` (the worktree) lets path checks see where a symlink leads, as the tools' walk
    follows it; without it paths are judged as written.
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
        elsewhere inside the worktree; a path with none (a symlink loop) is judged as
        written. The toolbox asks again with the path its walk opens, when it differs.
        """
        lexical = posixpath.normpath(path or ".")
        if self.root and posixpath.isabs(lexical) and Path(lexical).is_relative_to(self.root):
            lexical = posixpath.relpath(lexical, self.root)
        found = [lexical]
        if self.root is not None and "\x00" not in path:
            with contextlib.suppress(OSError, RuntimeError):  # RuntimeError: a symlink loop
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
