"""Routing that learns: the tier a step starts on, from the journal of its repository.

Every finished step leaves in the store which tiers it tried, which one passed and what
each cost. For a new step, the steps of the same repository are weighed by how alike
they are (the same step type is required; complexity by the rules, the description's
length and the files it names each halve or soften the weight when they differ). From
them, per tier:

- ``p``: the chance the tier passes, ``(prior + passed) / (1 + tried)``. The prior is
  the rules' belief: ``HIGH`` on the tier the rules start on and above, ``LOW`` below.
  A pass on a tier counts half as a pass on the stronger tiers the step never tried, a
  failure half as a failure on the weaker ones.
- ``cost``: what a step spent on the tier (its fix attempts included), the mean of the
  similar steps that tried it; a tier none tried is priced from the tiers that were, in
  the ratio of their token prices.

The step starts on the tier with the lowest expected cost of reaching a pass by
escalation, ``E(t) = cost(t) + (1 - p(t)) * E(next tier)``, skipping tiers that pass
fewer than ``MIN_PASS`` of similar steps. Until the journal holds ``[routing]
learn_after`` similar steps (weighted), or when a tier has no price, the rules decide,
so a new repository starts where the rules put it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.planning.routing import (
    PATH_LIKE,
    Complexity,
    complexity_for,
    score_words,
    start_tier,
)
from merlin_flow.store import Attempt, AttemptStatus, Job, Step, StepStatus
from merlin_flow.tasklist import StepType, TaskStep

HIGH, LOW = 0.8, 0.3
"""The prior chance of a pass on the rules' tier (and above), and below it."""
MIN_PASS = 0.15
"""A tier estimated to pass fewer similar steps than this is not started on."""
INFERRED = 0.5
"""The weight of a pass (failure) carried to a stronger (weaker) tier not tried."""
HISTORY = 500
"""The newest finished steps of a repository that are read."""
NOMINAL_TOKENS = (8000, 1000)
"""Prompt and completion tokens of a step, to compare the tiers' prices."""


@dataclass(frozen=True)
class StepKind:
    """What the router compares steps by."""

    step_type: str
    complexity: str
    words: str
    files: str

    def likeness(self, other: StepKind) -> float:
        """1.0 for the same kind, less the more they differ; 0 for another step type."""
        if self.step_type != other.step_type:
            return 0.0
        weight = 1.0
        weight *= 1.0 if self.complexity == other.complexity else 0.5
        weight *= 1.0 if self.words == other.words else 0.7
        weight *= 1.0 if self.files == other.files else 0.7
        return weight


def kind_of(step_type: StepType, description: str, verification: str = "") -> StepKind:
    """The kind of a step from its type and words."""
    words = len(description.split())
    files = len(set(PATH_LIKE.findall(description)))
    return StepKind(
        step_type.value,
        complexity_for(score_words(step_type, description, verification)).value,
        "short" if words <= 12 else "long" if words > 60 else "medium",
        "none" if files == 0 else "few" if files <= 2 else "many",
    )


@dataclass
class PastStep:
    """One finished step of the repository: per tier tried, whether it passed and the cost."""

    kind: StepKind
    passed: dict[str, bool] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TierEstimate:
    """What the journal says of one tier for a kind of step."""

    name: str
    passed: float
    tried: float
    p: float
    cost: float
    expected: float

    def to_record(self) -> dict[str, Any]:
        """For the step's ``route`` column."""
        return {
            "name": self.name,
            "passed": round(self.passed, 2),
            "tried": round(self.tried, 2),
            "p": round(self.p, 3),
            "cost": round(self.cost, 6),
            "expected": round(self.expected, 6),
        }


@dataclass(frozen=True)
class Route:
    """Where a step starts and why: ``by`` is ``step`` (its own tier), ``rules`` or ``journal``.

    The record says ``agent`` instead of ``step`` when the step's agent names the tier.
    """

    tier: int
    complexity: Complexity
    by: str
    rule_tier: int
    similar: float = 0.0
    tiers: tuple[TierEstimate, ...] = ()

    def to_record(self, config: MerlinConfig) -> dict[str, Any]:
        """The JSON kept on the step (``steps.route``)."""
        return {
            "by": self.by,
            "tier": config.tiers[self.tier].name,
            "rule_tier": config.tiers[self.rule_tier].name,
            "similar": round(self.similar, 2),
            "learn_after": config.routing.learn_after if config.routing.learn else None,
            "tiers": [estimate.to_record() for estimate in self.tiers],
        }


def describe(record: dict[str, Any] | None) -> str:
    """One line for people: the tier, who chose it and on what evidence."""
    if not record:
        return ""
    tier, rule = record["tier"], record["rule_tier"]
    if record["by"] in ("step", "agent"):
        who = "the step's agent" if record["by"] == "agent" else "the step"
        return f"{tier}: {who} names it"
    similar = f"{record['similar']:g} similar steps in the journal"
    if record["by"] == "rules":
        learn_after = record.get("learn_after")
        needed = f", {learn_after:g} needed to learn" if learn_after else ", learning off"
        return f"{tier}: by the rules ({similar}{needed})"
    tried = [t for t in record["tiers"] if t["tried"] > 0]
    evidence = ", ".join(f"{t['name']} passed {t['passed']:g} of {t['tried']:g}" for t in tried)
    rules = "" if tier == rule else f"; the rules say {rule}"
    return f"{tier}: from the journal ({similar}: {evidence}){rules}"


class RouteBook:
    """The finished steps of one repository, to route new steps by."""

    def __init__(self, past: Sequence[PastStep]) -> None:
        self.past = list(past)

    def route(self, step: TaskStep, config: MerlinConfig) -> Route:
        """Where ``step`` starts: its own tier, the rules' or the journal's."""
        rule_tier, complexity = start_tier(step, config)
        if step.tier:
            return Route(rule_tier, complexity, "step", rule_tier)
        kind = kind_of(step.step_type, step.description, step.verification)
        weighted = [(kind.likeness(past.kind), past) for past in self.past]
        weighted = [(weight, past) for weight, past in weighted if weight > 0]
        similar = sum(weight for weight, _ in weighted)
        serving = [i for i, tier in enumerate(config.tiers) if tier.serves(step.step_type)]
        learn = config.routing.learn and similar >= config.routing.learn_after
        if not learn or any(config.tiers[i].price_in is None for i in serving):
            return Route(rule_tier, complexity, "rules", rule_tier, similar)
        estimates = _estimates(config, serving, rule_tier, weighted)
        choices = [e for e in estimates[:-1] if e.p >= MIN_PASS] + [estimates[-1]]
        best = min(choices, key=lambda e: e.expected)
        rule = next((e for e in choices if e.name == config.tiers[rule_tier].name), None)
        if rule is not None and rule.expected <= best.expected:
            best = rule  # a tie keeps the rules' tier
        tier = serving[[e.name for e in estimates].index(best.name)]
        return Route(tier, complexity, "journal", rule_tier, similar, tuple(estimates))


def _estimates(
    config: MerlinConfig,
    serving: list[int],
    rule_tier: int,
    weighted: list[tuple[float, PastStep]],
) -> list[TierEstimate]:
    """Per serving tier: passes, tries, chance, cost and the expected cost from there."""
    names = [config.tiers[i].name for i in serving]
    passed = dict.fromkeys(names, 0.0)
    tried = dict.fromkeys(names, 0.0)
    spent = dict.fromkeys(names, 0.0)
    costed = dict.fromkeys(names, 0.0)
    for weight, past in weighted:
        for position, name in enumerate(names):
            if name in past.passed:
                tried[name] += weight
                passed[name] += weight * past.passed[name]
                spent[name] += weight * past.cost.get(name, 0.0)
                costed[name] += weight
                continue
            below = [past.passed[n] for n in names[:position] if n in past.passed]
            above = [past.passed[n] for n in names[position + 1 :] if n in past.passed]
            if any(below):  # a weaker tier passed: this one likely would have
                tried[name] += weight * INFERRED
                passed[name] += weight * INFERRED
            elif above and not any(above):  # a stronger tier failed: this one likely would
                tried[name] += weight * INFERRED
    costs = _costs(config, serving, spent, costed)
    chances = [
        ((HIGH if i >= rule_tier else LOW) + passed[name]) / (1.0 + tried[name])
        for i, name in zip(serving, names, strict=True)
    ]
    expected = [0.0] * len(names)
    for position in reversed(range(len(names))):
        after = expected[position + 1] if position + 1 < len(names) else 0.0
        last = position == len(names) - 1
        expected[position] = costs[position] + (0.0 if last else (1 - chances[position]) * after)
    return [
        TierEstimate(name, passed[name], tried[name], chances[k], costs[k], expected[k])
        for k, name in enumerate(names)
    ]


def _costs(
    config: MerlinConfig, serving: list[int], spent: dict[str, float], costed: dict[str, float]
) -> list[float]:
    """Each serving tier's cost per step: measured, else priced in proportion to a measured one."""
    nominal = [_nominal(config.tiers[i]) for i in serving]
    names = [config.tiers[i].name for i in serving]
    measured = {n: spent[n] / costed[n] for n in names if costed[n] > 0}
    ratios = [
        measured[n] / nominal[k] for k, n in enumerate(names) if n in measured and nominal[k] > 0
    ]
    scale = sum(ratios) / len(ratios) if ratios else 1.0
    return [measured.get(n, nominal[k] * scale) for k, n in enumerate(names)]


def _nominal(tier: Tier) -> float:
    """A step's cost on ``tier`` at ``NOMINAL_TOKENS`` (per million tokens prices)."""
    prompt, completion = NOMINAL_TOKENS
    return ((tier.price_in or 0.0) * prompt + (tier.price_out or 0.0) * completion) / 1e6


def route_book(session: Session, repo: str) -> RouteBook:
    """The newest ``HISTORY`` finished steps of ``repo`` (``Job.repo``), with their attempts.

    The newest steps first, by primary key, so a long history is not sorted whole.
    """
    newest = (
        select(Step.id)
        .join(Job, Job.id == Step.job_id)
        .where(Job.repo == repo, Step.status.in_([StepStatus.COMPLETED, StepStatus.FAILED]))
        .order_by(Step.id.desc())
        .limit(HISTORY)
    )
    rows = session.execute(
        select(
            Step.id,
            Step.step_type,
            Step.description,
            Step.verification,
            Attempt.tier,
            Attempt.status,
            Attempt.cost_usd,
        )
        .join(Attempt, Attempt.step_id == Step.id)
        .where(
            Step.id.in_(newest.scalar_subquery()),
            Attempt.status.in_([AttemptStatus.PASSED, AttemptStatus.FAILED]),
        )
        .order_by(Step.id.desc(), Attempt.number)
    ).all()
    steps: dict[int, PastStep] = {}
    for step_id, step_type, description, verification, tier, status, cost in rows:
        if step_id not in steps:
            kind = kind_of(StepType(step_type), description, verification or "")
            steps[step_id] = PastStep(kind)
        past = steps[step_id]
        past.passed[tier] = past.passed.get(tier, False) or status == AttemptStatus.PASSED
        past.cost[tier] = past.cost.get(tier, 0.0) + (cost or 0.0)
    return RouteBook(list(steps.values()))
