"""One step with a named agent: the job ``merlin agents run`` submits, and its dry run.

The job is a TaskList of one step, ``run``: the prompt is its description, the agent is
named by its `agent:`, and its type is ``Verify`` when the agent is offered no tool that
writes (a reviewer: the project's exit command for a check then applies), else
``Feature``. Past that it is a TaskList like any other: ``submission.submit_job`` checks
and records it, and its exit command is the project's default for the step's type.

The dry run (``preview``) writes nothing. It says what the step's agent would get at its
first attempt, from the same functions an attempt uses: the system prompt and the first
user message (``agents.loop.first_messages``, with the agent's prompt, the repository's
AGENTS.md and the specs' constraints), the tools after the permissions and the agent's
allowlist (``step_tools``), the rules in force and the paths they hide from commands;
and, as warnings, what submission would refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from merlin_flow.agents.choice import agent_tier_index, choose_agents
from merlin_flow.agents.definitions import AgentCatalog, AgentDefinition
from merlin_flow.agents.loop import StepBrief, first_messages
from merlin_flow.agents.step_tools import (
    BUILT_IN,
    WRITING_TOOLS,
    allowlisted,
    offered_built_ins,
    wanted_servers,
    with_instructions,
)
from merlin_flow.config import MerlinConfig
from merlin_flow.errors import GitError, InputError
from merlin_flow.jobs.submission import check_exit_commands
from merlin_flow.planning.routing import start_tier
from merlin_flow.planning.spec_check import with_spec_constraints
from merlin_flow.tasklist import StepType, TaskList, TaskStep
from merlin_flow.tool_config import PermissionRules
from merlin_flow.tools.permissions import Permissions
from merlin_flow.tools.toolbox import FINISH
from merlin_flow.workspace.checkout import permission_masks
from merlin_flow.workspace.exit_commands import exit_command_for
from merlin_flow.workspace.git import head_commit

RUN_STEP = "run"
"""The id of the one step."""
TITLE_CHARS = 72
"""The longest job title taken from a prompt; a longer first line is cut, with ``…``."""
NO_EXIT_COMMAND = "(none: see the warnings)"


def title_of(prompt: str) -> str:
    """The job's title: the prompt's first line, its spaces squeezed, cut to TITLE_CHARS."""
    line = next((" ".join(line.split()) for line in prompt.splitlines() if line.strip()), "")
    if not line:
        raise InputError("the prompt is empty: say what the agent should do")
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def step_type_for(agent: AgentDefinition, config: MerlinConfig) -> StepType:
    """``Verify`` when the agent is offered no tool that writes, else ``Feature``."""
    offered = offered_built_ins(Permissions(config.permissions), agent)
    return StepType.FEATURE if WRITING_TOOLS & set(offered) else StepType.VERIFY


def one_step_tasklist(agent: AgentDefinition, prompt: str, config: MerlinConfig) -> TaskList:
    """The TaskList of one step, ``run``, that the agent works on ``prompt``."""
    title = title_of(prompt)
    step = TaskStep(
        id=RUN_STEP,
        step_type=step_type_for(agent, config),
        description=prompt.strip(),
        agent=agent.name,
    )
    return TaskList(title=title, steps=[step])


@dataclass(frozen=True)
class ServerAccess:
    """A configured MCP server: whether the step would start it (its tools show then)."""

    name: str
    started: bool
    why: str


@dataclass(frozen=True)
class Preview:
    """What a dry run shows: the agent, its first messages, its tools and permissions."""

    agent: AgentDefinition
    tier: str
    """The tier the step would start on: the agent's own, else the one routing picks."""
    model: str
    step_type: StepType
    exit_command: str
    system_prompt: str
    user_prompt: str
    offered: tuple[str, ...]
    """The built-in tools offered, then ``finish``."""
    withheld: tuple[tuple[str, str], ...]
    """The built-in tools not offered, each with why."""
    servers: tuple[ServerAccess, ...]
    rules: PermissionRules
    hidden: tuple[str, ...]
    """Paths of the repository (relative, ``.`` the root) commands would not see."""
    read_only: tuple[str, ...]
    """Paths commands could read but not change (``.``: the whole worktree)."""
    warnings: tuple[str, ...]
    """The agent's own warnings, then what submission would refuse."""

    @property
    def writable(self) -> bool:
        """Whether the agent may change files (else commands see the worktree read-only)."""
        return bool(WRITING_TOOLS & set(self.offered))

    def to_json(self) -> dict[str, Any]:
        """What ``merlin agents run --dry-run --json`` prints (the keys are a contract)."""
        return {
            "agent": self.agent.name,
            "scope": self.agent.scope.value,
            "file": self.agent.file,
            "tier": self.tier,
            "system_prompt": self.system_prompt,
            "user_prompt": self.user_prompt,
            "tools": {
                "offered": list(self.offered),
                "withheld": [{"name": name, "why": why} for name, why in self.withheld],
                "mcp_servers": [
                    {"name": s.name, "started": s.started, "why": s.why} for s in self.servers
                ],
            },
            "permissions": {
                **self.rules.model_dump(mode="json"),
                "hidden": list(self.hidden),
                "read_only": list(self.read_only),
            },
            "warnings": list(self.warnings),
        }


def preview(
    agent: AgentDefinition, catalog: AgentCatalog, prompt: str, root: Path, config: MerlinConfig
) -> Preview:
    """What the step ``one_step_tasklist`` makes would give its agent in ``root``.

    Reads the repository's files and nothing else; writes nothing. What submission would
    refuse (an agent's tier not configured, no exit command, one the rules refuse) is a
    warning here.
    """
    tasklist = one_step_tasklist(agent, prompt, config)
    step = tasklist.steps[0]
    warnings = [f"{agent.file}: {warning}" for warning in agent.warnings]
    index = start_tier(step, config)[0]
    try:
        choose_agents([step], config, catalog)
        own = agent_tier_index(agent, config)
        index = index if own is None else own
    except InputError as exc:
        warnings.append(f"submission would refuse it: {exc}")
    command = NO_EXIT_COMMAND
    try:
        command = exit_command_for(step, config, root)
        check_exit_commands(tasklist, config, [command])
    except InputError as exc:
        warnings.append(f"submission would refuse it: {exc}")
    brief = StepBrief(
        step.id, step.step_type.value, step.description, step.verification, command,
        role_prompt=agent.prompt,
    )  # fmt: skip
    brief = with_instructions(_with_constraints(brief, root, config), root, config)
    system, user = first_messages(brief, None)
    permissions = Permissions(config.permissions)
    offered = [n for n in offered_built_ins(permissions, agent) if n != FINISH]  # always given
    masks = permission_masks(config.permissions, root)
    read_only = masks.read_only if WRITING_TOOLS & set(offered) else (root,)
    return Preview(
        agent=agent,
        tier=config.tiers[index].name,
        model=config.tiers[index].model,
        step_type=step.step_type,
        exit_command=command,
        system_prompt=system["content"],
        user_prompt=user["content"],
        offered=(*offered, FINISH),
        withheld=tuple(
            (name, _why_withheld(name, permissions, agent))
            for name in BUILT_IN
            if name not in (*offered, FINISH)
        ),
        servers=_servers(config, permissions, agent),
        rules=config.permissions,
        hidden=_relative(masks.hidden, root),
        read_only=_relative(read_only, root),
        warnings=tuple(warnings),
    )


def _with_constraints(brief: StepBrief, root: Path, config: MerlinConfig) -> StepBrief:
    """The specs' constraints at HEAD, as the attempt adds them (none without a commit)."""
    try:
        commit = head_commit(root)
    except GitError:
        return brief
    return with_spec_constraints(brief, root, commit, config)


def _why_withheld(name: str, permissions: Permissions, agent: AgentDefinition) -> str:
    reasons = []
    if not permissions.tool_offered(name):
        reasons.append("[permissions] refuse it whole")
    if not allowlisted(name, agent.tools):
        reasons.append("not in the agent's tools")
    return "; ".join(reasons)


def _servers(
    config: MerlinConfig, permissions: Permissions, agent: AgentDefinition
) -> tuple[ServerAccess, ...]:
    wanted = wanted_servers(config, permissions, agent)
    found = []
    for name in sorted(config.mcp_servers):
        prefix = f"mcp__{name}"
        if name in wanted:
            only = [t for t in agent.tools or () if t.startswith(prefix + "__")]
            why = "started at run time, which lists its tools"
            if only and prefix not in (agent.tools or ()):
                why += f"; the agent gets only {', '.join(only)}"
        elif not permissions.tool_offered(prefix):
            why = "not started: [permissions] refuse it whole"
        else:
            why = "not started: the agent's tools do not name it"
        found.append(ServerAccess(name, name in wanted, why))
    return tuple(found)


def _relative(paths: tuple[Path, ...], root: Path) -> tuple[str, ...]:
    top = root.resolve()
    return tuple(path.resolve().relative_to(top).as_posix() for path in paths)
