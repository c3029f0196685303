"""The dashboard's live feed: the events table as server-sent events.

Each event goes out with its row id as the SSE ``id``, so a browser that reconnects
(``Last-Event-ID``), after a reload or a restart of the server, gets the events it has
not seen, none twice. The table is read every ``POLL`` seconds; a comment line every
``KEEPALIVE`` seconds keeps proxies from closing a quiet stream. Where a reader starts
(``?after=``, ``Last-Event-ID``) is read by ``event_id``: anything but an id the events
table can hold is the reader's mistake (HTTP 400), not the server's.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from sqlalchemy import func, select

from merlin_flow.errors import InputError
from merlin_flow.store import Database, Event

POLL = 0.5
KEEPALIVE = 15.0
BATCH = 500
MOST_ID = 2**31 - 1
"""The largest id ``events.id`` holds (an ``Integer``: 32 bits on PostgreSQL)."""


def event_id(text: str | None, name: str = "after") -> int:
    """``text`` (0 when not given) as the event id a reader starts after.

    InputError naming ``name`` (the query parameter, or ``Last-Event-ID``) for anything
    but a whole number from 0 to ``MOST_ID``.
    """
    if text is None or text == "":
        return 0
    if not (text.isascii() and text.isdigit() and len(text) <= 10 and int(text) <= MOST_ID):
        raise InputError(f"{name} {text[:40]!r}: an event id, a whole number from 0 to {MOST_ID}")
    return int(text)


def newest_event(db: Database) -> int:
    """The id of the newest event (0 when there is none): where a new page starts."""
    with db.reader() as session:
        return int(session.scalar(select(func.max(Event.id))) or 0)


def events_after(db: Database, after: int, job_id: str | None = None) -> list[dict[str, Any]]:
    """Up to ``BATCH`` events with an id above ``after`` (of ``job_id`` only, if given)."""
    query = select(Event).where(Event.id > after).order_by(Event.id).limit(BATCH)
    if job_id is not None:
        query = query.where(Event.job_id == job_id)
    with db.reader() as session:
        return [
            {"id": row.id, "job": row.job_id, "kind": row.kind, "step": row.step_key,
             "message": row.message}
            for row in session.scalars(query)
        ]  # fmt: skip


def sse(event: dict[str, Any]) -> str:
    """One event in the SSE wire format."""
    return f"id: {event['id']}\nevent: merlin\ndata: {json.dumps(event)}\n\n"


async def feed(
    db: Database, after: int, job_id: str | None = None, until: float | None = None
) -> AsyncIterator[str]:
    """The events after ``after``, then each new one as it is written.

    ``until``: a ``time.monotonic()`` deadline to stop at (tests); None: never.
    """
    quiet_since = time.monotonic()
    while until is None or time.monotonic() < until:
        batch = await anyio.to_thread.run_sync(events_after, db, after, job_id)
        for event in batch:
            after = event["id"]
            yield sse(event)
        if batch:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > KEEPALIVE:
            quiet_since = time.monotonic()
            yield ": keepalive\n\n"
        if len(batch) < BATCH:
            await anyio.sleep(POLL)
