"""Benchmark: merlin_flow's orchestration overhead per step against a bare Celery chain.

Run: ``python -m tests.bench.overhead`` (about 6 minutes; ``--backends embedded`` for the
embedded one only). For each backend (the embedded SQLite store and broker; Redis +
Postgres on this machine) it starts one real worker of merlin's Celery app (prefork, 2
processes, every queue; ``tests/bench/noop_worker.py`` adds the no-op task) and
measures, in one run:

- a bare chain: ``2 * steps + 1`` no-op tasks (``merlin.bench.noop``) alternating the llm and
  verify queues like a job's step and verify tasks, then a final one on control; time
  from publishing to the last task, divided by ``steps``;
- a merlin job of ``steps`` steps whose scripted model answers at once and whose exit
  command is ``true``: time from ``enqueue_job`` to ``finished_at``, divided by ``steps``
  (the step's lease claims, two git worktrees, the commit, the journal, the database);
- throughput: 50 jobs of 5 steps submitted at once, against 50 bare chains of 11 tasks;
- the per-step time again after 10,000 finished jobs (5 steps, attempts, journal rows
  and events each) were written to the database.

Prints Markdown tables with medians and ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

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

    def start_worker(self) -> None:
        import subprocess

        from tests.e2e.helpers import merlin_env, wait_for

        log = self.work / "worker.log"
        env = merlin_env(self.work / "home", **{k: v for k, v in self.env.items()})
        # merlin's worker (`merlin worker` runs the same app) plus the no-op baseline task.
        command = [sys.executable, "-m", "celery", "-A", "tests.bench.noop_worker", "worker"]
        options = ["--queues=control,llm,verify", "--concurrency=2", "--loglevel=WARNING"]
        with log.open("ab") as handle:
            self.worker = subprocess.Popen(
                [*command, *options],
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=Path(__file__).resolve().parents[2],
            )
        wait_for(lambda: "ready" in log.read_text(errors="replace") or self._ping(), 90, "worker")

    def _ping(self) -> bool:
        # The worker logs "ready." at INFO only; at WARNING, a no-op chain shows it is up.
        return self.bare_chains(1, 1, timeout=2.0) is not None

    def stop_worker(self) -> None:
        from tests.e2e.helpers import stop_worker

        stop_worker(self.worker)
        self.db.dispose()

    def bare_chains(self, count: int, tasks: int, timeout: float = 300) -> float | None:
        """Seconds for ``count`` chains of ``tasks`` no-ops published at once; None on timeout."""
        from tests.bench.noop_worker import noop_chain

        self.app.set_default()
        markers = [self.markers / uuid.uuid4().hex for _ in range(count)]
        started = time.time()
        for marker in markers:
            noop_chain(tasks, str(marker)).apply_async()
        deadline = time.monotonic() + timeout
        while not all(m.exists() and m.read_text() for m in markers):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.005)
        return max(float(m.read_text()) for m in markers) - started

    def jobs(self, count: int, steps: int) -> float:
        """Seconds for ``count`` jobs of ``steps`` steps enqueued at once to all finish."""
        from sqlalchemy import func, select

        from merlin_flow.jobs.submission import create_job
        from merlin_flow.store import Job
        from workers.canvas import enqueue_job

        self.app.set_default()
        ids = [
            create_job(self.db, self.settings, tasklist(steps), self.repo, self.config)
            for _ in range(count)
        ]
        started = time.time()
        for job_id in ids:
            enqueue_job(self.db, job_id)
        while True:
            with self.db.reader() as session:
                left = session.scalar(
                    select(func.count())
                    .select_from(Job)
                    .where(Job.id.in_(ids), Job.finished_at.is_(None))
                )
            if not left:
                break
            time.sleep(0.01)
        with self.db.reader() as session:
            rows = session.execute(select(Job.status, Job.finished_at).where(Job.id.in_(ids)))
            statuses, finished = zip(*rows.all(), strict=True)
        assert set(statuses) == {"completed"}, statuses
        # finished_at is naive UTC, written by the worker when it finalized the job.
        return max(f.replace(tzinfo=UTC).timestamp() for f in finished) - started


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
        jobs, step_rows, attempts, calls, events = [], [], [], [], []
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
        seconds = bench.bare_chains(1, 2 * steps + 1)
        assert seconds is not None, "a bare chain timed out"
        bare.append(seconds / steps)
        merlin.append(bench.jobs(1, steps) / steps)
    return {"bare": bare, "merlin": merlin}


def run_backend(name: str, work: Path, env: dict[str, str], args: argparse.Namespace) -> dict:
    bench = Bench(name, work, env)
    bench.start_worker()
    try:
        bench.bare_chains(1, 3)
        bench.jobs(1, 1)  # warm up: imports, first connections
        empty = measure(bench, args.steps, args.samples)
        jobs_seconds = bench.jobs(args.concurrent, 5)
        chains_seconds = bench.bare_chains(args.concurrent, 11)
        seed_seconds = seed_finished_jobs(bench, args.seed_jobs)
        full = measure(bench, args.steps, args.samples)
    finally:
        bench.stop_worker()
    return {
        "name": name,
        "empty": empty,
        "full": full,
        "throughput_merlin": args.concurrent * 5 / jobs_seconds,
        "throughput_bare": args.concurrent * 5 / (chains_seconds or float("nan")),
        "seed_seconds": seed_seconds,
    }


def scaled_env(work: Path) -> tuple[dict[str, str], Any]:
    """A fresh Postgres database and a Redis server of the run's own, and a cleanup function."""
    from contextlib import ExitStack

    from sqlalchemy import create_engine, text

    from tests.redis_server import own_redis_server

    admin_url = os.environ.get(
        "MERLIN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
    )
    name = f"merlin_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    servers = ExitStack()
    redis_url = servers.enter_context(own_redis_server(work / "redis")) + "/14"

    def cleanup() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        servers.close()

    env = {
        "MERLIN_DATABASE_URL": admin_url.rsplit("/", 1)[0] + f"/{name}",
        "MERLIN_BROKER_URL": redis_url,
    }
    return env, cleanup


def main() -> None:
    """Measure each backend and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="embedded,redis+postgres")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=50)
    parser.add_argument("--seed-jobs", type=int, default=10_000)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="merlin-overhead-") as tmp:
        work = Path(tmp)
        os.environ["MERLIN_HOME"] = str(work / "default-home")  # before workers.app loads
        for name in args.backends.split(","):
            if name == "embedded":
                results.append(run_backend(name, work, {}, args))
            else:
                env, cleanup = scaled_env(work)
                try:
                    results.append(run_backend(name, work, env, args))
                finally:
                    cleanup()
    print_tables(results, args)


def print_tables(results: list[dict], args: argparse.Namespace) -> None:
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
    print(f"\nthroughput, {args.concurrent} jobs of 5 steps at once\n")
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
