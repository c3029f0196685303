"""The `[permissions]`, `[agents]` and `[mcp_servers.NAME]` sections of ``merlin.toml``.

They say what a step's agent may do and with what: the rules every tool call and command
is checked against (``merlin_flow.tools.permissions``), which agent a step gets
(``merlin_flow.agents.definitions``), and the MCP servers whose tools join the built-in ones
(``merlin_flow.tools.mcp``). ``MerlinConfig`` holds one of each. ``refuse_loosening``
says what a repository's own file may not set.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from merlin_flow.errors import ConfigError

SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
"""What an MCP server may be called: its tools are named ``mcp__<server>__<tool>``."""


class PermissionRules(BaseModel):
    """`[permissions]`: rules in the `Tool(specifier)` form coding agents share.

    A rule names a tool (`Bash`, `Read`, `Edit`, `Write`, a built-in tool's own name or an
    MCP tool's `mcp__server__tool`), alone or with a specifier: a command prefix for
    `Bash` (`Bash(git push:*)`), a path glob for the file tools (`Read(./secrets/**)`).
    Deny beats ask, ask beats allow; in a job nobody can answer `ask`, so it refuses.
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

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
        if rules:
            from merlin_flow.tools.permissions import parse_rule

            for rule in rules:
                parse_rule(rule)  # ValueError naming the rule and what is wrong with it
        return rules


class AgentSettings(BaseModel):
    """`[agents]`: which agent a step without an `agent:` gets."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    default: str | None = None
    """The agent of every step that names none (unset: merlin's plain coding agent)."""
    autodelegate: bool = False
    """Give a step that names no agent the one whose description best matches it."""
    min_score: float = Field(default=0.2, ge=0, le=1)
    """The lowest match score autodelegation accepts; below it, the default agent."""


class McpServer(BaseModel):
    """`[mcp_servers.NAME]`: a Model Context Protocol server whose tools steps may use."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

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


def refuse_loosening(overlay: dict[str, Any], user: dict[str, Any], source: Path) -> None:
    """A repository's own merlin.toml may tighten what steps may do, never loosen it.

    Its content is as untrusted as its code (a pull request can change it): turning the
    sandbox off, giving steps the network or passing variables in, an `allow` rule under
    the user's `default = "deny"`, or a `url` MCP server (the worker itself, outside the
    sandbox, would talk to an address of the repository's choosing) need a --config file.
    """
    problems = []
    sandbox = overlay.get("sandbox")
    if isinstance(sandbox, dict):
        loosened = [
            key
            for key, value in sandbox.items()
            if (key == "mode" and value != "bwrap")
            or (key == "network" and value is not False)
            or (key == "pass_env" and value)
        ]
        if loosened:
            problems.append(f"[sandbox] {', '.join(loosened)}")
    user_default = _table(user, "permissions").get("default")
    allows = _table(overlay, "permissions").get("allow")
    if user_default == "deny" and allows:
        problems.append('[permissions] allow (the user\'s file sets default = "deny")')
    servers = _table(overlay, "mcp_servers")
    remote = [n for n, s in servers.items() if isinstance(s, dict) and s.get("url") is not None]
    if remote:
        problems.append(f"[mcp_servers] with a url ({', '.join(sorted(remote))})")
    if problems:
        raise ConfigError(
            f"{source}: {'; '.join(problems)} would loosen the sandbox, and a "
            "repository's own merlin.toml may not (its content is untrusted, like its code): "
            "put these settings in a file you pass with --config"
        )


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    """The table ``data[key]``; {} when it is absent or not a table (validation says so)."""
    value = data.get(key)
    return value if isinstance(value, dict) else {}
