"""Benchmark: many jobs at once on the shipped worker layout, and what runs out first.

Run: ``python -m tests.bench.scale [--jobs 50,100,200] [--steps 5] [--smoke]``. On a
Postgres database and a Redis server of the run's own (as ``tests.bench.overhead``), it
starts the four workers of the shipped layout, each a real ``merlin worker`` process:
two on ``verify`` (prefork, 2 processes each) and two on ``llm,control`` (threads, 8
each). For each count of ``--jobs`` it creates that many jobs of ``--steps`` independent
steps (a scripted model that answers at once, exit command ``true`` in the sandbox),
publishes them all at once and, while they run, samples every ``SAMPLE_SECONDS``:

- the database's connections (``pg_stat_activity`` of its database, the sampler's own
  left out);
- the messages waiting in each queue (the Redis lists kombu keeps them in; a message a
  worker has reserved is not waiting there);

and the machine's CPU time over the round (``/proc/stat``).

Reported per count: steps per second (steps over the time from publishing to the last
job finished), the longest and the median wait of a step for a free slot (from its job's
publication to its first attempt's start: every step is runnable at once), the
connections at peak, each queue's backlog (mean and deepest) and how busy the cores
were. The first bottleneck named is the cores when they were at least ``CPU_BOUND``
busy (more slots cannot help then), else the queue with the largest mean backlog.

Without ``--smoke`` it writes its section of docs/BENCHMARKS.md; ``--smoke`` (2 jobs of 2
steps) writes nothing. The workers are stopped, each process group whole, however the
run ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from tests.bench.docs_section import write_section
from tests.bench.processes import log_tail, stop_group, terminated_as_exit, wait_until

HEADING = "## Scale: the shipped worker layout under 50 to 200 jobs"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md"
LAYOUT = (
    ("verify", "prefork", 2),
    ("verify", "prefork", 2),
    ("llm,control", "threads", 8),
    ("llm,control", "threads", 8),
)
"""Each worker: its queues, its pool and its slots (as deploy/compose.yaml runs them)."""
QUEUES = ("llm", "verify", "control")
SAMPLE_SECONDS = 0.25
CPU_BOUND = 0.85
"""A round whose cores were this busy was bound by them, whatever its queues held."""
INSTANT = "rules:\n  - reply: {content: done}\n"


@dataclass
class Round:
    """One count of jobs: what it took and what was sampled while it ran."""

    jobs: int
    steps: int
    seconds: float = 0.0
    waits: list[float] = field(default_factory=list)
    connections: int = 0
    backlog: dict[str, int] = field(default_factory=lambda: dict.fromkeys(QUEUES, 0))
    backlog_sum: dict[str, int] = field(default_factory=lambda: dict.fromkeys(QUEUES, 0))
    samples: int = 0
    cpu_busy: float = 0.0
    """The share of the machine's cores busy over the round (``/proc/stat``)."""

    def mean_backlog(self, queue: str) -> float:
        """Messages waiting in ``queue``, averaged over the round's samples."""
        return self.backlog_sum[queue] / self.samples if self.samples else 0.0

    @property
    def steps_per_second(self) -> float:
        """Steps finished per second of the round."""
        return self.jobs * self.steps / self.seconds if self.seconds else 0.0


class Sampler(threading.Thread):
    """Reads the database's connections and the queues' backlogs until stopped."""

    def __init__(self, database_url: str, broker_url: str, into: Round) -> None:
        super().__init__(daemon=True)
        import redis
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        self.engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"),
                                    poolclass=NullPool)  # fmt: skip
        self.redis = redis.Redis.from_url(broker_url)
        self.into, self.stopped = into, threading.Event()

    def run(self) -> None:
        from sqlalchemy import text

        query = text(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        with self.engine.connect() as connection:
            while not self.stopped.wait(SAMPLE_SECONDS):
                count = int(connection.execute(query).scalar_one())
                self.into.connections = max(self.into.connections, count)
                for queue in QUEUES:
                    depth = self.depth(queue)
                    self.into.backlog[queue] = max(self.into.backlog[queue], depth)
                    self.into.backlog_sum[queue] += depth
                self.into.samples += 1

    def depth(self, queue: str) -> int:
        """Messages waiting in ``queue``: kombu keeps one list per priority level."""
        names = [queue.encode(), *self.redis.scan_iter(match=f"{queue}\x06\x16*")]
        return sum(int(self.redis.llen(name)) for name in names)

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)
        self.engine.dispose()
        self.redis.close()


class Fleet:
    """The store, the broker, a repository, and the four workers."""

    def __init__(self, work: Path, backend: dict[str, str]) -> None:
        from merlin_flow.config import MerlinConfig, Tier
        from merlin_flow.settings import Settings
        from merlin_flow.store import Database, open_database, upgrade
        from tests.conftest import make_repo
        from tests.e2e.helpers import merlin_env
        from workers.app import create_app

        self.work, self.backend = work, backend
        self.env = merlin_env(work / "home", **backend)
        self.env.pop("MERLIN_SWEEP_INTERVAL")  # the workers' own sweep, as deployed
        self.settings = Settings(home=work / "home", database_url=backend["MERLIN_DATABASE_URL"],
                                 broker_url=backend["MERLIN_BROKER_URL"])  # fmt: skip
        schema = Database(self.settings.database)
        upgrade(schema)
        schema.dispose()
        self.db = open_database(self.settings.database)
        self.app = create_app(self.settings)
        script = work / "instant.yaml"
        script.write_text(INSTANT)
        self.config = MerlinConfig(tiers=[Tier(name="local", model=f"scripted/{script}")])
        self.repo = make_repo(work / "repo", {"README.md": "scale\n"})
        self.workers: list[Any] = []
        self.logs: list[Path] = []

    def start(self) -> None:
        """Start the four workers; wait until each is ready."""
        import subprocess
        import sys

        for n, (queues, pool, slots) in enumerate(LAYOUT):
            log = self.work / f"worker{n}.log"
            argv = [sys.executable, "-m", "merlin_flow.cli", "worker", "--queues", queues,
                    "--pool", pool, "--concurrency", str(slots), "--loglevel", "INFO"]  # fmt: skip
            with log.open("ab") as handle:
                self.workers.append(subprocess.Popen(
                    argv, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
                    start_new_session=True,
                ))  # fmt: skip
            self.logs.append(log)
        for log in self.logs:
            wait_until(lambda log=log: "ready." in log.read_text(errors="replace"),
                       f"the worker logging to {log}", self.workers, self.logs)  # fmt: skip

    def stop(self) -> None:
        for worker in self.workers:
            stop_group(worker)
        self.db.dispose()

    def round(self, jobs: int, steps: int) -> Round:
        """``jobs`` jobs of ``steps`` independent steps, published at once, run to the end."""
        from merlin_flow.jobs.submission import create_job
        from tests.bench.overhead import tasklist
        from workers.canvas import enqueue_job

        self.app.set_default()
        self.app.set_current()  # merlin's tasks are shared: they publish through it
        ids = [create_job(self.db, self.settings, tasklist(steps), self.repo, self.config)
               for _ in range(jobs)]  # fmt: skip
        result = Round(jobs, steps)
        sampler = Sampler(self.backend["MERLIN_DATABASE_URL"],
                          self.backend["MERLIN_BROKER_URL"], result)  # fmt: skip
        sampler.start()
        published: dict[str, float] = {}
        busy_before, total_before = _cpu_times()
        begun = time.time()
        try:
            for job_id in ids:
                enqueue_job(self.db, job_id)
                published[job_id] = time.time()
            timeout = 120 + 2 * jobs * steps
            wait_until(lambda: self.unfinished(ids) == 0, f"{jobs} jobs to finish",
                       self.workers, self.logs, timeout=timeout, poll=0.2)  # fmt: skip
        finally:
            sampler.stop()
        busy, total = _cpu_times()
        result.cpu_busy = (busy - busy_before) / max(1, total - total_before)
        last, result.waits = self.times(ids, published)
        result.seconds = last - begun
        return result

    def unfinished(self, ids: list[str]) -> int:
        from sqlalchemy import func, select

        from merlin_flow.store import Job

        with self.db.reader() as session:
            return int(session.scalar(select(func.count()).select_from(Job).where(
                Job.id.in_(ids), Job.finished_at.is_(None))) or 0)  # fmt: skip

    def times(self, ids: list[str], published: dict[str, float]) -> tuple[float, list[float]]:
        """When the last job finished, and each step's wait for its first attempt (s)."""
        from sqlalchemy import func, select

        from merlin_flow.store import Attempt, Job, Step

        with self.db.reader() as session:
            jobs = session.execute(select(Job.id, Job.status, Job.finished_at, Job.error)
                                   .where(Job.id.in_(ids))).all()  # fmt: skip
            firsts = session.execute(
                select(Step.job_id, func.min(Attempt.started_at))
                .join(Attempt, Attempt.step_id == Step.id)
                .where(Step.job_id.in_(ids))
                .group_by(Step.id)
            ).all()
        failed = [
            f"{row.id}: {row.status} {row.error}" for row in jobs if row.status != "completed"
        ]
        if failed:
            raise SystemExit(f"jobs did not complete: {failed[:3]}\n{log_tail(self.logs[0])}")
        last = max(_epoch(row.finished_at) for row in jobs)
        return last, [_epoch(started) - published[job_id] for job_id, started in firsts]


def _cpu_times() -> tuple[int, int]:
    """The machine's busy and total CPU time so far, in clock ticks (``/proc/stat``)."""
    fields = [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def _epoch(moment: datetime) -> float:
    """A naive UTC timestamp of the store as seconds since the epoch."""
    return moment.replace(tzinfo=UTC).timestamp()


def table(rounds: list[Round]) -> str:
    """The rounds as a Markdown table."""
    rows = [
        "| jobs | steps | seconds | steps/s | longest wait for a slot | median wait | "
        "DB connections at peak | backlog, mean (deepest): llm / verify / control | CPU busy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        backlog = " / ".join(f"{r.mean_backlog(q):.0f} ({r.backlog[q]})" for q in QUEUES)
        rows.append(
            f"| {r.jobs} | {r.jobs * r.steps} | {r.seconds:.1f} | {r.steps_per_second:.1f} | "
            f"{max(r.waits):.1f} s | {statistics.median(r.waits):.1f} s | {r.connections} | "
            f"{backlog} | {r.cpu_busy:.0%} |"
        )
    return "\n".join(rows) + "\n"


def bottleneck(rounds: list[Round]) -> str:
    """What ran out first in the largest round: the cores, or a queue's slots."""
    largest = rounds[-1]
    queue = max(QUEUES, key=largest.mean_backlog)
    slots = sum(s for queues, _pool, s in LAYOUT if queue in queues.split(","))
    waiting = (
        f"the `{queue}` queue ({slots} slots in all) had the most tasks waiting, "
        f"{largest.mean_backlog(queue):.0f} on average"
    )
    cores = os.cpu_count() or 1
    if largest.cpu_busy >= CPU_BOUND:
        return (
            f"First bottleneck: the machine's {cores} cores, {largest.cpu_busy:.0%} busy over "
            f"the {largest.jobs} jobs (merlin, git, the sandbox, Postgres and Redis share "
            f"them); more slots would not help. Of the queues, {waiting}."
        )
    return f"First bottleneck: {waiting}, with the cores {largest.cpu_busy:.0%} busy."


def section(rounds: list[Round], steps: int) -> str:
    """This benchmark's section of docs/BENCHMARKS.md."""
    counts = ",".join(str(r.jobs) for r in rounds)
    return (
        f"{HEADING}\n\n"
        f"Command: `python -m tests.bench.scale --jobs {counts} --steps {steps}`. Four real\n"
        "workers on a Redis and a Postgres of the run's own: two `verify` (prefork, 2\n"
        "processes each), two `llm,control` (threads, 8 each). Each job has independent\n"
        "steps whose scripted model answers at once and whose exit command is `true` (in the\n"
        "sandbox); all jobs are published at once. The wait of a step is from its job's\n"
        "publication to its first attempt's start; a backlog counts the messages in a\n"
        "queue's Redis list, not those a worker has reserved (prefetched) and not begun.\n\n"
        f"Run of {date.today().isoformat()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores:\n\n{table(rounds)}\n{bottleneck(rounds)}\n"
    )


def main() -> None:
    """Run each count of jobs on the four workers; print the table."""
    from tests.bench.overhead import Unavailable, scaled_env

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", default="50,100,200", help="counts of jobs, in order")
    parser.add_argument("--steps", type=int, default=5, help="independent steps per job")
    parser.add_argument("--smoke", action="store_true", help="2 jobs of 2 steps; no docs")
    parser.add_argument("--docs", type=Path, default=DOCS)
    args = parser.parse_args()
    counts = [2] if args.smoke else [int(n) for n in args.jobs.split(",")]
    steps = 2 if args.smoke else args.steps
    rounds: list[Round] = []
    with terminated_as_exit(), tempfile.TemporaryDirectory(prefix="merlin-scale-") as tmp:
        work = Path(tmp)
        os.environ["MERLIN_HOME"] = str(work / "default-home")  # never a developer's broker
        try:
            with scaled_env(work) as backend, _fleet(work, backend) as fleet:
                for count in counts:
                    rounds.append(fleet.round(count, steps))
                    print(table(rounds[-1:]), flush=True)
        except Unavailable as exc:
            if not args.smoke or os.environ.get("CI"):
                raise SystemExit(f"redis+postgres: {exc}") from None
            print(f"skipped: {exc}")
            return
    print(table(rounds))
    print(bottleneck(rounds))
    if not args.smoke:
        write_section(args.docs, HEADING, section(rounds, steps))


@contextlib.contextmanager
def _fleet(work: Path, backend: dict[str, str]) -> Iterator[Fleet]:
    fleet = Fleet(work, backend)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


if __name__ == "__main__":
    main()
