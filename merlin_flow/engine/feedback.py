"""What a failed attempt stands for, and what the next attempt is told about it.

The failure's kind is stored on the attempt when it ends (``Attempt.failure_kind``);
``failure_of`` reads it back for ``merlin_flow.failures.decide``. ``feedback_for`` writes
the text a fix, an integration or an escalation starts from; ``step_failure`` what a
step that failed for good tells its job (and the person reading it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from merlin_flow.failures import AttemptKind, Failure, FailureKind
from merlin_flow.store.status import AttemptStatus
from merlin_flow.workspace.secret_scan import SECRETS_REFUSED

if TYPE_CHECKING:
    from merlin_flow.store import Attempt, Step

FEEDBACK_CHARS = 6000
OLDER_ATTEMPT_CHARS = 800
LAST_LINE_CHARS = 200
"""The most of a command's last line a reason quotes."""
TAIL_LINES = 5
"""Lines of the decisive output a step's failure quotes (``merlin logs`` has the rest)."""
MARKED_LINES = 3
"""Earlier lines a step's failure quotes that a test runner marked as failures."""
SUMMARY = re.compile(
    r"\b(\d+ (failed|failures?|errors?|passed|problems?)|fail(ed|ures?)?|errors?)\b", re.I
)
"""A line that counts or names failures: pytest's, vitest's, TAP's, cargo's, a linter's."""
FAILURE_MARK = re.compile(
    r"^\s*(not ok\b|--- FAIL\b|FAILED\b|FAIL\b|[\u00d7\u2717\u2715] )|panicked at"
)
"""How test runners mark a failed test: TAP, go test, pytest, jest and vitest, cargo."""

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
    """A one-line reason for a failed attempt: its error, or its exit command's outcome.

    A failed exit command is named with its exit code and its summary line (pytest's or
    vitest's count, TAP's ``# fail 1``, a linter's total), which is what a person looks
    for first; not a timing line printed after it.
    """
    if attempt.error:
        return attempt.error
    said = summary_line(attempt.output_tail)
    return f"`{attempt.step.exit_command}` exited with code {attempt.exit_code}" + (
        f": {said}" if said else ""
    )


def summary_line(output: str | None, chars: int = LAST_LINE_CHARS) -> str:
    """The line of a command's output that sums it up: its last ``chars`` if it is long.

    That is the last line that counts or names failures, else the last non-empty line.
    """
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    summary = next((line for line in reversed(lines) if SUMMARY.search(line)), None)
    return (summary or (lines[-1] if lines else ""))[-chars:]


def decisive_lines(output: str | None) -> list[str]:
    """The lines of a failed command's output that a step's failure quotes.

    Its last ``TAIL_LINES``, after the first few lines before them that a test runner
    marked as a failed test (``not ok``, ``--- FAIL``, ``FAILED``...), then ``…``.
    """
    lines = [line.rstrip() for line in (output or "").splitlines() if line.strip()]
    tail, before = lines[-TAIL_LINES:], lines[:-TAIL_LINES]
    marked = [line for line in before if FAILURE_MARK.search(line)][:MARKED_LINES]
    return [*marked, "…", *tail] if marked else tail


def decisive_attempt(attempts: Sequence[Attempt]) -> Attempt | None:
    """The last attempt whose verification failed (exit command, merge re-check, specs)."""
    return next((a for a in reversed(attempts) if a.status == AttemptStatus.FAILED), None)


def step_failure(step: Step) -> str:
    """Why a step failed for good: the last verification that failed, and what came after.

    The decisive evidence is the last attempt whose verification failed (its exit
    command, the re-check of a merged tree, the spec check), with its output's last
    lines; attempts after it that could not even be verified (no change, a model error)
    follow, each with its reason. Without any verification failure, the last attempt's
    reason is all there is.
    """
    attempts = list(step.attempts)
    decisive = decisive_attempt(attempts)
    if decisive is None:
        return failure_reason(attempts[-1]) if attempts else "no attempt ran"
    text = f"attempt {decisive.number} ({decisive.kind} on tier {decisive.tier}): " + (
        failure_reason(decisive)
    )
    text += "".join(f"\n    {line}" for line in decisive_lines(decisive.output_tail))
    later = attempts[attempts.index(decisive) + 1 :]
    if later:
        text += "\nthen " + "; ".join(
            f"attempt {a.number} ({a.kind} on tier {a.tier}): {failure_reason(a)}" for a in later
        )
    return text


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
        if (failed[-1].error or "").startswith(SECRETS_REFUSED):  # its changes were dropped
            return text + "\nThe working tree is back where that attempt began: do it again."
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


def verify_failure(job_id: str, step: Step, exit_code: int | None, output: str) -> str:
    """A failed exit command in a few lines: the command, its exit code, its last lines."""
    lines = [line for line in output.rstrip().splitlines() if line.strip()][-TAIL_LINES:]
    tail = "".join(f"\n    {line}" for line in lines)
    return (
        f"`{step.exit_command}` exited with code {exit_code}:{tail}"
        f"\n    (all output: merlin logs {job_id} --step {step.key})"
    )
