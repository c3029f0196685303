"""From a request in plain words to a plan: the rules first, then one planner call.

``make_plan`` classifies the request (``merlin_flow.planning.requests``). A question gets
no plan and a single action one step, with no model call. Anything else goes to the tier
``[planning] tier`` names, with the repository's context (``merlin_flow.planning.context``).
Its answer is read leniently and checked (``merlin_flow.planning.reading``). A plan with
problems is sent back once, quoting them; if the second answer has problems too (or the model fails,
which is expected input, never a crash), the plan is the **fallback**: one step
carrying the whole request, flagged as such wherever it is shown.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.errors import PlanUnreadable
from merlin_flow.models.diagnosis import examine
from merlin_flow.models.llm import Completion, complete
from merlin_flow.planning.context import RepositoryContext
from merlin_flow.planning.reading import (
    PlannedStep,
    check_plan,
    fallback_plan,
    parse_plan,
    repair_prompt,
)
from merlin_flow.planning.requests import Classification, RequestKind, classify, step_type_for

ModelCall = Callable[[Tier, list[dict[str, Any]], list[dict[str, Any]]], Completion]

PLANNER_PROMPT = """\
You plan changes to a software repository. Split the request into at most {max_steps} \
steps that are each small enough for one focused coding session and each checked by \
the project's tests. Answer with JSON only, in this shape:
{{"steps": [{{"id": "short-id", "step_type": "Debug|Feature|Refactor|Verify|Test", \
"title": "a short title", "instruction": "what to do, precisely", "depends_on": \
["ids of steps that must come first"], "estimated_tokens": 20000, "files": \
["paths the step will likely change"]}}]}}
Use the file names you are shown. Do not write code in the plan."""


@dataclass
class Plan:
    """A request's plan, how it was made, and what it cost to make."""

    request: str
    classification: Classification
    steps: list[PlannedStep]
    planned: bool
    """A planner model made the steps (not the rules, not the fallback)."""
    fallback: bool = False
    answers: list[str] = field(default_factory=list)
    """The planner's raw answers, in order (two when it was asked to repair)."""
    problems: list[str] = field(default_factory=list)
    """What was wrong with the answers (why a repair or the fallback happened)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    seconds: float = 0.0


def planner_messages(
    request: str, classification: Classification, context: RepositoryContext, max_steps: int
) -> list[dict[str, Any]]:
    """The planner's conversation: instructions, then the request with its context."""
    parts = [f"Request:\n{request.strip()}"]
    if classification.skeleton:
        items = "\n".join(f"{n}. {item}" for n, item in enumerate(classification.skeleton, 1))
        parts.append(f"Make exactly one step per item, in this order:\n{items}")
    parts.append(f"The repository:\n{context.text()}")
    return [
        {"role": "system", "content": PLANNER_PROMPT.format(max_steps=max_steps)},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def make_plan(
    request: str,
    config: MerlinConfig,
    context: Callable[[Classification], RepositoryContext],
    call_model: ModelCall = complete,
) -> Plan:
    """Plan ``request``; ``context`` reads the repository (only when a model plans)."""
    started = time.monotonic()
    classification = classify(request)
    if classification.files and classification.kind is not RequestKind.PLANNED:
        context(classification)  # a missing @path is an input error, whatever the kind
    if classification.kind is RequestKind.QUESTION:
        return Plan(request, classification, [], planned=False)
    if classification.kind is RequestKind.SINGLE:
        step = PlannedStep(
            id=_slug(request),
            step_type=step_type_for(request),
            title=request.strip(),
            instruction=request.strip(),
            depends_on=(),
            estimated_tokens=None,
            files=classification.files,
        )
        return Plan(request, classification, [step], planned=False)
    tier = config.planning_tier()
    messages = planner_messages(
        request, classification, context(classification), config.planning.max_steps
    )
    plan = Plan(request, classification, [], planned=True)
    for _ in range(2):  # the answer, and one repair
        try:
            reply = call_model(tier, messages, [])
        except Exception as exc:  # a model's failure is expected input
            plan.problems.append(f"the planner call failed: {examine(exc).reason}")
            break
        _count(plan, reply)
        answer = str(reply.message.get("content") or "")
        plan.answers.append(answer)
        try:
            steps = parse_plan(answer)
            problems = check_plan(steps, config.planning.max_steps)
        except PlanUnreadable as exc:
            steps, problems = [], [str(exc)]
        if not problems:
            plan.steps = steps
            plan.seconds = time.monotonic() - started
            return plan
        plan.problems.extend(problems)
        messages = [
            *messages,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": repair_prompt(problems)},
        ]
    plan.steps = fallback_plan(request)
    plan.fallback, plan.planned = True, False
    plan.seconds = time.monotonic() - started
    return plan


def _count(plan: Plan, reply: Completion) -> None:
    plan.prompt_tokens += reply.prompt_tokens
    plan.completion_tokens += reply.completion_tokens
    if plan.cost_usd is not None:
        plan.cost_usd = None if reply.cost_usd is None else plan.cost_usd + reply.cost_usd


def _slug(request: str) -> str:
    """A step id from the request's first words: ``fix-the-timeout-bug``."""
    words = re.findall(r"[A-Za-z0-9]+", request.lower())[:4]
    return "-".join(words) or "request"


def plan_json(plan: Plan, tasklist: dict[str, Any]) -> dict[str, Any]:
    """``merlin plan --json``: the request, its kind and the TaskList with estimates."""
    by_id = {step.id: step for step in plan.steps}
    for step in tasklist.get("steps", []):
        planned = by_id.get(step["id"])
        step["instruction"] = planned.instruction if planned else None
        step["estimated_tokens"] = planned.estimated_tokens if planned else None
    kind = "question" if plan.classification.kind is RequestKind.QUESTION else "task"
    return {
        "request": plan.request,
        "kind": kind,
        "planned": plan.planned,
        "fallback": plan.fallback,
        "complexity": plan.classification.complexity.value,
        "tasklist": tasklist,
    }
