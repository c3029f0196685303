"""The disk-full campaign: ``python -m tests.chaos --disk-full [--jobs 30] [--backend sqlite]``.

The campaign's jobs run on real workers whose ``MERLIN_HOME`` and repositories (and, on
``sqlite``, merlin's database and the embedded broker) lie on a small file system of
their own: a tmpfs of ``--disk-mb`` megabytes, mounted for the run. Once every job is
submitted and some are running, the driver fills it to the last byte, holds it full for
``--full-seconds`` while it records what ``merlin list`` prints and what the workers log,
then frees it; ``--fills`` times. No worker is killed.

Expected (``DiskReport.failed`` says which failed): every job completed once space
returned, with nobody resuming them by hand; no database corrupted (``PRAGMA
integrity_check`` on SQLite) and no repository (``git fsck``); the campaign's invariants
hold (``tests.chaos.invariants``). docs/RELIABILITY.md holds the figures.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.campaign import Backend, Campaign, backend
from tests.chaos.invariants import Findings, check

NOTEWORTHY = ("no_space", "parked", "space is back", "No space left", "disk is full")
"""What a worker's log line says when it is about the full disk."""
TAIL_LINES = 15
"""Lines of each worker's log a report keeps (what a failed run shows)."""


@contextlib.contextmanager
def small_disk(where: Path, megabytes: int) -> Iterator[Path]:
    """A tmpfs of ``megabytes`` mounted at ``where`` (root only), unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    size = f"size={megabytes}m"
    subprocess.run(["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=False)


def fill(where: Path) -> Path:
    """Write a file into ``where`` until its file system has not one byte left."""
    filler = where / "filler"
    with filler.open("wb", buffering=0) as handle:
        for chunk in (1 << 20, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    handle.write(b"\0" * chunk)
    return filler


@dataclass
class DiskReport:
    """What one disk-full run saw."""

    findings: Findings
    seconds: float
    fills: list[tuple[float, float]] = field(default_factory=list)
    """Each fill: when it began (s from the start) and how long the disk stayed full."""
    listed: Counter[str] = field(default_factory=Counter)
    """Job statuses ``merlin list`` showed while the disk was full (summed over samples)."""
    list_failures: list[str] = field(default_factory=list)
    """What ``merlin list`` said when it could not answer while the disk was full."""
    parks: int = 0
    """``job_parked`` events, each for want of space or not."""
    parks_for_space: int = 0
    resumes: int = 0
    """``job_resumed`` events (each a resume by a worker's sweep: nobody resumed by hand)."""
    integrity: list[str] = field(default_factory=list)
    """What ``PRAGMA integrity_check`` and ``git fsck`` said, where they found a fault."""
    logged: list[str] = field(default_factory=list)
    """Worker log lines about the full disk (the first few)."""
    workers: list[str] = field(default_factory=list)
    """Each worker as the run ended: running or its exit code, and its log's last lines."""

    def failed(self, jobs: int) -> bool:
        """Whether a job did not complete, an invariant broke or a store is corrupt."""
        found = self.findings
        return bool(found.violations or found.completed < jobs or self.integrity)

    def diagnosis(self) -> str:
        """What a failed run's reader needs first: the figures, then each worker's state."""
        fills = ", ".join(f"at {at:.0f} s for {held:.0f} s" for at, held in self.fills)
        return "\n".join(
            [
                f"after {self.seconds:.0f} s: {self.findings.completed} of "
                f"{self.findings.jobs} jobs completed; fills {fills or 'none'}; "
                f"parks {self.parks} ({self.parks_for_space} for space), resumes "
                f"{self.resumes}; merlin list while full: {dict(self.listed)}",
                *self.workers,
            ]
        )


class DiskFullCampaign(Campaign):
    """A campaign whose driver fills the disk instead of killing workers."""

    def __init__(self, work: Path, logs: Path, args: Any, target: Backend) -> None:
        """Everything under ``work`` (the small disk); the workers' logs in ``logs``."""
        self.logs = logs
        super().__init__(work, args, target)
        self.report = DiskReport(Findings(), 0.0)
        self._full = threading.Event()

    def log(self, n: int) -> Path:
        """The log of the ``n``-th worker started, off the small disk (it must stay readable)."""
        return self.logs / f"worker{n}.log"

    def run(self) -> float:
        """Start the workers, submit the jobs, fill and free the disk; seconds taken."""
        begun = time.monotonic()
        deadline = begun + 60 * self.args.max_minutes
        for machine in self.machines:
            for queues in machine.roles:
                self.start_worker(machine, queues)
        with ThreadPoolExecutor(max_workers=2) as submitter:
            for future in [submitter.submit(self.submit, n) for n in range(self.args.jobs)]:
                future.result()
        while self._running() == 0 and time.monotonic() < deadline:
            time.sleep(0.25)
        for _ in range(self.args.fills):
            self._fill_for(self.args.full_seconds, begun)
            time.sleep(self.args.full_seconds / 2)
        while time.monotonic() < deadline and self.unfinished_submitted() > 0:
            time.sleep(0.5)
        self.finished = self.unfinished_submitted() == 0
        if self.finished:
            self.await_cleanup()
        self.report.workers = [self._describe(n, worker) for n, worker in enumerate(self.workers)]
        return time.monotonic() - begun

    def _describe(self, n: int, worker: Any, lines: int = TAIL_LINES) -> str:
        """Worker ``n``: running or its exit code, how many critical lines it logged, its
        log's last ``lines`` lines (each cut short)."""
        code = worker.process.poll()
        log = worker.log.read_text(errors="replace").splitlines()
        critical = sum(1 for line in log if "CRITICAL" in line or "Unrecoverable" in line)
        tail = "\n".join(f"    {line[:200]}" for line in log[-lines:])
        state = "running" if code is None else f"exited {code}"
        return f"worker{n}: {state}, {critical} critical lines, {len(log)} lines; last:\n{tail}"

    def _running(self) -> int:
        from sqlalchemy import func, select

        from merlin_flow.store import Job, JobStatus

        with self.db.reader() as session:
            count = session.scalar(select(func.count()).where(Job.status == JobStatus.RUNNING))
        return int(count or 0)

    def _fill_for(self, seconds: float, begun: float) -> None:
        """Fill the disk, sample ``merlin list`` while it stays full, then free it."""
        at = time.monotonic()
        filler = fill(self.work)
        end = at + seconds
        while time.monotonic() < end:
            self._sample()
            time.sleep(2.0)
        filler.unlink()
        self.report.fills.append((at - begun, time.monotonic() - at))

    def _sample(self) -> None:
        from tests.e2e.helpers import merlin

        shown = merlin(self.env, "list", "--json", "--limit", "1000", timeout=60)
        if shown.returncode != 0:
            self.report.list_failures.append(shown.stderr.strip()[-300:])
            return
        self.report.listed.update(job["status"] for job in json.loads(shown.stdout))


def integrity(target: Backend, repos: list[Path]) -> list[str]:
    """Faults ``PRAGMA integrity_check`` (SQLite files) and ``git fsck`` report; [] if none."""
    import sqlite3

    faults = []
    if target.name == "sqlite":
        path = Path(target.database_url.removeprefix("sqlite:///"))
        for database in (path, path.with_name("broker.db")):
            with contextlib.closing(sqlite3.connect(database)) as conn:
                answer = conn.execute("PRAGMA integrity_check").fetchone()[0]
            if answer != "ok":
                faults.append(f"{database.name}: {answer}")
    for repo in repos:
        proc = subprocess.run(
            ["git", "fsck", "--no-dangling", "--no-progress"],
            cwd=repo, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            faults.append(f"{repo.name}: git fsck: {proc.stderr.strip()[-300:]}")
    return faults


def count_events(db: Any, job_ids: list[str]) -> tuple[int, int, int]:
    """The jobs' ``job_parked`` events, those for want of space, and ``job_resumed`` events."""
    from sqlalchemy import select

    from merlin_flow.store import Event

    with db.reader() as session:
        events = session.scalars(
            select(Event).where(
                Event.job_id.in_(job_ids), Event.kind.in_(("job_parked", "job_resumed"))
            )
        ).all()
    parks = [e for e in events if e.kind == "job_parked"]
    space = sum(1 for e in parks if (e.data or {}).get("trouble") == "no_space")
    return len(parks), space, len(events) - len(parks)


def run_disk_full(name: str, args: Any) -> DiskReport:
    """One disk-full run on backend ``name`` (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix=f"merlin-disk-{name}-") as tmp:
        outside = Path(tmp)
        (outside / "logs").mkdir()
        disk = outside / "disk"
        # SQLite lives on the small disk; a Redis server and Postgres off it.
        with (
            small_disk(disk, args.disk_mb),
            backend(name, disk if name == "sqlite" else outside) as target,
        ):
            campaign = DiskFullCampaign(disk, outside / "logs", args, target)
            try:
                seconds = campaign.run()
            finally:
                campaign.stop()
            report = campaign.report
            report.seconds = seconds
            report.findings = check(campaign.db, campaign.job_ids, campaign.repos, campaign.homes)
            report.parks, report.parks_for_space, report.resumes = count_events(
                campaign.db, campaign.job_ids
            )
            campaign.stop()  # closes the database before the integrity check
            report.integrity = integrity(target, list(campaign.repos.values()))
            report.logged = _noteworthy(outside / "logs")
            return report


def _noteworthy(logs: Path, most: int = 12) -> list[str]:
    lines = []
    for log in sorted(logs.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if any(word in line for word in NOTEWORTHY):
                lines.append(f"{log.name}: {line.strip()[:240]}")
    return lines[:most]


def print_report(reports: dict[str, DiskReport], args: Any) -> None:
    """The table of each backend's figures, then what merlin printed and logged."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"disk-full campaign (seed {args.seed})")
    table.add_column("figure")
    for name in reports:
        table.add_column(name, justify="right")
    rows = {
        "jobs": lambda r: r.findings.jobs,
        "completed": lambda r: r.findings.completed,
        "statuses": lambda r: _counts(r.findings.statuses),
        "fills (at s, full for s)": lambda r: ", ".join(f"{a:.0f}/{b:.0f}" for a, b in r.fills),
        "merlin list while full": lambda r: _counts(r.listed) or "-",
        "merlin list refused while full": lambda r: len(r.list_failures),
        "jobs parked (for space)": lambda r: f"{r.parks} ({r.parks_for_space})",
        "resumed by a sweep": lambda r: r.resumes,
        "integrity faults": lambda r: len(r.integrity),
        "worktrees left": lambda r: r.findings.worktrees_left,
        "time": lambda r: f"{r.seconds:.0f} s",
        "violations": lambda r: len(r.findings.violations),
    }
    for label, figure in rows.items():
        table.add_row(label, *(str(figure(r)) for r in reports.values()))
    console.print(table)
    console.print(
        f"{args.jobs} jobs x {args.steps} steps, {args.workers} workers at --concurrency "
        f"{args.concurrency}, a {args.disk_mb} MB tmpfs filled {args.fills} times for "
        f"{args.full_seconds:g} s, sweep {args.sweep:g} s, sandbox {args.sandbox}"
    )
    for name, report in reports.items():
        for line in [*report.findings.violations, *report.integrity]:
            console.print(f"[red]{name}: {line}[/red]", highlight=False)
        for line in report.list_failures[:3]:
            console.print(f"{name}: merlin list while full: {line}", highlight=False)
        for line in report.logged:
            console.print(f"{name}: {line}", highlight=False, markup=False)


def _counts(counter: Any) -> str:
    return ", ".join(f"{key} {n}" for key, n in sorted(counter.items()))
