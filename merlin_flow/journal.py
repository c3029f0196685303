"""The LLM journal: every model call recorded, and replayed when an attempt runs again.

Each call of an attempt is a row of ``llm_calls`` (tokens, cost, latency, the response,
or the error). When a worker dies in the middle of an attempt, the attempt runs again
from its start commit; its conversation then asks the same questions again. The
``Replayer`` answers them from the journal (same turn, same request hash, in order) at
no cost, and goes live at the first request that differs or was never answered. So a
crash never pays twice for a call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from merlin_flow.config import Tier
from merlin_flow.llm import Completion, complete, request_hash
from merlin_flow.store import Attempt, Database, LlmCall

ModelCheck = Callable[[Tier, list[dict[str, Any]], list[dict[str, Any]]], None]


@dataclass(frozen=True)
class CallContext:
    """Where a call belongs: the job, step and attempt, and which run of the attempt."""

    job_id: str
    step_id: int
    attempt_id: int
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


def replayable_calls(session: Session, attempt_id: int) -> list[JournalEntry]:
    """The attempt's paid answers, one per turn from turn 0, as the last run saw them."""
    rows = session.scalars(
        select(LlmCall)
        .where(
            LlmCall.attempt_id == attempt_id,
            LlmCall.error.is_(None),
            LlmCall.replayed.is_(False),
        )
        .order_by(LlmCall.seq)
    ).all()
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


class Replayer:
    """A model call (``agent.ModelCall``) that answers from the journal while it can."""

    def __init__(self, entries: list[JournalEntry], before_live: ModelCheck | None = None) -> None:
        """Replay ``entries`` (turn order) before going live.

        ``before_live`` runs before every live call and may raise (the budget check).
        """
        self._entries = entries
        self._live = not entries
        self._before_live = before_live

    def __call__(
        self, tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> Completion:
        """The journaled answer to this request if it is the next one; else a live call."""
        if not self._live:
            turn = sum(1 for m in messages if m.get("role") == "assistant")
            digest = request_hash(tier.model, messages, tools)
            entry = self._entries[turn] if turn < len(self._entries) else None
            if entry is not None and entry.turn == turn and entry.request_hash == digest:
                return Completion(
                    message=entry.message,
                    prompt_tokens=entry.prompt_tokens,
                    completion_tokens=entry.completion_tokens,
                    cost_usd=0.0,
                    latency_ms=0.0,
                    request_hash=digest,
                    replayed=True,
                )
            self._live = True  # the conversation left the journal: never come back
        if self._before_live is not None:
            self._before_live(tier, messages, tools)
        return complete(tier, messages, tools)


def record_call(
    db: Database,
    context: CallContext,
    seq: int,
    turn: int,
    reply: Completion | None,
    error: BaseException | None,
) -> None:
    """Write one call to the journal; a paid call adds its tokens and cost to the attempt."""
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
            if not reply.replayed:
                session.execute(
                    update(Attempt)
                    .where(Attempt.id == context.attempt_id)
                    .values(
                        prompt_tokens=Attempt.prompt_tokens + reply.prompt_tokens,
                        completion_tokens=Attempt.completion_tokens + reply.completion_tokens,
                        cost_usd=Attempt.cost_usd + reply.cost_usd,
                    )
                    .execution_options(synchronize_session=False)
                )
        session.add(call)
