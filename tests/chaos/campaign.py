"""The chaos campaign's driver: real workers, real jobs, a killer, and connection cuts.

One ``Campaign`` runs on one backend (``sqlite``: the embedded store and broker in a
temporary ``MERLIN_HOME``; ``redis``: a Redis server of its own and a fresh Postgres
database). It starts ``workers`` real ``merlin worker --concurrency 1`` processes, each
in its own process group, submits ``jobs`` jobs with ``merlin submit --json`` (each on a
repository of its own, ``steps`` chained steps whose scripted model waits a little at
each turn and calls tools), and meanwhile:

- every ``kill_every`` seconds (uniform between the two bounds) SIGKILLs the whole
  process group of a random worker (``os.killpg``) and starts a replacement;
- on ``redis``, every few kills, cuts every Postgres session of the campaign's database
  and every Redis client connection (an outage).

It stops by itself: when every job has finished, or after ``max_minutes``. Then it stops
the workers, and the checks of ``tests.chaos.invariants`` read the database and git.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LEASE_SECONDS = 4.0
"""The jobs' lease: a killed worker's step is taken over this long after its last beat."""

CONFIG = """\
[[tiers]]
name = "local"
model = "scripted/SCRIPT"
price_in = 1.0
price_out = 2.0

[limits]
lease_seconds = LEASE
exit_command_timeout = 60
"""


POISON_COMMAND = (
    "p=$$; while [ $p -gt 1 ]; do p=$(cut -d' ' -f4 /proc/$p/stat); "
    "if grep -q merlin_flow /proc/$p/cmdline; then kill -9 $p; exit; fi; done"
)
"""Kill the nearest merlin ancestor: the pool process that runs the step (not its worker)."""

POISON_TASKLIST = {
    "title": "poison",
    "steps": [
        {"id": "poison", "step_type": "Feature", "description": "crash", "exit_command": "true"}
    ],
}
"""A one-step job whose step kills the process running it, every time it is delivered."""


def step_key(n: int) -> str:
    """The key of the ``n``-th step (from 1)."""
    return f"s{n}"


def tasklist(steps: int) -> dict[str, Any]:
    """``steps`` chained steps, each writing its own file, checked by its exit command."""
    return {
        "title": "chaos",
        "steps": [
            {
                "id": step_key(n),
                "step_type": "Feature",
                "description": f"write {step_key(n)}.txt",
                "exit_command": f"grep -q S{n} {step_key(n)}.txt",
            }
            for n in range(1, steps + 1)
        ],
    }


def script(steps: int, delay: float) -> dict[str, Any]:
    """The scripted model: per step, a command, then the file, then done; ``delay`` per turn."""
    rules: list[dict[str, Any]] = []
    for n in range(1, steps + 1):
        key, match = step_key(n), rf"Step {step_key(n)} \("
        run = {"name": "run_command", "arguments": {"command": f"echo working on {key}"}}
        write = {"name": "write_file", "arguments": {"path": f"{key}.txt", "content": f"S{n}\n"}}
        rules += [
            {"match": match, "turn": 0, "reply": {"delay": delay, "tool_calls": [run]}},
            {"match": match, "turn": 1, "reply": {"delay": delay, "tool_calls": [write]}},
        ]
    crash = {"name": "run_command", "arguments": {"command": POISON_COMMAND}}
    rules.append({"match": r"Step poison \(", "turn": 0, "reply": {"tool_calls": [crash]}})
    rules.append({"reply": {"delay": delay / 2, "content": "done"}})
    return {"rules": rules}


@dataclass
class Backend:
    """Where the campaign's jobs live."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    database_url: str = ""
    redis_url: str | None = None


@contextlib.contextmanager
def backend(name: str, work: Path) -> Iterator[Backend]:
    """The embedded SQLite store and broker, or a Redis server and Postgres database of our own."""
    if name == "sqlite":
        yield Backend("sqlite", {}, f"sqlite:///{work / 'home' / 'merlin.db'}")
        return
    from sqlalchemy import create_engine, text

    from merlin_flow.store import Database, upgrade
    from tests.conftest import POSTGRES_ADMIN_URL
    from tests.redis_server import own_redis_server

    database = f"merlin_chaos_{uuid.uuid4().hex[:10]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{database}"'))
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{database}"
    try:
        db = Database(url)
        upgrade(db)  # what `merlin db upgrade` does before the workers start
        db.dispose()
        with own_redis_server(work / "redis") as base:
            broker = f"{base}/1"
            env = {"MERLIN_BROKER_URL": broker, "MERLIN_DATABASE_URL": url}
            yield Backend("redis", env, url, broker)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()


@dataclass
class Tally:
    """What the driver did, with when: the report's first figures."""

    kills: list[float] = field(default_factory=list)
    """When each worker was killed (time.time())."""
    idle_kills: int = 0
    """Kills of a worker that was running no step."""
    outages: int = 0
    cut_sessions: int = 0
    cut_clients: int = 0
    submit_failures: list[str] = field(default_factory=list)
    submit_retries: int = 0
    """Submits whose database connection an outage cut before they wrote anything."""


class Campaign:
    """One campaign on one backend: workers, jobs, the killer; see the module docstring."""

    def __init__(self, work: Path, args: Any, target: Backend) -> None:
        from tests.e2e.helpers import merlin_env

        self.work, self.args, self.backend = work, args, target
        self.home = work / "home"
        self.env = merlin_env(self.home, MERLIN_SWEEP_INTERVAL="1", **target.env)
        self.random = random.Random(args.seed)
        self.workers: list[subprocess.Popen[bytes]] = []
        self.started_workers = 0
        self.tally = Tally()
        self.job_ids: list[str] = []
        self.repos: dict[str, Path] = {}
        self._lock = threading.Lock()
        files = work / "job"
        files.mkdir(parents=True)
        (files / "local.yaml").write_text(json.dumps(script(args.steps, args.delay)))
        self.config = files / "merlin.toml"
        self.config.write_text(
            CONFIG.replace("SCRIPT", str(files / "local.yaml")).replace(
                "LEASE", f"{LEASE_SECONDS:g}"
            )
        )
        self.tasklist = files / "tasklist.json"
        self.tasklist.write_text(json.dumps(tasklist(args.steps)))
        # The poison step's command must reach its worker: no sandbox for it.
        self.poison_config = files / "poison.toml"
        self.poison_config.write_text(self.config.read_text() + '\n[sandbox]\nmode = "none"\n')
        self.poison_tasklist = files / "poison.json"
        self.poison_tasklist.write_text(json.dumps(POISON_TASKLIST))
        self.poisoned: set[str] = set()
        self._db: Any = None

    @property
    def db(self) -> Any:
        """The campaign's database (opened once)."""
        from merlin_flow.store import open_database

        if self._db is None:
            self._db = open_database(self.backend.database_url)
        return self._db

    def log(self, n: int) -> Path:
        """The log of the ``n``-th worker started."""
        return self.work / "logs" / f"worker{n}.log"

    def start_worker(self) -> subprocess.Popen[bytes]:
        """Start one more `merlin worker` (every queue, concurrency 1, its own group)."""
        from tests.e2e.helpers import start_worker

        self.log(0).parent.mkdir(exist_ok=True)
        worker = start_worker(self.env, self.log(self.started_workers))
        self.started_workers += 1
        self.workers.append(worker)
        return worker

    def submit(self, n: int) -> None:
        """Make job ``n``'s repository and submit the job."""
        from tests.conftest import make_repo
        from tests.e2e.helpers import merlin

        repo = make_repo(self.work / "repos" / f"r{n}", {"README.md": f"chaos {n}\n"})
        poison = n < self.args.poison
        files = (
            (self.poison_tasklist, self.poison_config) if poison else (self.tasklist, self.config)
        )
        command = ["submit", str(files[0]), "--repo", str(repo), "--config", str(files[1])]
        for _ in range(3):  # a submit cut off by an outage before it wrote anything: again
            result = merlin(self.env, *command, "--json", timeout=300)
            if result.returncode == 0 or "cannot use the database" not in result.stderr:
                break
            with self._lock:
                self.tally.submit_retries += 1
        if result.returncode != 0:
            with self._lock:
                self.tally.submit_failures.append(result.stderr[-500:])
            return
        job_id = json.loads(result.stdout)["job_id"]
        with self._lock:
            self.job_ids.append(job_id)
            self.repos[job_id] = repo
            if poison:
                self.poisoned.add(job_id)

    def unfinished(self) -> int:
        """Jobs submitted and not finished yet (every job counts until it is submitted)."""
        from sqlalchemy import func, select

        from merlin_flow.store import Job

        with self.db.reader() as session:
            done = session.scalar(select(func.count()).where(Job.finished_at.is_not(None)))
        return self.args.jobs - int(done or 0)

    def running_pids(self) -> set[int]:
        """Process group ids of workers now running a step (their lease token's pid's group)."""
        from sqlalchemy import select

        from merlin_flow.leases import QUEUED
        from merlin_flow.store import Step

        with self.db.reader() as session:
            owners = session.scalars(
                select(Step.lease_owner).where(Step.lease_owner.is_not(None))
            ).all()
        groups = set()
        for owner in owners:
            if owner == QUEUED:
                continue
            with contextlib.suppress(ValueError, OSError):
                groups.add(os.getpgid(int(owner.split(":")[1])))
        return groups

    def kill_one(self) -> None:
        """SIGKILL a random live worker's process group and start a replacement."""
        from tests.e2e.helpers import kill_worker

        live = [w for w in self.workers if w.poll() is None]
        if not live:
            return
        victim = self.random.choice(live)
        with contextlib.suppress(Exception):
            if victim.pid not in self.running_pids():
                self.tally.idle_kills += 1
        kill_worker(victim)
        self.tally.kills.append(time.time())
        self.workers.remove(victim)
        self.start_worker()

    def outage(self) -> None:
        """Cut every Postgres session of our database and every Redis client connection."""
        from tests.e2e.test_connection_loss import _cut_postgres, _cut_redis

        if self.backend.redis_url is None:
            return
        database = self.backend.database_url.rsplit("/", 1)[1]
        self.tally.cut_sessions += _cut_postgres(database)
        self.tally.cut_clients += _cut_redis(self.backend.redis_url)
        self.tally.outages += 1

    def run(self) -> float:
        """Start the workers, submit the jobs and cause chaos until all finished; seconds taken."""
        begun = time.monotonic()
        deadline = begun + 60 * self.args.max_minutes
        for _ in range(self.args.workers):
            self.start_worker()
        submitter = ThreadPoolExecutor(max_workers=2)
        futures = [submitter.submit(self.submit, n) for n in range(self.args.jobs)]
        low, high = self.args.kill_every
        next_kill = time.monotonic() + self.random.uniform(low, high)
        try:
            while time.monotonic() < deadline:
                time.sleep(0.5)
                if all(f.done() for f in futures) and self.unfinished_submitted() == 0:
                    break
                kills = len(self.tally.kills)
                if time.monotonic() >= next_kill and kills < self.args.max_kills:
                    self.kill_one()
                    next_kill = time.monotonic() + self.random.uniform(low, high)
                    if self.args.outage_every and (kills + 1) % self.args.outage_every == 0:
                        self.outage()
        finally:
            submitter.shutdown(wait=True, cancel_futures=True)
            for future in futures:
                with contextlib.suppress(Exception):
                    future.result()
        return time.monotonic() - begun

    def unfinished_submitted(self) -> int:
        """Submitted jobs not finished yet, and jobs not submitted at all."""
        with self._lock:
            failed = len(self.tally.submit_failures)
        return self.unfinished() - failed

    def stop(self) -> None:
        """Stop every worker (warm shutdown, then the whole group) and close the database."""
        from tests.e2e.helpers import kill_worker, stop_worker

        for worker in self.workers:
            with contextlib.suppress(ProcessLookupError):
                if worker.poll() is None:
                    os.kill(worker.pid, signal.SIGTERM)
        for worker in self.workers:
            try:
                stop_worker(worker)
            finally:
                kill_worker(worker)
        if self._db is not None:
            self._db.dispose()
            self._db = None

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every worker's log, for a failed run."""
        logs = sorted((self.work / "logs").glob("*.log"))
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in logs)
