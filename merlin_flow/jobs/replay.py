"""``merlin replay``: run a finished job again, offline, from its own journal.

The replay is a new job on a new branch, from the original's base commit, with the
original's TaskList and configuration. Its model calls are answered by the original
job's journal, turn by turn (``merlin_flow.models.journal.OriginalJournal``), and nothing goes
live; its tools and exit commands run for real. So the replay shows whether the job's
outcome follows from its recorded answers: same path of attempts, same trees at every
step. Commit ids differ (they carry dates and the job id); trees are compared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from merlin_flow.agents.choice import AgentChoice, stored_agent
from merlin_flow.config import MerlinConfig
from merlin_flow.errors import InputError, JobNotFoundError
from merlin_flow.jobs.submission import create_job
from merlin_flow.models.journal import OriginalJournal, replayable_calls
from merlin_flow.settings import Settings
from merlin_flow.store import Attempt, Database, Event, Job, JobStatus, LlmCall, Step
from merlin_flow.store.events import EventKind
from merlin_flow.tasklist import TaskList
from merlin_flow.workspace.git import git
from merlin_flow.workspace.repository import JobRepository, repository_of


def create_replay(db: Database, settings: Settings, job_id: str) -> str:
    """Create the replay job of finished job ``job_id``; returns its id (not enqueued).

    A question is answered again here, from the original's journal: its replay has
    finished when this returns.
    """
    with db.reader() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        if job.finished_at is None:
            raise InputError(
                f"job {job_id} has not finished (status {job.status}); "
                "only a finished job can be replayed"
            )
        if job.status == JobStatus.REJECTED:
            raise InputError(f"job {job_id} was rejected: nothing ran, so nothing can be replayed")
        if (job.plan or {}).get("kind") == "question":
            return _replay_question(db, settings, job)
        tasklist = TaskList.model_validate(job.tasklist)
        config = MerlinConfig.model_validate(job.config)
        repo, base, budget = job.repo, job.base_commit, job.budget_usd
        commands = [step.exit_command for step in job.steps]
        agents = [  # the agents the original ran with, not today's files
            AgentChoice(stored_agent(step.agent_spec), step.agent_choice, step.agent_score)
            for step in job.steps
        ]
    return create_job(
        db,
        settings,
        tasklist,
        repo,
        config,
        budget_usd=budget,
        base_commit=base,
        replay_of=job_id,
        exit_commands=commands,
        agents=agents,
    )


def _replay_question(db: Database, settings: Settings, job: Job) -> str:
    """Answer ``job``'s question again, every call answered by the original's journal."""
    from merlin_flow.jobs.requesting import plan_job, record_request

    with db.reader() as session:
        entries = replayable_calls(session, None, job_id=job.id)
    config = MerlinConfig.model_validate(job.config)
    request = job.request or ""
    replay_id = record_request(
        db, request, job.repo, job.base_commit, config, job.budget_usd, replay_of=job.id
    )
    plan_job(db, settings, replay_id, OriginalJournal(entries, f"the question of job {job.id}"))
    return replay_id


@dataclass(frozen=True)
class StepComparison:
    """One step of the original job beside the same step of its replay."""

    step: str
    original_path: str
    replay_path: str
    original_commit: str | None
    replay_commit: str | None
    same_tree: bool

    @property
    def reproduced(self) -> bool:
        """Same attempts (kind and tier, in order) ending on the same tree."""
        return self.same_tree and self.original_path == self.replay_path


@dataclass(frozen=True)
class ReplayReport:
    """Whether a replay reached what the original job reached."""

    original: str
    replay: str
    original_status: JobStatus
    replay_status: JobStatus
    steps: list[StepComparison]
    calls: int
    identical_requests: int
    """Replay requests whose hash equals the original's at the same turn."""
    resumes: int = 0
    """Times the original was resumed (``merlin resume``): a replay runs in one go."""
    original_answer: str | None = None
    """A question's answer, and its replay's (a job with steps has neither)."""
    replay_answer: str | None = None

    @property
    def reproduced(self) -> bool:
        """Same final status, every step reproduced, and the same answer."""
        return (
            self.original_status == self.replay_status
            and all(s.reproduced for s in self.steps)
            and self.original_answer == self.replay_answer
        )

    @property
    def differences(self) -> list[str]:
        """Why the replay is not a reproduction, one line per difference (empty if it is)."""
        lines = []
        if self.original_status != self.replay_status:
            lines.append(f"the original {self.original_status}, the replay {self.replay_status}")
        if self.original_answer != self.replay_answer:
            lines.append("the replay's answer differs from the original's")
        for step in self.steps:
            if step.original_path != step.replay_path:
                lines.append(
                    f"step {step.step}: the original's attempts were {step.original_path}, "
                    f"the replay's {step.replay_path}"
                )
            elif not step.same_tree:
                lines.append(f"step {step.step}: same attempts, but they ended on other files")
        if lines and self.resumes:
            lines.append(
                f"the original was resumed {self.resumes} time(s) (merlin resume): the replay "
                "runs in one go, without the failure, the wait or the tier chosen at resume"
            )
        return lines

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data, with the verdict."""
        data = asdict(self)
        data["reproduced"] = self.reproduced
        data["differences"] = self.differences
        for step, comparison in zip(data["steps"], self.steps, strict=True):
            step["reproduced"] = comparison.reproduced
        return data


def compare(db: Database, settings: Settings, replay_id: str) -> ReplayReport:
    """Compare replay job ``replay_id`` with the job it replays."""
    with db.reader() as session:
        replay = session.get(Job, replay_id)
        if replay is None or replay.replay_of is None:
            raise JobNotFoundError(f"no replay job with id {replay_id!r}")
        original = session.get_one(Job, replay.replay_of)
        repository = repository_of(original.repo, settings)
        replayed = {step.key: step for step in replay.steps}
        steps = []
        for step in original.steps:
            twin = replayed[step.key]
            old, new = _final_commit(step), _final_commit(twin)
            steps.append(
                StepComparison(
                    step=step.key,
                    original_path=_path(step),
                    replay_path=_path(twin),
                    original_commit=old,
                    replay_commit=new,
                    same_tree=(
                        _tree(repository, original.id, old) == _tree(repository, replay.id, new)
                    ),
                )
            )
        calls, identical = _request_agreement(session, original.id, replay.id)
        resumes = session.scalar(
            select(func.count())
            .select_from(Event)
            .where(Event.job_id == original.id, Event.kind == EventKind.JOB_RESUMED)
        )
        return ReplayReport(
            original=original.id,
            replay=replay.id,
            original_status=JobStatus(original.status),
            replay_status=JobStatus(replay.status),
            steps=steps,
            calls=calls,
            identical_requests=identical,
            resumes=int(resumes or 0),
            original_answer=original.answer,
            replay_answer=replay.answer,
        )


def _final_commit(step: Step) -> str | None:
    attempts = list(step.attempts)
    return attempts[-1].commit if attempts else None


def _path(step: Step) -> str:
    return ", ".join(f"{a.kind}@{a.tier}" for a in step.attempts) or "-"


def _tree(repository: JobRepository, job_id: str, commit: str | None) -> str | None:
    if commit is None:
        return None
    repository.have(job_id, commit)
    return git("rev-parse", f"{commit}^{{tree}}", cwd=repository.path).strip()


def _request_agreement(session: Session, original_id: str, replay_id: str) -> tuple[int, int]:
    """How many replay calls there were, and how many sent the original's exact request."""

    def hashes(job_id: str) -> dict[tuple[str, int, int], str]:
        answered = (LlmCall.job_id == job_id) & LlmCall.error.is_(None)
        rows = session.execute(
            select(Step.key, Attempt.number, LlmCall.turn, LlmCall.request_hash)
            .join(Attempt, LlmCall.attempt_id == Attempt.id)
            .join(Step, Attempt.step_id == Step.id)
            .where(answered)
            .order_by(LlmCall.seq)
        ).all()
        own = session.execute(  # the job's own: planning, a question
            select(LlmCall.turn, LlmCall.request_hash)
            .where(answered, LlmCall.attempt_id.is_(None))
            .order_by(LlmCall.seq)
        ).all()
        found = {(key, number, turn): digest for key, number, turn, digest in rows}
        return found | {("", 0, turn): digest for turn, digest in own}

    old, new = hashes(original_id), hashes(replay_id)
    return len(new), sum(1 for key, digest in new.items() if old.get(key) == digest)
