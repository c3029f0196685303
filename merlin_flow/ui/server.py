"""``merlin ui``: the jobs dashboard, a Starlette app over the views ``status --json`` uses.

Pages are rendered on the server (Jinja2, autoescaped); a few lines of JavaScript
(``static/live.js``) follow the event stream (``stream.py``), or poll ``/api/events``
without it. Actions are the CLI's own operations (``jobs.control``, ``jobs.requesting``)
with the CLI's publishing (``workers.canvas``); an approval or rejection is recorded as
``merlin ui (ADDRESS)``. ``access.py`` says who may see and act, and ``gate.py``
checks it before any page or action; each page carries its session's CSRF value.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from merlin_flow.config import MerlinConfig
from merlin_flow.errors import MerlinError
from merlin_flow.jobs.plan_preview import plan_rows
from merlin_flow.jobs.pruning import parse_age
from merlin_flow.jobs.views import JobListEntry, events_since, job_view, list_jobs
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, JobStatus, LlmCall, utcnow
from merlin_flow.tasklist import TaskList
from merlin_flow.ui import formats
from merlin_flow.ui.access import Access
from merlin_flow.ui.filters import AGES, JobsFilter
from merlin_flow.ui.fleet import fleet_view, parse_days
from merlin_flow.ui.gate import Gate, bearer, keep_session, session
from merlin_flow.ui.stream import event_id, events_after, feed, newest_event

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
PAGE = 100
CONFIRMED = ("cancel", "reject")
"""Actions the page asks to confirm."""
STREAM_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
"""The event stream's headers: no cache, and no buffering by nginx (docs/dashboard.md)."""


def actor(request: Request) -> str:
    """Who approves or rejects from the dashboard: ``merlin ui (ADDRESS)``.

    The dashboard knows no user (its one token is everyone's), only the address uvicorn
    gives for the request: the browser's, or the ``X-Forwarded-For`` of a proxy it trusts
    (127.0.0.1 and ::1 unless ``FORWARDED_ALLOW_IPS`` says otherwise).
    """
    return f"merlin ui ({request.client.host})" if request.client else "merlin ui"


def create_app(db: Database, settings: Settings, access: Access, read_only: bool) -> Starlette:
    """The dashboard over ``db``; ``read_only`` shows and accepts no action."""
    templates = Environment(
        loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape()
    )
    templates.filters.update(
        cost=formats.cost,
        duration=formats.duration,
        seconds=formats.seconds,
        waterfall=formats.waterfall,
    )

    def page(request: Request, name: str, **values: Any) -> HTMLResponse:
        """A page with its session's CSRF value; a request without one starts a session."""
        kept = session(request)
        current = access.new_session() if kept is None else kept
        body = templates.get_template(name).render(
            csrf=access.csrf(current), read_only=read_only, confirmed=CONFIRMED, **values
        )
        response = HTMLResponse(body, headers={"Cache-Control": "no-store"})
        if kept is None:
            keep_session(response, request, access, current)
        return response

    async def jobs(request: Request) -> Response:
        try:
            wanted = JobsFilter.from_query(request.query_params)
        except MerlinError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        rows = await anyio.to_thread.run_sync(_job_rows, db, wanted)
        after = await anyio.to_thread.run_sync(newest_event, db)
        more = wanted.next_page(rows[-1]["id"]) if len(rows) == PAGE else None
        return page(request, "jobs.html", jobs=rows, wanted=wanted, statuses=list(JobStatus),
                    ages=AGES, after=after, more=more)  # fmt: skip

    async def job(request: Request) -> Response:
        view, events = await anyio.to_thread.run_sync(_job, db, request.path_params["job"])
        rows = await anyio.to_thread.run_sync(_plan, db, view)
        after = events[-1]["id"] if events else 0
        return page(request, "job.html", **_job_values(view, events, rows), after=after)

    async def job_body(request: Request) -> Response:
        view, events = await anyio.to_thread.run_sync(_job, db, request.path_params["job"])
        rows = await anyio.to_thread.run_sync(_plan, db, view)
        return page(request, "job_body.html", **_job_values(view, events, rows))

    async def attempt(request: Request) -> Response:
        found = await anyio.to_thread.run_sync(
            _attempt, db, settings, request.path_params["job"], request.path_params["step"],
            request.path_params["number"],
        )  # fmt: skip
        entry, change, calls = found
        events = await anyio.to_thread.run_sync(events_since, db, request.path_params["job"])
        mine = [event for event in events if event["step_key"] == entry["step"]]
        name = "attempt_panel.html" if request.query_params.get("panel") else "attempt.html"
        return page(request, name, job_id=request.path_params["job"], entry=entry, diff=change,
                    step_events=mine, calls=calls)  # fmt: skip

    async def fleet(request: Request) -> Response:
        try:
            days = parse_days(request.query_params.get("days"))
        except MerlinError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        view = await anyio.to_thread.run_sync(fleet_view, db, settings, days)
        if request.url.path.startswith("/api/"):
            return JSONResponse(view)
        return page(request, "fleet.html", fleet=view)

    async def api_job(request: Request) -> Response:
        view, _ = await anyio.to_thread.run_sync(_job, db, request.path_params["job"])
        return JSONResponse(view)

    async def events(request: Request) -> Response:
        resumed = request.headers.get("last-event-id")
        try:
            after = event_id(resumed, "Last-Event-ID") if resumed else _after(request)
        except MerlinError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        stream = feed(db, after, request.query_params.get("job"))
        return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)

    async def api_events(request: Request) -> Response:
        """The events the stream would send next, at once: the pages' polling fallback."""
        try:
            after = _after(request)
        except MerlinError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        job_id = request.query_params.get("job")
        batch = await anyio.to_thread.run_sync(events_after, db, after, job_id)
        return JSONResponse(batch, headers={"Cache-Control": "no-store"})

    async def act(request: Request) -> Response:
        if read_only:
            return PlainTextResponse("read-only dashboard", status_code=403)
        form = await request.form()
        given = str(form.get("csrf") or "")
        if not bearer(request) and not access.csrf_holds(session(request), given):
            return PlainTextResponse("missing or wrong CSRF value (or no session): reload the "
                                     "page and try again", status_code=403)  # fmt: skip
        job_id, action = request.path_params["job"], request.path_params["action"]
        try:
            await anyio.to_thread.run_sync(_do, db, settings, job_id, action, actor(request))
        except MerlinError as exc:
            return PlainTextResponse(f"{action} {job_id}: {exc}", status_code=409)
        return RedirectResponse(f"/jobs/{job_id}", status_code=303)

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return HTMLResponse(_LOGIN)
        form = await request.form()
        if not access.accepts_login(str(form.get("token") or "")):
            return HTMLResponse(_LOGIN, status_code=401)
        response = RedirectResponse("/", status_code=303)
        keep_session(response, request, access, access.new_session())  # a new one: a new CSRF
        return response

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [
        Route("/", jobs),
        Route("/jobs/{job}", job),
        Route("/jobs/{job}/body", job_body),
        Route("/jobs/{job}/steps/{step}/attempts/{number:int}", attempt),
        Route("/jobs/{job}/{action:str}", act, methods=["POST"]),
        Route("/api/jobs/{job}", api_job),
        Route("/fleet", fleet),
        Route("/api/fleet", fleet),
        Route("/events", events),
        Route("/api/events", api_events),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/healthz", healthz),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(Gate, access=access)],
                    exception_handlers={404: _not_found})  # fmt: skip
    return app


def _after(request: Request) -> int:
    """``?after=``: the id of the last event the reader has (InputError naming it)."""
    return event_id(request.query_params.get("after"), "after")


async def _not_found(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(str(getattr(exc, "detail", "not found")), status_code=404)


def _job_rows(db: Database, wanted: JobsFilter) -> list[JobListEntry]:
    """A page of jobs as ``merlin list --json`` gives them (HTTP 400 for a bad filter)."""
    from starlette.exceptions import HTTPException

    since = utcnow() - parse_age(wanted.age) if wanted.age else None
    statuses = [wanted.status] if wanted.status else []
    try:
        return list_jobs(db, PAGE, statuses, wanted.repo or None, since, wanted.before or None)
    except MerlinError as exc:
        raise HTTPException(400, str(exc)) from None


def _job(db: Database, job_id: str) -> tuple[Any, list[Any]]:
    from starlette.exceptions import HTTPException

    try:
        return job_view(db, job_id), events_since(db, job_id)
    except MerlinError as exc:
        raise HTTPException(404, str(exc)) from None


def _attempt(
    db: Database, settings: Settings, job_id: str, step: str, number: int
) -> tuple[Any, str, list[dict[str, Any]]]:
    """An attempt with its transcript and output (``merlin logs``), its diff and its calls.

    A question's conversation (``merlin logs`` calls it step ``question``) has no attempt
    row: its calls are those made for the job as a whole, and it has no diff.
    """
    from sqlalchemy import select
    from starlette.exceptions import HTTPException

    from merlin_flow.jobs.logs import job_logs
    from merlin_flow.workspace.git import diff
    from merlin_flow.workspace.repository import repository_of

    try:
        entries = [e for e in job_logs(db, job_id, step) if e["number"] == number]
    except MerlinError as exc:
        raise HTTPException(404, str(exc)) from None
    if not entries:
        raise HTTPException(404, f"step {step} of job {job_id} has no attempt {number}")
    entry = entries[0]
    with db.reader() as session:
        row = session.get_one(Job, job_id)
        location = row.repo
        attempt = next((a for s in row.steps if s.key == step
                        for a in s.attempts if a.number == number), None)  # fmt: skip
        query = select(*_CALL_COLUMNS).where(LlmCall.job_id == job_id).order_by(LlmCall.seq)
        which = LlmCall.attempt_id == attempt.id if attempt else LlmCall.attempt_id.is_(None)
        calls = [dict(call._mapping) for call in session.execute(query.where(which))]
    if attempt is None or not entry["commit"]:
        return entry, "", calls
    try:
        repository = repository_of(location, settings)
        repository.have(job_id, attempt.start_commit, entry["commit"])
        return entry, diff(repository.path, attempt.start_commit, entry["commit"]), calls
    except MerlinError as exc:
        return entry, f"(the diff cannot be read here: {exc})", calls


_CALL_COLUMNS = (LlmCall.seq, LlmCall.turn, LlmCall.tier, LlmCall.model, LlmCall.prompt_tokens,
                 LlmCall.completion_tokens, LlmCall.cost_usd, LlmCall.latency_ms, LlmCall.cached,
                 LlmCall.replayed, LlmCall.error)  # fmt: skip
"""What the panel shows of each model call (not the response: the transcript has it)."""


def _plan(db: Database, view: Any) -> list[Any]:
    """The plan's preview rows of a job waiting for approval (none otherwise)."""
    if view["status"] != JobStatus.AWAITING_APPROVAL or not view["plan"]:
        return []
    with db.reader() as session:
        job = session.get_one(Job, view["id"])
        config, tasklist = MerlinConfig.model_validate(job.config), job.tasklist
    return plan_rows(view["plan"], config, TaskList.model_validate(tasklist))


def _job_values(view: Any, events: list[Any], rows: list[Any]) -> dict[str, Any]:
    return {"job": view, "events": events, "plan_rows": rows, "actions": _actions(view)}


def _actions(view: Any) -> list[str]:
    status = view["status"]
    if status == JobStatus.AWAITING_APPROVAL:
        return ["approve", "reject"]
    if status in (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PARKED):
        return ["resume"]
    return [] if view["finished_at"] else ["cancel"]


def _do(db: Database, settings: Settings, job_id: str, action: str, who: str) -> None:
    """The CLI's operation ``action`` on ``job_id``, then its publishing.

    ``who`` is recorded as the approver or rejecter (cancel and resume record no one,
    as on the command line).
    """
    from merlin_flow.jobs.control import cancel_job, resume_job
    from merlin_flow.jobs.decisions import reject_job
    from merlin_flow.jobs.requesting import approve_job

    if action == "cancel":
        cancel_job(db, settings, job_id)
    elif action == "resume":
        resume_job(db, settings, job_id)
        _publish(db, job_id)
    elif action == "approve":
        approve_job(db, settings, job_id, who)
        _publish(db, job_id)
    elif action == "reject":
        reject_job(db, job_id, who)
    else:
        from merlin_flow.errors import InputError

        raise InputError(f"no action {action!r}: cancel, resume, approve or reject")


def _publish(db: Database, job_id: str) -> None:
    from workers.app import publish_job

    reason = publish_job(db, job_id)
    if reason is not None:
        log.warning("job %s: its tasks could not be published (%s): a worker's recovery "
                    "sweep will publish them", job_id, reason)  # fmt: skip


_LOGIN = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>merlin</title>
</head><body><form method="post" action="/login"><label>token
<input type="password" name="token" autofocus></label> <button>sign in</button></form>
</body></html>"""
