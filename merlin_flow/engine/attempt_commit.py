"""An attempt's commit: what the attempt may not keep taken out, recorded, and the rest committed.

After the agent of an attempt is done, its worktree is settled in this order:

1. changes an `Edit`/`Write` deny forbids are undone (``write_refused`` events), and a
   sandbox that could not hide or protect what the rules cover is recorded;
2. the change is staged through a quarantine (``merlin_flow.workspace.staging``): nested
   git repositories are removed (``nested_repository_removed`` events) and secrets are
   looked for; a secret discards the whole change (``secret_in_diff`` events) and fails
   the attempt;
3. the staged tree is committed with the attempt's start as its one parent, which lets
   verify skip an ancestry check.
"""

from __future__ import annotations

from pathlib import Path

from merlin_flow.agents.definitions import AgentDefinition
from merlin_flow.agents.step_tools import permission_events
from merlin_flow.engine.held_step import HeldStep
from merlin_flow.store.events import AttemptData, EventKind, add_event
from merlin_flow.workspace.git import commit_tree
from merlin_flow.workspace.secret_scan import hit_lines, secret_error
from merlin_flow.workspace.staging import NESTED_REMOVED, StagedChange, stage_change


def commit_attempt(
    held: HeldStep,
    worktree: Path,
    excludes: Path,
    attempt: tuple[int, str],
    agent: AgentDefinition | None,
    message: str,
    error: str | None,
) -> tuple[str, str | None]:
    """Settle and commit attempt ``attempt`` (its number and start commit); (commit, error).

    ``error``: the attempt's error so far; a secret found puts its own first.
    """
    number, start = attempt
    events = permission_events(worktree, held.config, agent)
    staged = stage_change(worktree, excludes, held.config.secrets.allow, start)
    events += [
        (EventKind.NESTED_REPOSITORY_REMOVED, f"{p}: {NESTED_REMOVED}") for p in staged.nested
    ]
    _record(held, number, events, staged)
    if staged.hits:  # nothing the attempt wrote is committed: it fails
        error = secret_error(staged.hits) + (f"\n\n{error}" if error else "")
    return commit_tree(worktree, staged.tree, start, message), error


def _record(
    held: HeldStep, number: int, events: list[tuple[EventKind, str]], staged: StagedChange
) -> None:
    """The events of the settled attempt; secrets named by file, line and kind, never value."""
    if not events and not staged.hits:
        return
    data: AttemptData = {"attempt": number}
    with held.db.session() as session:
        for kind, text in events:
            shown = data if kind is EventKind.NESTED_REPOSITORY_REMOVED else None
            add_event(session, held.job_id, kind, text, held.step_key, shown)
        for hit in hit_lines(staged.hits):
            add_event(session, held.job_id, EventKind.SECRET_IN_DIFF, hit, held.step_key, data)
