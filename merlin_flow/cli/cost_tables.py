"""Rich tables of what jobs cost (`merlin costs`) and of a replay (`merlin replay`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from merlin_flow.jobs.costs import CostsSince, JobCosts
    from merlin_flow.jobs.replay import ReplayReport
    from merlin_flow.jobs.routing_report import RoutingReport

COST_COLUMNS = ("calls", "replayed", "cached", "failed", "tokens in", "tokens out", "cost")
"""The numeric columns of every cost table: right-aligned, so their digits line up."""


def _add_cost_columns(table: Table) -> None:
    for column in COST_COLUMNS:
        table.add_column(column, justify="right")


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
    attempts.add_column("step")
    attempts.add_column("attempt", justify="right")
    for column in ("kind", "tier"):
        attempts.add_column(column)
    _add_cost_columns(attempts)
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
    tiers.add_column("tier")
    _add_cost_columns(tiers)
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
    table.add_column("tier")
    _add_cost_columns(table)
    for row in report["tiers"]:
        table.add_row(row["tier"], *_cost_cells(row))
    table.add_row("total", *_cost_cells(report["total"]), style="bold")
    return table


def routing_table(report: RoutingReport) -> Table:
    """`merlin costs --routing`: how often the first tier was right, per way of routing."""
    total = report["total"]
    share = "-" if total["right_share"] is None else f"{total['right_share']:.0%}"
    when = "" if report["since_hours"] is None else f" since {report['since_hours']:g} h"
    title = f"{total['steps']} finished steps{when} · the first tier was right for {share}"
    table = Table(title=title, title_justify="left")
    for column in ("routed by", "first tier"):
        table.add_column(column)
    for column in ("steps", "right first", "escalated", "failed", "right", "cost", "wasted"):
        table.add_column(column, justify="right")
    for row in [*report["rows"], total]:
        table.add_row(
            row["by"],
            row["tier"],
            str(row["steps"]),
            str(row["right_first"]),
            str(row["escalated"]),
            str(row["failed"]),
            "-" if row["right_share"] is None else f"{row['right_share']:.0%}",
            f"${row['cost_usd']:.4f}",
            f"${row['wasted_usd']:.4f}",
            style="bold" if row is total else "",
        )
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
