"""Benchmark: merlin_flow's orchestration overhead per step against a bare Celery chain.

Run: ``python -m tests.bench.overhead`` (about 6 minutes; ``--backends embedded`` for the
embedded one only; ``--smoke``: the smallest sizes, under a minute). For each backend (the
embedded SQLite store and broker; Redis + Postgres: a ``redis-server`` of the run's own,
or ``MERLIN_TEST_REDIS_URL``'s, and a database of its own on ``MERLIN_TEST_POSTGRES_URL``'s
server, dropped after, as the tests have them) it starts one real worker of merlin's
Celery app (prefork, 2 processes, every queue; ``tests/bench/noop_worker.py`` adds the
no-op task), waits until it has run a no-op from each queue, and measures, in one run:

- a bare chain: ``2 * steps + 1`` no-op tasks (``merlin.bench.noop``) alternating the llm and
  verify queues like a job's step and verify tasks, then a final one on control; time
  from publishing to the last task, divided by ``steps``;
- a merlin job of ``steps`` steps whose scripted model answers at once and whose exit
  command is ``true``: time from ``enqueue_job`` to ``finished_at``, divided by ``steps``
  (the step's lease claims, two git worktrees, the commit, the journal, the database);
- throughput: 50 jobs of 5 steps submitted at once, against 50 bare chains of 11 tasks
  (``--concurrent``, ``--throughput-steps``);
- the per-step time again after 10,000 finished jobs (5 steps, attempts, journal rows
  and events each) were written to the database.

Prints Markdown tables with medians and ratios. The worker is stopped, its whole process
group, however the run ends (a failure, Ctrl-C, SIGTERM). ``--smoke`` runs both backends
(Redis + Postgres is skipped with a notice where they are missing, unless ``CI`` is set).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

from tests.bench.processes import log_tail, stop_group, terminated_as_exit, wait_until

QUEUES = ("control", "llm", "verify")
INSTANT = "rules:\n  - reply: {content: done}\n"


def tasklist(steps: int) -> Any:
    from merlin_flow.tasklist import parse_tasklist

    return parse_tasklist(
        {
            "title": "overhead",
            "steps": [
                {"id": f"s{i}", "step_type": "Verify", "description": f"step {i}",
                 "exit_command": "true"}
                for i in range(steps)
            ],
        }
    )  # fmt: skip


class Bench:
    """One backend: its settings, database, Celery app and worker process."""

    def __init__(self, name: str, work: Path, env: dict[str, str]) -> None:
        from merlin_flow.config import MerlinConfig, Tier
        from merlin_flow.settings import Settings
        from merlin_flow.store import Database, open_database, upgrade
        from tests.conftest import make_repo
        from workers.app import create_app

        self.name = name
        self.work = work / name
        self.work.mkdir(parents=True)
        self.env = {"MERLIN_HOME": str(self.work / "home"), **env}
        self.settings = Settings(
            home=self.work / "home",
            database_url=env.get("MERLIN_DATABASE_URL"),
            broker_url=env.get("MERLIN_BROKER_URL"),
        )
        if self.settings.database_url:  # what `merlin db upgrade` does on a server database
            schema = Database(self.settings.database)
            upgrade(schema)
            schema.dispose()
        self.db = open_database(self.settings.database)
        self.app = create_app(self.settings)
        script = self.work / "instant.yaml"
        script.write_text(INSTANT)
        self.config = MerlinConfig(tiers=[Tier(name="local", model=f"scripted/{script}")])
        self.repo = make_repo(self.work / "repo", {"README.md": "bench\n"})
        self.markers = self.work / "markers"
        self.markers.mkdir()
        self.log = self.work / "worker.log"
        self.worker: subprocess.Popen[bytes] | None = None

    def start_worker(self) -> None:
        """Start the worker in its own process group; wait until it serves every queue."""
        from tests.bench.noop_worker import ping
        from tests.e2e.helpers import merlin_env

        env = merlin_env(self.work / "home", **self.env)
        # merlin's worker (`merlin worker` runs the same app) plus the no-op baseline task.
        command = [sys.executable, "-m", "celery", "-A", "tests.bench.noop_worker", "worker"]
        options = [f"--queues={','.join(QUEUES)}", "--concurrency=2", "--loglevel=WARNING"]
        with self.log.open("ab") as handle:
            self.worker = subprocess.Popen(
                [*command, *options],
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=Path(__file__).resolve().parents[2],
            )
        # At WARNING the worker logs nothing when it is ready: a no-op on each queue,
        # published through this backend's broker, shows that it is up and consuming.
        markers = {queue: self.markers / f"ready-{queue}" for queue in QUEUES}
        for queue, marker in markers.items():
            ping(self.app, queue, str(marker))
        broker = self.settings.broker.split("@")[-1]
        wait_until(
            lambda: all(marker.exists() for marker in markers.values()),
            f"the {self.name} worker (celery -A tests.bench.noop_worker, broker {broker}) "
            f"to run a no-op from each of its queues {', '.join(QUEUES)}",
            [self.worker],
            [self.log],
        )

    def close(self) -> None:
        """Stop the worker's whole process group; close the database."""
        stop_group(self.worker)
        self.db.dispose()

    def wait(self, predicate: Any, timeout: float, what: str) -> Any:
        """Poll ``predicate`` while the worker runs; an error with its log's tail if not."""
        return wait_until(predicate, what, [self.worker] if self.worker else [], [self.log],
                          timeout=timeout, poll=0.005)  # fmt: skip

    def bare_chains(self, count: int, tasks: int, timeout: float = 300) -> float:
        """Seconds for ``count`` chains of ``tasks`` no-ops published at once."""
        from tests.bench.noop_worker import noop_chain

        markers = [self.markers / uuid.uuid4().hex for _ in range(count)]
        started = time.time()
        for marker in markers:
            noop_chain(self.app, tasks, str(marker)).apply_async()
        self.wait(
            lambda: all(m.exists() and m.read_text() for m in markers),
            timeout,
            f"{count} bare chains of {tasks} no-ops",
        )
        return max(float(m.read_text()) for m in markers) - started

    def jobs(self, count: int, steps: int) -> float:
        """Seconds for ``count`` jobs of ``steps`` steps enqueued at once to all finish."""
        from sqlalchemy import func, select

        from merlin_flow.jobs.submission import create_job
        from merlin_flow.store import Job
        from workers.canvas import enqueue_job

        self.app.set_default()
        self.app.set_current()  # merlin's tasks are shared: they publish through it
        ids = [
            create_job(self.db, self.settings, tasklist(steps), self.repo, self.config)
            for _ in range(count)
        ]
        started = time.time()
        for job_id in ids:
            enqueue_job(self.db, job_id)

        def finished() -> bool:
            with self.db.reader() as session:
                left = session.scalar(
                    select(func.count())
                    .select_from(Job)
                    .where(Job.id.in_(ids), Job.finished_at.is_(None))
                )
            return not left

        self.wait(finished, 120 + 5 * count * steps, f"{count} jobs of {steps} steps to finish")
        with self.db.reader() as session:
            rows = session.execute(
                select(Job.status, Job.finished_at, Job.error).where(Job.id.in_(ids))
            )
            statuses, finished_at, errors = zip(*rows.all(), strict=True)
        if set(statuses) != {"completed"}:
            raise RuntimeError(
                f"jobs ended {sorted(set(statuses))}: {[e for e in errors if e][:3]}\n"
                f"--- the last lines of {self.log}:\n{log_tail(self.log)}"
            )
        # finished_at is naive UTC, written by the worker when it finalized the job.
        last: float = max(f.replace(tzinfo=UTC).timestamp() for f in finished_at)
        return last - started


def seed_finished_jobs(bench: Bench, count: int, steps: int = 5) -> float:
    """Write ``count`` finished jobs with their steps, attempts, calls and events."""
    from sqlalchemy import insert

    from merlin_flow.store import Attempt, Event, Job, LlmCall, Step, utcnow

    started = time.monotonic()
    now = utcnow() - timedelta(days=1)
    base = "0" * 40
    config = bench.config.model_dump(mode="json")
    chunk = 1000
    for offset in range(0, count, chunk):
        jobs: list[dict[str, Any]] = []
        step_rows: list[dict[str, Any]] = []
        attempts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        for n in range(offset, min(count, offset + chunk)):
            job_id = f"seed{n:08d}"
            jobs.append(
                {"id": job_id, "title": "seeded", "repo": str(bench.repo), "status": "completed",
                 "branch": f"merlin/{job_id}", "base_commit": base, "head_commit": base,
                 "tasklist": {}, "config": config, "created_at": now, "started_at": now,
                 "finished_at": now, "updated_at": now}
            )  # fmt: skip
            for position in range(steps):
                ident = 10_000_000 + n * steps + position
                step_rows.append(
                    {"id": ident, "job_id": job_id, "position": position, "key": f"s{position}",
                     "step_type": "Verify", "description": "seeded", "verification": "",
                     "exit_command": "true", "depends_on": [], "status": "Completed",
                     "phase": "done", "tier_index": 0, "next_kind": "execute",
                     "deliveries": 2, "recoveries": 0, "started_at": now, "finished_at": now}
                )  # fmt: skip
                attempts.append(
                    {"id": ident, "step_id": ident, "number": 1, "kind": "execute",
                     "tier": "local", "model": "scripted", "status": "passed",
                     "start_commit": base, "commit": base, "exit_code": 0, "turns": 1, "runs": 1,
                     "prompt_tokens": 100, "completion_tokens": 5, "cost_usd": 0.0,
                     "started_at": now, "finished_at": now}
                )  # fmt: skip
                calls.append(
                    {"job_id": job_id, "step_id": ident, "attempt_id": ident, "seq": 0,
                     "turn": 0, "run": 1, "tier": "local", "model": "scripted",
                     "request_hash": uuid.uuid4().hex * 2, "prompt_tokens": 100,
                     "completion_tokens": 5, "cost_usd": 0.0, "latency_ms": 1.0,
                     "response": {"role": "assistant", "content": "done"}, "replayed": False,
                     "cached": False, "created_at": now}
                )  # fmt: skip
            for kind in ("job_submitted", "job_started", "job_finished"):
                events.append(
                    {"job_id": job_id, "kind": kind, "message": kind, "data": {},
                     "created_at": now}
                )  # fmt: skip
        with bench.db.session() as session:
            for model, rows in ((Job, jobs), (Step, step_rows), (Attempt, attempts),
                                (LlmCall, calls), (Event, events)):  # fmt: skip
                session.execute(insert(model), rows)
    return time.monotonic() - started


def measure(bench: Bench, steps: int, samples: int) -> dict[str, list[float]]:
    """Alternate bare chains and jobs, ``samples`` of each; per-step seconds."""
    bare, merlin = [], []
    for _ in range(samples):
        bare.append(bench.bare_chains(1, 2 * steps + 1) / steps)
        merlin.append(bench.jobs(1, steps) / steps)
    return {"bare": bare, "merlin": merlin}


def run_backend(
    name: str, work: Path, env: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    bench = Bench(name, work, env)
    begun = time.monotonic()

    def done(what: str) -> None:
        print(f"  {name}: {what} at {time.monotonic() - begun:.1f} s", file=sys.stderr)

    try:
        bench.start_worker()
        done("worker ready")
        bench.bare_chains(1, 3)
        bench.jobs(1, 1)  # warm up: imports, first connections
        done("warmed up")
        empty = measure(bench, args.steps, args.samples)
        done("measured")
        jobs_seconds = bench.jobs(args.concurrent, args.throughput_steps)
        chains_seconds = bench.bare_chains(args.concurrent, 2 * args.throughput_steps + 1)
        done("throughput measured")
        seed_seconds = seed_finished_jobs(bench, args.seed_jobs)
        full = measure(bench, args.steps, args.samples)
        done("measured after seeding")
    finally:
        bench.close()
    return {
        "name": name,
        "empty": empty,
        "full": full,
        "throughput_merlin": args.concurrent * args.throughput_steps / jobs_seconds,
        "throughput_bare": args.concurrent * args.throughput_steps / chains_seconds,
        "seed_seconds": seed_seconds,
    }


class Unavailable(RuntimeError):
    """Redis or Postgres is not there for the Redis + Postgres backend."""


@contextlib.contextmanager
def scaled_env(work: Path) -> Iterator[dict[str, str]]:
    """A fresh Postgres database and a Redis server of the run's own, as the tests have them.

    The database is made on ``MERLIN_TEST_POSTGRES_URL``'s server (``test`` on this machine
    by default) and dropped after; Redis is ``tests/redis_server.py``'s: a ``redis-server``
    on a free port, stopped after, or ``MERLIN_TEST_REDIS_URL``'s, whose database 1 is
    emptied after. A developer's own data is never touched.
    """
    import pytest
    import redis

    from tests.conftest import _postgres_database
    from tests.redis_server import NoRedisServer, own_redis_server

    with contextlib.ExitStack() as stack:
        try:
            database_url = stack.enter_context(contextlib.contextmanager(_postgres_database)())
            redis_url = stack.enter_context(own_redis_server(work / "redis")) + "/1"
        except (pytest.skip.Exception, pytest.fail.Exception, NoRedisServer) as exc:
            raise Unavailable(str(exc)) from None
        client = redis.Redis.from_url(redis_url)
        stack.callback(client.close)
        client.flushdb()  # our own database of our own server, or of the tests' given one
        stack.callback(client.flushdb)
        yield {"MERLIN_DATABASE_URL": database_url, "MERLIN_BROKER_URL": redis_url}


SMOKE = {"steps": 1, "samples": 1, "concurrent": 2, "throughput_steps": 1, "seed_jobs": 20}
"""The smallest run (``--smoke``): each part once, on both backends."""


def main() -> None:
    """Measure each backend and print the tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backends", default="embedded,redis+postgres")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=50)
    parser.add_argument("--throughput-steps", type=int, default=5, help="steps of those jobs")
    parser.add_argument("--seed-jobs", type=int, default=10_000)
    parser.add_argument("--smoke", action="store_true", help=f"the smallest run: {SMOKE}")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    results = []
    with terminated_as_exit(), tempfile.TemporaryDirectory(prefix="merlin-overhead-") as tmp:
        work = Path(tmp)
        # Before workers.app loads: a home of this run's own, never a developer's broker.
        os.environ["MERLIN_HOME"] = str(work / "default-home")
        for variable in ("MERLIN_DATABASE_URL", "MERLIN_BROKER_URL", "MERLIN_CONFIG"):
            os.environ.pop(variable, None)
        for name in args.backends.split(","):
            if name == "embedded":
                results.append(run_backend(name, work, {}, args))
                continue
            try:
                with scaled_env(work) as env:
                    results.append(run_backend(name, work, env, args))
            except Unavailable as exc:
                if not args.smoke or os.environ.get("CI"):
                    raise SystemExit(f"{name}: {exc}") from None
                print(f"{name}: skipped, {exc}", file=sys.stderr)
    print_tables(results, args)


def print_tables(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Medians and ratios, then throughput."""
    med = statistics.median
    print(f"per step, median of {args.samples} runs of {args.steps} steps\n")
    print(
        "| backend | bare Celery chain | merlin_flow | ratio | merlin_flow with "
        f"{args.seed_jobs:,} finished jobs | ratio to empty |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        bare, merlin, full = (
            med(r["empty"]["bare"]),
            med(r["empty"]["merlin"]),
            med(r["full"]["merlin"]),
        )
        print(
            f"| {r['name']} | {bare * 1000:.0f} ms | {merlin * 1000:.0f} ms | "
            f"{merlin / bare:.1f}x | {full * 1000:.0f} ms | {full / merlin:.2f}x |"
        )
    print(f"\nthroughput, {args.concurrent} jobs of {args.throughput_steps} steps at once\n")
    print("| backend | bare chains (steps/s) | merlin_flow (steps/s) | seeding time |")
    print("|---|---|---|---|")
    for r in results:
        print(
            f"| {r['name']} | {r['throughput_bare']:.1f} | {r['throughput_merlin']:.1f} | "
            f"{r['seed_seconds']:.0f} s |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
