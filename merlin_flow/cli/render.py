"""Rich rendering for the CLI: the steps table, job lists, and live progress.

What jobs cost is drawn by ``merlin_flow.cli.cost_tables``, an attempt's log by
``merlin_flow.cli.transcripts``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from merlin_flow.cli.cost_tables import money
from merlin_flow.store.status import OPEN_ATTEMPT_STATUSES, AttemptStatus, JobStatus, StepStatus

if TYPE_CHECKING:
    from merlin_flow.jobs.views import (
        AttemptView,
        EventView,
        JobListEntry,
        JobView,
        StepView,
    )

STATUS_STYLE: dict[str, str] = {
    StepStatus.COMPLETED: "green",
    JobStatus.COMPLETED: "green",
    StepStatus.FAILED: "red",
    JobStatus.FAILED: "red",
    StepStatus.IN_PROGRESS: "yellow",
    JobStatus.RUNNING: "yellow",
    StepStatus.PENDING: "dim",
    JobStatus.PENDING: "dim",
    StepStatus.SKIPPED: "dim",
    JobStatus.CANCELLED: "magenta",
    JobStatus.BUDGET_EXCEEDED: "magenta",
    JobStatus.PARTIALLY_COMPLETED: "yellow",
    JobStatus.PLANNING: "yellow",
    JobStatus.AWAITING_APPROVAL: "cyan",
    JobStatus.REJECTED: "magenta",
    StepStatus.PARKED: "cyan",
    JobStatus.PARKED: "cyan",
}
FAILED = (AttemptStatus.FAILED, AttemptStatus.ERROR)
ATTEMPT_MARK: dict[str, str] = {
    AttemptStatus.PASSED: "✓",
    AttemptStatus.FAILED: "✗",
    AttemptStatus.ERROR: "✗",
    AttemptStatus.RUNNING: "working…",
    AttemptStatus.COMMITTED: "verifying…",
    AttemptStatus.CANCELLED: "cancelled",
}
"""How each attempt status is marked in the steps table (every status has one)."""
STATUS_ICON: dict[str, str] = {
    StepStatus.COMPLETED: "✓",
    StepStatus.FAILED: "✗",
    StepStatus.IN_PROGRESS: "⟳",
    StepStatus.PENDING: "○",
    StepStatus.SKIPPED: "⤼",
    StepStatus.PARKED: "⏸",
}
RECENT_EVENTS = 6
FAILURE_LINES = 8
"""Lines of a failed exit command's output shown under the steps table."""
ATTEMPT_STYLE: dict[str, str] = {
    AttemptStatus.PASSED: "green",
    AttemptStatus.FAILED: "red",
    AttemptStatus.ERROR: "red",
    AttemptStatus.CANCELLED: "magenta",
}


STALLED_MARK = "waiting for a worker"
"""An open attempt's mark when no worker is alive to work or verify it."""


def _attempts_cell(attempts: list[AttemptView], stalled: bool = False) -> Text:
    text = Text()
    for index, attempt in enumerate(attempts):
        if index:
            text.append("  ")
        status = attempt["status"]
        style = ATTEMPT_STYLE.get(status, "yellow")
        mark = ATTEMPT_MARK[status]
        if stalled and status in OPEN_ATTEMPT_STATUSES:
            mark = STALLED_MARK
        code = "" if attempt["exit_code"] is None else f" exit {attempt['exit_code']}"
        text.append(f"{attempt['kind']}@{attempt['tier']}{code} {mark}", style=style)
    return text


def steps_table(
    view: JobView, plain: bool = False, stalled: bool = False, note: str = ""
) -> RenderableType:
    """The steps table, and the output of the exit commands that failed last.

    ``plain``: one line per step instead of a table, for CI logs and pipes.
    ``stalled``: no worker is alive, so an open attempt is waiting, not working.
    ``note``: words after the job's status (``waiting for space``).
    """
    steps = steps_lines(view, stalled, note) if plain else _steps_table(view, stalled, note)
    notes = failure_notes(view)
    return Group(steps, notes) if notes.plain else steps


def steps_lines(view: JobView, stalled: bool = False, note: str = "") -> Text:
    """The steps table as plain lines: the job, then ``step · type · status · ...`` per step."""
    status = f"{view['status']} · {note}" if note else view["status"]
    lines = [f"job {view['id']} · {view['title']} · {status} · {money(view)}"]
    for step in view["steps"]:
        attempts = _attempts_cell(step["attempts"], stalled).plain or "no attempt yet"
        if not step["attempts"] and step["status"] == StepStatus.SKIPPED:
            attempts = step["result"] or "skipped"
        needs = f"needs {_needs(step).plain} · " if step.get("depends_on") else ""
        agent = f"agent {agent_label(step)} · " if step.get("agent") else ""
        lines.append(
            f"  {step['id']} · {step['step_type']} · {agent}{needs}{step['status']} · tier "
            f"{step['tier'] or '-'} · {_elapsed(step.get('started_at'), step.get('finished_at'))}"
            f" · {attempts} · exit command: {step['exit_command']}"
        )
    return Text("\n".join(lines))


def route_lines(view: JobView) -> str:
    """Where each step started and why: ``started on:`` then a line per routed step."""
    from merlin_flow.planning.route_learning import describe

    routed = [step for step in view["steps"] if step["route"]]
    lines = [f"  {step['id']}: {describe(step['route'])}" for step in routed]
    return "\n".join(["started on:", *lines]) if lines else ""


def failure_notes(view: JobView) -> Text:
    """The evidence of each failing step: its exit command's exit code and last lines.

    For a step still trying, its latest attempt if that failed its exit command; for a
    step that failed for good, the last attempt whose exit command failed, then what
    the attempts after it did (changed nothing, could not reach a model...). Only the
    tail fits here; ``merlin logs JOB --step ID`` has the rest.
    """
    text = Text()
    for step in view["steps"]:
        attempts = step["attempts"]
        ran = [a for a in attempts if a["status"] in FAILED and a["exit_code"]]
        shown = ran[-1] if ran else None
        if shown is None or (step["status"] != StepStatus.FAILED and shown is not attempts[-1]):
            continue
        lines = (shown["output_tail"] or "").rstrip().splitlines()[-FAILURE_LINES:]
        text.append(
            f"\n{step['id']}: `{step['exit_command']}` exited with code "
            f"{shown['exit_code']} (attempt {shown['number']}, tier {shown['tier']}); "
            "last lines:\n",
            style="red",
        )
        text.append("".join(f"  {line}\n" for line in lines), style="dim")
        later = attempts[attempts.index(shown) + 1 :]
        for attempt in later if step["status"] == StepStatus.FAILED else []:
            text.append(
                f"  then attempt {attempt['number']} ({attempt['kind']}@{attempt['tier']}): "
                f"{attempt['error'] or 'failed'}\n",
                style="red",
            )
        text.append(f"  all of it: merlin logs {view['id']} --step {step['id']}\n")
    return text


def _steps_table(view: JobView, stalled: bool = False, note: str = "") -> Table:
    """One row per step: status, current tier, attempts with their tiers and exit codes."""
    status = view["status"]
    noted = f" · [yellow]{note}[/]" if note else ""
    title = (
        f"job {view['id']} · {view['title']} · "
        f"[{STATUS_STYLE.get(status, '')}]{status}[/]{noted} · {money(view)}"
    )
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("step")
    table.add_column("type")
    agents = any(step.get("agent") for step in view["steps"])
    if agents:
        table.add_column("agent")
    table.add_column("needs")
    table.add_column("status")
    table.add_column("tier")
    table.add_column("attempt", justify="right")
    table.add_column("elapsed", justify="right")
    table.add_column("attempts (kind@tier, exit code)")
    table.add_column("exit command", overflow="fold")
    for step in view["steps"]:
        icon = STATUS_ICON.get(step["status"], "?")
        attempts = _attempts_cell(step["attempts"], stalled)
        if not step["attempts"] and step["status"] == StepStatus.SKIPPED:
            attempts = Text(step["result"] or "skipped", style="dim")
        table.add_row(
            step["id"],
            step["step_type"],
            *([agent_label(step)] if agents else []),
            _needs(step),
            Text(f"{icon} {step['status']}", style=STATUS_STYLE.get(step["status"], "")),
            step["tier"] or "",
            str(len(step["attempts"])) if step["attempts"] else "-",
            _elapsed(step.get("started_at"), step.get("finished_at")),
            attempts,
            step["exit_command"],
        )
    return table


def agent_label(step: StepView) -> str:
    """The step's agent and, unless the step named it, how it was chosen."""
    agent = step.get("agent") or ""
    how = step.get("agent_choice")
    if how == "autodelegated":
        return f"{agent} (autodelegated, score {step.get('agent_score') or 0:.2f})"
    return f"{agent} (default)" if how == "default" else agent


def _needs(step: StepView) -> Text:
    """The steps this one needs: those not passed yet in yellow (the graph, row by row)."""
    text = Text()
    waiting = set(step.get("waiting_on") or [])
    for index, key in enumerate(step.get("depends_on") or []):
        text.append(", " if index else "")
        text.append(key, style="yellow" if key in waiting else "")
    return text if text.plain else Text("-")


def _elapsed(started: str | None, finished: str | None) -> str:
    """``1m05s`` from ISO times (now when not finished); ``-`` before the start."""
    if not started:
        return "-"
    begin = datetime.fromisoformat(started.removesuffix("Z"))
    end = datetime.fromisoformat(finished.removesuffix("Z")) if finished else _utcnow()
    seconds = max(0, int((end - begin).total_seconds()))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def jobs_table(jobs: Sequence[JobListEntry], waiting: Collection[str] = ()) -> Table:
    """One row per job, newest first; those of ``waiting`` marked as waiting for space."""
    table = Table(title="jobs", title_justify="left")
    for column in ("id", "status", "title", "repo", "created"):
        table.add_column(column)
    for job in jobs:
        status = Text(job["status"], style=STATUS_STYLE.get(job["status"], ""))
        if job["id"] in waiting:
            status.append(" · waiting for space", style="yellow")
        table.add_row(
            job["id"],
            status,
            job["title"],
            job["repo"],
            job["created_at"] or "",
        )
    return table


def follow(
    console: Console,
    load_view: Callable[[], JobView],
    load_events: Callable[[int], list[EventView]],
    poll: float = 0.3,
    load_tool_calls: Callable[[], dict[str, str]] = dict,
) -> JobView:
    """Show progress until the job is finished; returns its final view.

    On a terminal the steps table updates in place, with the latest events and each
    working step's last tool call under it; elsewhere (CI logs, pipes) each event is
    printed as a line as it happens.
    """
    from rich.live import Live

    last_event = 0
    view = load_view()
    if console.is_terminal:
        recent: deque[EventView] = deque(maxlen=RECENT_EVENTS)
        with Live(steps_table(view), console=console, refresh_per_second=8) as live:
            while view["finished_at"] is None:
                time.sleep(poll)
                view = load_view()
                events = load_events(last_event)
                if events:
                    last_event = events[-1]["id"]
                    recent.extend(events)
                live.update(
                    Group(steps_table(view), _tools(load_tool_calls()), _events_text(list(recent)))
                )
            live.update(steps_table(view))
        return view
    while True:
        for event in load_events(last_event):
            last_event = event["id"]
            console.print(_event_line(event), highlight=False, markup=False)
        if view["finished_at"] is not None:
            return view
        time.sleep(poll)
        view = load_view()


def _tools(calls: dict[str, str]) -> Text:
    """``[slow] now: → run_command {"command": "pytest"}`` for each working step."""
    return Text("\n".join(f"[{step}] now: → {call}" for step, call in calls.items()))


def _event_line(event: EventView) -> str:
    where = f"[{event['step_key']}] " if event["step_key"] else ""
    return f"{(event['created_at'] or '')[11:19]} {where}{event['message']}"


def _events_text(events: list[EventView]) -> Text:
    return Text("\n".join(_event_line(e) for e in events), style="dim")
