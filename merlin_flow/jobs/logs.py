"""What ``merlin logs`` and ``merlin watch`` read: each attempt's conversation and output.

An attempt's transcript is stored on its row as it grows; a question's conversation,
on its job (``plan.transcript``), is shown as one attempt of a step called
``question``. The latest tool call of each working agent is what ``watch`` shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from merlin_flow.errors import InputError, JobNotFoundError
from merlin_flow.failures import AttemptKind
from merlin_flow.jobs.costs import cost_fields
from merlin_flow.jobs.views import (
    AttemptView,
    EventView,
    attempt_view,
    events_since,
    iso_utc,
    job_view,
)
from merlin_flow.store import (
    OPEN_ATTEMPT_STATUSES,
    Attempt,
    AttemptStatus,
    Database,
    Job,
    JobStatus,
    LlmCall,
    Step,
)


class LogEntry(AttemptView):
    """One attempt with its step, transcript and output: ``merlin logs --json``."""

    step: str
    exit_command: str
    transcript: list[dict[str, Any]]


def job_logs(db: Database, job_id: str, step_key: str | None = None) -> list[LogEntry]:
    """Every attempt of the job (or of one step), with its transcript and command output."""
    with db.reader() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        if (job.plan or {}).get("kind") == "question" and step_key in (None, QUESTION):
            return [_question_log(session, job)]
        steps = [s for s in job.steps if step_key is None or s.key == step_key]
        if step_key is not None and not steps:
            known = ", ".join(s.key for s in job.steps)
            raise InputError(f"job {job_id} has no step {step_key!r}; its steps: {known}")
        return [
            {
                "step": step.key,
                "exit_command": step.exit_command,
                **attempt_view(attempt),
                "transcript": attempt.transcript or [],
            }
            for step in steps
            for attempt in step.attempts
        ]


QUESTION = "question"
"""What ``merlin logs`` calls a question's one conversation, in the place of a step."""


def _question_log(session: Session, job: Job) -> LogEntry:
    """A question's conversation as one attempt: its tier, calls, answer or error."""
    plan = job.plan or {}
    tier = str(plan.get("tier") or "")
    models = {t["name"]: t["model"] for t in job.config.get("tiers", [])}
    transcript: list[dict[str, Any]] = list(plan.get("transcript") or [])
    calls = session.execute(
        select(
            func.coalesce(func.sum(LlmCall.prompt_tokens), 0),
            func.coalesce(func.sum(LlmCall.completion_tokens), 0),
            func.coalesce(func.sum(LlmCall.cost_usd), 0.0),
        ).where(LlmCall.job_id == job.id, LlmCall.attempt_id.is_(None))
    ).one()
    status = AttemptStatus.PASSED if job.answer is not None else AttemptStatus.ERROR
    return {
        "step": QUESTION,
        "exit_command": "",
        "number": 1,
        "kind": AttemptKind.EXECUTE,
        "tier": tier,
        "model": models.get(tier, ""),
        "status": AttemptStatus.RUNNING if job.status == JobStatus.PLANNING else status,
        "commit": None,
        "exit_code": None,
        "error": job.error,
        "output_tail": None,
        "summary": job.answer,
        "turns": sum(1 for m in transcript if m.get("role") == "assistant"),
        "runs": 1,
        "prompt_tokens": int(calls[0]),
        "completion_tokens": int(calls[1]),
        "started_at": iso_utc(job.started_at or job.created_at),
        "finished_at": None if job.status == JobStatus.PLANNING else iso_utc(job.finished_at),
        **cost_fields(float(calls[2] or 0.0), 0),
        "transcript": transcript,
    }


LogLine = dict[str, Any]
"""One line of ``merlin logs --follow --json``: a JSON object whose ``type`` says which
(docs/reference.md). Each has ``job``, ``step`` and ``attempt`` (None where it belongs to
no step or attempt)."""


def follow_log(
    db: Database,
    job_id: str,
    step_key: str | None = None,
    poll: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[LogLine]:
    """The job's log as it is written, in lines, until the job has ended.

    Each poll gives the events recorded since the last one (of ``step_key`` only, if
    given), then for each attempt: ``attempt_start`` once, its new messages, and
    ``attempt_end`` once it has a verdict. ``job_end`` comes last. An attempt whose
    transcript shrank (its worker was lost and it started again) gives
    ``attempt_restarted``, then its messages again from the first.
    """
    shown: dict[tuple[str, int], int] = {}  # messages given, per (step, attempt)
    closed: set[tuple[str, int]] = set()
    last_event = 0
    while True:
        ended = _finalized(db, job_id)  # then what follows is the whole rest
        entries = job_logs(db, job_id, step_key)  # before the events, so an attempt's
        # `attempt_started` event is given before its own lines
        for event in events_since(db, job_id, last_event):
            last_event = event["id"]
            if step_key is None or event["step_key"] == step_key:
                yield _event_line(job_id, event)
        for entry in entries:
            yield from _attempt_lines(job_id, entry, shown, closed)
        if ended:
            view = job_view(db, job_id)
            yield {
                "type": "job_end", "job": job_id, "step": None, "attempt": None,
                "status": view["status"], "branch": view["branch"], "error": view["error"],
                "patch": view["patch"],
            }  # fmt: skip
            return
        sleep(poll)


def _finalized(db: Database, job_id: str) -> bool:
    """Whether the job has ended and been closed (its logs are final)."""
    with db.reader() as session:
        job = session.get(Job, job_id)
        return job is not None and job.finished_at is not None


def _event_line(job_id: str, event: EventView) -> LogLine:
    data = event["data"] or {}
    return {
        "type": "event", "job": job_id, "step": event["step_key"],
        "attempt": data.get("attempt"), "id": event["id"], "kind": event["kind"],
        "message": event["message"], "data": event["data"], "created_at": event["created_at"],
    }  # fmt: skip


def _attempt_lines(
    job_id: str, entry: LogEntry, shown: dict[tuple[str, int], int], closed: set[tuple[str, int]]
) -> Iterator[LogLine]:
    """An attempt's new lines: its start when first seen, new messages, its end once."""
    key = (entry["step"], entry["number"])
    where = {"job": job_id, "step": entry["step"], "attempt": entry["number"]}
    fields = {k: v for k, v in entry.items() if k not in ("step", "number", "transcript")}
    messages = entry["transcript"]
    if key not in shown:
        yield {"type": "attempt_start", **where, **fields}
    elif len(messages) < shown[key]:
        yield {"type": "attempt_restarted", **where}
        shown[key] = 0
    for index in range(shown.get(key, 0), len(messages)):
        yield {"type": "message", **where, "index": index, "message": messages[index]}
    shown[key] = len(messages)
    if entry["status"] not in OPEN_ATTEMPT_STATUSES and key not in closed:
        closed.add(key)
        yield {"type": "attempt_end", **where, **fields}


def last_tool_calls(db: Database, job_id: str) -> dict[str, str]:
    """For each step whose agent is working now: its latest tool call, as one line."""
    with db.reader() as session:
        attempts = session.scalars(
            select(Attempt)
            .join(Step, Attempt.step_id == Step.id)
            .where(Step.job_id == job_id, Attempt.status == AttemptStatus.RUNNING)
        ).all()
        calls = {}
        for attempt in attempts:
            line = tool_call_line(attempt.transcript or [])
            if line:
                calls[attempt.step.key] = line
        return calls


def tool_call_line(messages: list[dict[str, Any]]) -> str | None:
    """The conversation's latest tool call: ``run_command {"command": "pytest -q"}``."""
    for message in reversed(messages):
        for call in reversed(message.get("tool_calls") or []):
            function = call.get("function", {})
            return f"{function.get('name')} {str(function.get('arguments', ''))[:200]}"
    return None
