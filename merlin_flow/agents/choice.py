"""Which agent each step of a job gets, chosen once, at submission, and stored with it.

A step's `agent:` names its agent; a step without one gets `[agents] default`, or with
`[agents] autodelegate = true` the agent whose description best matches the step
(``merlin_flow.agents.delegation``), when its score reaches `[agents] min_score`. No agent at
all: merlin's plain coding agent, with every tool the permissions allow.

The chosen definitions are stored with the steps (``Step.agent_spec``), so every worker
runs a step with the agent it was submitted with, whatever the files say later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from merlin_flow.agents.definitions import AgentCatalog, AgentDefinition
from merlin_flow.agents.delegation import delegate
from merlin_flow.config import MerlinConfig
from merlin_flow.errors import InputError
from merlin_flow.tasklist import TaskStep


@dataclass(frozen=True)
class AgentChoice:
    """The agent a step runs with, and how it was chosen."""

    agent: AgentDefinition | None
    how: str | None = None
    """``named`` (the step's `agent:`), ``default`` or ``autodelegated``; None: no agent."""
    score: float | None = None
    """The autodelegation score of the chosen agent."""


def choose_agents(
    steps: Sequence[TaskStep], config: MerlinConfig, catalog: AgentCatalog
) -> list[AgentChoice]:
    """Each step's agent; InputError naming the step when an agent is unknown or unusable."""
    default = _default(config, catalog)
    choices = []
    for step in steps:
        if step.agent is not None:
            choice = AgentChoice(_known(catalog, step.agent, f"step {step.id}"), "named")
        elif (
            config.agents.autodelegate
            and (found := delegate(f"{step.step_type.value}: {step.description}", _pool(catalog)))
            is not None
            and found.score >= config.agents.min_score
        ):
            choice = AgentChoice(found.agent, "autodelegated", round(found.score, 3))
        elif default is not None:
            choice = AgentChoice(default, "default")
        else:
            choice = AgentChoice(None)
        if choice.agent is not None:
            check_agent_tier(choice.agent, config, f"step {step.id}")
            own = agent_tier_index(choice.agent, config)
            if own is not None and not config.tiers[own].serves(step.step_type):
                raise InputError(
                    f"step {step.id}: agent {choice.agent.name!r} starts on tier "
                    f"{config.tiers[own].name!r}, which does not take {step.step_type.value} "
                    "steps (tiers.step_types)"
                )
        choices.append(choice)
    return choices


def agent_tier_index(agent: AgentDefinition | None, config: MerlinConfig) -> int | None:
    """The tier an agent starts its steps on (`tier:`, or the tier of its `model:`)."""
    if agent is None:
        return None
    if agent.tier is not None:
        return config.tier_index(agent.tier)
    if agent.model is not None:
        return next(i for i, tier in enumerate(config.tiers) if tier.model == agent.model)
    return None


def check_agent_tier(agent: AgentDefinition, config: MerlinConfig, where: str) -> None:
    """InputError when the agent's `tier:` or `model:` is not one of the job's tiers."""
    names = ", ".join(tier.name for tier in config.tiers)
    if agent.tier is not None and agent.tier not in {tier.name for tier in config.tiers}:
        raise InputError(
            f"{where}: agent {agent.name!r} ({agent.file}) asks for tier {agent.tier!r}, "
            f"which is not configured; tiers: {names}"
        )
    if agent.model is not None and agent.model not in {tier.model for tier in config.tiers}:
        raise InputError(
            f"{where}: agent {agent.name!r} ({agent.file}) asks for model {agent.model!r}, "
            f"which no tier uses: add a [[tiers]] entry with that model (prices and key "
            f"are set per tier), or name a tier with `tier:`; tiers: {names}"
        )


def _default(config: MerlinConfig, catalog: AgentCatalog) -> AgentDefinition | None:
    name = config.agents.default
    return None if name is None else _known(catalog, name, "[agents] default")


def _known(catalog: AgentCatalog, name: str, where: str) -> AgentDefinition:
    try:
        return catalog.get(name)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def _pool(catalog: AgentCatalog) -> list[AgentDefinition]:
    return sorted(catalog.agents.values(), key=lambda agent: agent.name)


def stored_agent(spec: dict[str, Any] | None) -> AgentDefinition | None:
    """The agent definition stored with a step (``Step.agent_spec``), or None."""
    return AgentDefinition.from_record(spec) if spec else None
