"""``merlin prune``: removing what merlin made for jobs that ended long ago."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer
from rich.markup import escape

from merlin_flow.cli.common import JsonOption, console, guarded, state


def prune(
    failed: Annotated[
        bool,
        typer.Option(
            "--failed",
            help="Only jobs that failed, were cancelled or ran out of budget, and remove "
            "their branch and patch too (they can no longer be resumed).",
        ),
    ] = False,
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than", help="Only jobs that ended at least this long ago: 30m, 12h, 7d, 2w."
        ),
    ] = "7d",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Remove what merlin made for jobs that ended more than --older-than ago.

    Each such job loses its attempt refs (refs/merlin/<job>/...) and leftover worktrees.
    Its branch merlin/<job> and its patch are kept, unless the job completed with nothing
    to merge; --failed removes them too. A branch someone moved or has checked out is
    kept. Without --failed, environments last used more than --older-than ago go too,
    unless one is being built or a job of its repository is running, and so do worktree
    folders of jobs the store does not know and stale worktrees registered in this
    machine's caches. Running and pending jobs are never touched, and every job stays in
    the history (`merlin list`).
    """

    def work() -> None:
        from rich.table import Table

        from merlin_flow.jobs.pruning import parse_age
        from merlin_flow.jobs.pruning import prune as prune_jobs

        age = parse_age(older_than)
        settings, db = state()
        report = prune_jobs(db, settings, older_than=age, failed_only=failed, dry_run=dry_run)
        if as_json:
            console.print_json(json.dumps(asdict(report)))
            return
        if not report.removed and not report.skipped:
            console.print(f"nothing to prune older than {older_than}")
            return
        if report.removed:
            title = "would remove (dry run)" if dry_run else "removed"
            table = Table(title=title, title_justify="left")
            for column in ("kind", "job", "what", "where"):
                table.add_column(column, overflow="fold")
            for item in report.removed:
                row = (item.kind.value, item.job_id or "", item.target, item.where or "")
                table.add_row(*map(escape, row))
            console.print(table)
        if report.skipped:
            table = Table(title="left in place", title_justify="left")
            for column in ("job", "what", "why"):
                table.add_column(column, overflow="fold")
            for left in report.skipped:
                table.add_row(*map(escape, (left.job_id or "", left.target, left.reason)))
            console.print(table)

    guarded(work)
