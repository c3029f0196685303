"""Agent definitions: Markdown files with YAML front matter, found in three scopes.

An agent file holds ``---``, YAML front matter (``FIELDS``), ``---``, then the body: the
agent's system prompt. Scopes, highest first: ``project`` (``<repo>/.merlin/agents/*.md``),
``user`` (``$MERLIN_HOME/agents/*.md``) and ``builtin`` (the starter agents shipped in
``config/agents/``). A name defined in a higher scope hides (shadows) it below.

A file that does not validate is skipped with its problem and never stops the others
from loading. Decisions where a choice had to be made:

- a ``name`` that differs from the file's stem loads, with a warning;
- two files of one scope with the same ``name``: the first by file name wins, the other
  is skipped; files whose name starts with ``.`` (editor locks) are not read;
- ``tools`` is a YAML list or a comma-separated string (``tools: Read, Grep``); names
  merlin does not know warn; ``tools: []`` means no tool, an absent ``tools`` every one;
- ``tier`` and ``model`` are not checked against ``merlin.toml`` here: submission does.

The body and the memory file may hold ``@path`` import lines (``merlin_flow.agents.instructions``,
which also reads the repository's AGENTS.md). A project's files come from its repository
and are as untrusted as its code: the files themselves, their imports and memory must
stay inside the repository root (no ``~``, no absolute path, no ``..`` or symlink out).
"""

from __future__ import annotations

import re
import reprlib
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from merlin_flow.agents.instructions import (
    ensure_inside,
    expand_imports,
    instruction_file,
    instruction_text,
    locate,
    read_text,
)
from merlin_flow.errors import AgentFileError
from merlin_flow.resources import resource_dir
from merlin_flow.tasklist import YAML_TAG_ERRORS, load_yaml

__all__ = [
    "AgentCatalog",
    "AgentDefinition",
    "AgentScope",
    "agent_dir",
    "expand_imports",
    "instruction_file",
    "instruction_text",
    "load_agents",
    "parse_agent_file",
]

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
"""What an agent may be called: lower case letters, digits, ``-`` and ``_``."""
FIELDS = ("name", "description", "tools", "tier", "model", "memory")
NATIVE_TOOLS = ("read_file", "write_file", "edit_file", "list_files", "grep", "run_command")
CLAUDE_CODE_TOOLS = ("Read", "Grep", "Glob", "Edit", "Write", "Bash")
KNOWN_TOOLS = frozenset((*NATIVE_TOOLS, *CLAUDE_CODE_TOOLS))
"""Tool names a ``tools`` list may hold, besides MCP tools (``mcp__server__tool``)."""
PROJECT_AGENTS = Path(".merlin") / "agents"
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)^(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.S | re.M)
_MCP_TOOL = re.compile(r"^mcp__[A-Za-z0-9_-]+(?:__\S+)?$")


class AgentScope(StrEnum):
    """Where an agent file was found; a higher scope hides the same name below it."""

    PROJECT = "project"
    USER = "user"
    BUILTIN = "builtin"


@dataclass(frozen=True)
class AgentDefinition:
    """One agent, as its file defines it, with its prompt ready to use."""

    name: str
    description: str
    prompt: str
    """The body, its imports expanded, the memory file appended under a heading."""
    tools: tuple[str, ...] | None
    """The allowlist of tool names as written; None: every tool the step may use."""
    tier: str | None
    model: str | None
    memory: str | None
    """The ``memory`` field as written."""
    scope: AgentScope
    file: str
    warnings: tuple[str, ...] = ()

    def to_record(self) -> dict[str, Any]:
        """The definition as JSON-able data, as a job stores it."""
        return {
            "name": self.name,
            "description": self.description,
            "prompt": self.prompt,
            "tools": None if self.tools is None else list(self.tools),
            "tier": self.tier,
            "model": self.model,
            "memory": self.memory,
            "scope": self.scope.value,
            "file": self.file,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> AgentDefinition:
        """The definition ``to_record`` stored; AgentFileError if the record is damaged."""
        try:
            tools = data.get("tools")
            return cls(
                name=str(data["name"]),
                description=str(data["description"]),
                prompt=str(data["prompt"]),
                tools=None if tools is None else tuple(str(tool) for tool in tools),
                tier=data.get("tier"),
                model=data.get("model"),
                memory=data.get("memory"),
                scope=AgentScope(data["scope"]),
                file=str(data["file"]),
                warnings=tuple(str(w) for w in data.get("warnings", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AgentFileError(f"a stored agent record is damaged: {exc!r}") from None


@dataclass
class AgentCatalog:
    """Every agent found: the effective ones, the ones hidden by a higher scope, the bad."""

    agents: dict[str, AgentDefinition] = field(default_factory=dict)
    shadowed: list[AgentDefinition] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(file, problem)`` of each file that could not be loaded."""

    def get(self, name: str) -> AgentDefinition:
        """The effective agent ``name``; AgentFileError naming the known ones otherwise."""
        if name in self.agents:
            return self.agents[name]
        known = ", ".join(sorted(self.agents)) or "none"
        bad = [file for file, _ in self.skipped if Path(file).stem == name]
        hint = f" ({bad[0]} did not load: see `merlin agents list`)" if bad else ""
        raise AgentFileError(f"no agent named {name!r}{hint}; the agents: {known}")

    def definitions(self, name: str) -> list[AgentDefinition]:
        """Every definition of ``name``, the effective one first, then those it hides."""
        found = [self.agents[name]] if name in self.agents else []
        return found + [agent for agent in self.shadowed if agent.name == name]

    @property
    def warnings(self) -> list[str]:
        """Every problem (skipped files) and warning (loaded ones), each naming its file."""
        found = [f"{file}: skipped: {problem}" for file, problem in self.skipped]
        for agent in [*self.agents.values(), *self.shadowed]:
            found += [f"{agent.file}: {warning}" for warning in agent.warnings]
        return found


def agent_dir(scope: AgentScope, project_root: Path | None, user_home: Path) -> Path:
    """The folder of ``scope``'s agent files (``user_home`` is MERLIN_HOME)."""
    if scope is AgentScope.PROJECT:
        if project_root is None:
            raise AgentFileError("project agents need a repository: none was given")
        return project_root / PROJECT_AGENTS
    if scope is AgentScope.USER:
        return user_home / "agents"
    return resource_dir("config") / "agents"


def load_agents(project_root: Path | None, user_home: Path) -> AgentCatalog:
    """Every agent of the three scopes (no project scope without ``project_root``)."""
    catalog = AgentCatalog()
    for scope in AgentScope:
        if scope is AgentScope.PROJECT and project_root is None:
            continue
        folder = agent_dir(scope, project_root, user_home)
        try:
            paths = sorted(p for p in folder.glob("*.md") if not p.name.startswith("."))
        except OSError as exc:
            catalog.skipped.append((str(folder), f"cannot list the folder: {exc}"))
            continue
        mine: dict[str, str] = {}
        for path in paths:
            try:
                agent = parse_agent_file(path, scope, project_root)
            except AgentFileError as exc:
                catalog.skipped.append((str(path), str(exc)))
                continue
            if agent.name in mine:
                problem = f"{mine[agent.name]} of the same scope defines {agent.name!r} already"
                catalog.skipped.append((str(path), problem))
            elif agent.name in catalog.agents:
                catalog.shadowed.append(agent)
            else:
                catalog.agents[agent.name] = agent
            mine.setdefault(agent.name, path.name)
    return catalog


def parse_agent_file(path: Path, scope: AgentScope, root: Path | None) -> AgentDefinition:
    """The agent ``path`` defines; AgentFileError saying what is wrong with it.

    ``root`` is the repository root: a project file's imports and memory stay inside it.
    """
    confine = None
    if scope is AgentScope.PROJECT:
        if root is None:
            raise AgentFileError("a project agent file needs its repository root")
        confine = root
        ensure_inside(path, root.resolve(), f"the agent file {path.name}")
    text = read_text(path, "the agent file")
    data, body = _front_matter(text)
    warnings: list[str] = []
    name = _text(data, "name", required=True) or ""
    if not NAME.fullmatch(name):
        raise AgentFileError(
            f"name {name!r} is not a valid agent name: use lower-case letters, digits, - "
            "and _, starting with a letter or a digit"
        )
    if name != path.stem:
        warnings.append(f"name {name!r} differs from the file name {path.name}")
    description = _text(data, "description", required=True) or ""
    tools = _tools(data.get("tools"), warnings)
    tier, model, memory = _text(data, "tier"), _text(data, "model"), _text(data, "memory")
    if tier and model:
        raise AgentFileError(
            f"both tier ({_shown(tier)}) and model ({_shown(model)}) are set: keep one"
        )
    unknown = sorted(str(key) for key in data if key not in FIELDS)
    if unknown:
        warnings.append(
            f"unknown key(s) ignored: {', '.join(unknown)} (known: {', '.join(FIELDS)})"
        )
    prompt = expand_imports(body, path, confine_to=confine).strip()
    if memory:
        memory_file = locate(memory, path.resolve(), confine.resolve() if confine else None)
        remembered = expand_imports(
            read_text(memory_file, "the memory file"), memory_file, confine_to=confine
        )
        prompt = f"{prompt}\n\n## Memory\n\n{remembered.strip()}".strip()
    if not prompt:
        warnings.append("the body is empty: the agent has no instructions of its own")
    return AgentDefinition(
        name, description.strip(), prompt, tools, tier, model, memory, scope, str(path),
        tuple(warnings),
    )  # fmt: skip


def _front_matter(text: str) -> tuple[dict[Any, Any], str]:
    """The front matter's mapping and the body after it."""
    import yaml

    match = _FRONT_MATTER.match(text.removeprefix("\ufeff"))
    if match is None:
        raise AgentFileError(
            "no front matter: an agent file starts with a line `---`, then YAML (name, "
            "description...), then a line `---`, then the prompt"
        )
    try:
        data = load_yaml(match.group(1))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or exc
        raise AgentFileError(f"invalid YAML in the front matter{where}: {problem}") from None
    except RecursionError:
        raise AgentFileError("the front matter is nested too deeply (lists or mappings)") from None
    except YAML_TAG_ERRORS as exc:
        raise AgentFileError(
            f"invalid YAML in the front matter: a value unfit for its tag ({exc})"
        ) from None
    if not isinstance(data, dict):
        raise AgentFileError(
            "the front matter is not a mapping of keys (name: ..., description: ...)"
        )
    return data, text.removeprefix("\ufeff")[match.end() :]


def _text(data: dict[Any, Any], key: str, *, required: bool = False) -> str | None:
    """The text of field ``key``: None when absent (AgentFileError when required)."""
    value = data.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise AgentFileError(f"the required field `{key}` is missing or empty")
        return None
    if not isinstance(value, str):
        raise AgentFileError(f"`{key}` must be text, not {type(value).__name__} ({_shown(value)})")
    return value.strip()


def _tools(value: Any, warnings: list[str]) -> tuple[str, ...] | None:
    """The ``tools`` allowlist as written; a warning for names merlin does not know."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not all(isinstance(t, str) and t.strip() for t in value):
        raise AgentFileError(
            f"`tools` must be a list of tool names or a comma-separated string, not {_shown(value)}"
        )
    tools = tuple(tool.strip() for tool in value)
    unknown = [t for t in tools if t not in KNOWN_TOOLS and not _MCP_TOOL.match(t)]
    if unknown:
        warnings.append(
            f"unknown tool name(s) {', '.join(unknown)} (known: {', '.join(sorted(KNOWN_TOOLS))}, "
            "or an MCP tool's mcp__server__tool)"
        )
    return tools


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring = 2, 4, 4, 60


def _shown(value: Any) -> str:
    """A value for a message, cut short: YAML aliases can nest a file's values deeply."""
    return _SHORT.repr(value)
