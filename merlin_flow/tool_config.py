"""The sections of ``merlin.toml`` that say what a step may do, and where it runs.

`[permissions]`, with the grammar of its rules (``parse_rule``) and how two levels merge
(``merge_rules``); `[sandbox]` and `[environment]`, where a step's commands run; `[agents]`
(which agent a step gets), `[mcp_servers]` (whose tools join the built-in ones), `[secrets]`.
``MerlinConfig`` holds one of each; what a repository's own file may not set is
``merlin_flow.config_files.refuse_loosening``. The rules are applied by
``merlin_flow.tools.permissions`` (to tool calls) and ``merlin_flow.workspace.checkout``
(to what the sandbox mounts).
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from merlin_flow.errors import ConfigError

SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
"""What an MCP server may be called: its tools are named ``mcp__<server>__<tool>``."""


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


class PermissionRules(BaseModel):
    """`[permissions]`: rules in the `Tool(specifier)` form coding agents share.

    A rule names a tool (`Bash`, `Read`, `Edit`, `Write`, a built-in tool's own name or an
    MCP tool's `mcp__server__tool`), alone or with a specifier: a command prefix for
    `Bash` (`Bash(git push:*)`), a path glob for the file tools (`Read(./secrets/**)`).
    Deny beats ask, ask beats allow; in a job nobody can answer `ask`, so it refuses.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    allow: list[str] = Field(default_factory=list)
    """Rules for what may run; with `default = "deny"`, the only things that may."""
    deny: list[str] = Field(default_factory=list)
    """Rules for what may never run or be read or written, even by a command."""
    ask: list[str] = Field(default_factory=list)
    """Rules that would ask a person: nobody answers in a job, so they refuse too."""
    default: Literal["allow", "deny"] = "allow"
    """What happens to a call no rule matches. `deny`: only what `allow` lists runs."""

    @field_validator("allow", "deny", "ask")
    @classmethod
    def _valid_rules(cls, rules: list[str]) -> list[str]:
        for rule in rules:
            parse_rule(rule)  # ValueError naming the rule and what is wrong with it
        return rules


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


class SandboxMode(StrEnum):
    """Where a step's commands run."""

    BWRAP = "bwrap"
    """In a bubblewrap sandbox (Linux): no network, no home, no secrets."""
    NONE = "none"
    """Directly as the worker's user; must be chosen explicitly, warned on every job."""


SECRET_NAME_PATTERNS = ("*_KEY", "*_TOKEN", "*_SECRET", "*PASSWORD*")
"""Names of environment variables that hold secrets (matched case-insensitively)."""


def is_secret_name(name: str) -> bool:
    """True when an environment variable called ``name`` holds a secret by its name."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_NAME_PATTERNS)


class Sandbox(BaseModel):
    """How a step's commands (`run_command`, exit commands, setup) are confined."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mode: SandboxMode = SandboxMode.BWRAP
    """`bwrap` (the default; Linux, Debian package `bubblewrap`) or `none` (no sandbox)."""
    network: bool | Literal["host"] = False
    """Steps' network: none, `true` (outbound only, as setup's) or `"host"` (setup's too)."""
    pass_env: list[str] = Field(default_factory=list)
    """Names of the worker's environment variables passed into the sandbox (never
    secret-looking names: `*_KEY`, `*_TOKEN`, `*_SECRET`, `*PASSWORD*`)."""
    max_file_size_mb: int | None = Field(default=1024, gt=0)
    """Largest file a command may write, in MiB (RLIMIT_FSIZE); unset: no limit."""
    max_memory_mb: int | None = Field(default=None, gt=0)
    """Address-space limit of a command, in MiB (RLIMIT_AS); unset: no limit."""

    @model_validator(mode="after")
    def _no_secret_names(self) -> Self:
        secret = [name for name in self.pass_env if is_secret_name(name)]
        if secret:
            raise ValueError(
                f"pass_env may not pass secret-looking variables into the sandbox: "
                f"{', '.join(secret)}"
            )
        return self


class SecretScan(BaseModel):
    """`[secrets]`: what the scan of each attempt's changes for secrets leaves alone."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    allow: list[str] = Field(default_factory=list)
    """Path globs, as `[permissions]` path rules read them (`tests/fixtures/**`), whose
    added lines are not scanned for key formats. The worker's own secrets are looked for
    in every file."""

    @field_validator("allow")
    @classmethod
    def _valid_globs(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            path_glob(pattern)  # ValueError naming the pattern
        return patterns


def path_glob(pattern: str) -> Rule:
    """A path glob read as `[permissions]` path rules are (``Rule.matches_path``), or ValueError."""
    spec, problem = pattern.strip(), "empty, a NUL character, or a path outside the repository"
    try:
        path = _path_pattern(spec, spec) if spec and "\x00" not in spec else None
    except ValueError:
        path, problem = None, "`.`, `..` or `//` inside the path"
    if path is None:
        raise ValueError(f"path glob {pattern!r}: {problem}")
    return Rule(spec, "Read", spec, path=path)


class Environment(BaseModel):
    """The project's own environment, built once per cache key and reused by every job."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    setup: list[str] | None = None
    """Shell commands that build the environment in `/merlin/env` with the project at
    `/workspace` (network allowed). Unset: the default for the project's kind (Python:
    a uv virtual environment with the project and its test extras, editable). `[]`: no
    environment; commands see merlin's own interpreter first on PATH."""
    cache_key: list[str] | None = None
    """Files whose content keys the built environment (unset: the usual manifests and
    lock files, such as pyproject.toml, setup.py, requirements*.txt, uv.lock)."""
    setup_timeout: float = Field(default=1800.0, gt=0)
    """Seconds the whole setup may take before it fails."""
    attempt_network: bool = False
    """Give the network to a build for dependency files a step changed (its code is the
    model's); off, it works from the package caches. Only a --config file turns it on."""


class AgentSettings(BaseModel):
    """`[agents]`: which agent a step without an `agent:` gets."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    default: str | None = None
    """The agent of every step that names none (unset: merlin's plain coding agent)."""
    autodelegate: bool = False
    """Give a step that names no agent the one whose description best matches it."""
    min_score: float = Field(default=0.2, ge=0, le=1)
    """The lowest match score autodelegation accepts; below it, the default agent."""
    citations: Literal["check", "enforce"] = "check"
    """How `path:line` citations are checked: marked, or enforced (docs/context.md)."""


class McpServer(BaseModel):
    """`[mcp_servers.NAME]`: a Model Context Protocol server whose tools steps may use."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    command: str | None = None
    """The program of a stdio server, started inside the step's sandbox."""
    args: list[str] = Field(default_factory=list)
    """Its arguments."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables set for it (inside the sandbox: never the worker's secrets)."""
    url: str | None = None
    """The address of a server reached over HTTP (streamable HTTP), instead of `command`."""
    timeout: float = Field(default=60.0, gt=0)
    """Seconds to start the server and list its tools, and for each tool call."""

    @model_validator(mode="after")
    def _one_transport(self) -> Self:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server needs exactly one of `command` and `url`")
        return self


USER_FILE_SECTIONS = ("permissions", "agents", "mcp_servers")
"""What the user's own ``$MERLIN_HOME/merlin.toml`` may set: it lies under the project's."""


def user_sections(data: dict[str, Any], source: Path) -> dict[str, Any]:
    """The sections of the user's file, checked: ConfigError naming any other key."""
    others = sorted(key for key in data if key not in USER_FILE_SECTIONS)
    if others:
        raise ConfigError(
            f"{source}: the user's merlin.toml holds only {', '.join(USER_FILE_SECTIONS)}; "
            f"found {', '.join(others)} (set those in the project's merlin.toml or --config)"
        )
    return data
