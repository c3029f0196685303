"""The LLM journal: every model call recorded, and replayed when an attempt runs again.

Each call of an attempt is a row of ``llm_calls`` (tokens, cost, latency, the response,
or the error). When a worker dies in the middle of an attempt, the attempt runs again
from its start commit; its conversation then asks the same questions again. The
``Replayer`` answers them from the journal (same turn, same request hash, in order) at
no cost, and goes live at the first request that differs or was never answered. So a
crash never pays twice for a call.

Two more sources can answer before a paid call:

- the response cache (``response_cache = true``): an identical request (same model,
  messages and tools; every call is made at temperature 0) answered before, by any job;
- ``merlin replay``: a replay job's calls are answered by the original job's journal,
  by position (same step, attempt and turn), and nothing goes live.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from merlin_flow.config import Tier
from merlin_flow.errors import ReplayDiverged
from merlin_flow.models.llm import Completion, ModelCall, complete, request_hash
from merlin_flow.store import Attempt, Database, LlmCall

ModelCheck = Callable[[Tier, list[dict[str, Any]], list[dict[str, Any]]], None]


@dataclass(frozen=True)
class CallContext:
    """Where a call belongs: the job, step and attempt, and which run of the attempt.

    A call made for the job as a whole (planning, answering a question) has no step and
    no attempt.
    """

    job_id: str
    step_id: int | None
    attempt_id: int | None
    run: int
    tier: Tier


@dataclass(frozen=True)
class JournalEntry:
    """A paid, successful call that a later run of the attempt may replay."""

    turn: int
    request_hash: str
    message: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int


def replayable_calls(
    session: Session, attempt_id: int | None, *, paid_only: bool = True, job_id: str = ""
) -> list[JournalEntry]:
    """The attempt's answers, one per turn from turn 0, as the last run saw them.

    ``attempt_id`` None: the job's own calls (planning, a question), of job ``job_id``.
    ``paid_only`` leaves out answers that were themselves replays (a crashed attempt's
    rerun replays only what was paid for; ``merlin replay`` takes every answer).
    """
    owner = (
        LlmCall.attempt_id == attempt_id
        if attempt_id is not None
        else (LlmCall.job_id == job_id) & LlmCall.attempt_id.is_(None)
    )
    query = select(LlmCall).where(owner, LlmCall.error.is_(None))
    if paid_only:
        query = query.where(LlmCall.replayed.is_(False))
    rows = session.scalars(query.order_by(LlmCall.seq)).all()
    by_turn = {row.turn: row for row in rows}  # a later run's answer wins
    entries: list[JournalEntry] = []
    while (row := by_turn.get(len(entries))) is not None and row.response is not None:
        entries.append(
            JournalEntry(
                row.turn,
                row.request_hash,
                row.response,
                row.prompt_tokens,
                row.completion_tokens,
            )
        )
    return entries


def _turn(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant")


def _answer(entry: JournalEntry, digest: str, *, cached: bool = False) -> Completion:
    """A journaled answer, free this time."""
    return Completion(
        message=entry.message,
        prompt_tokens=entry.prompt_tokens,
        completion_tokens=entry.completion_tokens,
        cost_usd=0.0,
        latency_ms=0.0,
        request_hash=digest,
        replayed=not cached,
        cached=cached,
    )


class ResponseCache:
    """Answers a request from any earlier successful call with the same request hash."""

    def __init__(self, db: Database) -> None:
        """Look answers up in ``db``'s journal."""
        self._db = db

    def lookup(self, digest: str) -> JournalEntry | None:
        """The latest answer to the request ``digest``, or None."""
        with self._db.reader() as session:
            row = session.scalars(
                select(LlmCall)
                .where(
                    LlmCall.request_hash == digest,
                    LlmCall.error.is_(None),
                    LlmCall.response.is_not(None),
                    # Replayed rows answered by position (merlin replay): their answer may
                    # belong to a different request. Paid and cached rows are exact.
                    LlmCall.replayed.is_(False),
                )
                .order_by(LlmCall.id.desc())
                .limit(1)
            ).first()
            if row is None or row.response is None:
                return None
            return JournalEntry(
                row.turn, digest, row.response, row.prompt_tokens, row.completion_tokens
            )


class OriginalJournal:
    """The model of a replay job: the original attempt's answers, turn by turn."""

    def __init__(self, entries: list[JournalEntry], where: str) -> None:
        """Answer from ``entries`` (the original attempt's, in turn order)."""
        self._entries = entries
        self._where = where

    def __call__(
        self, tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> Completion:
        """The original answer at this turn; ReplayDiverged when there was none."""
        turn = _turn(messages)
        if turn >= len(self._entries):
            raise ReplayDiverged(f"the original job made no call at {self._where}, turn {turn}")
        return _answer(self._entries[turn], request_hash(tier.model, messages, tools))


class Replayer:
    """A model call (``llm.ModelCall``) that answers from the journal while it can."""

    def __init__(
        self,
        entries: list[JournalEntry],
        before_live: ModelCheck | None = None,
        *,
        cache: ResponseCache | None = None,
        live: ModelCall = complete,
    ) -> None:
        """Replay ``entries`` (turn order), then ask ``cache``, then go ``live``.

        ``before_live`` runs before every live call and may raise (the budget check).
        """
        self._entries = entries
        self._live = not entries
        self._before_live = before_live
        self._cache = cache
        self._call = live

    def __call__(
        self, tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> Completion:
        """The journaled answer to this request if it is the next one; else a live call."""
        digest = request_hash(tier.model, messages, tools)
        if not self._live:
            turn = _turn(messages)
            entry = self._entries[turn] if turn < len(self._entries) else None
            if entry is not None and entry.turn == turn and entry.request_hash == digest:
                return _answer(entry, digest)
            self._live = True  # the conversation left the journal: never come back
        if self._cache is not None and (hit := self._cache.lookup(digest)) is not None:
            return _answer(hit, digest, cached=True)
        if self._before_live is not None:
            self._before_live(tier, messages, tools)
        return self._call(tier, messages, tools)


def record_call(
    db: Database,
    context: CallContext,
    seq: int,
    turn: int,
    reply: Completion | None,
    error: BaseException | None,
) -> None:
    """Write one call to the journal; a paid call adds its tokens and cost to the attempt.

    A refusal (``ModelRefused``) is an error that was paid for: its reply's usage counts.
    """
    paid = getattr(error, "completion", None)
    if reply is None and isinstance(paid, Completion):
        reply = paid
    with db.session() as session:
        call = LlmCall(
            job_id=context.job_id,
            step_id=context.step_id,
            attempt_id=context.attempt_id,
            seq=seq,
            turn=turn,
            run=context.run,
            tier=context.tier.name,
            model=context.tier.model,
            request_hash=reply.request_hash if reply else "",
            error=f"{type(error).__name__}: {error}"[:2000] if error else None,
        )
        if reply is not None:
            call.prompt_tokens = reply.prompt_tokens
            call.completion_tokens = reply.completion_tokens
            call.cost_usd = reply.cost_usd
            call.latency_ms = reply.latency_ms
            call.response = reply.message
            call.replayed = reply.replayed
            call.cached = reply.cached
            if not (reply.replayed or reply.cached) and context.attempt_id is not None:
                session.execute(
                    update(Attempt)
                    .where(Attempt.id == context.attempt_id)
                    .values(
                        prompt_tokens=Attempt.prompt_tokens + reply.prompt_tokens,
                        completion_tokens=Attempt.completion_tokens + reply.completion_tokens,
                        cost_usd=Attempt.cost_usd + (reply.cost_usd or 0.0),  # known part
                    )
                    .execution_options(synchronize_session=False)
                )
        session.add(call)


class JobCalls:
    """The model call of a job's own conversation: planning it, or answering its question.

    Answered from the job's journal while the conversation asks what it asked before
    (the process that planned died: the new run pays nothing twice), then live; every
    call is recorded against the job, with no step and no attempt.
    """

    def __init__(self, db: Database, job_id: str, live: ModelCall = complete) -> None:
        """Replay ``job_id``'s journaled calls, then call ``live``."""
        self._db = db
        self._job_id = job_id
        mine = (LlmCall.job_id == job_id) & LlmCall.attempt_id.is_(None)
        with db.reader() as session:
            entries = replayable_calls(session, None, job_id=job_id)
            self._seq = session.scalar(select(func.count()).where(mine)) or 0
            self._run = (session.scalar(select(func.max(LlmCall.run)).where(mine)) or 0) + 1
        self._replayer = Replayer(entries, live=live)

    def __call__(
        self, tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> Completion:
        """One call, journaled (a failed one too, then raised again)."""
        context = CallContext(self._job_id, None, None, self._run, tier)
        self._seq += 1
        try:
            reply = self._replayer(tier, messages, tools)
        except Exception as exc:
            record_call(self._db, context, self._seq, _turn(messages), None, exc)
            raise
        record_call(self._db, context, self._seq, _turn(messages), reply, None)
        return reply
