"""What one attempt's agent is given: its brief, its tools, and the permissions on them.

The brief is the step, the agent's own prompt, the repository's instruction file
(AGENTS.md, else MERLIN.md, read from the attempt's worktree) and the repository's map
ranked towards the step (``with_map``; none for a repository of a few files).

The active tools are the registry (the built-in tools, then the MCP servers' tools),
filtered by `[permissions]` (a tool a whole-tool rule refuses is not offered at all),
then by the agent's `tools:` allowlist. Each call then goes through the permissions
(``Permissions.check_call``), and the commands run in a sandbox that hides what a `Read`
deny covers and binds read-only what an `Edit`/`Write` deny covers; an agent with no
tool that writes gets the worktree read-only, so its `run_command` cannot write either.
After the attempt, ``drop_denied_writes`` undoes a change no mount could stop (a new
file a command created under an `Edit` deny).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from merlin_flow.agents.choice import stored_agent
from merlin_flow.agents.context_window import step_map
from merlin_flow.agents.definitions import AgentDefinition
from merlin_flow.agents.instructions import instruction_file, instruction_text
from merlin_flow.agents.loop import StepBrief
from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.store import Step
from merlin_flow.store.events import EventKind
from merlin_flow.tool_config import KIND_TOOLS, McpServer, SandboxMode
from merlin_flow.tools.mcp import open_mcp_tools
from merlin_flow.tools.permissions import Permissions
from merlin_flow.tools.schemas import FINISH, TOOL_SCHEMAS
from merlin_flow.tools.toolbox import Toolbox
from merlin_flow.workspace.beneath import Top, unlink_beneath
from merlin_flow.workspace.checkout import Checkout, confine
from merlin_flow.workspace.git import git, uncommitted_files
from merlin_flow.workspace.sandbox import unenforceable

BUILT_IN = tuple(s["function"]["name"] for s in TOOL_SCHEMAS if s["function"]["name"] != FINISH)
"""The built-in tools, in the order they are offered (``finish`` is always added)."""
WRITING_TOOLS = frozenset({"write_file", "edit_file"})


def step_brief(step: Step) -> StepBrief:
    """What the agent is told about ``step`` (its agent's own prompt included)."""
    agent = stored_agent(step.agent_spec)
    return StepBrief(
        step.key,
        step.step_type,
        step.description,
        step.verification,
        step.exit_command,
        role_prompt=agent.prompt if agent is not None else "",
    )


def with_map(brief: StepBrief, tier: Tier, toolbox: Toolbox) -> StepBrief:
    """``brief`` with the repository's map ranked towards the step, for its first prompt."""
    return dataclasses.replace(brief, repo_map=step_map(brief.description, tier, toolbox))


def with_instructions(brief: StepBrief, worktree: Path, config: MerlinConfig) -> StepBrief:
    """``brief`` with the repository's instruction file, as the attempt's worktree has it.

    Held to `[permissions]`: no file a `Read` rule hides from the agent is imported.
    """
    name = instruction_file(worktree)
    if name is None:
        return brief
    readable = Permissions(config.permissions, root=worktree).path_readable
    text = instruction_text(worktree, readable)
    return dataclasses.replace(brief, instructions=text, instructions_file=name)


def allowlisted(name: str, allowlist: Sequence[str] | None) -> bool:
    """Whether an agent's `tools:` list lets it have the tool ``name``.

    Entries are tool names (``read_file``), the kinds coding agents use (``Read`` means
    every tool that reads, ``Bash`` means ``run_command``...), or MCP names:
    ``mcp__server`` for all of a server's tools, ``mcp__server__tool`` for one.
    """
    if allowlist is None:
        return True
    for entry in allowlist:
        if name in KIND_TOOLS.get(entry, ()) or entry == name:
            return True
        if entry.startswith("mcp__") and name.startswith(entry.rstrip("*").rstrip("_") + "__"):
            return True
    return False


def offered_built_ins(permissions: Permissions, agent: AgentDefinition | None) -> list[str]:
    """The built-in tools the agent is offered, after the permissions and its allowlist."""
    tools = agent.tools if agent is not None else None
    return [n for n in BUILT_IN if permissions.tool_offered(n) and allowlisted(n, tools)]


def wanted_servers(
    config: MerlinConfig, permissions: Permissions, agent: AgentDefinition | None
) -> Mapping[str, McpServer]:
    """The MCP servers worth starting: not denied whole, and named by the allowlist."""
    tools = agent.tools if agent is not None else None
    wanted = {}
    for name, server in config.mcp_servers.items():
        prefix = f"mcp__{name}"
        named = any(rule.startswith(prefix) for rule in config.permissions.allow)
        if not permissions.tool_offered(prefix) and not (permissions.default_deny and named):
            continue  # denied whole (under `default = "deny"`, unless a rule allows a tool)
        if tools is None or any(t == prefix or t.startswith(prefix + "__") for t in tools):
            wanted[name] = server
    return wanted


@contextlib.contextmanager
def open_step_tools(
    checkout: Checkout, config: MerlinConfig, agent: AgentDefinition | None
) -> Iterator[Toolbox]:
    """The attempt's toolbox in ``checkout``, its MCP servers running until the end.

    An agent with no tool that writes gets the checkout read-only. Raises
    ToolSourceError when an MCP server cannot start.
    """
    permissions = Permissions(config.permissions, root=checkout.worktree)
    names = offered_built_ins(permissions, agent)
    if not WRITING_TOOLS & set(names):
        checkout = checkout.read_only()
    servers = wanted_servers(config, permissions, agent)
    tools = agent.tools if agent is not None else None
    with open_mcp_tools(servers, checkout.confinement, checkout.sandbox) as found:
        extra = [
            t for t in found if permissions.tool_offered(t.name) and allowlisted(t.name, tools)
        ]
        yield Toolbox(
            checkout,
            config.limits.tool_command_timeout,
            only=(*names, *(t.name for t in extra)),
            gate=permissions.check_call,
            readable=permissions.path_readable,
            extra=extra,
        )


def can_write(toolbox: Toolbox) -> bool:
    """Whether the toolbox's agent may change files (a reviewer may not)."""
    return bool(WRITING_TOOLS & set(toolbox.names))


def drop_denied_writes(worktree: Path, config: MerlinConfig) -> list[tuple[str, str]]:
    """Undo the attempt's changes to paths an `Edit`/`Write` deny covers; (path, why) each.

    A changed file goes back to the attempt's start (``HEAD`` of the worktree); a new
    one is removed beneath the worktree's descriptor (``unlink_beneath``: a symlinked
    folder never leads the removal out of it).
    """
    rules = config.permissions
    if not (rules.deny or rules.ask or rules.default == "deny"):
        return []
    dropped = Permissions(rules, root=worktree).denied_writes(uncommitted_files(worktree))
    with Top(worktree) as top:
        for path, _why in dropped:
            tracked = git("ls-files", "--error-unmatch", "--", path, cwd=worktree, check=False)
            if tracked.strip():
                git("checkout", "HEAD", "--", path, cwd=worktree)
            else:
                unlink_beneath(top, path)
    return dropped


def permission_events(
    worktree: Path, config: MerlinConfig, agent: AgentDefinition | None
) -> list[tuple[EventKind, str]]:
    """After an attempt: its denied writes undone, and what the sandbox could not enforce.

    Each is an event, ``(kind, message)``: ``write_refused`` per undone path, and
    ``permissions_unenforced`` when `[sandbox] mode = "none"` could not hide or protect
    what the rules cover.
    """
    events = []
    if config.sandbox.mode is SandboxMode.NONE:
        permissions = Permissions(config.permissions, root=worktree)
        writes = bool(WRITING_TOOLS & set(offered_built_ins(permissions, agent)))
        confinement = confine(worktree, None, config, writable=writes)  # as it is now
        warning = unenforceable(confinement, config.sandbox)
        if warning is not None:
            events.append((EventKind.PERMISSIONS_UNENFORCED, warning))
    dropped = drop_denied_writes(worktree, config)
    return events + [(EventKind.WRITE_REFUSED, f"{path}: {why}") for path, why in dropped]
