"""What merlin writes in a GitHub thread: the plan, the progress of a job, the pull request.

Each is Markdown a person reads first; what merlin reads back (the signed plan, the job a
progress comment follows) is in hidden HTML comments beside it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from merlin_flow.config import MerlinConfig
from merlin_flow.jobs.costs import CostFields
from merlin_flow.jobs.plan_preview import how_planned, plan_rows
from merlin_flow.jobs.views import JobView, StepView
from merlin_flow.store.status import StepStatus
from merlin_flow.tasklist import TaskList

PROGRESS_MARK = "<!-- merlin-progress {job} -->"
PROGRESS = re.compile(r"<!-- merlin-progress (\w+) -->")
DONE = {
    StepStatus.COMPLETED: "passed",
    StepStatus.FAILED: "failed",
    StepStatus.SKIPPED: "skipped",
    StepStatus.PARKED: "parked",
}


def plan_comment(
    record: dict[str, Any],
    config: MerlinConfig,
    tasklist: TaskList,
    exit_commands: dict[str, str],
    block: str,
    auto: bool,
) -> str:
    """The plan, its estimates, each step's exit command, and how to approve it.

    ``exit_commands`` by step id; ``block`` is the signed plan.
    """
    sentence, fallback = how_planned(record, config)
    lines = [
        f"### merlin's plan: {_cell(tasklist.title)}",
        "",
        ("> [!WARNING]\n> " if fallback else "") + sentence[0].upper() + sentence[1:] + ".",
        "",
        "| step | type | title | depends on | est. tokens | est. cost (tier) |",
        "|---|---|---|---|---|---|",
    ]
    *rows, totals = plan_rows(record, config, tasklist)
    lines += [
        f"| `{r.step}` | {r.step_type} | {_cell(r.title)} | {r.depends_on} | {r.tokens} | "
        f"{r.cost} |"
        for r in rows
    ]
    lines.append(f"| **total** | | | | {totals.tokens} | {totals.cost} |")
    lines += ["", "Each step is done when its exit command passes:", ""]
    lines += [f"- `{step.id}`: `{exit_commands.get(step.id) or step.exit_command}`"
              for step in tasklist.steps]  # fmt: skip
    lines.append("")
    lines.append(
        "Running it now (label `merlin:auto`)."
        if auto
        else "Reply `/merlin approve` to run it, or `/merlin reject` to drop it."
    )
    return "\n".join(lines) + "\n\n" + block + "\n"


def progress_comment(view: JobView, run_url: str | None) -> str:
    """A job's state: one row per step with its tiers, attempts and cost so far."""
    done = sum(1 for step in view["steps"] if step["status"] == StepStatus.COMPLETED)
    lines = [
        f"### merlin job `{view['id']}`: {view['status']} "
        f"({done} of {len(view['steps'])} steps passed)",
        "",
    ]
    if run_url:
        lines += [f"[The workflow run]({run_url}) has the log.", ""]
    lines += ["| step | status | tiers | attempts | cost |", "|---|---|---|---|---|"]
    for step in view["steps"]:
        attempts = step["attempts"]
        status = DONE.get(step["status"], "working" if attempts else "waiting")
        cost = _cost(sum(a["known_cost_usd"] for a in attempts), attempts)
        lines.append(f"| `{step['id']}` | {status} | {_tiers(step)} | {len(attempts)} | {cost} |")
    lines.append(f"| **total** | | | | {_cost(view['known_cost_usd'], [view])} |")
    failure = view["failure"]
    if failure is not None:
        lines += ["", f"**Step `{failure['step']}` failed:** {_cell(failure['reason'])}"]
        if failure["tail"]:
            lines += ["", "```text", failure["tail"].replace("```", "` ` `"), "```"]
    elif view["error"]:
        lines += ["", f"**Failed:** {_cell(view['error'])}"]
    return "\n".join(lines) + "\n\n" + PROGRESS_MARK.format(job=view["id"]) + "\n"


def _cost(known: float, priced: Sequence[CostFields]) -> str:
    """``$0.0012``, or ``≥$0.0012`` when some call had no price."""
    floor = "≥" if any(item["unpriced_calls"] for item in priced) else ""
    return f"{floor}${known:.4f}"


def pull_request_body(number: int, view: JobView) -> str:
    """The draft pull request's text, from the job's view (``merlin status --json``).

    The issue it closes; per step, its exit command and that command's result, the
    tiers it ran on and its cost; then the job's cost: what the priced calls cost, and
    how many calls had no price.
    """
    done = sum(1 for step in view["steps"] if step["status"] == StepStatus.COMPLETED)
    lines = [
        f"Closes #{number}.",
        "",
        f"Made by merlin job `{view['id']}`: {_cell(view['title'])}, {view['status']} "
        f"({done} of {len(view['steps'])} steps passed).",
        "",
        "| step | exit command | result | tiers | attempts | cost |",
        "|---|---|---|---|---|---|",
    ]
    for step in view["steps"]:
        attempts = step["attempts"]
        cost = _cost(sum(a["known_cost_usd"] for a in attempts), attempts)
        lines.append(
            f"| `{step['id']}` | {_code(step['exit_command'])} | {_result(step)} | "
            f"{_tiers(step)} | {len(attempts)} | {cost} |"
        )
    lines += ["", f"**Cost:** ${view['known_cost_usd']:.4f}"]
    if view["unpriced_calls"]:
        calls = "call" if view["unpriced_calls"] == 1 else "calls"
        lines[-1] += f" known, plus {view['unpriced_calls']} model {calls} with no known price"
    return "\n".join(lines) + ".\n"


def _result(step: StepView) -> str:
    """What the step's exit command said last: ``passed (exit code 0)``, ``failed (...)``."""
    codes = [a["exit_code"] for a in step["attempts"] if a["exit_code"] is not None]
    status = DONE.get(step["status"], str(step["status"]))
    return f"{status} (exit code {codes[-1]})" if codes else status


def _tiers(step: StepView) -> str:
    """The tiers the step's attempts ran on, in order: ``local → premium``."""
    return " → ".join(dict.fromkeys(a["tier"] for a in step["attempts"])) or step["tier"] or "-"


def followed_job(comment: str) -> str | None:
    """The job a progress comment follows, or None."""
    found = PROGRESS.search(comment)
    return found[1] if found else None


def _cell(text: str) -> str:
    """Text safe in one table cell: one line, no pipe."""
    return " ".join(text.split()).replace("|", "\\|")


def _code(text: str) -> str:
    """``text`` as inline code in a table cell, whatever backticks it holds."""
    fence = "``" if "`" in text else "`"
    return f"{fence} {_cell(text)} {fence}" if fence == "``" else f"`{_cell(text)}`"
