"""Why a job failed, as users see it: the decisive evidence of its first failed step.

A step fails for good after its last tier; its last attempts may have changed nothing
or failed to reach their model, but the cause a person needs is the last verification
that failed: the exit command (or the re-check of a merged tree, or the spec check), its
exit code and its last lines. ``merlin status --json`` carries it as ``failure``; the
job's error (``engine.feedback.step_failure``), the note under the steps table and the
JUnit report say the same.
"""

from __future__ import annotations

from typing import TypedDict

from merlin_flow.engine.feedback import decisive_attempt, decisive_lines, failure_reason
from merlin_flow.failures import AttemptKind
from merlin_flow.store import Step, StepStatus


class LaterAttempt(TypedDict):
    """An attempt after the decisive one, and why it failed too."""

    attempt: int
    kind: AttemptKind
    tier: str
    reason: str


class FailureView(TypedDict):
    """Why a job failed, as its first failed step shows it: the decisive evidence.

    The decisive attempt is the last one whose verification failed (its exit command,
    the re-check of a merged tree, the spec check); its fields are None when none was
    verified (every attempt failed before its exit command could run).
    """

    step: str
    attempt: int | None
    kind: AttemptKind | None
    tier: str | None
    exit_command: str
    exit_code: int | None
    reason: str
    """The decisive attempt's reason (or the last attempt's, when none was verified)."""
    tail: str
    """The last lines of its output (``merlin logs JOB --step ID`` has all of it)."""
    later: list[LaterAttempt]


def failure_view(steps: list[Step]) -> FailureView | None:
    """The first failed step's decisive evidence (``engine.feedback.step_failure``)."""
    step = next((s for s in steps if s.status == StepStatus.FAILED), None)
    if step is None:
        return None
    attempts = list(step.attempts)
    decisive = decisive_attempt(attempts)
    last = decisive or (attempts[-1] if attempts else None)
    later = attempts[attempts.index(decisive) + 1 :] if decisive is not None else []
    return {
        "step": step.key,
        "attempt": decisive.number if decisive else None,
        "kind": AttemptKind(decisive.kind) if decisive else None,
        "tier": decisive.tier if decisive else None,
        "exit_command": step.exit_command,
        "exit_code": decisive.exit_code if decisive else None,
        "reason": failure_reason(last) if last else (step.error or ""),
        "tail": "\n".join(decisive_lines(decisive.output_tail if decisive else None)),
        "later": [
            {
                "attempt": a.number,
                "kind": AttemptKind(a.kind),
                "tier": a.tier,
                "reason": failure_reason(a),
            }
            for a in later
        ],
    }
