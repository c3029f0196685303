"""A job's steps as a graph: which steps may start, which are blocked, finished or complete.

A step runs once every step it ``depends_on`` has passed; steps whose dependencies have
all passed run at the same time, each in its own worktree, up to ``[limits]
max_parallel_steps`` at once for one job. A TaskList in which no step has a
``depends_on`` is a sequence: each step depends on the one before it, as such files
always ran. Once any step has one (``depends_on: []`` included), the file is a graph,
and a step without one, or with an empty one, starts at once.

A job is *finished* when every step passed, failed or was skipped, and *complete* when
every step passed. A step that fails with ``on_failure: continue`` skips every step that
needs it, directly or not; the other branches of the graph go on.

The functions here read and decide only; ``merlin_flow.engine.lifecycle`` writes what they say.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

from merlin_flow.engine.leases import QUEUED
from merlin_flow.store.status import FINISHED_STEP_STATUSES, StepStatus
from merlin_flow.tasklist import TaskStep


class StepNode(Protocol):
    """What the graph needs of a step (a ``store.Step`` row has it)."""

    key: str
    status: str
    depends_on: list[str]
    lease_owner: str | None


N = TypeVar("N", bound=StepNode)


def dependencies(steps: Sequence[TaskStep]) -> list[list[str]]:
    """Each step's dependencies as the engine runs them (a plain list is a sequence)."""
    if any(step.depends_on is not None for step in steps):
        return [list(step.depends_on or []) for step in steps]
    return [[]] + [[earlier.id] for earlier in steps[:-1]]


def is_finished(statuses: Iterable[str]) -> bool:
    """Every step passed, failed or was skipped: nothing is left to run."""
    return all(status in FINISHED_STEP_STATUSES for status in statuses)


def is_complete(statuses: Iterable[str]) -> bool:
    """Every step passed."""
    return all(status == StepStatus.COMPLETED for status in statuses)


def is_active(step: StepNode) -> bool:
    """Started, or queued to start: it counts against ``max_parallel_steps``."""
    if step.status in FINISHED_STEP_STATUSES:
        return False
    return step.status == StepStatus.IN_PROGRESS or step.lease_owner is not None


def runnable(steps: Sequence[N], limit: int) -> list[N]:
    """Pending steps whose dependencies have all passed, in file order, that may start now.

    Steps already started or queued count against ``limit``; a queued step is never
    returned again.
    """
    passed = {step.key for step in steps if step.status == StepStatus.COMPLETED}
    room = limit - sum(1 for step in steps if is_active(step))
    ready = [
        step
        for step in steps
        if step.status == StepStatus.PENDING
        and step.lease_owner is None
        and all(dep in passed for dep in step.depends_on)
    ]
    return ready[: max(room, 0)]


def dependents(steps: Sequence[N], key: str) -> list[N]:
    """The steps that need ``key``, directly or through others, in file order."""
    needing = {key}
    found = []
    for step in steps:  # file order is a topological order: dependencies come first
        if needing.intersection(step.depends_on):
            needing.add(step.key)
            found.append(step)
    return found


def blocked_reason(steps: Sequence[StepNode], step: StepNode) -> str | None:
    """Why a pending step cannot start: a dependency that failed or was skipped; or None."""
    by_key = {other.key: other for other in steps}
    for dep in step.depends_on:
        other = by_key.get(dep)
        if other is not None and other.status in (StepStatus.FAILED, StepStatus.SKIPPED):
            what = "failed" if other.status == StepStatus.FAILED else "was skipped"
            return f"needs {dep}, which {what}"
    return None


def waiting_on(steps: Sequence[StepNode], step: StepNode) -> list[str]:
    """The dependencies of ``step`` that have not passed yet."""
    passed = {other.key for other in steps if other.status == StepStatus.COMPLETED}
    return [dep for dep in step.depends_on if dep not in passed]


def queued(step: StepNode) -> bool:
    """A message for the step is on the broker (or about to be)."""
    return step.lease_owner == QUEUED
