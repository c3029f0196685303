"""Rich rendering for the CLI: the steps table, job lists, and live progress."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from merlin_flow.store.status import OPEN_ATTEMPT_STATUSES, AttemptStatus, JobStatus, StepStatus

if TYPE_CHECKING:
    from merlin_flow.jobs.costs import CostsSince, JobCosts
    from merlin_flow.jobs.replay import ReplayReport
    from merlin_flow.jobs.views import (
        AttemptView,
        EventView,
        JobListEntry,
        JobView,
        LogEntry,
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
}
RECENT_EVENTS = 6
FAILURE_LINES = 8
"""Lines of a failed exit command's output shown under the steps table."""
LOG_TOOL_LINES = 20
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


def steps_table(view: JobView, plain: bool = False, stalled: bool = False) -> RenderableType:
    """The steps table, and the output of the exit commands that failed last.

    ``plain``: one line per step instead of a table, for CI logs and pipes.
    ``stalled``: no worker is alive, so an open attempt is waiting, not working.
    """
    steps = steps_lines(view, stalled) if plain else _steps_table(view, stalled)
    notes = failure_notes(view)
    return Group(steps, notes) if notes.plain else steps


def steps_lines(view: JobView, stalled: bool = False) -> Text:
    """The steps table as plain lines: the job, then ``step · type · status · ...`` per step."""
    lines = [f"job {view['id']} · {view['title']} · {view['status']} · {money(view)}"]
    for step in view["steps"]:
        attempts = _attempts_cell(step["attempts"], stalled).plain or "no attempt yet"
        if not step["attempts"] and step["status"] == "Skipped":
            attempts = step["result"] or "skipped"
        needs = f"needs {_needs(step).plain} · " if step.get("depends_on") else ""
        agent = f"agent {agent_label(step)} · " if step.get("agent") else ""
        lines.append(
            f"  {step['id']} · {step['step_type']} · {agent}{needs}{step['status']} · tier "
            f"{step['tier'] or '-'} · {_elapsed(step.get('started_at'), step.get('finished_at'))}"
            f" · {attempts} · exit command: {step['exit_command']}"
        )
    return Text("\n".join(lines))


def failure_notes(view: JobView) -> Text:
    """For each step whose latest attempt failed its exit command: the output's last lines.

    Only the tail fits here; ``merlin logs JOB --step ID`` has the rest.
    """
    text = Text()
    for step in view["steps"]:
        attempts = step["attempts"]
        last = attempts[-1] if attempts else None
        if last is None or last["status"] not in FAILED or not last["exit_code"]:
            continue
        lines = (last["output_tail"] or "").rstrip().splitlines()[-FAILURE_LINES:]
        text.append(
            f"\n{step['id']}: `{step['exit_command']}` exited with code {last['exit_code']} "
            f"(attempt {last['number']}, tier {last['tier']}); last lines:\n",
            style="red",
        )
        text.append("".join(f"  {line}\n" for line in lines), style="dim")
        text.append(f"  all of it: merlin logs {view['id']} --step {step['id']}\n")
    return text


def _steps_table(view: JobView, stalled: bool = False) -> Table:
    """One row per step: status, current tier, attempts with their tiers and exit codes."""
    status = view["status"]
    title = (
        f"job {view['id']} · {view['title']} · "
        f"[{STATUS_STYLE.get(status, '')}]{status}[/] · {money(view)}"
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
        if not step["attempts"] and step["status"] == "Skipped":
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


def jobs_table(jobs: list[JobListEntry]) -> Table:
    """One row per job, newest first."""
    table = Table(title="jobs", title_justify="left")
    for column in ("id", "status", "title", "repo", "created"):
        table.add_column(column)
    for job in jobs:
        table.add_row(
            job["id"],
            Text(job["status"], style=STATUS_STYLE.get(job["status"], "")),
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


COST_COLUMNS = ("calls", "replayed", "cached", "failed", "tokens in", "tokens out", "cost")


def _cost_cells(row: Mapping[str, Any]) -> list[str]:
    return [
        str(row["calls"]),
        str(row["replayed_calls"]),
        str(row["cached_calls"]),
        str(row["failed_calls"]),
        str(row["prompt_tokens"]),
        str(row["completion_tokens"]),
        money(row),
    ]


def money(row: Mapping[str, Any]) -> str:
    """A row's cost: `$0.0123`, `unknown`, or `≥$0.0123 (+2 unpriced calls)`.

    `unknown` when no call was priced, the `≥` form when some were not
    (``merlin_flow.jobs.costs`` gives every row ``known_cost_usd`` and ``unpriced_calls``).
    """
    unpriced = row.get("unpriced_calls", 0)
    known = row.get("known_cost_usd", row.get("cost_usd")) or 0.0
    if not unpriced:
        return f"${known:.4f}"
    if not known:
        return "unknown"
    return f"≥${known:.4f} (+{unpriced} unpriced call{'s' if unpriced > 1 else ''})"


def job_costs_tables(report: JobCosts) -> list[Table]:
    """`merlin costs JOB`: one row per attempt, then per tier, then the escalations."""
    budget = report["budget_usd"]
    title = f"costs of job {report['job_id']} · total {money(report['total'])}"
    if budget is not None:
        title += f" of a ${budget:.4f} budget"
    attempts = Table(title=title, title_justify="left")
    for column in ("step", "attempt", "kind", "tier", *COST_COLUMNS):
        attempts.add_column(column)
    for step in report["steps"]:
        for attempt in step["attempts"]:
            attempts.add_row(
                step["id"],
                str(attempt["number"]),
                attempt["kind"],
                attempt["tier"],
                *_cost_cells(attempt),
            )
    attempts.add_row("total", "", "", "", *_cost_cells(report["total"]), style="bold")
    tiers = Table(title="per tier", title_justify="left")
    for column in ("tier", *COST_COLUMNS):
        tiers.add_column(column)
    for row in report["tiers"]:
        tiers.add_row(row["tier"], *_cost_cells(row))
    tables = [attempts, tiers]
    if report["escalations"]:
        escalations = Table(title="escalations", title_justify="left")
        for column in ("step", "from", "to", "reason"):
            escalations.add_column(column, overflow="fold")
        for item in report["escalations"]:
            escalations.add_row(
                item["step"] or "", item["from_tier"] or "", item["to_tier"] or "",
                Text(item["reason"] or ""),
            )  # fmt: skip
        tables.append(escalations)
    return tables


def costs_since_table(report: CostsSince) -> Table:
    """`merlin costs --since`: totals across jobs, per tier."""
    title = (
        f"{report['jobs']} jobs since {report['since']} · {money(report['total'])} · "
        f"{report['escalations']} escalations"
    )
    table = Table(title=title, title_justify="left")
    for column in ("tier", *COST_COLUMNS):
        table.add_column(column)
    for row in report["tiers"]:
        table.add_row(row["tier"], *_cost_cells(row))
    table.add_row("total", *_cost_cells(report["total"]), style="bold")
    return table


def replay_table(report: ReplayReport) -> Table:
    """`merlin replay`: each step's attempts and final commit, original beside replay."""
    table = Table(
        title=f"job {report.original} ({report.original_status}) replayed as "
        f"{report.replay} ({report.replay_status})",
        title_justify="left",
    )
    for column in ("step", "original attempts", "replay attempts", "original", "replay", "tree"):
        table.add_column(column)
    for step in report.steps:
        table.add_row(
            step.step,
            step.original_path,
            step.replay_path,
            (step.original_commit or "-")[:10],
            (step.replay_commit or "-")[:10],
            Text("same ✓", style="green") if step.same_tree else Text("differs ✗", style="red"),
        )
    return table


def attempt_log(entry: LogEntry) -> Group:
    """`merlin logs`: one attempt's conversation, then its exit command's output."""
    parts: list[Any] = [attempt_header(entry)]
    for message in entry["transcript"]:
        parts.extend(message_lines(message))
    parts.extend(attempt_footer(entry))
    return Group(*parts)


def attempt_header(entry: LogEntry) -> Text:
    """``── step fix · attempt 2 · fix@local · failed, exit code 1``."""
    code = "" if entry["exit_code"] is None else f", exit code {entry['exit_code']}"
    return Text(
        f"── step {entry['step']} · attempt {entry['number']} · {entry['kind']}@{entry['tier']}"
        f" · {entry['status']}{code}",
        style=f"bold {ATTEMPT_STYLE.get(entry['status'], '')}".strip(),
    )


def message_lines(message: dict[str, Any]) -> list[Text]:
    """One message of a conversation: the user's brief, a reply and its tool calls, a result."""
    role = message.get("role")
    content = (message.get("content") or "").rstrip()
    if role == "user":
        return [Text(f"user: {content}", style="cyan")]
    if role == "tool":
        return [Text(f"← {_clip(content, LOG_TOOL_LINES)}", style="dim")]
    if role != "assistant":
        return []
    lines = [Text(f"assistant: {content}")] if content else []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        arguments = str(function.get("arguments", ""))
        lines.append(Text(f"→ {function.get('name')} {arguments[:300]}", style="yellow"))
    return lines


def attempt_footer(entry: LogEntry) -> list[Text]:
    """The attempt's error, and its exit command with the output's tail."""
    lines = []
    if entry["error"]:
        lines.append(Text(f"error: {entry['error']}", style="red"))
    if entry["exit_code"] is not None:
        lines.append(Text(f"$ {entry['exit_command']}  (exit code {entry['exit_code']})"))
        lines.append(Text((entry["output_tail"] or "").rstrip(), style="dim"))
    return lines


def _clip(text: str, lines: int) -> str:
    kept = text.splitlines()
    if len(kept) <= lines:
        return text
    return "\n".join([*kept[:lines], f"[... {len(kept) - lines} more lines]"])
