"""Where ``merlin agents`` reads and writes agent files, and what its commands share.

The repository ``--repo`` names (the git work tree around it), the folders of the
scopes written to, the files that define a name (even one that does not load), why
there is none, the template a new agent starts from, and the options.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from merlin_flow.cli.common import console, err_console
from merlin_flow.errors import InputError, MerlinError

if TYPE_CHECKING:
    from merlin_flow.agents.definitions import AgentCatalog, AgentDefinition, AgentScope


class WritableScope(StrEnum):
    """The scopes whose folders ``merlin agents`` writes to."""

    PROJECT = "project"
    USER = "user"


RepoOption = Annotated[
    str,
    typer.Option(
        "--repo",
        help="The repository whose .merlin/agents/ holds the project's agents.",
        show_default="the git work tree around the current folder",
    ),
]
RunRepoOption = Annotated[
    str,
    typer.Option(
        "--repo",
        help="The git repository the step works on; its .merlin/agents/ holds the "
        "project's agents.",
        show_default="the git work tree around the current folder",
    ),
]
NameArg = Annotated[str, typer.Argument(help="The agent's name.", metavar="NAME")]
PromptArg = Annotated[
    str,
    typer.Argument(
        help="What the agent should do, quoted: the step's description.", metavar="PROMPT"
    ),
]
ScopeOption = Annotated[
    WritableScope | None,
    typer.Option("--scope", help="project: <repo>/.merlin/agents/; user: $MERLIN_HOME/agents/."),
]
TEMPLATE = """{header}\
# tools: [read_file, list_files, grep, run_command]  # leave out: every allowed tool
# tier: fast                                        # a tier of merlin.toml, or model: ...
---
You are ... (one sentence: who this agent is and what it is for).

## Responsibilities

- ...

## How to work

1. ...

## Guardrails

- ...
"""
DEFAULT_DESCRIPTION = (
    "TODO: what this agent does and which steps it is for (autodelegation matches a "
    "step's words against these)."
)


def say(text: str) -> None:
    """Print ``text`` as written: no markup, no highlighting, no path broken across lines."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def warn(text: str) -> None:
    """Print a warning to stderr, unwrapped."""
    err_console.print(f"[yellow]warning:[/] {escape(text)}", highlight=False, soft_wrap=True)


def project_root(repo: str) -> Path:
    """The folder ``--repo`` names, or the git work tree around it (the first with .git)."""
    path = Path(repo).expanduser()
    if not path.is_dir():
        raise InputError(f"--repo {repo}: no such folder")
    path = path.resolve()
    return next((p for p in (path, *path.parents) if (p / ".git").exists()), path)


def home() -> Path:
    """MERLIN_HOME: the user scope's agents are in its ``agents/``."""
    from merlin_flow.settings import get_settings

    return get_settings().home_dir


def config_places() -> tuple[Path, Path]:
    """MERLIN_HOME and the system's merlin.toml: where ``load_config`` looks beside a project."""
    from merlin_flow.settings import get_settings

    settings = get_settings()
    return settings.home_dir, settings.system_config


def load_catalog(repo: str) -> tuple[Path, AgentCatalog]:
    """The repository's root, and every agent of the three scopes as seen from it."""
    from merlin_flow.agents.definitions import load_agents

    root = project_root(repo)
    return root, load_agents(root, home())


def folder(scope: AgentScope | WritableScope, root: Path) -> Path:
    """The folder of ``scope``'s agent files."""
    from merlin_flow.agents.definitions import AgentScope, agent_dir

    return agent_dir(AgentScope(scope.value), root, home())


def tools_text(agent: AgentDefinition) -> str:
    """The agent's tools as a table shows them: all, none, or the names."""
    if agent.tools is None:
        return "all"
    return ", ".join(agent.tools) or "none"


def runs_on(agent: AgentDefinition) -> str:
    """The tier or model the agent names, or ``-``."""
    if agent.tier:
        return f"tier {agent.tier}"
    return f"model {agent.model}" if agent.model else "-"


def listing(agent: AgentDefinition) -> dict[str, Any]:
    """What ``merlin agents list --json`` gives of an agent (the names are a contract)."""
    keys = ("name", "description", "scope", "file", "tools", "model", "tier", "warnings")
    record = agent.to_record()
    return {key: record[key] for key in keys}


def files_of(
    name: str, root: Path, catalog: AgentCatalog, scope: WritableScope | None
) -> list[tuple[WritableScope, Path]]:
    """The project and user (or ``scope``'s) files of ``name``, the one in effect first.

    A file named for the agent that does not load counts too: it is what needs editing.
    """
    found: list[tuple[WritableScope, Path]] = []
    for each in WritableScope:
        if scope is not None and each is not scope:
            continue
        bad = folder(each, root) / f"{name}.md"
        paths = {Path(a.file) for a in catalog.definitions(name) if a.scope.value == each.value}
        paths |= {Path(file) for file, _ in catalog.skipped if Path(file) == bad}
        found += [(each, path) for path in sorted(paths)]
    return found


def not_found(name: str, catalog: AgentCatalog, scope: WritableScope | None) -> InputError:
    """Why there is no project or user file of ``name`` to change."""
    defined = catalog.definitions(name)
    if scope is not None and defined:
        where = ", ".join(f"{a.scope.value} ({a.file})" for a in defined)
        return InputError(f"no {scope.value} agent {name}; it is defined in: {where}")
    if defined and all(a.scope.value == "builtin" for a in defined):
        return InputError(
            f"{name} is a builtin agent, shipped with merlin, and cannot be changed or "
            f"removed: copy it with `merlin agents init` (or hide it with `merlin agents "
            f"create {name}`) and change the copy"
        )
    try:
        catalog.get(name)
    except MerlinError as exc:
        return InputError(str(exc))
    return InputError(f"no project or user file defines the agent {name}")
