"""The failure taxonomy and the one retry decision: what a failure leads to.

Failures come in four kinds (``merlin_flow.models.diagnosis.examine`` reads a model
call's):

- transient (rate limit, timeout, dropped connection, a 5xx that did not recur): the
  same model call is retried on the same tier after 0.5 s, 1 s, 2 s... up to
  ``max_retry_attempts``, within the turn's time; then it counts as a capability failure;
- capability (verification failed, turn limit, tool errors, unparseable output, no
  scripted reply, a change that did not integrate with its siblings'): ``fix_attempts``
  fixes on the same tier, then the next tier from the job branch's head with the
  failures as feedback; after the last tier the step fails;
- access (no key, a bad login, a model that does not exist, no server at the endpoint):
  never retried and never fixed; the step goes straight to the next tier, or fails
  naming what is missing;
- budget: neither; the job stops.

``decide`` is the only function that turns a failure into an action. It is policy
below the agent (a failed call inside an attempt) and the engine (a failed attempt):
both ask it, neither decides for itself. What a fix or an escalation is told about the
failures before it is the engine's (``merlin_flow.engine.feedback``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from merlin_flow.config import Limits


class AttemptKind(StrEnum):
    """Why an attempt was made."""

    EXECUTE = "execute"
    """The step's first attempt."""
    FIX = "fix"
    """Same tier again, continuing from the failed attempt's commit."""
    ESCALATE = "escalate"
    """The next tier, from the job branch's head, with the failures as feedback."""
    INTEGRATE = "integrate"
    """Same tier again, from the job branch's head: the last attempt passed alone, but
    not merged with the work of steps that passed beside it (``merlin_flow.engine.integration``).
    Counted like a fix."""


class FailureKind(StrEnum):
    """The four classes of failure, which take different paths."""

    TRANSIENT = "transient"
    CAPABILITY = "capability"
    ACCESS = "access"
    BUDGET = "budget"


class Action(StrEnum):
    """What to do about a failure."""

    RETRY_CALL = "retry_call"
    """Repeat the same model call on the same tier after ``delay`` seconds."""
    END_ATTEMPT = "end_attempt"
    """The attempt fails (a capability failure); verification decides what follows."""
    FIX = "fix"
    """A fix attempt on the same tier."""
    ESCALATE = "escalate"
    """An attempt on the next tier."""
    FAIL_STEP = "fail_step"
    """No tier left: the step fails."""
    STOP_JOB = "stop_job"
    """The budget is spent: the job stops."""


@dataclass(frozen=True)
class Failure:
    """A classified failure and a one-line reason."""

    kind: FailureKind
    reason: str


@dataclass(frozen=True)
class Decision:
    """The action a failure leads to, with the tier it applies to."""

    action: Action
    tier_index: int
    reason: str
    delay: float = 0.0

    @property
    def attempt_kind(self) -> AttemptKind:
        """The kind of the next attempt (for FIX and ESCALATE)."""
        return AttemptKind.FIX if self.action is Action.FIX else AttemptKind.ESCALATE


class _AttemptLike(Protocol):
    kind: str


def decide(
    failure: Failure,
    *,
    tier_index: int,
    next_tier: int | None,
    limits: Limits,
    attempts: Sequence[_AttemptLike] = (),
    call_retries: int | None = None,
) -> Decision:
    """What ``failure`` leads to.

    ``next_tier`` is the tier an escalation goes to (None on the step's last tier; see
    ``MerlinConfig.next_tier``). ``call_retries`` (how often this model call was retried
    already) is given for a failed call inside an attempt; ``attempts`` (the step's
    attempts, the failed one last) for a failed attempt.
    """
    if failure.kind is FailureKind.BUDGET:
        return Decision(Action.STOP_JOB, tier_index, failure.reason)
    if call_retries is not None:
        if failure.kind is FailureKind.TRANSIENT and call_retries < limits.max_retry_attempts:
            delay = limits.retry_base_delay * 2**call_retries
            return Decision(Action.RETRY_CALL, tier_index, failure.reason, delay)
        return Decision(Action.END_ATTEMPT, tier_index, failure.reason)
    if failure.kind is FailureKind.ACCESS:  # another try on this tier cannot do better
        if next_tier is not None:
            return Decision(Action.ESCALATE, next_tier, failure.reason)
        return Decision(Action.FAIL_STEP, tier_index, failure.reason)
    fixes = 0
    for attempt in reversed(attempts):
        if attempt.kind not in (AttemptKind.FIX, AttemptKind.INTEGRATE):
            break
        fixes += 1
    if fixes < limits.fix_attempts:
        return Decision(Action.FIX, tier_index, failure.reason)
    if next_tier is not None:
        return Decision(Action.ESCALATE, next_tier, failure.reason)
    return Decision(Action.FAIL_STEP, tier_index, failure.reason)
