"""Integration: a passed step's work, merged onto a job branch that moved while it ran.

Steps of one job run at once, each from the branch's head when it started. When one
passes after a sibling has already moved the branch, its commit cannot simply become the
branch's head: its change is merged onto the head (``git.merge_commit_onto``, a
three-way merge with no worktree) and the merged tree is verified again, by the step's
own exit command and by those of the steps that passed while it ran, before the branch
moves. So the branch only ever holds trees somebody tested.

A conflict, or a re-verification that fails, fails the attempt: the next attempt (an
``integrate`` attempt, counted like a fix) starts from the branch's new head with the
conflict or the failure as feedback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from merlin_flow.store import Step, StepStatus
from merlin_flow.workspace.git import is_ancestor, merge_commit_onto
from merlin_flow.workspace.process import CommandResult

INTEGRATION_FAILED = "integration failed: "
"""How the error of an attempt that passed alone but not on the moved branch starts."""


@dataclass(frozen=True)
class Integration:
    """A passed commit, as it stands against the job branch's head ``onto``."""

    onto: str
    commit: str | None
    """What the branch moves to: the attempt's own commit (the branch had not moved),
    or the merged commit; None when the integration failed."""
    merged: bool = False
    commands: tuple[str, ...] = ()
    """The exit commands run again on the merged tree."""
    error: str | None = None
    details: str = ""
    """The conflicting hunks, or the output of the exit command that failed."""
    exit_code: int | None = None
    stopped: bool = False
    """The re-verification was stopped: its job ended (cancelled) while it ran."""


def commands_to_reverify(steps: Sequence[Step], step: Step) -> list[str]:
    """``step``'s exit command, then those of the steps that passed while it ran, once each."""
    started = step.started_at
    commands = [step.exit_command]
    for other in steps:
        if other.key == step.key or other.status != StepStatus.COMPLETED:
            continue
        if started is None or (other.finished_at is not None and other.finished_at >= started):
            commands.append(other.exit_command)
    return list(dict.fromkeys(commands))


def integrate(
    repo: Path,
    onto: str,
    commit: str,
    commands: list[str],
    message: str,
    run: Callable[[str, list[str]], tuple[str, CommandResult]],
    parent: str | None = None,
) -> Integration:
    """``commit`` made ready for a branch at ``onto``: as it is, or merged and re-verified.

    ``run(commit, commands)`` runs exit commands on a commit, in one worktree, until one
    fails; it returns the last one run and its result. ``parent``: a commit ``commit`` is
    known to descend from (the attempt's start: its commit is made with that parent), so
    no git process asks when the branch is still there, as it is for a chain's steps.
    """
    if onto in (commit, parent) or is_ancestor(repo, onto, commit):
        return Integration(onto, commit)
    merged, conflicts = merge_commit_onto(repo, onto, commit, message)
    if merged is None:
        what = ", ".join(
            line.rsplit(" in ", 1)[-1] for line in conflicts.splitlines() if "CONFLICT" in line
        )
        error = (
            f"{INTEGRATION_FAILED}the step's change conflicts with the job branch "
            f"({onto[:10]}), which steps that ran beside it moved: {what or 'see the conflict'}"
        )
        return Integration(onto, None, error=error, details=conflicts)
    command, result = run(merged, commands)
    if not result.ok:
        error = (
            f"{INTEGRATION_FAILED}`{command}` exited with code {result.exit_code} on the "
            f"step's change merged onto the job branch ({onto[:10]}); it passed alone"
        )
        return Integration(
            onto,
            None,
            True,
            tuple(commands),
            error,
            result.output_tail,
            result.exit_code,
            result.stopped,
        )
    return Integration(onto, merged, True, tuple(commands))


def failure_details(details: str, diff: str, chars: int = 2500) -> str:
    """What the failed attempt records for the next one: the failure, then its own change."""
    change = diff.strip()
    if len(change) > chars:
        change = change[:chars] + "\n[... cut]"
    return f"{details.strip()}\n\nThe step's change that did not integrate:\n{change}"
