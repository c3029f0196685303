"""What must hold after a chaos campaign, read from the database, git and ``/proc``.

- every job completed, but the poison jobs (``--poison``): each of those failed, its step
  parked as poison after ``max_recoveries`` counted losses;
- a completed job's steps are all ``Completed`` and its attempts all ``passed`` (or
  ``cancelled`` when merlin's machinery parked the job, a full disk say, and it went on
  later: ``engine.machinery``); every step has exactly one passing attempt;
- no step had two attempts, or two runs of one attempt, at once: attempt rows' spans do
  not overlap, and no model call of an earlier run comes after the first call of a
  later run of the same attempt;
- no model call was paid twice: one paid call per attempt and turn (journal);
- the job branch holds one commit per step, and its head is the job's head commit (on
  the job's repository, or its remote for a job on a git URL);
- nothing left behind: no worktree folder (under every machine's ``MERLIN_HOME``), no
  worktree registered in the job's repository or in any machine's cache of its remote,
  no process of the campaign's ``MERLIN_HOME`` (worker, sandbox, command) once the
  workers are stopped;
- no step waited for a lost message longer than a lease (re-published because its
  hand-off lease expired, rather than noticed by the sweep).
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any


@dataclass
class Findings:
    """The campaign's figures and its violations (each a line naming the job)."""

    jobs: int = 0
    completed: int = 0
    parked: int = 0
    """Poison jobs whose step was parked, as they must be."""
    statuses: dict[str, int] = field(default_factory=dict)
    losses: int = 0
    """Steps taken over from a lost worker (every take-over, counted or not)."""
    counted: int = 0
    """Of those, the ones counted against their step (``recoveries``: it was lost alone)."""
    lost_messages: int = 0
    """Queued steps whose message was gone, re-published by the sweep."""
    stale_handoffs: int = 0
    """Queued steps re-published only when their hand-off lease expired."""
    paid_calls: int = 0
    replayed_calls: int = 0
    max_idle: float = 0.0
    """The longest time a job went without an event while unfinished (seconds)."""
    worktrees_left: int = 0
    """Worktree folders and registered worktrees left once the jobs ended."""
    violations: list[str] = field(default_factory=list)


def _cancelled_by_a_park(attempt: Any) -> bool:
    """An attempt its job's park cancelled (``lifecycle._fail`` with status ``Parked``)."""
    return attempt.status == "cancelled" and " parked (" in (attempt.error or "")


def check(
    db: Any,
    job_ids: list[str],
    repos: Mapping[str, Path],
    homes: Path | Sequence[Path],
    poisoned: Collection[str] = (),
) -> Findings:
    """Check every invariant of the module docstring over the campaign's jobs.

    ``repos`` holds each job's repository (its remote, for a job on a git URL);
    ``homes`` every machine's ``MERLIN_HOME``.
    """
    from sqlalchemy import select

    from merlin_flow.store import AttemptStatus, Event, Job, JobStatus, LlmCall, StepStatus

    found = Findings(jobs=len(job_ids))
    with db.reader() as session:
        for job_id in job_ids:
            job = session.get_one(Job, job_id)
            found.statuses[job.status] = found.statuses.get(job.status, 0) + 1
            if job_id in poisoned:
                _check_poison(found, job)
                continue
            completed = job.status == JobStatus.COMPLETED and job.finished_at is not None
            if completed:
                found.completed += 1
            else:
                found.violations.append(f"{job_id}: ended {job.status}: {job.error}")
            for step in job.steps:
                found.losses += step.losses
                found.counted += step.recoveries
                passed = [a for a in step.attempts if a.status == AttemptStatus.PASSED]
                if len(passed) != 1:
                    found.violations.append(f"{job_id}/{step.key}: {len(passed)} passing attempts")
                if completed and step.status != StepStatus.COMPLETED:
                    found.violations.append(f"{job_id}/{step.key}: step {step.status}")
                ok = [*passed, *(a for a in step.attempts if _cancelled_by_a_park(a))]
                if completed and len(ok) != len(step.attempts):
                    others = sorted(a.status for a in step.attempts if a not in ok)
                    found.violations.append(f"{job_id}/{step.key}: attempts {', '.join(others)}")
                spans = sorted((a.started_at, a.finished_at or datetime.max) for a in step.attempts)
                for (_, end), (start, _) in itertools.pairwise(spans):
                    if start < end:
                        found.violations.append(f"{job_id}/{step.key}: two attempts at once")
            calls = session.scalars(
                select(LlmCall).where(LlmCall.job_id == job_id).order_by(LlmCall.seq)
            ).all()
            _check_calls(found, job_id, calls)
            events = session.scalars(
                select(Event).where(Event.job_id == job_id).order_by(Event.id)
            ).all()
            for event in events:
                if event.kind == "step_recovered" and "message was lost" in event.message:
                    found.lost_messages += 1
                if event.kind == "step_recovered" and "waited too long" in event.message:
                    found.stale_handoffs += 1
                    found.violations.append(f"{job_id}/{event.step_key}: {event.message}")
            times = [e.created_at for e in events]
            for before, after in itertools.pairwise(times):
                found.max_idle = max(found.max_idle, (after - before).total_seconds())
            _check_git(found, job, repos.get(job_id))
    homes = [homes] if isinstance(homes, Path) else list(homes)
    left = worktrees_left(homes, repos)
    found.worktrees_left = len(left)
    found.violations += left
    for home in homes:
        for pid in leftover_processes(home):
            found.violations.append(f"process left: {pid} {_cmdline(pid)}")
    return found


def _check_poison(found: Findings, job: Any) -> None:
    """The poison job failed, its step parked after ``max_recoveries + 1`` counted losses."""
    from merlin_flow.config import MerlinConfig

    limit = MerlinConfig.model_validate(job.config).limits.max_recoveries
    step = job.steps[0]
    if job.status == "failed" and "poison" in (job.error or "") and step.recoveries == limit + 1:
        found.parked += 1
    else:
        found.violations.append(
            f"{job.id}: poison job ended {job.status} ({job.error}), "
            f"{step.recoveries} counted losses of {step.losses}"
        )


def _check_calls(found: Findings, job_id: str, calls: Any) -> None:
    """No turn of an attempt paid twice; no run of an attempt going on after a later one began."""
    paid: dict[tuple[int | None, int], int] = defaultdict(int)
    runs: dict[int | None, dict[int, list[datetime]]] = defaultdict(lambda: defaultdict(list))
    for call in calls:
        runs[call.attempt_id][call.run].append(call.created_at)
        if call.replayed or call.cached:
            found.replayed_calls += 1
            continue
        if call.error is None:
            found.paid_calls += 1
            paid[call.attempt_id, call.turn] += 1
    for (attempt, turn), count in paid.items():
        if count > 1:
            found.violations.append(f"{job_id}: attempt {attempt} turn {turn} paid {count} times")
    for attempt, by_run in runs.items():
        ordered = sorted(by_run)
        for earlier, later in itertools.pairwise(ordered):
            if max(by_run[earlier]) > min(by_run[later]):
                found.violations.append(
                    f"{job_id}: attempt {attempt} run {earlier} called after run {later} began"
                )


def _check_git(found: Findings, job: Any, repo: Path | None) -> None:
    """One commit per step on the job branch, and its head the job's head commit."""
    if repo is None:
        found.violations.append(f"{job.id}: repository unknown")
        return
    steps = len(job.steps)
    commits = _git(repo, "rev-list", f"main..{job.branch}").split()
    if len(commits) != steps:
        found.violations.append(f"{job.id}: {len(commits)} commits on its branch for {steps} steps")
    head = _git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{job.branch}").strip()
    if job.status == "completed" and head != job.head_commit:
        found.violations.append(
            f"{job.id}: branch {job.branch} at {head or 'nothing'}, job head {job.head_commit}"
        )


def worktrees_left(homes: Iterable[Path], repos: Mapping[str, Path]) -> list[str]:
    """A line for each worktree left: a folder under a ``MERLIN_HOME``'s ``worktrees/<job>``,
    or one registered in a job's repository or in a machine's cache of a remote."""
    found = []
    places = {str(repo): job_id for job_id, repo in repos.items()}
    for home in homes:
        worktrees = home / "worktrees"
        if worktrees.is_dir():
            for folder in sorted(worktrees.iterdir()):
                if any(folder.iterdir()) if folder.is_dir() else True:
                    found.append(f"worktree folder left: {folder}")
        caches = home / "repos"
        if caches.is_dir():
            places.update((str(cache), f"cache {cache}") for cache in sorted(caches.glob("*.git")))
    for place, whose in places.items():
        listed = _git(Path(place), "worktree", "list", "--porcelain").split("\n\n")
        for left in [entry for entry in listed if entry.strip()][1:]:
            found.append(f"{whose}: worktree left registered: {' '.join(left.split())}")
    return found


def leftover_processes(home: Path) -> list[int]:
    """Processes whose environment or command line names ``home``."""
    mark, me = str(home).encode(), os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if mark in environ or mark in cmdline:
            found.append(int(name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "(gone)"


def _git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
    return result.stdout
