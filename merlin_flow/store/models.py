"""SQLAlchemy models: jobs, steps, attempts, LLM calls, events, budget holds, worker beats.

The database is the source of truth. Celery messages carry a job id and a step key and
nothing else; a task starts by loading these rows. The schema is created and changed
only by the Alembic migrations in ``alembic/versions``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from merlin_flow.failures import AttemptKind
from merlin_flow.store.status import Phase

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """Naive UTC now: stored and compared the same way on SQLite and Postgres."""
    return datetime.now(UTC).replace(tzinfo=None)


IDENTIFIER = {"identifier": True}
"""``info`` of a ``Text`` column that holds one of merlin's own identifiers (a path, a
branch, a model): never redacted (``database._may_hold_secrets``)."""


class Base(DeclarativeBase):
    """Base of merlin's tables."""

    metadata = MetaData(naming_convention=NAMING)


class Job(Base):
    """One submitted TaskList run against one repository."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    title: Mapped[str] = mapped_column(Text)
    repo: Mapped[str] = mapped_column(Text, index=True, info=IDENTIFIER)
    status: Mapped[str] = mapped_column(String(24), index=True)
    branch: Mapped[str] = mapped_column(Text, info=IDENTIFIER)
    base_commit: Mapped[str] = mapped_column(String(64))
    head_commit: Mapped[str] = mapped_column(String(64))
    tasklist: Mapped[dict[str, Any]] = mapped_column(JSON)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    patch_path: Mapped[str | None] = mapped_column(Text, info=IDENTIFIER)
    budget_usd: Mapped[float | None] = mapped_column(Float)
    replay_of: Mapped[str | None] = mapped_column(String(32))
    """For a job made by ``merlin replay``: the job whose journal answers its calls."""
    request: Mapped[str | None] = mapped_column(Text)
    """For a job made from a request in plain words: the request, as given."""
    plan: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """How the request was planned (``merlin_flow.jobs.requesting``): the planner's raw answers,
    the parsed steps, the problems, and who approved the plan and when."""
    answer: Mapped[str | None] = mapped_column(Text)
    """For a question: the answer, the job's result."""
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)

    steps: Mapped[list[Step]] = relationship(
        back_populates="job", order_by="Step.position", cascade="all, delete-orphan"
    )


class Step(Base):
    """One step of a job, with the lease that lets exactly one worker act on it."""

    __tablename__ = "steps"
    __table_args__ = (UniqueConstraint("job_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(64))
    step_type: Mapped[str] = mapped_column(String(16))
    description: Mapped[str] = mapped_column(Text)
    verification: Mapped[str] = mapped_column(Text, default="")
    exit_command: Mapped[str] = mapped_column(Text)
    agent: Mapped[str | None] = mapped_column(String(128))
    """The name of the step's agent (None: merlin's plain coding agent)."""
    agent_spec: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """The agent's definition as it was at submission (``AgentDefinition.to_record``)."""
    agent_choice: Mapped[str | None] = mapped_column(String(16))
    """How the agent was chosen: ``named`` (by the step), ``default``, ``autodelegated``."""
    agent_score: Mapped[float | None] = mapped_column(Float)
    """The autodelegation match score of the chosen agent."""
    depends_on: Mapped[list[str]] = mapped_column(JSON, default=list)
    """The steps that must pass before this one starts (``merlin_flow.engine.graph``)."""
    on_failure: Mapped[str] = mapped_column(String(16), default="stop", server_default="stop")
    """``stop``: the step's failure fails the job; ``continue``: its dependents are skipped."""
    status: Mapped[str] = mapped_column(String(16))
    # 'attempt': the next attempt must be made; 'verify': the last attempt awaits its
    # exit command; 'done': nothing more to do.
    phase: Mapped[str] = mapped_column(String(16), default=Phase.ATTEMPT.value)
    tier_index: Mapped[int] = mapped_column(Integer, default=0)
    complexity: Mapped[str | None] = mapped_column(String(16))
    route: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Where the step started and why (``merlin_flow.planning.route_learning.Route``)."""
    next_kind: Mapped[str] = mapped_column(String(16), default=AttemptKind.EXECUTE.value)
    base_commit: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    result: Mapped[str | None] = mapped_column(Text)
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime, index=True)
    deliveries: Mapped[int] = mapped_column(Integer, default=0)
    recoveries: Mapped[int] = mapped_column(Integer, default=0)
    """Losses of its worker counted against the step (``merlin_flow.engine.recovery``): those in
    which it was the only step lost; past ``max_recoveries`` it is parked as poison."""
    losses: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Every take-over of the step from a lost worker, counted against it or not."""
    lost_at: Mapped[datetime | None] = mapped_column(DateTime, index=True)
    """When the recovery sweep last took the step over from a lost worker."""
    lost_by: Mapped[str | None] = mapped_column(String(128))
    """The lease token of the worker it was last taken over from."""
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)

    job: Mapped[Job] = relationship(back_populates="steps")
    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="step", order_by="Attempt.number", cascade="all, delete-orphan"
    )


class Attempt(Base):
    """One try at a step on one tier: the agent's commit and the exit command's verdict."""

    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("step_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    step_id: Mapped[int] = mapped_column(ForeignKey("steps.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    tier: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(Text, info=IDENTIFIER)
    # running -> committed -> passed | failed; or running -> error (the agent gave up)
    status: Mapped[str] = mapped_column(String(16))
    start_commit: Mapped[str] = mapped_column(String(64))
    commit: Mapped[str | None] = mapped_column(String(64))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    output_tail: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    failure_kind: Mapped[str | None] = mapped_column(String(16))
    """Why the attempt failed (``merlin_flow.failures.FailureKind``), as its worker saw it;
    None when it did not fail, or was closed with its step (``lifecycle.end_job``). The
    escalation decision reads None as a capability failure."""
    feedback: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[str | None] = mapped_column(Text)
    transcript: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    """The attempt's conversation (user, assistant and tool messages) for `merlin logs`."""
    turns: Mapped[int] = mapped_column(Integer, default=0)
    runs: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    started_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)

    step: Mapped[Step] = relationship(back_populates="attempts")


class LlmCall(Base):
    """One completion request of an attempt, with its tokens, cost and response."""

    __tablename__ = "llm_calls"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    step_id: Mapped[int | None] = mapped_column(Integer)
    attempt_id: Mapped[int | None] = mapped_column(
        ForeignKey("attempts.id", ondelete="CASCADE"), index=True
    )
    """NULL for a call made for the job as a whole: planning, or answering a question."""
    seq: Mapped[int] = mapped_column(Integer)
    turn: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    run: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    tier: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(Text, info=IDENTIFIER)
    request_hash: Mapped[str] = mapped_column(String(64), index=True)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    """USD paid; NULL for a failed call, or a paid one of unknown price (``llm.call_price``)."""
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    response: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    replayed: Mapped[bool] = mapped_column(Boolean, default=False)
    """Answered from the journal (a crashed attempt's own calls, or ``merlin replay``)."""
    cached: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Answered by the response cache from an identical earlier request."""
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Event(Base):
    """Something that happened to a job, in order: the job's history."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(32))
    step_key: Mapped[str | None] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class BudgetHold(Base):
    """A live model call's estimated cost, held against its job's budget until it is paid.

    Steps of one job run at once: each call holds its estimate, so two calls cannot
    both spend the budget's last dollar. A hold its worker never released (killed
    mid-call) stops counting at ``expires_at``.
    """

    __tablename__ = "budget_holds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    amount_usd: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[datetime] = mapped_column(DateTime)


class WorkerBeat(Base):
    """A worker that is alive: it writes ``last_seen`` at every recovery sweep."""

    __tablename__ = "worker_beats"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    queues: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
