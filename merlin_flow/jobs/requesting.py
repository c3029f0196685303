"""Jobs made from a request in plain words: planned, approved, then run; or answered.

``submit_request`` checks what ``submit_job`` checks (the repository, the configuration
read from the commit the job starts at, a usable tier, the ``@path`` files), records the
job in status ``planning`` and plans it where it was submitted (``plan_job``). The
planner's calls are journaled against the job, so a job whose planning was cut off (its
process died) is planned again by ``merlin resume``, replaying the answers already paid
for. Then:

- a **question** is answered by a read-only agent (``questions``); the job completes
  with the answer as its result, and has no step and no branch;
- a **single action** is approved at once: its one step is what was asked for;
- a **plan** waits in ``awaiting_approval`` with the request, the planner's raw answers
  and the parsed steps. ``approve_job`` (``merlin approve``, or ``--yes`` at submission)
  makes the job branch and the step rows, possibly from an edited TaskList, and records
  who approved it and when; the caller enqueues it. ``reject_job``
  (``decisions``) ends it as ``rejected``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from merlin_flow.agents.choice import choose_agents
from merlin_flow.agents.definitions import load_agents
from merlin_flow.config import MerlinConfig, load_config
from merlin_flow.config_files import CONFIG_FILE_NAME
from merlin_flow.engine.budget import require_priced_tiers
from merlin_flow.engine.lifecycle import approve_plan, await_approval, record_answer
from merlin_flow.errors import InputError, RecordInDoubt
from merlin_flow.jobs.decisions import decided, found, user_name, waiting
from merlin_flow.jobs.submission import (
    add_steps,
    check_budget,
    check_exit_commands,
    default_exit_commands,
    learned_routes,
    left_out_warnings,
    new_job_id,
)
from merlin_flow.models.credentials import require_a_usable_tier
from merlin_flow.models.endpoints import pin_endpoints
from merlin_flow.models.journal import JobCalls
from merlin_flow.models.llm import ModelCall, complete
from merlin_flow.planning.context import RepositoryContext, read_context
from merlin_flow.planning.planner import Plan, make_plan, plan_json
from merlin_flow.planning.reading import to_tasklist
from merlin_flow.planning.requests import Classification, RequestKind, classify
from merlin_flow.planning.specs import relevant_constraints
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, JobStatus, utcnow
from merlin_flow.store.database import write_patiently
from merlin_flow.store.events import EventKind, add_event
from merlin_flow.tasklist import TaskList
from merlin_flow.tools.permissions import Permissions
from merlin_flow.workspace.git import job_branch
from merlin_flow.workspace.repository import (
    JobRepository,
    refusals_as_input_errors,
    repository_for_input,
    repository_of,
)

TITLE_CHARS = 80
SPEC_CHARS = 6000
"""The most the relevant specs' constraints may take of the planner's prompt."""


@dataclass(frozen=True)
class RequestSubmission:
    """A job made from a request, planned (or answered), and where it stands."""

    job_id: str
    config: MerlinConfig
    status: JobStatus
    """``awaiting_approval``, ``pending`` (approved: enqueue it) or ``completed`` (answered)."""
    warnings: tuple[str, ...] = ()


def submit_request(
    db: Database,
    settings: Settings,
    request: str,
    repo: str,
    config_path: Path | None = None,
    budget_usd: float | None = None,
    *,
    approved_by: str | None = None,
    check_tiers: bool = True,
    call_model: ModelCall = complete,
) -> RequestSubmission:
    """Check and record a request's job, then plan it (``approved_by``: approve it too).

    Raises InputError (exit code 2) before anything is written: an empty request, a
    repository or configuration that does not hold, an ``@path`` the commit lacks.
    """
    request = request.strip()
    if not request:
        raise InputError("the request is empty: say what to do")
    check_budget(budget_usd)
    repository = repository_for_input(repo, settings)
    with refusals_as_input_errors(repository):
        base = repository.base_commit()
    with repository.files_at(base) as files:
        config = pin_endpoints(
            load_config(files, config_path, settings.home_dir, settings.system_config)
        )
    if check_tiers:
        require_a_usable_tier(config)
    kind = classify(request)
    if kind.files:  # a missing @path is refused before anything is written
        read_context(
            repository.path,
            base,
            kind.files,
            config.planning.context_tokens,
            readable=Permissions(config.permissions).path_readable,
        )
    budget = budget_usd if budget_usd is not None else config.budget_usd
    job_id = record_request(db, request, repository.location, base, config, budget)
    status = plan_job(db, settings, job_id, call_model)
    single = kind.kind is RequestKind.SINGLE  # the one step asked for: nothing to review
    if status == JobStatus.AWAITING_APPROVAL and (approved_by is not None or single):
        approve_job(db, settings, job_id, approved_by)
        status = JobStatus.PENDING
    inputs = [p for p in (config_path,) if p is not None] + [repository.path / CONFIG_FILE_NAME]
    warnings = left_out_warnings(repository, repo, base, inputs)
    return RequestSubmission(job_id, config, status, warnings)


def record_request(
    db: Database,
    request: str,
    location: str,
    base: str,
    config: MerlinConfig,
    budget_usd: float | None,
    replay_of: str | None = None,
) -> str:
    """Record a request's job, in status ``planning``; its id."""
    job_id = new_job_id()

    def write(session: Session) -> None:
        session.add(
            Job(
                id=job_id,
                title=_title(request),
                repo=location,
                status=JobStatus.PLANNING,
                branch=job_branch(job_id),
                base_commit=base,
                head_commit=base,
                tasklist={},
                config=config.model_dump(mode="json"),
                budget_usd=budget_usd,
                request=request,
                replay_of=replay_of,
            )
        )
        message = f"request submitted: {_title(request)}"
        add_event(session, job_id, EventKind.JOB_SUBMITTED, message)

    # One transaction, tried again if an outage cuts it (never recorded twice).
    write_patiently(db, write, lambda s: s.get(Job, job_id) is not None, f"job {job_id}")
    return job_id


def request_context(
    repository: JobRepository,
    base: str,
    config: MerlinConfig,
    request: str,
    drawn: list[str] | None = None,
) -> Callable[[Classification], RepositoryContext]:
    """What ``make_plan`` reads of the repository: attached files, README, tree, specs.

    ``drawn`` is filled with the paths of the specs the planner is given.
    """

    def read(kind: Classification) -> RepositoryContext:
        specs = config.specs
        constraints, paths = relevant_constraints(
            repository.path, base, specs.paths, specs.top, request, SPEC_CHARS, specs.scorer
        )
        if drawn is not None:
            drawn[:] = [str(path) for path in paths]
        budget = config.planning.context_tokens
        readable = Permissions(config.permissions).path_readable
        return read_context(
            repository.path, base, kind.files, budget, constraints, readable, request=request
        )

    return read


def plan_job(
    db: Database, settings: Settings, job_id: str, call_model: ModelCall = complete
) -> JobStatus:
    """Plan (or answer) a job in status ``planning``; its status afterwards."""
    with db.reader() as session:
        job = found(session.get(Job, job_id), job_id)
        if job.status != JobStatus.PLANNING or job.request is None:
            raise InputError(f"job {job_id} is {job.status}, not planning")
        request, location, base = job.request, job.repo, job.base_commit
        config = MerlinConfig.model_validate(job.config)
    repository = repository_of(location, settings)
    calls = JobCalls(db, job_id, call_model)
    if classify(request).kind is RequestKind.QUESTION:
        from merlin_flow.planning.questions import answer_question

        tier = config.planning_tier().name

        def so_far(transcript: list[dict[str, Any]]) -> None:  # for `merlin logs --follow`
            with db.session() as session:
                _still_planning(session, job_id).plan = question_record(tier, transcript)

        answer = answer_question(repository, base, config, request, calls, so_far)
        with db.session() as session:
            job = _still_planning(session, job_id)
            job.plan = question_record(tier, answer.transcript, answer.error, answer.citations)
            record_answer(session, job, answer.text, answer.error)
            return JobStatus(job.status)
    drawn: list[str] = []
    context = request_context(repository, base, config, request, drawn)
    made = make_plan(request, config, context, calls)
    tasklist = to_tasklist(request, made.steps)
    with db.session() as session:
        job = _still_planning(session, job_id)
        job.title = tasklist.title
        job.tasklist = tasklist.model_dump(mode="json")
        job.plan = plan_record(made, job.tasklist, drawn)
        how = "fallback plan" if made.fallback else f"plan of {len(tasklist.steps)} step(s)"
        await_approval(session, job, how)
    return JobStatus.AWAITING_APPROVAL


def question_record(
    tier: str,
    transcript: list[dict[str, Any]],
    error: str | None = None,
    citations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """What a question's job keeps of its answering.

    The tier, the conversation, the error, and each citation of the answer checked
    (``citation``, ``ok``, ``problem``, ``snippet``).
    """
    return {
        "kind": "question",
        "error": error,
        "tier": tier,
        "transcript": transcript,
        "citations": citations or [],
    }


def plan_record(
    made: Plan, tasklist: dict[str, Any], specs: list[str] | None = None
) -> dict[str, Any]:
    """What the job keeps of its planning: ``plan --json``'s fields, answers and problems.

    ``specs``: the paths of the specs the planner drew on (kept as ``specs`` when given).
    """
    return {
        **({"specs": list(specs)} if specs is not None else {}),
        **plan_json(made, dict(tasklist, steps=[dict(s) for s in tasklist["steps"]])),
        "reason": made.classification.reason,
        "answers": made.answers,
        "problems": made.problems,
        "steps": [asdict(step) for step in made.steps],
        "prompt_tokens": made.prompt_tokens,
        "completion_tokens": made.completion_tokens,
        "cost_usd": made.cost_usd,
        "seconds": round(made.seconds, 3),
        "approved_by": None,
        "approved_at": None,
    }


def approve_job(
    db: Database,
    settings: Settings,
    job_id: str,
    approved_by: str | None = None,
    tasklist: TaskList | None = None,
) -> None:
    """Accept a job's plan (or ``tasklist``, an edited one): its branch and steps are made.

    The job is then ``pending``; the caller enqueues it. The steps' exit commands and
    agents come from the files of the job's base commit, not from the work tree as it is
    now (it may have moved on, or hold edits, since the request). InputError when the job
    does not wait for approval, or the TaskList cannot run (unpriced tiers under a budget...).
    """
    with db.reader() as session:
        job = waiting(session.get(Job, job_id), job_id, "approved")
        location, base = job.repo, job.base_commit
        config = MerlinConfig.model_validate(job.config)
        chosen = tasklist or TaskList.model_validate(job.tasklist)
        budget = job.budget_usd
    chosen.check_submittable()
    require_priced_tiers(config, chosen, budget)
    repository = repository_of(location, settings)
    with refusals_as_input_errors(repository), repository.files_at(base, committed=True) as files:
        commands = default_exit_commands(chosen, config, files)  # the base's, not today's tree
        agents = choose_agents(chosen.steps, config, load_agents(files, settings.home_dir))
    check_exit_commands(chosen, config, commands)
    book = learned_routes(db, location, config)
    who = approved_by or user_name()

    def write(session: Session) -> None:
        job = waiting(session.get(Job, job_id, with_for_update=True), job_id, "approved")
        job.tasklist = chosen.model_dump(mode="json")
        job.title = chosen.title
        add_steps(job, chosen, config, commands, settings, agents, book)
        job.plan = dict(job.plan or {}, approved_by=who, approved_at=utcnow().isoformat())
        job.plan["edited"] = tasklist is not None
        approve_plan(session, job, who, edited=tasklist is not None)

    branch = job_branch(job_id)
    with refusals_as_input_errors(repository):  # of two approvers, one makes the branch
        repository.start_branch(branch, base)
    try:  # tried again if an outage cuts it, never recorded twice (as `submit`)
        write_patiently(db, write, lambda s: decided(s, job_id), f"the approval of {job_id}")
    except RecordInDoubt:
        raise  # the approval may have landed: its branch stays
    except BaseException:
        repository.drop_branch(branch)
        raise


def _still_planning(session: Session, job_id: str) -> Job:
    """The job's row, locked; InputError when another planner finished it meanwhile.

    A request is planned where it was submitted, and ``merlin resume`` plans it again if
    that was cut off: of two planners at once, the second writes nothing.
    """
    job = found(session.get(Job, job_id, with_for_update=True), job_id)
    if job.status != JobStatus.PLANNING:
        raise InputError(f"job {job_id} was planned meanwhile (it is {job.status}); kept as is")
    return job


def _title(request: str) -> str:
    line = request.strip().splitlines()[0]
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"
