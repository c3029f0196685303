"""Benchmark: the jobs dashboard (``merlin ui``) over 10,000 finished jobs.

Run: ``python -m tests.bench.dashboard [--backend sqlite|postgres|both]`` (about 1.5
minutes on SQLite, 2 on Postgres, most of it writing the jobs). It writes its section of
docs/BENCHMARKS.md (``--no-docs`` to leave the file alone; ``--smoke``: 150 jobs, one
request of each page, two events, one profiled request, on both backends, Postgres
skipped with a notice where it is missing unless ``CI`` is set; never writes it).

For each backend it makes a temporary ``MERLIN_HOME`` (the embedded SQLite store, made
and migrated by ``open_database`` as merlin does on first use; or, with ``postgres``, a
database of its own on ``MERLIN_TEST_POSTGRES_URL``'s server, upgraded as ``merlin db
upgrade`` does, analyzed after the inserts as autovacuum would, and dropped after), then
bulk-inserts, with SQLAlchemy Core:

- 10,000 finished jobs created over 30 days in four repositories: most completed, some
  failed, partially completed, cancelled, over budget, parked or rejected; 1 to 6 steps
  each, attempts that escalate local -> fast -> premium with fixes between, their
  transcripts, journal rows and events, as the engine writes them;
- one job of 40 steps x 5 attempts (200 attempts, 12 turns each: transcripts, 2,400
  journal rows, the events);
- one pending job of 60 steps, for the live feed.

Then it starts a real ``merlin ui --port PORT`` (uvicorn) and times, from this process
over HTTP (httpx, one kept-alive connection), ``--requests`` requests of each page:

- (a) the jobs page ``GET /`` (``Accept: text/html``), and with filters and its second
  page: target 300 ms;
- (c) the 200-attempt job's page ``/jobs/ID``, its ``/jobs/ID/body`` fragment (what
  the page fetches on each event) and ``/api/jobs/ID``: target 500 ms;
- (b) an event reaching an open page: two SSE clients stay connected to ``/events``
  (the jobs page's stream, and the job page's ``?job=ID``), and the benchmark makes
  ``--events`` real state transitions of the pending job (``lifecycle.start_job``, then
  ``start_step`` step by step, each writing its event with ``add_event``), a random
  0.2-0.7 s apart; the time runs from opening the writing transaction to the client
  reading the event. Target 1 s.

It reports the median, the 95th percentile (nearest rank) and the slowest of each. Then it
profiles pages in this process (the same app on the same database through
``httpx.ASGITransport``, its worker threads run inline so that cProfile sees them): always
``/`` and the 200-attempt job's page (a summary of the latter goes to the docs), and
every page that missed its target (or every page, ``--profile``), printing their hot
functions, their SQL statements with count and time, and the garbage collector's time.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import cProfile
import gc
import json
import math
import os
import platform
import pstats
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.bench.docs_section import write_section
from tests.bench.processes import READY_SECONDS

HEADING = "## Dashboard"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md"
ROOT = Path(__file__).resolve().parents[2]
JOBS_TARGET, EVENT_TARGET, JOB_TARGET = 0.300, 1.0, 0.500
POSTGRES_ADMIN_URL = os.environ.get(
    "MERLIN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
"""The server the ``postgres`` backend makes its database on (as the tests do)."""
BIG_STEPS, BIG_ATTEMPTS, BIG_TURNS = 40, 5, 12
LIVE_STEPS = 60
TIERS = (  # name, model, USD per million tokens in / out (the shipped defaults' tiers)
    ("local", "ollama_chat/qwen2.5-coder:7b", 0.0, 0.0),
    ("fast", "openai/gpt-4o-mini", 0.15, 0.60),
    ("premium", "anthropic/claude-sonnet-4-5", 3.0, 15.0),
)
PASS_RATE = (0.55, 0.75, 0.9)
"""How often an attempt passes on each tier (the others fail their exit command)."""
STATUSES = (("completed", 74), ("failed", 12), ("partially_completed", 4), ("cancelled", 4),
            ("budget_exceeded", 2), ("parked", 1), ("rejected", 3))  # fmt: skip
REPOS = (("/srv/git/api", 4), ("/srv/git/web", 3),
         ("https://github.com/acme/billing.git", 2), ("/srv/git/infra", 1))  # fmt: skip
STEP_TYPES = ("Debug", "Feature", "Refactor", "Test", "Verify")
TEXT = "".join(
    f"    value_{n} = compute(value_{n - 1}, limit={n % 17}, name='field_{n}')  # step {n}\n"
    for n in range(4000)
)
"""Code-like text the transcripts, outputs and answers are cut from."""


def cut(rng: random.Random, size: int) -> str:
    start = rng.randrange(0, len(TEXT) - size)
    return TEXT[start : start + size]


# -- seeding --------------------------------------------------------------------------------


@dataclass
class Rows:
    """Rows to insert, with the ids of steps and attempts given here (attempts refer to them)."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    next_step: int = 1
    next_attempt: int = 1
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def event(self, job: str, kind: str, message: str, at: datetime,
              step: str | None = None, data: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.events.append({"job_id": job, "step_key": step, "kind": kind, "message": message,
                            "data": data or {}, "created_at": at})  # fmt: skip

    def flush(self, db: Any) -> None:
        from sqlalchemy import insert

        from merlin_flow.store import Attempt, Event, Job, LlmCall, Step

        tables = ((Job, self.jobs), (Step, self.steps), (Attempt, self.attempts),
                  (LlmCall, self.calls), (Event, self.events))  # fmt: skip
        with db.session() as session:
            for model, rows in tables:
                if rows:
                    session.execute(insert(model), rows)
                    self.counts[model.__tablename__] += len(rows)
                    rows.clear()


@dataclass(frozen=True)
class AttemptPlan:
    kind: str  # AttemptKind
    tier: int
    status: str  # AttemptStatus


def attempt_path(rng: random.Random, start: int, outcome: str) -> list[AttemptPlan]:
    """A step's attempts: execute, fix on the same tier, escalate to the next, fix, ...

    ``outcome``: ``pass`` (the last attempt passes), ``fail`` (every one fails),
    ``cancel`` (the last was cancelled), ``error`` (the last gave up: budget, model).
    """
    ladder = [("execute", start), ("fix", start)]
    for tier in range(start + 1, len(TIERS)):
        ladder += [("escalate", tier), ("fix", tier)]
    ladder = ladder[:5]
    plans: list[AttemptPlan] = []
    for number, (kind, tier) in enumerate(ladder):
        last = number == len(ladder) - 1
        if outcome == "pass" and (last or rng.random() < PASS_RATE[tier]):
            return [*plans, AttemptPlan(kind, tier, "passed")]
        if outcome in ("cancel", "error") and (last or rng.random() < 0.3):
            ended = "cancelled" if outcome == "cancel" else "error"
            return [*plans, AttemptPlan(kind, tier, ended)]
        plans.append(AttemptPlan(kind, tier, "failed"))
    return plans


def step_outcomes(rng: random.Random, status: str, count: int) -> list[str | None]:
    """Per step: the outcome of its attempts (``attempt_path``), or None for a skipped step."""
    if status == "completed":
        return ["pass"] * count
    broken = rng.randrange(count)
    ending = {"failed": "fail", "partially_completed": "fail", "cancelled": "cancel",
              "budget_exceeded": "error", "parked": "cancel"}[status]  # fmt: skip
    if status == "partially_completed":  # on_failure: continue; the next step needs it
        return [ending if n == broken else None if n == broken + 1 else "pass"
                for n in range(count)]  # fmt: skip
    return ["pass" if n < broken else ending if n == broken else None for n in range(count)]


def config_dump() -> dict[str, Any]:
    from merlin_flow.config import MerlinConfig, Tier

    tiers = [Tier(name=n, model=m, price_in=i, price_out=o) for n, m, i, o in TIERS]
    return MerlinConfig(tiers=tiers).model_dump(mode="json")


def add_job(rows: Rows, rng: random.Random, config: dict[str, Any], job_id: str, status: str,
            repo: str, created: datetime, outcomes: list[str | None], turns: tuple[int, int],
            chars: int) -> None:  # fmt: skip
    """One job with its steps, attempts, journal and events, as a worker leaves them."""
    base, head = uuid.uuid4().hex + "0" * 24, uuid.uuid4().hex + "1" * 24
    title = f"{rng.choice(('Fix', 'Add', 'Refactor', 'Test'))} {cut(rng, 40).strip()}"
    request = f"{title}, and keep the API" if rng.random() < 0.25 or status == "rejected" else None
    plan: dict[str, Any] | None = None
    if request is not None:
        plan = {"kind": "plan", "request": request, "how": "planner", "reason": "several steps",
                "answers": [cut(rng, 1500)], "problems": [], "steps": [], "prompt_tokens": 5200,
                "completion_tokens": 600, "cost_usd": 0.0247, "seconds": 7.5,
                "approved_by": None if status == "rejected" else "alice",
                "approved_at": None if status == "rejected" else f"{created.isoformat()}Z",
        }  # fmt: skip
    rows.event(job_id, "job_submitted", "job submitted", created)
    clock = created + timedelta(seconds=rng.uniform(1, 30))
    started = clock if outcomes else None
    if started is not None:
        rows.event(job_id, "job_started", "job started", clock)
    tasklist_steps = []
    for position, outcome in enumerate(outcomes):
        key, step_id = f"s{position + 1}", rows.next_step
        rows.next_step += 1
        step_type = rng.choice(STEP_TYPES)
        description = f"{cut(rng, 60).strip()}\n{cut(rng, 200)}"
        exit_command = "python -m pytest -q"
        tasklist_steps.append({"id": key, "step_type": step_type, "description": description})
        plans = attempt_path(rng, rng.choices((0, 1, 2), (5, 3, 2))[0], outcome) if outcome else []
        step_start = clock if plans else None
        if plans:
            rows.event(job_id, "step_started", f"step {key} started", clock, key)
        for number, plan_ in enumerate(plans, 1):
            clock = add_attempt(rows, rng, job_id, step_id, key, number, plan_, clock, turns, chars)
            following = plans[number] if number < len(plans) else None
            if plan_.status == "failed" and following is not None:
                kind = "escalated" if following.kind == "escalate" else "fix_planned"
                data = {"from_tier": TIERS[plan_.tier][0], "to_tier": TIERS[following.tier][0],
                        "reason": "exit command failed"}  # fmt: skip
                rows.event(job_id, kind, f"{kind.replace('_', ' ')}", clock, key, data)
        step_status = {None: "Skipped", "pass": "Completed", "fail": "Failed",
                       "cancel": "Parked" if status == "parked" else "Skipped",
                       "error": "Failed"}[outcome]  # fmt: skip
        if step_status == "Completed":
            rows.event(job_id, "step_completed", f"step {key} completed", clock, key)
        elif step_status == "Failed" and status == "partially_completed":
            rows.event(job_id, "step_failed", f"step {key} failed", clock, key)
        elif step_status == "Skipped" and not plans:
            rows.event(job_id, "step_skipped", f"skipped: the job ended ({status})", clock, key)
        last = plans[-1] if plans else None
        rows.steps.append(
            {"id": step_id, "job_id": job_id, "position": position, "key": key,
             "step_type": step_type, "description": description, "verification": "",
             "exit_command": exit_command, "depends_on": [f"s{position}"] if position else [],
             "on_failure": "continue" if status == "partially_completed" else "stop",
             "status": step_status, "phase": "done", "tier_index": last.tier if last else 0,
             "complexity": rng.choice(("simple", "medium", "complex")),
             "next_kind": "execute", "base_commit": base,
             "error": f"exit command failed on {len(plans)} attempts" if step_status == "Failed"
             else None, "result": "done" if step_status == "Completed" else None,
             "deliveries": 2 * len(plans), "recoveries": 0, "started_at": step_start,
             "finished_at": clock if plans else None}
        )  # fmt: skip
    finished = clock + timedelta(seconds=rng.uniform(1, 5))
    if status in ("failed", "cancelled", "budget_exceeded", "parked"):
        parked: dict[str, Any] | None = {"trouble": "disk_full", "tries": 3}
        rows.event(job_id, f"job_{status}", f"job {status}", finished, None,
                   parked if status == "parked" else None)  # fmt: skip
    if status == "rejected":
        rows.event(job_id, "plan_ready", "planned: waiting for approval", finished)
        rows.event(job_id, "plan_rejected", "plan rejected by bob", finished)
    else:
        patch = f"/var/lib/merlin/jobs/{job_id}/{job_id}.patch"
        rows.event(job_id, "job_finished", f"job {status}", finished, None, {"patch": patch})
    rows.jobs.append(
        {"id": job_id, "title": title, "repo": repo, "status": status,
         "branch": f"merlin/{job_id}", "base_commit": base, "head_commit": head,
         "tasklist": {"title": title, "steps": tasklist_steps}, "config": config,
         "error": None if status in ("completed", "rejected") else f"job {status}",
         "patch_path": None if status == "rejected" else f"/var/lib/merlin/jobs/{job_id}.patch",
         "budget_usd": rng.choice((None, None, 1.0, 5.0)), "request": request, "plan": plan,
         "created_at": created, "started_at": started, "finished_at": finished,
         "updated_at": finished}
    )  # fmt: skip


def add_attempt(rows: Rows, rng: random.Random, job_id: str, step_id: int, key: str,
                number: int, plan: AttemptPlan, start: datetime, turns: tuple[int, int],
                chars: int) -> datetime:  # fmt: skip
    """One attempt, its journal rows and events; returns when it ended."""
    tier, model, price_in, price_out = TIERS[plan.tier]
    attempt_id = rows.next_attempt
    rows.next_attempt += 1
    rows.event(job_id, "attempt_started", f"attempt {number} ({plan.kind}) on {tier}", start, key,
               {"attempt": number, "kind": plan.kind, "tier": tier})  # fmt: skip
    made = rng.randint(*turns)
    transcript: list[dict[str, Any]] = [{"role": "user", "content": cut(rng, chars * 2)}]
    clock, prompt, completion, cost = start, 0, 0, 0.0
    for turn in range(made):
        arguments = json.dumps({"path": f"src/mod{turn}.py", "text": cut(rng, 120)})
        call = {"id": f"call_{turn}", "type": "function", "function": {
            "name": rng.choice(("read_file", "edit_file", "bash", "grep")),
            "arguments": arguments}}  # fmt: skip
        reply = {"role": "assistant", "content": cut(rng, 160), "tool_calls": [call]}
        transcript += [reply, {"role": "tool", "tool_call_id": f"call_{turn}",
                               "content": cut(rng, chars)}]  # fmt: skip
        tokens_in, tokens_out = 1500 + 900 * turn, rng.randint(80, 600)
        priced = (tokens_in * price_in + tokens_out * price_out) / 1e6
        latency = rng.uniform(400, 9000)
        clock += timedelta(milliseconds=latency + rng.uniform(100, 3000))
        rows.calls.append(
            {"job_id": job_id, "step_id": step_id, "attempt_id": attempt_id, "seq": turn,
             "turn": turn, "run": 1, "tier": tier, "model": model,
             "request_hash": uuid.uuid4().hex * 2, "prompt_tokens": tokens_in,
             "completion_tokens": tokens_out, "cost_usd": priced, "latency_ms": latency,
             "response": reply, "error": None, "replayed": False, "cached": False,
             "created_at": clock}
        )  # fmt: skip
        prompt, completion, cost = prompt + tokens_in, completion + tokens_out, cost + priced
    transcript.append({"role": "assistant", "content": "Done: " + cut(rng, 200)})
    verified = plan.status in ("passed", "failed")
    if verified:
        rows.event(job_id, "attempt_committed", f"attempt {number} committed", clock, key,
                   {"attempt": number})  # fmt: skip
        clock += timedelta(seconds=rng.uniform(2, 90))  # the exit command
    if plan.status == "failed":
        rows.event(job_id, "verify_failed", "exit command failed (exit 1)", clock, key,
                   {"attempt": number, "exit_code": 1})  # fmt: skip
    elif plan.status == "error":
        rows.event(job_id, "attempt_error", "budget exceeded", clock, key, {"attempt": number})
    rows.attempts.append(
        {"id": attempt_id, "step_id": step_id, "number": number, "kind": plan.kind,
         "tier": tier, "model": model, "status": plan.status, "start_commit": "a" * 40,
         "commit": uuid.uuid4().hex + "b" * 8 if verified else None,
         "exit_code": {"passed": 0, "failed": 1}.get(plan.status),
         "output_tail": "FAILED tests/test_mod.py::test_value - AssertionError\n"
         + cut(rng, chars) if plan.status == "failed" else "12 passed in 0.4s\n",
         "error": "budget exceeded" if plan.status == "error" else None,
         "failure_kind": "capability" if plan.status == "failed" else None,
         "feedback": cut(rng, 300) if plan.kind != "execute" else None,
         "summary": transcript[-1]["content"], "transcript": transcript, "turns": made,
         "runs": 1, "prompt_tokens": prompt, "completion_tokens": completion, "cost_usd": cost,
         "started_at": start, "finished_at": clock}
    )  # fmt: skip
    return clock


@dataclass
class Seeded:
    """What was written: the jobs the benchmark reads, and how long writing took."""

    big: str
    live: str
    repo: str
    second_page: str
    seconds: float
    counts: dict[str, int]


def seed(db: Any, jobs: int, rng: random.Random) -> Seeded:
    """``jobs`` finished jobs, the 200-attempt job and the pending job, in chunks of 500."""
    from sqlalchemy import select

    from merlin_flow.store import Job, utcnow

    started = time.monotonic()
    now = utcnow()
    config = config_dump()
    rows = Rows()
    statuses, weights = [s for s, _ in STATUSES], [w for _, w in STATUSES]
    repos, repo_weights = [r for r, _ in REPOS], [w for _, w in REPOS]
    sizes = (1, 2, 3, 4, 5, 6)
    for n in range(jobs):
        status = rng.choices(statuses, weights)[0]
        count = 0 if status == "rejected" else rng.choices(sizes, (3, 4, 4, 3, 2, 1))[0]
        created = now - timedelta(seconds=rng.uniform(600, 30 * 86400))
        add_job(rows, rng, config, f"{rng.getrandbits(48):012x}", status,
                rng.choices(repos, repo_weights)[0], created,
                step_outcomes(rng, status, count) if count else [], (2, 6), 300)  # fmt: skip
        if n % 500 == 499:
            rows.flush(db)
    big = f"{rng.getrandbits(48):012x}"
    big_rows = add_big_job(rows, rng, config, big, repos[0], now - timedelta(hours=3))
    live = f"{rng.getrandbits(48):012x}"
    rows.jobs.append(
        {**big_rows, "id": live, "title": "Live: the feed's job", "status": "pending",
         "branch": f"merlin/{live}", "started_at": None, "finished_at": None,
         "patch_path": None, "error": None, "created_at": now, "updated_at": now}
    )  # fmt: skip
    rows.event(live, "job_submitted", "job submitted", now)
    for position in range(LIVE_STEPS):
        rows.steps.append(
            {"id": rows.next_step, "job_id": live, "position": position, "key": f"s{position + 1}",
             "step_type": "Debug", "description": f"live step {position + 1}",
             "verification": "", "exit_command": "true", "depends_on": [], "on_failure": "stop",
             "status": "Pending", "phase": "attempt", "tier_index": 0, "complexity": "simple",
             "next_kind": "execute", "base_commit": None, "error": None, "result": None,
             "deliveries": 0, "recoveries": 0, "started_at": None, "finished_at": None}
        )  # fmt: skip
        rows.next_step += 1
    rows.flush(db)
    if not db.is_sqlite:  # the ids given here did not move the sequences
        from sqlalchemy import text

        with db.session() as session:
            for table in ("steps", "attempts"):
                session.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                                     f"(SELECT max(id) FROM {table}))"))  # fmt: skip
            session.execute(text("ANALYZE"))  # what autovacuum does after a bulk load
    with db.reader() as session:  # the jobs page's second page starts after its 100th job
        newest = select(Job.id).order_by(Job.created_at.desc(), Job.id.desc())
        second_page = session.scalars(newest.offset(99).limit(1)).one()
    return Seeded(big, live, repos[0], second_page, time.monotonic() - started, dict(rows.counts))


def add_big_job(rows: Rows, rng: random.Random, config: dict[str, Any], job_id: str, repo: str,
                created: datetime) -> dict[str, Any]:  # fmt: skip
    """The job of BIG_STEPS steps of BIG_ATTEMPTS attempts: four fail, the fifth passes."""
    ladder = [AttemptPlan("execute", 0, "failed"), AttemptPlan("fix", 0, "failed"),
              AttemptPlan("escalate", 1, "failed"), AttemptPlan("fix", 1, "failed"),
              AttemptPlan("escalate", 2, "passed")]  # fmt: skip
    clock = created + timedelta(seconds=3)
    rows.event(job_id, "job_submitted", "job submitted", created)
    rows.event(job_id, "job_started", "job started", clock)
    for position in range(BIG_STEPS):
        key, step_id = f"s{position + 1}", rows.next_step
        rows.next_step += 1
        step_start = clock
        rows.event(job_id, "step_started", f"step {key} started", clock, key)
        for number, plan in enumerate(ladder[:BIG_ATTEMPTS], 1):
            clock = add_attempt(rows, rng, job_id, step_id, key, number, plan, clock,
                                (BIG_TURNS, BIG_TURNS), 700)  # fmt: skip
            if number < BIG_ATTEMPTS:
                following = ladder[number]
                kind = "escalated" if following.kind == "escalate" else "fix_planned"
                rows.event(job_id, kind, kind.replace("_", " "), clock, key,
                           {"from_tier": TIERS[plan.tier][0], "to_tier": TIERS[following.tier][0],
                            "reason": "exit command failed"})  # fmt: skip
        rows.event(job_id, "step_completed", f"step {key} completed", clock, key)
        rows.steps.append(
            {"id": step_id, "job_id": job_id, "position": position, "key": key,
             "step_type": "Feature", "description": f"Part {position + 1}: {cut(rng, 200)}",
             "verification": "", "exit_command": "python -m pytest -q",
             "depends_on": [f"s{position}"] if position else [], "on_failure": "stop",
             "status": "Completed", "phase": "done", "tier_index": 2, "complexity": "complex",
             "next_kind": "execute", "base_commit": "a" * 40, "error": None, "result": "done",
             "deliveries": 10, "recoveries": 0, "started_at": step_start, "finished_at": clock}
        )  # fmt: skip
    rows.event(job_id, "job_finished", "job completed", clock, None,
               {"patch": f"/var/lib/merlin/jobs/{job_id}.patch"})  # fmt: skip
    job = {"id": job_id, "title": f"Split the monolith into {BIG_STEPS} modules", "repo": repo,
           "status": "completed", "branch": f"merlin/{job_id}", "base_commit": "a" * 40,
           "head_commit": "c" * 40, "tasklist": {"title": "split", "steps": []},
           "config": config, "error": None,
           "patch_path": f"/var/lib/merlin/jobs/{job_id}.patch", "budget_usd": 50.0,
           "request": None, "plan": None, "created_at": created, "started_at": created,
           "finished_at": clock, "updated_at": clock}  # fmt: skip
    rows.jobs.append(job)
    return job


# -- the store and the server --------------------------------------------------------------


@contextlib.contextmanager
def store(backend: str, work: Path) -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """The database (migrated as merlin does it), its settings, and the server's environment."""
    from merlin_flow.settings import Settings
    from merlin_flow.store import Database, open_database, upgrade

    home = work / "home"
    env = {k: v for k, v in os.environ.items()
           if k not in ("MERLIN_DATABASE_URL", "MERLIN_BROKER_URL", "MERLIN_UI_TOKEN")}  # fmt: skip
    env["MERLIN_HOME"] = str(home)
    cleanup = contextlib.ExitStack()
    if backend == "postgres":
        from sqlalchemy import create_engine, text

        admin_url = POSTGRES_ADMIN_URL
        name = f"merlin_bench_ui_{uuid.uuid4().hex[:8]}"
        admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))

        @cleanup.callback
        def drop() -> None:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()

        env["MERLIN_DATABASE_URL"] = admin_url.rsplit("/", 1)[0] + f"/{name}"
    with cleanup:
        settings = Settings(home=home, database_url=env.get("MERLIN_DATABASE_URL"))
        if settings.database_url:  # what `merlin db upgrade` does on a server database
            schema = Database(settings.database)
            upgrade(schema)
            schema.dispose()
        db = open_database(settings.database)  # SQLite: made and upgraded on first use
        try:
            yield db, settings, env
        finally:
            db.dispose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """``merlin ui --port PORT`` in its own process group."""

    def __init__(self, env: dict[str, str], work: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = work / "ui.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "merlin_flow.cli", "ui", "--port", str(self.port)],
                env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        atexit.register(self.stop)
        import httpx

        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"merlin ui exited: {self.log.read_text(errors='replace')}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"merlin ui did not answer {self.url}/healthz in {READY_SECONDS:g} s: "
            f"{self.log.read_text(errors='replace')}"
        )

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL after 10 s; idempotent."""
        if self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


# -- measuring -----------------------------------------------------------------------------


@dataclass
class Figure:
    """One timed thing: its samples in seconds, the target, and its page's size."""

    backend: str
    group: str  # "jobs", "job", "event"
    what: str
    target: float
    samples: list[float]
    size: int = 0
    path: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p95(self) -> float:
        ordered = sorted(self.samples)
        return ordered[math.ceil(0.95 * len(ordered)) - 1]

    @property
    def met(self) -> bool:
        return self.p95 < self.target


def time_pages(url: str, paths: list[tuple[str, str, str, float]], count: int,
               backend: str) -> list[Figure]:  # fmt: skip
    """``count`` timed GETs of each path (after two untimed ones), round-robin."""
    import httpx

    figures = {path: Figure(backend, group, what, target, [], 0, path)
               for group, what, path, target in paths}  # fmt: skip
    with httpx.Client(base_url=url, timeout=30, headers={"Accept": "text/html"}) as client:
        for path in figures:
            for _ in range(2):
                client.get(path).raise_for_status()
        for _ in range(count):
            for path, figure in figures.items():
                started = time.perf_counter()
                response = client.get(path)
                body = response.content
                figure.samples.append(time.perf_counter() - started)
                response.raise_for_status()
                figure.size = len(body)
    return list(figures.values())


class Listener(threading.Thread):
    """An SSE client of ``/events``: when each event (kind, step) was read."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.seen: dict[tuple[str, str | None], float] = {}
        self.connected = threading.Event()
        self.response: Any = None
        self.failure: BaseException | None = None

    def run(self) -> None:
        import httpx

        timeout = httpx.Timeout(10, read=None)
        try:
            with (
                httpx.Client(timeout=timeout) as client,
                client.stream("GET", self.url, headers={"Accept": "text/event-stream"}) as response,
            ):
                self.response = response
                response.raise_for_status()
                self.connected.set()
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        self.seen[(event["kind"], event["step"])] = time.perf_counter()
        except Exception as exc:  # closed by close(), or a real failure (reported)
            if not self.connected.is_set():
                self.failure = exc
            self.connected.set()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.response is not None:
                self.response.close()


def time_events(url: str, db: Any, seeded: Seeded, count: int, rng: random.Random,
                backend: str) -> list[Figure]:  # fmt: skip
    """``count`` real transitions of the pending job; seconds until each SSE client read it."""
    from merlin_flow.engine.lifecycle import start_job, start_step
    from merlin_flow.store import Job
    from merlin_flow.ui.stream import newest_event

    after = newest_event(db)
    listeners = {
        "the jobs page's stream (`/events`)": Listener(f"{url}/events?after={after}"),
        "the job page's stream (`/events?job=ID`)": Listener(
            f"{url}/events?after={after}&job={seeded.live}"
        ),
    }
    for listener in listeners.values():
        listener.start()
        listener.connected.wait(15)
        if listener.failure is not None:
            raise RuntimeError(f"{listener.url}: {listener.failure}")
    samples: dict[str, list[float]] = {name: [] for name in listeners}
    try:
        for n in range(min(count, LIVE_STEPS + 1)):
            time.sleep(rng.uniform(0.2, 0.7))  # at a random point of the server's polling
            written = time.perf_counter()
            with db.session() as session:
                job = session.get_one(Job, seeded.live)
                if n == 0:
                    start_job(session, job, sandboxed=True)
                    key: tuple[str, str | None] = ("job_started", None)
                else:
                    step = next(s for s in job.steps if s.position == n - 1)
                    start_step(session, job, step)
                    key = ("step_started", step.key)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not all(
                key in listener.seen for listener in listeners.values()
            ):
                time.sleep(0.002)
            for name, listener in listeners.items():
                seen = listener.seen.get(key)
                samples[name].append(seen - written if seen is not None else math.inf)
    finally:
        for listener in listeners.values():
            listener.close()
            listener.join(5)
    return [Figure(backend, "event", name, EVENT_TARGET, got) for name, got in samples.items()]


# -- profiling -----------------------------------------------------------------------------


@dataclass
class Profile:
    """Where requests of one page spent their time, in this process (per request)."""

    path: str
    runs: int
    wall: float
    statements: list[tuple[str, float, float]]  # text, count, seconds
    functions: list[tuple[float, float, int, str]]  # cumulative, own seconds, calls, where
    collecting: float
    """Seconds per request in the garbage collector (any generation)."""
    full_collections: int
    """Collections of the oldest generation in all ``runs`` requests."""

    def cumulative(self, file: str, name: str) -> float:
        """Seconds in function ``name`` of ``file`` and what it called."""
        return sum(
            row[0] for row in self.functions if file in row[3] and row[3].endswith(f"({name})")
        )

    def own(self, file: str, name: str) -> float:
        """Seconds in function ``name`` of ``file`` itself."""
        return sum(
            row[1] for row in self.functions if file in row[3] and row[3].endswith(f"({name})")
        )

    @property
    def sql(self) -> tuple[float, float]:
        """Statements and seconds of SQL (execution; fetching is in the functions)."""
        return sum(n for _, n, _ in self.statements), sum(t for _, _, t in self.statements)

    def report(self, backend: str) -> str:
        count, seconds = self.sql
        lines = [f"### {backend}: `GET {self.path}` in process: {self.wall * 1000:.0f} ms "
                 f"(median of {self.runs}, under cProfile)", "",
                 f"SQL per request: {count:.0f} statements, {seconds * 1000:.1f} ms executing:",
                 ""]  # fmt: skip
        for text, n, spent in self.statements[:6]:
            lines.append(f"- {n:.0f} x, {spent * 1000:.1f} ms: `{text}`")
        lines += ["", "merlin_flow's functions and templates (own / cumulative ms, calls):", ""]
        mine = [row for row in self.functions if "merlin_flow/" in row[3]]
        for cumulative, own, calls, where in sorted(mine, reverse=True)[:10]:
            lines.append(f"- {own * 1000:.1f} / {cumulative * 1000:.1f} ms, {calls} calls: "
                         f"`{where}`")  # fmt: skip
        lines += ["", "Every function by its own time (own / cumulative ms, calls):", ""]
        for cumulative, own, calls, where in sorted(self.functions, key=lambda r: -r[1])[:10]:
            lines.append(f"- {own * 1000:.1f} / {cumulative * 1000:.1f} ms, {calls} calls: "
                         f"`{where}`")  # fmt: skip
        return "\n".join(lines)


def profile(db: Any, settings: Any, path: str, runs: int = 5) -> Profile:
    """``runs`` requests of ``path`` in this process, under cProfile, after one untimed one.

    The same app as ``merlin ui`` serves (``create_app``) on the same database, through
    ``httpx.ASGITransport``; the worker threads it hands the database to run inline, so
    that cProfile, which sees one thread, sees them. Each SQL statement is timed.
    """
    from unittest.mock import patch

    import anyio
    import anyio.to_thread
    import httpx
    from sqlalchemy import event

    from merlin_flow.ui.access import Access
    from merlin_flow.ui.server import create_app

    app = create_app(db, settings, Access(None), False)
    queries: dict[str, list[float]] = defaultdict(list)
    began: list[float] = []
    profiling = False

    def before(*_: Any) -> None:
        began.append(time.perf_counter())

    def after(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if profiling:
            queries[" ".join(statement.split())[:140]].append(time.perf_counter() - began[-1])

    async def inline(func: Callable[..., Any], *args: Any, **_: Any) -> Any:
        return func(*args)

    profiler = cProfile.Profile()
    wall: list[float] = []
    collected = {"seconds": 0.0, "full": 0, "since": 0.0}

    def collector(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collected["since"] = time.perf_counter()
        elif profiling:
            collected["seconds"] += time.perf_counter() - collected["since"]
            collected["full"] += info["generation"] == 2

    async def run() -> None:
        nonlocal profiling
        transport = httpx.ASGITransport(app=app)
        headers = {"Accept": "text/html"}
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            (await client.get(path, headers=headers)).raise_for_status()
            profiling = True
            for _ in range(runs):
                started = time.perf_counter()
                profiler.enable()
                await client.get(path, headers=headers)
                profiler.disable()
                wall.append(time.perf_counter() - started)
            profiling = False

    event.listen(db.engine, "before_cursor_execute", before)
    event.listen(db.engine, "after_cursor_execute", after)
    gc.callbacks.append(collector)
    try:
        with patch.object(anyio.to_thread, "run_sync", inline):
            anyio.run(run)
    finally:
        gc.callbacks.remove(collector)
        event.remove(db.engine, "before_cursor_execute", before)
        event.remove(db.engine, "after_cursor_execute", after)
    statements = sorted(((text, len(times) / runs, sum(times) / runs)
                         for text, times in queries.items()), key=lambda row: -row[2])  # fmt: skip
    functions = []
    stats: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    for (filename, line, name), (_, calls, own, cumulative, _) in stats.items():
        where = filename.split("site-packages/")[-1].replace(f"{ROOT}/", "")
        functions.append((cumulative / runs, own / runs, calls // runs, f"{where}:{line}({name})"))
    return Profile(path, runs, statistics.median(wall), statements, functions,
                   collected["seconds"] / runs, int(collected["full"]))  # fmt: skip


# -- the report ----------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return "lost" if math.isinf(seconds) else f"{seconds * 1000:,.0f} ms"


def table(figures: list[Figure], count: int) -> str:
    columns = ["backend", "request", "target", f"median of {count}", "p95", "slowest", "size",
               "result"]  # fmt: skip
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for f in figures:
        size = f"{f.size / 1024:,.0f} KiB" if f.size else ""
        result = "met" if f.met else "**missed**"
        lines.append(f"| {f.backend} | {f.what} | {ms(f.target)} | {ms(f.median)} | {ms(f.p95)} "
                     f"| {ms(max(f.samples))} | {size} | {result} |")  # fmt: skip
    return "\n".join(lines)


def machine() -> str:
    memory = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
        memory = f", {kib / 1024**2:.0f} GB"
    return f"{os.cpu_count()} cores{memory}, Python {platform.python_version()}"


@dataclass
class Run:
    """One backend's figures, what was seeded, and the pages profiled in process."""

    backend: str
    figures: list[Figure]
    seeded: Seeded
    profiles: dict[str, Profile]
    missed: list[str]
    """The paths of the pages that missed their target."""

    def reported(self, every: bool) -> list[Profile]:
        """The profiles to show: every one, or those of the missed pages."""
        return [found for path, found in self.profiles.items() if every or path in self.missed]


def run_backend(backend: str, args: argparse.Namespace) -> Run:
    """Seed a store, serve it with `merlin ui`, time the pages and the feed, profile."""
    with tempfile.TemporaryDirectory(prefix="merlin-dashboard-") as tmp:
        work = Path(tmp)
        with store(backend, work) as (db, settings, env):
            seeded = seed(db, args.jobs, random.Random(args.seed))
            print(f"{backend}: seeded in {seeded.seconds:.0f} s: {seeded.counts}", flush=True)
            big = seeded.big
            paths = [
                ("jobs", "`GET /` (the newest 100)", "/", JOBS_TARGET),
                ("jobs", "`GET /?status=failed`", "/?status=failed", JOBS_TARGET),
                ("jobs", "`GET /?repo=...&age=7d`", f"/?repo={seeded.repo}&age=7d", JOBS_TARGET),
                ("jobs", "`GET /?before=...` (second page)", f"/?before={seeded.second_page}",
                 JOBS_TARGET),
                ("job", "`GET /jobs/ID`", f"/jobs/{big}", JOB_TARGET),
                ("job", "`GET /jobs/ID/body`", f"/jobs/{big}/body", JOB_TARGET),
                ("job", "`GET /api/jobs/ID`", f"/api/jobs/{big}", JOB_TARGET),
            ]  # fmt: skip
            server = Server(env, work)
            try:
                figures = time_pages(server.url, paths, args.requests, backend)
                figures += time_events(server.url, db, seeded, args.events,
                                       random.Random(args.seed), backend)  # fmt: skip
            finally:
                server.stop()
            missed = [f.path for f in figures if not f.met and f.path]
            wanted = {"/", f"/jobs/{big}"}  # always: the summary of where the time goes
            wanted |= {path for _, _, path, _ in paths if args.profile or path in missed}
            runs = args.profile_runs
            profiles = {path: profile(db, settings, path, runs) for path in sorted(wanted)}
    return Run(backend, figures, seeded, profiles, missed)


def where_it_goes(run: Run) -> str:
    """One line: how the 200-attempt job's page spends its time, from its profile."""
    found = run.profiles[f"/jobs/{run.seeded.big}"]
    count, seconds = found.sql
    per_step = sum(n for text, n, _ in found.statements if text.startswith("SELECT attempts."))
    view = found.cumulative("merlin_flow/jobs/views.py", "job_view")
    events = found.cumulative("merlin_flow/jobs/views.py", "events_since")
    render = found.cumulative("merlin_flow/ui/server.py", "page")
    decoding = found.own("json/decoder.py", "raw_decode")
    return (f"{run.backend}: {found.wall * 1000:.0f} ms in all. `job_view` "
            f"{view * 1000:.0f} ms, of which {decoding * 1000:.0f} ms decoding JSON; "
            f"{count:.0f} SQL statements, {per_step:.0f} of them reading attempts (the SQL "
            f"itself executes in {seconds * 1000:.0f} ms). `events_since` {events * 1000:.0f} "
            f"ms; the templates {render * 1000:.0f} ms. Of all this, Python's garbage "
            f"collector took {found.collecting * 1000:.0f} ms a request "
            f"({found.full_collections} full collections in {found.runs} requests).")  # fmt: skip


def wrap(text: str, bullet: bool = False, indent: str = "") -> str:
    """A paragraph (or a ``- `` bullet) wrapped at 90 columns, as the page's text is."""
    first = indent + ("- " if bullet else "")
    later = indent + ("  " if bullet else "")
    joined = re.sub(r"(\d) (ms|s|KiB)\b", "\\1\0\\2", " ".join(text.split()))  # 5 ms
    pieces = joined.split("`")  # no line break inside a `code span` either
    kept = "`".join(p.replace(" ", "\0") if n % 2 else p for n, p in enumerate(pieces))
    return textwrap.fill(kept, 90, initial_indent=first, subsequent_indent=later,
                         break_on_hyphens=False).replace("\0", " ")  # fmt: skip


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def section(runs: list[Run], args: argparse.Namespace, seconds: float) -> str:
    """The Markdown section of docs/BENCHMARKS.md."""
    from merlin_flow.ui.stream import POLL

    figures = [f for run in runs for f in run.figures]
    counts = runs[0].seeded.counts
    verdict = []
    for group, what in ((
        ("jobs", f"(a) the jobs page over {args.jobs:,} finished jobs under 300 ms"),
        ("event", "(b) an event reaches an open page under 1 s"),
        ("job", f"(c) a job page of {BIG_STEPS * BIG_ATTEMPTS} attempts under 500 ms"),
    )):  # fmt: skip
        mine = [f for f in figures if f.group == group]
        worst = max(mine, key=lambda f: f.p95)
        result = "met" if all(f.met for f in mine) else "missed"
        verdict.append(wrap(f"**{what}: {result}** (the slowest p95: {ms(worst.p95)}, "
                            f"{worst.what} on {worst.backend}).", bullet=True))  # fmt: skip
    reports = [found.report(run.backend) for run in runs for found in run.reported(False)]
    profiled = ""
    if reports:
        profiled = ("\nProfiles of the missed pages (in process: the same app on the same "
                    "database):\n\n" + "\n\n".join(reports) + "\n")  # fmt: skip
    body = next(f for f in figures if f.what == "`GET /jobs/ID/body`")
    feed = next(f for f in figures if f.group == "event" and "job=" in f.what)
    shown = feed.median + 0.3 + body.median
    late = feed.p95 + 0.3 + body.p95
    rank = math.ceil(0.95 * args.requests)
    length = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} minutes"
    seeding = ", ".join(f"{run.seeded.seconds:.0f} s on {run.backend}" for run in runs)
    filling = wrap(f"""The benchmark fills a temporary store (the embedded SQLite store, made and
        migrated as merlin does on first use; with `--backend postgres`, a database of its
        own, upgraded as `merlin db upgrade` does, analyzed as autovacuum would after a bulk
        load, and dropped after) with {args.jobs:,} finished jobs, bulk-inserted with
        SQLAlchemy Core as workers leave them: created over 30 days in four repositories,
        {STATUSES[0][1]}% completed, the rest failed, partially completed, cancelled, over
        budget, parked or rejected; 1 to 6 steps, attempts that escalate local -> fast ->
        premium with fixes between, their transcripts, journal rows and events. One more job
        has {BIG_STEPS} steps of {BIG_ATTEMPTS} attempts ({BIG_STEPS * BIG_ATTEMPTS}
        attempts of {BIG_TURNS} turns, four failing per step, with their transcripts and
        journal rows), and one is pending, for the live feed. In all: {counts["jobs"]:,}
        jobs, {counts["steps"]:,} steps, {counts["attempts"]:,} attempts,
        {counts["llm_calls"]:,} journal rows, {counts["events"]:,} events, written in
        {seeding}.""")
    timing = wrap(f"""Then it starts a real `merlin ui --port PORT` and times {args.requests}
        requests of each page over HTTP from its own process (httpx, one kept-alive
        connection, after two untimed requests per page): the time to the last byte; p95 is
        the nearest rank (the {ordinal(rank)} of {args.requests}). For the live feed, two SSE
        clients stay connected to `/events` (the jobs page's stream, and the job page's
        `?job=ID`) while the benchmark makes {min(args.events, LIVE_STEPS + 1)} real
        transitions of the pending job (`lifecycle.start_job`, then `start_step`, each
        writing its event with `add_event`), 0.2 to 0.7 s apart: the time runs from opening
        the writing transaction to the client reading the event.""")
    polling = wrap(
        f"""The live feed's delay is the stream's polling: `ui/stream.py` reads
        the events table every {POLL:g} s (`POLL`), so an event waits 0 to {POLL:g} s for the
        next read, and its p95 is about {POLL:g} s whatever the store holds. On the job page,
        `live.js` then waits 300 ms and fetches `/jobs/ID/body`: for a job of
        {BIG_STEPS * BIG_ATTEMPTS} attempts the page shows an event about {shown:.1f} s
        after it was written (median feed + 0.3 s + median body), and {late:.2f} s with
        both at their p95 ({body.backend}).""",
        bullet=True,
    )
    profiles = "\n".join(wrap(where_it_goes(run), bullet=True, indent="  ") for run in runs)
    where = wrap(f"""Where the job page's time goes (`GET /jobs/ID` of the
        {BIG_STEPS * BIG_ATTEMPTS}-attempt job, in process under cProfile, which slows it):""",
                 bullet=True)  # fmt: skip
    return f"""{HEADING}

Command (about {length}):

```
python -m tests.bench.dashboard --backend {args.backend}    # --jobs {args.jobs} \
--requests {args.requests} --events {args.events}
```

{filling}

{timing}

Run of {date.today().isoformat()} ({machine()}; the server, the benchmark and the database
share the 2 cores):

{table(figures, args.requests)}

{chr(10).join(verdict)}

What the figures say:

{polling}
{where}
{profiles}
{profiled}"""


SMOKE = {"backend": "both", "jobs": 150, "requests": 1, "events": 2, "profile_runs": 1,
         "no_docs": True}  # fmt: skip
"""The smallest run (``--smoke``): docs/BENCHMARKS.md untouched."""


def postgres_missing() -> str | None:
    """Why ``MERLIN_TEST_POSTGRES_URL``'s server cannot be used, or None."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    admin = create_engine(POSTGRES_ADMIN_URL)
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        return f"Postgres unreachable: {str(exc).splitlines()[0]}"
    finally:
        admin.dispose()
    return None


def main() -> None:
    """Measure each backend, print the tables, write the section of docs/BENCHMARKS.md."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="sqlite")
    parser.add_argument("--jobs", type=int, default=10_000, help="finished jobs to write")
    parser.add_argument("--requests", type=int, default=20, help="timed requests per page")
    parser.add_argument("--events", type=int, default=20, help=f"at most {LIVE_STEPS + 1}")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--profile", action="store_true", help="profile every page")
    parser.add_argument("--docs", type=Path, default=DOCS, help="the file to write the section to")
    parser.add_argument("--no-docs", action="store_true", help="print only")
    parser.add_argument("--profile-runs", type=int, default=10, help="requests per profile")
    parser.add_argument("--smoke", action="store_true", help=f"the smallest run: {SMOKE}")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    runs = []
    try:
        for backend in ("sqlite", "postgres") if args.backend == "both" else (args.backend,):
            missing = postgres_missing() if backend == "postgres" and args.smoke else None
            if missing and not os.environ.get("CI"):
                print(f"postgres: skipped, {missing}", file=sys.stderr)
                continue
            runs.append(run_backend(backend, args))
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(table([f for run in runs for f in run.figures], args.requests))
    for run in runs:
        print("\n" + where_it_goes(run))
        for found in run.reported(args.profile):
            print("\n" + found.report(run.backend))
    if not args.no_docs:
        write_section(args.docs, HEADING, section(runs, args, time.monotonic() - started))
        print(f"\nwrote the section {HEADING[3:]!r} of {args.docs}")


if __name__ == "__main__":
    main()
