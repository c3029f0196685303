"""What happens after a failed attempt: fix on the same tier, escalate, or give up.

One decision function. After ``fix_attempts`` fixes on a tier have failed, the step moves
to the next tier and starts again from its base commit, carrying the failures forward as
feedback; after the last tier it fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from merlin_flow.store import Attempt

FEEDBACK_CHARS = 6000
OLDER_ATTEMPT_CHARS = 800


class AttemptKind(StrEnum):
    """Why an attempt was made."""

    EXECUTE = "execute"
    """The step's first attempt."""
    FIX = "fix"
    """Same tier again, continuing from the failed attempt's commit."""
    ESCALATE = "escalate"
    """The next tier, from the step's base commit, with the failures as feedback."""


@dataclass(frozen=True)
class NextAttempt:
    """The attempt to make next."""

    kind: AttemptKind
    tier_index: int
    reason: str


def decide(
    attempts: list[Attempt], tier_index: int, tier_count: int, fix_attempts: int
) -> NextAttempt | None:
    """The next attempt after the last of ``attempts`` failed, or None to give up."""
    last = attempts[-1]
    reason = failure_reason(last)
    fixes = 0
    for attempt in reversed(attempts):
        if attempt.kind != AttemptKind.FIX:
            break
        fixes += 1
    if fixes < fix_attempts:
        return NextAttempt(AttemptKind.FIX, tier_index, reason)
    if tier_index + 1 < tier_count:
        return NextAttempt(AttemptKind.ESCALATE, tier_index + 1, reason)
    return None


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
    failed = [a for a in attempts if a.status in ("failed", "error")]
    if kind is AttemptKind.EXECUTE or not failed:
        return None
    if kind is AttemptKind.FIX:
        text = _describe(failed[-1], FEEDBACK_CHARS)
        return text + "\nYour earlier changes are in the working tree: repair them."
    parts = [_describe(a, OLDER_ATTEMPT_CHARS) for a in failed[:-1]]
    parts.append(_describe(failed[-1], FEEDBACK_CHARS))
    text = "\n\n".join(parts)
    return (
        text[-FEEDBACK_CHARS * 2 :]
        + "\nThe working tree is back at the step's starting point: solve the step afresh."
    )
