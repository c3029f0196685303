"""Step messages a killed worker had reserved run elsewhere within a lease.

A worker reserves up to ``--concurrency`` messages at once. Killed between receiving
them and claiming their steps, it takes them along: Redis keeps them unacknowledged for
its visibility timeout (hours), the embedded broker never delivers them again. The
recovery sweep must notice (``merlin_flow.engine.recovery``: a queued step whose message is
neither waiting nor just delivered) and publish them again within a lease, not after
the hand-off time (``MERLIN_HANDOFF_SECONDS``, 300 s).

To hold the window open, the first worker's pool processes are stopped (SIGSTOP) before
the jobs are submitted: its main process still reserves the messages, and nothing
claims them. Its own sweep looks only once a minute (``MERLIN_SWEEP_INTERVAL``), so it
never publishes them again itself while the test waits for it to hold both, however slow
the machine. It is killed as soon as it holds both; a second worker then starts, and the
time is measured from that worker's ``ready`` (its start is not the sweep's work: on a
loaded machine it alone took 15 s).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text

from merlin_flow.engine.leases import QUEUED
from merlin_flow.store import Step
from tests.e2e.conftest import Backend
from tests.e2e.helpers import (
    kill_worker,
    merlin,
    merlin_env,
    start_worker,
    stop_worker,
    wait_for,
    write_job_files,
)

pytestmark = pytest.mark.e2e

LEASE = 15.0
"""Seconds: the second worker's sweep must publish the lost messages well within this."""
TASKLIST = """\
title: One step
steps:
  - id: docs
    step_type: Refactor
    description: add a README
    exit_command: test -f README.md
"""


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def all_reserved(backend: Backend, home: Path) -> bool:
    """Whether a worker took both messages off the queue and has not acknowledged them.

    The embedded broker's delivered rows are purged by the sweep: there, no message
    left waiting means both were delivered.
    """
    if backend.name == "embedded":
        engine = create_engine(f"sqlite:///{home / 'broker.db'}")
        try:
            with engine.connect() as conn:
                waiting = conn.scalar(text("SELECT count(*) FROM kombu_message WHERE visible = 1"))
                return waiting == 0
        finally:
            engine.dispose()
    import redis

    client = redis.Redis.from_url(backend.env["MERLIN_BROKER_URL"])
    try:
        return int(client.hlen("unacked")) >= 2
    finally:
        client.close()


def claimed(db: Any, job_ids: list[str]) -> int:
    """Steps of ``job_ids`` a worker has claimed (or finished)."""
    with db.reader() as session:
        return int(
            session.scalar(
                select(func.count()).where(
                    Step.job_id.in_(job_ids),
                    (Step.lease_owner != QUEUED) | Step.lease_owner.is_(None),
                )
            )
            or 0
        )


def test_messages_a_killed_worker_reserved_run_elsewhere_within_a_lease(
    tmp_path: Path, py_repo: Path, backend: Backend
) -> None:
    home = tmp_path / "home"
    env = merlin_env(home, **backend.env)
    tasklist, config = write_job_files(tmp_path / "job", tasklist=TASKLIST, lease_seconds=LEASE)
    log = tmp_path / "first.log"
    first = start_worker({**env, "MERLIN_SWEEP_INTERVAL": "60"}, log, "--concurrency", "2")
    second = None
    try:
        wait_for(lambda: " ready." in log.read_text(), 60, "the first worker to be ready")
        pool = children(first.pid)
        assert len(pool) >= 2, pool
        for pid in pool:
            os.kill(pid, signal.SIGSTOP)
        job_ids = []
        for _ in range(2):
            result = merlin(
                env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config),
                "--json",
            )  # fmt: skip
            assert result.returncode == 0, result.stderr
            job_ids.append(json.loads(result.stdout)["job_id"])
        wait_for(lambda: all_reserved(backend, home), 30, "the first worker to reserve both")
        kill_worker(first)  # at once: its own sweep would publish them again in seconds
        killed = time.monotonic()
        db = backend.open(home)
        assert claimed(db, job_ids) == 0
        second_log = tmp_path / "second.log"
        second = start_worker(env, second_log, "--concurrency", "2")
        wait_for(lambda: " ready." in second_log.read_text(), 90, "the second worker", 0.1)
        ready = time.monotonic()
        wait_for(lambda: claimed(db, job_ids) == 2, 60, "both steps to be claimed again", 0.1)
        took = time.monotonic() - ready
        print(
            f"[{backend.name}] reserved steps claimed again {took:.1f} s after the second "
            f"worker was ready ({ready - killed:.1f} s after the kill)"
        )
        wait_for(
            lambda: all(
                json.loads(merlin(env, "status", j, "--json").stdout)["finished_at"]
                for j in job_ids
            ),
            60,
            "both jobs to finish",
        )
    finally:
        kill_worker(first)
        if second is not None:
            stop_worker(second)
    assert took < LEASE, f"the reserved steps waited {took:.1f} s for a ready worker"
    for job_id in job_ids:
        status = json.loads(merlin(env, "status", job_id, "--json").stdout)
        assert status["status"] == "completed"
        assert status["steps"][0]["recoveries"] == 0  # a lost message costs the step nothing
