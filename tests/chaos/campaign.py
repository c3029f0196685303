"""The chaos campaign's driver: real workers, real jobs, a killer, and connection cuts.

One ``Campaign`` runs on one backend (``sqlite``: the embedded store and broker in a
temporary ``MERLIN_HOME``; ``redis``: a Redis server of its own and a fresh Postgres
database). It starts real ``merlin worker --concurrency 2`` processes (``concurrency``),
each in its own process group, submits ``jobs`` jobs with ``merlin submit --json`` (each
on a repository of its own, ``steps`` chained steps whose scripted model waits a little
at each turn, runs a command of ``command`` seconds and writes a file; the exit command
takes half as long), and meanwhile:

- every ``kill_every`` seconds (uniform between the two bounds) SIGKILLs the whole
  process group of a random worker (``os.killpg``) and starts a replacement; just
  before, it notes the commands the victim runs and the steps the kill may stall
  (``tests.chaos.watch``), then checks that those commands are gone a few seconds later
  and times how long each step sits until its lease moves;
- on ``redis``, every few kills, cuts every Postgres session of the campaign's database
  and every Redis client connection (an outage).

With ``machines`` (Redis + Postgres only), it simulates that many machines: each has its
own ``MERLIN_HOME`` and working directory and runs an ``llm,control`` worker and a
``verify`` worker; they share Redis, Postgres and the jobs' git URLs (a bare repository
per job, ``file://``), and each submits its share of the jobs. A kill picks a random
machine, then one of its workers, and restarts it there.

With ``namespaces`` too, each machine runs in a PID and mount namespace of its own
(``tests.chaos.namespaces``): no machine sees another's processes, so a step of a
worker killed on one machine is taken over at once only by a worker of the same machine
(``leases.process_gone``); from another, once its lease lapsed. The bound on idle after
a kill is then a lease and a sweep. With ``crash_every`` N, every N-th kill is a
machine's crash: its namespace's init is killed (every process in it at once) and the
machine boots again in a new namespace, a new pid space, as a rebooted machine has a new
boot id; its steps can then only be taken over once their lease lapsed.

A kill comes only once the campaign is in the steady state its bound is promised for:
every live worker has logged that it is ready, the last of them a lost message's grace
ago (``recovery.grace``: a sweeper that has just begun watching the broker cannot yet
tell a message delivered to a dead worker from one a live worker is about to claim).
A kill whose time has come waits for that; on a loaded machine kills are further apart.

It stops by itself: when every job has finished, or after ``max_minutes``. Then it gives
the workers a few sweep intervals to remove what is left of worktrees, stops them,
counts the commands left, and the checks of ``tests.chaos.invariants`` read the
database and git.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
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

from tests.chaos.namespaces import Namespace, children, namespace_of
from tests.chaos.watch import (
    ORPHAN_SECONDS,
    POLL_MARGIN,
    Broker,
    IdleWatch,
    Key,
    Stall,
    alive,
    campaign_commands,
    command_processes,
    describe,
    held_steps,
    taken,
)

LEASE_SECONDS = 4.0
"""The jobs' lease (``--lease``): a killed worker's step is taken over this long after its
last beat."""
SWEEP_SECONDS = 1.0
"""Seconds between each worker's recovery sweeps (``--sweep``, ``MERLIN_SWEEP_INTERVAL``)."""
READY = re.compile(r"(\S+@\S+) ready\.")
"""A worker's log line once it is ready, with its Celery host name."""
TOKEN_SAMPLE_SECONDS = 1.0
"""How often the driver reads the lease tokens of running steps (their pid spaces)."""
BOOT_SECONDS = 60.0
"""How long the end of a campaign waits for rebooted workers before it counts sweeps."""
CLEANUP_SWEEPS = 3
"""Sweep intervals (plus ``POLL_MARGIN``) the workers get to remove worktrees at the end."""

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

NO_SANDBOX = '\n[sandbox]\nmode = "none"\n'

POISON_COMMAND = (
    "p=$$; while [ $p -gt 1 ]; do p=$(cut -d' ' -f4 /proc/$p/stat); "
    "if grep -q merlin_flow /proc/$p/cmdline && ! grep -q command_guard /proc/$p/cmdline; "
    "then kill -9 $p; exit; fi; done"
)
"""Kill the nearest merlin ancestor but the command's guard
(``merlin_flow.workspace.command_guard``): the pool process that runs the step (not its
worker)."""

POISON_TASKLIST = {
    "title": "poison",
    "steps": [
        {"id": "poison", "step_type": "Feature", "description": "crash", "exit_command": "true"}
    ],
}
"""A one-step job whose step kills the process running it, every time it is delivered."""


def start_worker_in(
    namespace: Namespace, env: dict[str, str], log: Path, *args: str, cwd: Path
) -> subprocess.Popen[bytes]:
    """``tests.e2e.helpers.start_worker`` in ``namespace``: the ``nsenter`` leads the
    worker's process group (killing the group kills the worker and all it started)."""
    from tests.e2e.helpers import MERLIN

    command = [*MERLIN, "worker", "--concurrency", "1", "--loglevel", "INFO", *args]
    with log.open("ab") as handle:
        return subprocess.Popen(
            [*namespace.enter(cwd), *command], env=env, stdout=handle,
            stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd,
        )  # fmt: skip


def step_key(n: int) -> str:
    """The key of the ``n``-th step (from 1)."""
    return f"s{n}"


def tasklist(steps: int, command: float = 0.0) -> dict[str, Any]:
    """``steps`` chained steps, each writing its own file, checked by an exit command of
    ``command / 2`` seconds (exit commands run without a shell: ``sh -c``)."""

    def check(n: int) -> str:
        grep = f"grep -q S{n} {step_key(n)}.txt"
        return f"sh -c 'sleep {command / 2:g}; {grep}'" if command else grep

    return {
        "title": "chaos",
        "steps": [
            {
                "id": step_key(n),
                "step_type": "Feature",
                "description": f"write {step_key(n)}.txt",
                "exit_command": check(n),
            }
            for n in range(1, steps + 1)
        ],
    }


def script(steps: int, delay: float, command: float = 0.0) -> dict[str, Any]:
    """The scripted model: per step, a command of ``command`` seconds, then the file, then
    done; ``delay`` per turn."""
    rules: list[dict[str, Any]] = []
    wait = f"sleep {command:g}; " if command else ""
    for n in range(1, steps + 1):
        key, match = step_key(n), rf"Step {step_key(n)} \("
        run = {"name": "run_command", "arguments": {"command": f"{wait}echo working on {key}"}}
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
class Machine:
    """A simulated machine: its own ``MERLIN_HOME`` and working directory, and its workers."""

    name: str
    home: Path
    cwd: Path
    env: dict[str, str]
    roles: tuple[str, ...]
    """The queues of each of its workers ("": every queue)."""
    namespace: Namespace | None = None
    """Its own PID and mount namespace (``--namespaces``), or this machine's."""
    spaces: list[str] = field(default_factory=list)
    """The pid spaces of its namespaces, one per boot (``--namespaces``)."""


@dataclass
class Worker:
    """A `merlin worker` process the campaign started."""

    process: subprocess.Popen[bytes]
    machine: Machine
    queues: str
    log: Path
    ready_at: float | None = None
    """When its log first said it was ready (``time.monotonic``)."""

    @property
    def pid(self) -> int:
        """The `merlin worker` process: in a namespace, the child of its ``nsenter``."""
        if self.machine.namespace is not None:
            return next(iter(children(self.process.pid)), self.process.pid)
        return self.process.pid

    def name(self) -> str:
        """Its Celery host name, as its log says once it is ready (the last field of its
        lease tokens); "" before."""
        found = READY.findall(self.log.read_text(errors="replace"))
        return str(found[-1]) if found else ""


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
    commands_at_kills: int = 0
    """Processes of commands the victims were running when they were killed."""
    orphans: list[str] = field(default_factory=list)
    """Commands alive ``ORPHAN_SECONDS`` after their worker was killed (a line each)."""
    orphans_at_end: list[str] = field(default_factory=list)
    """Commands of the campaign's workers still alive once every worker was stopped."""
    snapshot_failures: int = 0
    """Kills before which the database or broker could not be read (an outage)."""
    cleanup_seconds: float = 0.0
    """How long the last worktrees took to go after the last job finished."""
    crashes: int = 0
    """Kills of a whole machine (``--crash-every``), of ``kills``."""
    tokens: set[str] = field(default_factory=set)
    """Every worker lease token seen on a step (sampled while running, and ``lost_by``)."""
    isolation: dict[str, dict[str, int]] = field(default_factory=dict)
    """With ``--namespaces``: how many processes of each machine (their environment names
    its ``MERLIN_HOME``) each machine's namespace showed, once every worker was ready."""
    namespace_problems: list[str] = field(default_factory=list)
    """With ``--namespaces``: a machine that saw another's processes, a token of another
    pid space than its machine's, a process left in a namespace at the end."""


class Campaign:
    """One campaign on one backend: workers, jobs, the killer; see the module docstring."""

    def __init__(self, work: Path, args: Any, target: Backend) -> None:
        from merlin_flow.settings import Settings
        from tests.e2e.helpers import merlin_env

        self.work, self.args, self.backend = work, args, target
        if args.machines and target.redis_url is None:
            raise ValueError("--machines needs the redis backend (machines share Postgres)")
        sweep = {"MERLIN_SWEEP_INTERVAL": f"{args.sweep:g}", **target.env}
        if args.machines:
            places = [(f"m{i}", work / f"m{i}") for i in range(args.machines)]
            roles: tuple[str, ...] = ("llm,control", "verify")
        else:
            places, roles = [("local", work)], ("",) * args.workers
        self.machines = [
            Machine(name, cwd / "home", cwd, merlin_env(cwd / "home", **sweep), roles)
            for name, cwd in places
        ]
        self.home = self.machines[0].home
        self.env = self.machines[0].env
        self.random = random.Random(args.seed)
        self.workers: list[Worker] = []
        self.started: list[Worker] = []
        """Every worker started, killed or not."""
        self.started_workers = 0
        self.namespaces: list[Namespace] = []
        """Every namespace made, crashed or not (each holds its pid space until the end)."""
        self._isolated = False
        """Whether the namespaces' isolation was checked (once every worker was ready)."""
        self.tally = Tally()
        self.broker = Broker(
            target.redis_url, None if target.redis_url else self.home / "broker.db"
        )
        self.handoff = float(
            self.env.get("MERLIN_HANDOFF_SECONDS", Settings.model_fields["handoff_seconds"].default)
        )
        self.idle = IdleWatch(args.lease, self.handoff)
        self._orphan_checks: list[tuple[float, int, set[Key]]] = []
        self._stopped = False
        self.finished = False
        """Whether every job finished before ``max_minutes`` (set by ``run``)."""
        self.job_ids: list[str] = []
        self.repos: dict[str, Path] = {}
        self._lock = threading.Lock()
        files = work / "job"
        files.mkdir(parents=True)
        (files / "local.yaml").write_text(json.dumps(script(args.steps, args.delay, args.command)))
        self.config = files / "merlin.toml"
        self.config.write_text(
            CONFIG.replace("SCRIPT", str(files / "local.yaml")).replace("LEASE", f"{args.lease:g}")
            + (NO_SANDBOX if args.sandbox == "none" else "")
        )
        self.tasklist = files / "tasklist.json"
        self.tasklist.write_text(json.dumps(tasklist(args.steps, args.command)))
        # The poison step's command must reach its worker: no sandbox for it.
        self.poison_config = files / "poison.toml"
        poison = self.config.read_text()
        self.poison_config.write_text(poison if args.sandbox == "none" else poison + NO_SANDBOX)
        self.poison_tasklist = files / "poison.json"
        self.poison_tasklist.write_text(json.dumps(POISON_TASKLIST))
        self.poisoned: set[str] = set()
        self._db: Any = None

    @property
    def homes(self) -> list[Path]:
        """Every machine's ``MERLIN_HOME``."""
        return [machine.home for machine in self.machines]

    @property
    def namespaced(self) -> bool:
        """Whether each machine runs in a PID and mount namespace of its own."""
        return bool(getattr(self.args, "namespaces", False))

    @property
    def idle_bound(self) -> float:
        """The longest a step may sit after a kill: a lease; across PID namespaces, a lease
        and a sweep (a worker of another machine cannot see the victim is gone: the lease
        must lapse, then a sweep take the step over)."""
        if self.namespaced:
            return float(self.args.lease + self.args.sweep)
        return float(self.args.lease)

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

    def start_worker(self, machine: Machine, queues: str) -> Worker:
        """Start one more `merlin worker` on ``machine`` (its own process group)."""
        from tests.e2e.helpers import start_worker

        self.log(0).parent.mkdir(exist_ok=True)
        machine.cwd.mkdir(parents=True, exist_ok=True)
        options = ["--concurrency", str(self.args.concurrency)]  # the last one counts
        if queues:
            options += ["--queues", queues]
        log = self.log(self.started_workers)
        if len(self.machines) > 1:
            log = log.with_name(f"{machine.name}-{queues.replace(',', '-')}-{log.name}")
        if machine.namespace is None:
            process = start_worker(machine.env, log, *options, cwd=machine.cwd)
        else:
            process = start_worker_in(
                machine.namespace, machine.env, log, *options, cwd=machine.cwd
            )
        self.started_workers += 1
        worker = Worker(process, machine, queues, log)
        self.workers.append(worker)
        self.started.append(worker)
        return worker

    def submit(self, n: int) -> None:
        """Make job ``n``'s repository (and, with machines, its remote) and submit the job."""
        from tests.conftest import git, make_repo
        from tests.e2e.helpers import MERLIN

        repo = make_repo(self.work / "repos" / f"r{n}", {"README.md": f"chaos {n}\n"})
        location, machine = str(repo), self.machines[n % len(self.machines)]
        if self.args.machines:
            repo = self.work / "remotes" / f"r{n}.git"
            git(self.work, "clone", "-q", "--bare", location, str(repo))
            location = f"file://{repo}"
        poison = n < self.args.poison
        files = (
            (self.poison_tasklist, self.poison_config) if poison else (self.tasklist, self.config)
        )
        command = [*MERLIN, "submit", str(files[0]), "--repo", location, "--config", str(files[1])]
        for _ in range(3):  # a submit cut off by an outage before it wrote anything: again
            result = subprocess.run(
                [*command, "--json"], env=machine.env, cwd=machine.cwd, capture_output=True,
                text=True, timeout=300, check=False,
            )  # fmt: skip
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
        return int(self.args.jobs) - int(done or 0)

    def settled(self) -> bool:
        """Whether every live worker is ready, the last of them a message's grace ago."""
        from merlin_flow.engine.recovery import MIN_GRACE_SECONDS

        ready = self.ready_times()
        if ready is None:
            return False
        grace = max(MIN_GRACE_SECONDS, self.args.sweep)
        return time.monotonic() - max(ready) >= grace

    def ready_times(self) -> list[float] | None:
        """When each live worker became ready (time.monotonic()); None while one is not."""
        now = time.monotonic()
        for worker in self.workers:
            if worker.ready_at is None and "ready." in worker.log.read_text(errors="replace"):
                worker.ready_at = now
        ready = [w.ready_at for w in self.workers if w.process.poll() is None]
        if not ready or None in ready:
            return None
        return [r for r in ready if r is not None]

    def kill_one(self, crash: bool = False) -> None:
        """SIGKILL a random live worker's process group and start a replacement
        (``crash``: every process of a random machine at once, its PID namespace's init,
        and bring the machine back in a new namespace, as after a reboot).

        Just before, note the commands they run and the steps the kill may stall; the
        driver's loop then checks the first are gone and times the second.
        """
        from tests.e2e.helpers import kill_worker

        live = [w for w in self.workers if w.process.poll() is None]
        if not live:
            return
        machine = self.random.choice(sorted({w.machine.name for w in live}))
        if crash:
            victims = [w for w in self.workers if w.machine.name == machine]
        else:
            victims = [self.random.choice([w for w in live if w.machine.name == machine])]
        groups = [victim.process.pid for victim in victims]
        commands = set().union(*(command_processes(group) for group in groups))
        watched = True
        try:
            held, queued = held_steps(self.db, groups, self.broker, self.handoff)
        except Exception:  # an outage cut our own session: the kill goes on unwatched
            held, queued, watched = [], [], False
            self.tally.snapshot_failures += 1
        place = victims[0].machine
        if crash:
            assert place.namespace is not None
            place.namespace.close()  # its init: every process in it
            self.tally.crashes += 1
        for victim in victims:
            kill_worker(victim.process)
        at, wall = time.monotonic(), time.time()
        held += taken(queued, self.broker)  # taken off their queue just before the kill
        number = len(self.tally.kills)
        self.tally.kills.append(time.time())
        if watched and not any(not h.delivered for h in held):
            self.tally.idle_kills += 1
        self.tally.commands_at_kills += len(commands)
        self.idle.add(Stall(number, wall, held))
        self._orphan_checks.append((at + ORPHAN_SECONDS, number, commands))
        if crash:
            self.boot(place)
        for victim in victims:
            self.workers.remove(victim)
            self.start_worker(victim.machine, victim.queues)

    def boot(self, machine: Machine) -> None:
        """Give ``machine`` a new PID and mount namespace (a new pid space)."""
        log = self.log(0).with_name(f"{machine.name}-namespace.txt")
        machine.namespace = Namespace(machine.name, log)
        machine.spaces.append(machine.namespace.space)
        self.namespaces.append(machine.namespace)

    def check_orphans(self, wait: bool = False) -> None:
        """Count the commands of each kill still alive ``ORPHAN_SECONDS`` after it (``wait``:
        every kill's, waiting for the last ones' time to come)."""
        due = [c for c in self._orphan_checks if wait or c[0] <= time.monotonic()]
        for check in due:
            at, number, commands = check
            time.sleep(max(0.0, at - time.monotonic()))
            for line in describe(alive(commands)):
                self.tally.orphans.append(f"kill {number}: {line}")
            self._orphan_checks.remove(check)

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
        if self.namespaced:
            for machine in self.machines:
                self.boot(machine)
        for machine in self.machines:
            for queues in machine.roles:
                self.start_worker(machine, queues)
        submitter = ThreadPoolExecutor(max_workers=2)
        futures = [submitter.submit(self.submit, n) for n in range(self.args.jobs)]
        low, high = self.args.kill_every
        next_kill = time.monotonic() + self.random.uniform(low, high)
        finished = False
        sampled = 0.0
        try:
            while time.monotonic() < deadline:
                time.sleep(0.25)
                with contextlib.suppress(Exception):  # an outage cut our session: next time
                    self.idle.poll(self.db, self.broker)
                if time.monotonic() - sampled >= TOKEN_SAMPLE_SECONDS:
                    sampled = time.monotonic()
                    with contextlib.suppress(Exception):
                        self.sample_tokens()
                self.check_orphans()
                if all(f.done() for f in futures) and self.unfinished_submitted() == 0:
                    finished = self.finished = True
                    break
                kills = len(self.tally.kills)
                due = time.monotonic() >= next_kill and kills < self.args.max_kills
                if self.namespaced and not self._isolated and self.settled():
                    self.check_isolation()
                if due and self.settled():
                    every = getattr(self.args, "crash_every", 0)
                    self.kill_one(crash=bool(every) and (kills + 1) % every == 0)
                    next_kill = time.monotonic() + self.random.uniform(low, high)
                    if self.args.outage_every and (kills + 1) % self.args.outage_every == 0:
                        self.outage()
        finally:
            submitter.shutdown(wait=True, cancel_futures=True)
            for future in futures:
                with contextlib.suppress(Exception):
                    future.result()
        if finished:
            self.await_cleanup()
        with contextlib.suppress(Exception):
            self.idle.poll(self.db, self.broker)
        with contextlib.suppress(Exception):
            self.sample_tokens(lost=True)
        self.idle.close()
        return time.monotonic() - begun

    def sample_tokens(self, lost: bool = False) -> None:
        """Note the lease tokens of the steps workers hold now (``lost``: and of every
        step's last lost worker)."""
        from sqlalchemy import select

        from merlin_flow.engine.leases import QUEUED
        from merlin_flow.store import Step

        with self.db.reader() as session:
            owners = set(
                session.scalars(select(Step.lease_owner).where(Step.lease_owner.is_not(None)))
            )
            if lost:
                owners |= set(
                    session.scalars(select(Step.lost_by).where(Step.lost_by.is_not(None)))
                )
        self.tally.tokens |= {owner for owner in owners if owner and owner != QUEUED}

    def token_spaces(self) -> dict[str, set[str]]:
        """The pid spaces of the tokens seen, by the machine of the worker that wrote them
        (the token's last field, its Celery host name, as that worker logged it)."""
        from merlin_flow.engine.leases import token_worker

        machines = {w.name(): w.machine.name for w in self.started}
        machines.pop("", None)
        spaces: dict[str, set[str]] = {}
        for token in self.tally.tokens:
            host = token.partition(":")[0]
            machine = machines.get(token_worker(token), "?")
            spaces.setdefault(machine, set()).add(host.rpartition("/")[2])
        return spaces

    def check_isolation(self) -> None:
        """With ``--namespaces``, once every worker is ready: each machine's namespace shows
        its own workers and none of another machine's (processes whose environment names
        that machine's ``MERLIN_HOME``), and each worker runs in its machine's namespace."""
        self._isolated = True
        homes = {machine.name: str(machine.home) for machine in self.machines}
        ours = namespace_of(os.getpid())
        for machine in self.machines:
            if machine.namespace is None:
                continue
            try:
                seen = machine.namespace.seen(list(homes.values()))
            except (subprocess.SubprocessError, OSError, ValueError) as error:
                self.tally.namespace_problems.append(f"{machine.name}: cannot look inside: {error}")
                continue
            counts = {name: seen.get(home, 0) for name, home in homes.items()}
            self.tally.isolation[machine.name] = counts
            for name, count in counts.items():
                if (name == machine.name) != bool(count):
                    self.tally.namespace_problems.append(
                        f"{machine.name}'s PID namespace shows {count} processes of {name}"
                    )
            for worker in self.workers:
                if worker.machine is machine and worker.process.poll() is None:
                    inode = namespace_of(worker.pid)  # None: it died just now
                    if inode is not None and (inode == ours or inode != machine.namespace.inode):
                        self.tally.namespace_problems.append(
                            f"{machine.name}: worker {worker.pid} in PID namespace {inode}, "
                            f"not the machine's {machine.namespace.inode}"
                        )

    def namespace_violations(self) -> list[str]:
        """With ``--namespaces``: every problem of ``Tally.namespace_problems``, and tokens
        whose pid space is not their machine's, or the same as another machine's."""
        problems = list(self.tally.namespace_problems)
        if not self.namespaced:
            return problems
        if not self._isolated:
            problems.append("the namespaces' isolation was never checked (no worker ready)")
        spaces = self.token_spaces()
        booted = [space for machine in self.machines for space in machine.spaces]
        if len(set(booted)) < len(booted):
            problems.append(f"a pid space used by two namespaces: {', '.join(booted)}")
        owner: dict[str, str] = {}
        for machine in self.machines:
            for space in sorted(spaces.get(machine.name, set())):
                if space not in machine.spaces:
                    problems.append(
                        f"{machine.name}: a lease token of pid space {space!r}, not one of "
                        f"the machine's ({', '.join(machine.spaces)})"
                    )
                if owner.setdefault(space, machine.name) != machine.name:
                    problems.append(f"{machine.name} and {owner[space]} share pid space {space!r}")
        return problems

    def await_cleanup(self) -> None:
        """Give the workers a few sweep intervals to remove every worktree of ended jobs."""
        from tests.chaos.invariants import worktrees_left

        begun = time.monotonic()
        # A machine that crashed near the end may still be booting: its folders go at its
        # workers' first sweeps, so the sweeps are counted from when every worker is ready.
        while self.ready_times() is None and time.monotonic() < begun + BOOT_SECONDS:
            time.sleep(0.25)
        deadline = time.monotonic() + CLEANUP_SWEEPS * self.args.sweep + POLL_MARGIN
        while worktrees_left(self.homes, self.repos) and time.monotonic() < deadline:
            time.sleep(0.25)
        self.tally.cleanup_seconds = time.monotonic() - begun

    def unfinished_submitted(self) -> int:
        """Submitted jobs not finished yet, and jobs not submitted at all."""
        with self._lock:
            failed = len(self.tally.submit_failures)
        return self.unfinished() - failed

    def stop(self) -> None:
        """Stop every worker (warm shutdown, then the whole group), count the commands they
        left (once), and close the database."""
        from tests.e2e.helpers import kill_worker, stop_worker

        if not self._stopped:
            self.check_orphans(wait=True)  # before the stop: the last kills' commands
        try:
            for worker in self.workers:
                with contextlib.suppress(ProcessLookupError):
                    if worker.process.poll() is None:
                        os.kill(
                            worker.pid, signal.SIGTERM
                        )  # not nsenter's: it would not pass it on
            for worker in self.workers:
                try:
                    if worker.machine.namespace is None:
                        stop_worker(worker.process)
                    else:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            worker.process.wait(timeout=20)
                finally:
                    kill_worker(worker.process)
            if not self._stopped:
                self._stopped = True
                self.tally.orphans_at_end = describe(alive(campaign_commands(self.work)))
        finally:
            self.close_namespaces()
        if self._db is not None:
            self._db.dispose()
            self._db = None

    def close_namespaces(self) -> None:
        """Note any process left in a machine's namespace (a few seconds to go), then kill
        each namespace (its init, so everything in it)."""
        for machine in self.machines:
            if machine.namespace is None or machine.namespace.closed:
                continue
            deadline = time.monotonic() + ORPHAN_SECONDS
            while (left := machine.namespace.members()) and time.monotonic() < deadline:
                time.sleep(0.1)
            for line in describe((pid, 0) for pid in left):
                self.tally.namespace_problems.append(
                    f"{machine.name}: left in its PID namespace: {line}"
                )
            machine.namespace.close()
        for namespace in self.namespaces:
            namespace.close()
            namespace.release()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every worker's log, for a failed run."""
        logs = sorted((self.work / "logs").glob("*.log"))
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in logs)
