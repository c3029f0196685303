"""Routing: which tier a step starts on.

Precedence: the step's own ``tier:``, then the tier ``[routing]`` names for the step's
complexity, moved up to the first tier that takes the step's type (``step_types`` on a
tier; a step's own ``tier:`` is taken as written). Complexity is a cheap heuristic
over the step (no model call), scored:

- the step type: Debug, Feature and Refactor start at 1; Verify and Test at 0;
- size: a description of more than 60 words adds 1, one of 12 words or fewer takes 1 off;
- breadth: 3 or more files or paths named in the description add 1;
- wording: words of broad or delicate work ("all", "every", "across", "migrate",
  "architecture", "concurrency", "race", "security", "performance"...) add 1; words of
  small work ("typo", "rename", "docstring", "comment", "format", "readme"...) take 1 off.

Score 0 or less is simple, 1 is medium, 2 or more is complex. Simple steps always start
on the cheapest tier that takes their type; the escalation path catches the ones the
heuristic misjudges, so a wrong guess costs a failed cheap attempt, not a failed job.
"""

from __future__ import annotations

import re
from enum import StrEnum

from merlin_flow.config import MerlinConfig
from merlin_flow.tasklist import StepType, TaskStep


class Complexity(StrEnum):
    """How hard a step looks."""

    SIMPLE = "simple"
    MEDIUM = "medium"
    COMPLEX = "complex"


TYPE_SCORE = {
    StepType.DEBUG: 1,
    StepType.FEATURE: 1,
    StepType.REFACTOR: 1,
    StepType.VERIFY: 0,
    StepType.TEST: 0,
}
BROAD_WORDS = re.compile(
    r"\b(all|every|across|throughout|migrat\w*|architect\w*|redesign\w*|concurren\w*|"
    r"race|deadlock\w*|security|performance|distributed|protocol)\b",
    re.IGNORECASE,
)
SMALL_WORDS = re.compile(
    r"\b(typo\w*|renam\w*|docstring\w*|comments?|format\w*|readme|spelling|bump|"
    r"whitespace|log message)\b",
    re.IGNORECASE,
)
PATH_LIKE = re.compile(
    r"[\w./-]+\.(?:py|rs|ts|tsx|js|go|java|c|h|cpp|toml|ya?ml|json|md)\b|\b\w+/\w+"
)


def score(step: TaskStep) -> int:
    """The complexity score of a step (see the module docstring)."""
    return score_words(step.step_type, step.description, step.verification)


def score_words(step_type: StepType, description: str, verification: str = "") -> int:
    """The complexity score of a step of ``step_type`` described so."""
    text = f"{description} {verification}"
    words = len(description.split())
    points = TYPE_SCORE[step_type]
    if words > 60:
        points += 1
    elif words <= 12:
        points -= 1
    if len(set(PATH_LIKE.findall(description))) >= 3:
        points += 1
    if BROAD_WORDS.search(text):
        points += 1
    if SMALL_WORDS.search(text):
        points -= 1
    return points


def complexity_of(step: TaskStep) -> Complexity:
    """Simple, medium or complex."""
    return complexity_for(score(step))


def complexity_for(points: int) -> Complexity:
    """The complexity of a score."""
    if points <= 0:
        return Complexity.SIMPLE
    if points == 1:
        return Complexity.MEDIUM
    return Complexity.COMPLEX


def start_tier(step: TaskStep, config: MerlinConfig) -> tuple[int, Complexity]:
    """The index of the tier the step starts on, and the step's complexity."""
    complexity = complexity_of(step)
    if step.tier:
        return config.tier_index(step.tier), complexity
    index = 0
    if complexity is not Complexity.SIMPLE:
        level = config.routing.medium if complexity is Complexity.MEDIUM else config.routing.complex
        index = config.tier_index(level) if level else 0
    if not config.tiers[index].serves(step.step_type):
        index = config.next_tier(index, step.step_type) or _first_serving(config, step)
    return index, complexity


def _first_serving(config: MerlinConfig, step: TaskStep) -> int:
    """The cheapest tier that takes the step's type (one exists: the config checks it)."""
    return next(i for i, tier in enumerate(config.tiers) if tier.serves(step.step_type))
