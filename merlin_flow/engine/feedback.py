"""What a failed attempt stands for, and what the next attempt is told about it.

The failure's kind is stored on the attempt when it ends (``Attempt.failure_kind``);
``failure_of`` reads it back for ``merlin_flow.failures.decide``. ``feedback_for`` writes
the text a fix, an integration or an escalation starts from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from merlin_flow.failures import AttemptKind, Failure, FailureKind
from merlin_flow.store.status import AttemptStatus

if TYPE_CHECKING:
    from merlin_flow.store import Attempt

FEEDBACK_CHARS = 6000
OLDER_ATTEMPT_CHARS = 800

INTEGRATE_GUIDANCE = (
    "\nSteps of this job that ran beside this one passed first and moved the job branch. "
    "The working tree is now the branch's head, with their work in it: make this step's "
    "change again on this tree, keeping their work."
)


def failure_of(attempt: Attempt) -> Failure:
    """The failure a failed attempt stands for: an unusable model, or a capability one."""
    kind = FailureKind(attempt.failure_kind or FailureKind.CAPABILITY)
    return Failure(kind, failure_reason(attempt))


def failure_reason(attempt: Attempt) -> str:
    """A one-line reason for a failed attempt."""
    if attempt.error:
        return attempt.error
    return f"exit command failed with exit code {attempt.exit_code}"


def _describe(attempt: Attempt, chars: int) -> str:
    head = (
        f"Attempt {attempt.number} ({attempt.kind} on tier {attempt.tier}): "
        f"{failure_reason(attempt)}"
    )
    output = (attempt.output_tail or "").strip()
    if output:
        head += f"\nOutput (tail):\n{output[-chars:]}"
    return head


def feedback_for(kind: AttemptKind, attempts: list[Attempt]) -> str | None:
    """The text an attempt of ``kind`` is given about the attempts before it."""
    failed = [a for a in attempts if a.status in (AttemptStatus.FAILED, AttemptStatus.ERROR)]
    if kind is AttemptKind.EXECUTE or not failed:
        return None
    if kind is AttemptKind.FIX:
        text = _describe(failed[-1], FEEDBACK_CHARS)
        return text + "\nYour earlier changes are in the working tree: repair them."
    if kind is AttemptKind.INTEGRATE:
        return _describe(failed[-1], FEEDBACK_CHARS) + INTEGRATE_GUIDANCE
    parts = [_describe(a, OLDER_ATTEMPT_CHARS) for a in failed[:-1]]
    parts.append(_describe(failed[-1], FEEDBACK_CHARS))
    text = "\n\n".join(parts)
    return (
        text[-FEEDBACK_CHARS * 2 :]
        + "\nThe working tree is back at the step's starting point: solve the step afresh."
    )
