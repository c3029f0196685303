"""The event stream: SSE lines with the event ids, resumable from Last-Event-ID."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio

from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.ui.stream import events_after, feed, newest_event, sse
from tests.unit.engine.finished_jobs import finished_job


def _collect(db: Database, after: int, job: str | None = None) -> list[str]:
    async def run() -> list[str]:
        return [chunk async for chunk in feed(db, after, job, until=time.monotonic() + 0.3)]

    return anyio.run(run)


def test_events_go_out_once_in_order_and_resume_after_an_id(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    assert newest_event(db) == 0
    job = finished_job(db, settings, py_repo, tmp_path, "true")
    chunks = _collect(db, 0)
    ids = [int(chunk.split("\n", 1)[0].removeprefix("id: ")) for chunk in chunks]
    assert ids == sorted(ids)
    assert len(ids) == len(set(ids)) == len(events_after(db, 0))
    assert ids[-1] == newest_event(db)
    first = json.loads(chunks[0].split("data: ", 1)[1])
    assert first["job"] == job
    assert chunks[0] == sse(first)
    later = _collect(db, ids[2])  # a browser that saw three reconnects
    assert [int(c.split("\n", 1)[0][4:]) for c in later] == ids[3:]
    assert _collect(db, 0, "other") == []
