"""``merlin prune``: taking back what merlin made for jobs that ended long ago.

Per job, merlin makes the branch ``merlin/<job>`` and attempt refs
``refs/merlin/<job>/<step>/<n>`` in the job's repository, worktrees in
``$MERLIN_HOME/worktrees/<job>`` (a worker killed mid-task leaves them) and the patch and
summary in ``$MERLIN_HOME/jobs/<job>``; per repository and cache key, an environment in
``$MERLIN_HOME/envs``. The rules:

- Only jobs that ended (final status, finalized) more than ``older_than`` ago; pending,
  running and finalizing jobs are never touched, and no row of the store changes.
- Each loses its attempt refs and worktrees. Its branch, the product a user merges, stays
  with the job folder that describes it, unless the job completed with nothing to merge
  (the branch holds its base's files) or ``failed_only`` is set: that prunes only jobs
  that ended without completing (failed, cancelled, budget_exceeded), branch and folder
  included, so they can no longer be resumed.
- A branch goes only where its job left it (compare-and-swap), never while checked out.
- Without ``failed_only``, environments last used more than ``older_than`` ago go too
  (each use touches the marker), unless being built (lock held) or of a repository with
  an open job; one still wanted is built again.
- Without ``failed_only``, the worktree folders of jobs the store does not know go too,
  once unchanged for ``older_than`` and at least an hour, and this machine's caches drop
  the worktrees they register whose folder is gone (``git worktree prune``); never in a
  user's repository. (Every worker's sweep clears ended jobs' worktrees on its machine
  anyway: ``merlin_flow.workspace.worktree_cleanup``.)
- Refs only under ``refs/heads/merlin/<job>`` and ``refs/merlin/<job>/`` of jobs the store
  knows; folders only directly under the settings' folders.

For a git URL the branch is deleted on the remote (``JobRepository.drop_branch``) and in
this machine's cache, attempt refs in the cache only (the remote keeps them); with no
cache here, only worktrees go. What cannot be done (a repository gone, a moved branch, a
remote that does not answer) is reported with its reason; the rest goes on.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import TypeAlias

from sqlalchemy import Row, or_, select

from merlin_flow.errors import GitError, InputError, RemoteUnavailable
from merlin_flow.jobs.costs import DURATION, UNIT_SECONDS
from merlin_flow.settings import Settings
from merlin_flow.store import FINAL_JOB_STATUSES, Database, Job, JobStatus, utcnow
from merlin_flow.workspace.environment import MARKER_FILE
from merlin_flow.workspace.git import (
    git,
    has_commit,
    job_branch,
    remove_worktree,
    run_git,
    same_tree,
)
from merlin_flow.workspace.repository import JobRepository, cache_path, is_git_url
from merlin_flow.workspace.worktree_cleanup import (
    UNKNOWN_AFTER,
    caches,
    drop_stale,
    leftovers,
    registered,
    remove,
    remove_folder,
    worktrees_of,
)

UNSUCCESSFUL = FINAL_JOB_STATUSES - {JobStatus.COMPLETED}
"""The statuses ``--failed`` prunes: jobs that ended without completing."""
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
_ENV_FOLDER = re.compile(r"(?P<slug>[A-Za-z0-9._-]{1,40})-[0-9a-f]{16}")
_JobRow: TypeAlias = "Row[str, str, str, str, str, str]"
"""A job's id, repo, status, branch, base_commit and head_commit."""


class Kind(StrEnum):
    """What a removal is."""

    BRANCH = "branch"
    ATTEMPT_REF = "attempt ref"
    WORKTREE = "worktree"
    WORKTREE_FOLDER = "worktree folder"
    REGISTRATION = "worktree registration"
    JOB_FOLDER = "job folder"
    ENV_CACHE = "env cache"


@dataclass(frozen=True)
class Removal:
    """One thing removed (in a dry run: to be removed): a ref's name or a folder's path."""

    kind: Kind
    target: str
    job_id: str | None = None
    where: str | None = None
    """The repository of a ref: the job's path or URL."""


@dataclass(frozen=True)
class Skipped:
    """Something prune left in place, and why."""

    target: str
    reason: str
    job_id: str | None = None


@dataclass
class PruneReport:
    """What ``prune`` removed (in a dry run: would remove), and what it left and why."""

    dry_run: bool
    removed: list[Removal] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def of_kind(self, kind: Kind) -> list[str]:
        """The targets of one kind that were removed, in order."""
        return [removal.target for removal in self.removed if removal.kind is kind]


def parse_age(text: str) -> timedelta:
    """``30m``, ``12h``, ``7d`` or ``2w`` as a timedelta; InputError (exit code 2) otherwise."""
    match = DURATION.match(text)
    if match is None:
        raise InputError(f"--older-than {text!r}: use a number and m, h, d or w, like 7d")
    try:
        return timedelta(seconds=int(match.group(1)) * UNIT_SECONDS[match.group(2)])
    except OverflowError:
        raise InputError(f"--older-than {text!r} is too long") from None


def prune(
    db: Database,
    settings: Settings,
    *,
    older_than: timedelta,
    failed_only: bool = False,
    dry_run: bool = False,
    now: datetime | None = None,
) -> PruneReport:
    """Remove what merlin made for jobs that ended before ``now - older_than``.

    The rules are in the module's docstring. ``now`` (default: the present; naive means
    UTC) is for tests and reports. InputError for a negative ``older_than``.
    """
    if older_than < timedelta(0):
        raise InputError("--older-than cannot be negative")
    if now is not None and now.tzinfo is not None:
        now = now.astimezone(UTC).replace(tzinfo=None)  # the store holds naive UTC
    cutoff = (now or utcnow()) - older_than
    statuses = sorted(UNSUCCESSFUL if failed_only else FINAL_JOB_STATUSES)
    columns = (Job.id, Job.repo, Job.status, Job.branch, Job.base_commit, Job.head_commit)
    with db.reader() as session:
        ended = session.execute(
            select(*columns)
            .where(Job.status.in_(statuses), Job.finished_at <= cutoff)
            .order_by(Job.finished_at)
        ).all()
        open_ = or_(Job.status.not_in(FINAL_JOB_STATUSES), Job.finished_at.is_(None))
        busy = {_env_slug(location) for location in session.scalars(select(Job.repo).where(open_))}
    pruner = _Pruner(settings, PruneReport(dry_run))
    for job in ended:
        pruner.job(job, drop=failed_only)
    if not failed_only:
        since = cutoff.replace(tzinfo=UTC).timestamp()
        pruner.unknown_jobs(db, min(since, time.time() - UNKNOWN_AFTER))
        pruner.registrations()
        pruner.environments(since, busy)
    return pruner.report


@dataclass
class _Pruner:
    settings: Settings
    report: PruneReport
    problems: dict[str, str | None] = field(default_factory=dict)
    """Why each repository met so far cannot be used (None: it can), by location."""

    def job(self, job: _JobRow, drop: bool) -> None:
        """Prune one ended job (a row of ``jobs``); ``drop``: its branch and job folder too."""
        if not _JOB_ID.fullmatch(job.id) or job.branch != job_branch(job.id):
            self._skip(job.id, "not an id and branch merlin makes: left alone", job.id)
            return
        repository = self._reach(job.repo)
        path = repository.path if repository else None
        try:
            listing = _worktree_list(path) if path else []
            self._worktrees(job, path, [where for where, _ in listing])
            if repository is None:  # a deleted work tree took the branch with it
                gone = drop and not is_git_url(job.repo) and not Path(job.repo).exists()
            else:
                for ref, commit in _attempt_refs(repository.path, job.id):
                    removal = Removal(Kind.ATTEMPT_REF, ref, job.id, job.repo)
                    delete = partial(git, "update-ref", "-d", ref, commit, cwd=repository.path)
                    self._do(removal, delete)
                holders = {branch: where for where, branch in listing if branch}
                gone = self._branch(job, repository, drop, holders)
        except GitError as exc:
            if isinstance(exc, RemoteUnavailable):
                self.problems[job.repo] = str(exc)
            self._skip(job.repo, str(exc), job.id)
            return
        folder = self.settings.jobs_dir / job.id
        if gone and folder.is_dir() and not folder.is_symlink():
            self._do(Removal(Kind.JOB_FOLDER, str(folder), job.id), partial(shutil.rmtree, folder))

    def _reach(self, location: str) -> JobRepository | None:
        """The repository as git reaches it here, or None (and why, once per location)."""
        url = location if is_git_url(location) else None
        path = cache_path(location, self.settings) if url else Path(location)
        if location not in self.problems:
            if url is not None:
                problem = None if (path / "HEAD").is_file() else "no cache of it on this machine"
            elif not path.is_dir():
                problem = "the repository no longer exists"
            else:
                top = run_git(["rev-parse", "--show-toplevel"], path).stdout.strip()
                same = bool(top) and Path(top).resolve() == path.resolve()
                problem = None if same else "no longer the top of a git work tree"
            self.problems[location] = problem
            if problem:
                self._skip(location, f"{problem}: the refs of its jobs are left")
        if self.problems[location]:
            return None
        return JobRepository(location, path, self.settings.worktrees_dir, url)

    def _worktrees(self, job: _JobRow, repo: Path | None, registered: list[Path]) -> None:
        """Remove the job's worktrees: its folder's entries, and those git still lists."""
        folder = self.settings.worktrees_dir / job.id
        mine = {folder / p.name for p in registered if p.parent == folder.resolve()}
        removed = True
        for path in sorted(mine | (set(folder.iterdir()) if folder.is_dir() else set())):
            removal = Removal(Kind.WORKTREE, str(path), job.id, job.repo)
            removed &= self._do(removal, partial(_delete_worktree, repo, path))
        if folder.is_dir() and removed:
            self._do(
                Removal(Kind.WORKTREE_FOLDER, str(folder), job.id), partial(remove_folder, folder)
            )

    def unknown_jobs(self, db: Database, unchanged_since: float) -> None:
        """Remove the worktree folders of jobs the store does not know, unchanged since then."""
        for leftover in leftovers(db, self.settings, unchanged_since):
            if leftover.location is not None:
                continue  # a job of the store: by the rules above
            removed = True
            for path, repo in worktrees_of(leftover):
                where = str(repo) if repo else None
                removal = Removal(Kind.WORKTREE, str(path), leftover.job_id, where)
                removed &= self._do(removal, partial(remove, repo, path))
            if removed:
                removal = Removal(Kind.WORKTREE_FOLDER, str(leftover.folder), leftover.job_id)
                self._do(removal, partial(remove_folder, leftover.folder))

    def registrations(self) -> None:
        """Drop the worktrees this machine's caches register whose folder is gone."""
        listed = {removal.target for removal in self.report.removed}
        for cache in caches(self.settings):
            try:
                stale = [p for p in registered(cache, prunable_only=True) if str(p) not in listed]
                dropped = stale if self.report.dry_run else drop_stale(cache)
            except GitError as exc:
                self._skip(str(cache), f"could not list or prune its worktrees: {exc}")
                continue
            for path in dropped:
                self.report.removed.append(Removal(Kind.REGISTRATION, str(path), where=str(cache)))
            for path in sorted(set(stale) - set(dropped)):
                self._skip(str(path), f"still registered in {cache}")

    def _branch(
        self, job: _JobRow, repository: JobRepository, drop: bool, holders: dict[str, Path]
    ) -> bool:
        """Delete the job's branch if ``drop`` or it has nothing to merge; True once it is gone."""
        base, last = job.base_commit, job.head_commit
        if not drop and not (
            job.status == JobStatus.COMPLETED
            and has_commit(repository.path, base)
            and has_commit(repository.path, last)
            and same_tree(repository.path, base, last)
        ):
            return False  # the product: kept
        head = repository.branch_head(job.branch)  # for a URL, the remote's
        if head is None:
            return True
        if head != last:
            reason = f"moved since the job ended (to {head[:10]}, from {last[:10]}): kept"
            self._skip(job.branch, reason, job.id)
            return False
        ref = f"refs/heads/{job.branch}"
        if ref in holders:
            self._skip(job.branch, f"checked out in {holders[ref]}: kept", job.id)
            return False
        removal = Removal(Kind.BRANCH, job.branch, job.id, job.repo)
        return self._do(removal, partial(_delete_branch, repository, job.branch, head))

    def environments(self, cutoff: float, busy: set[str]) -> None:
        """Remove the environments last used before ``cutoff`` (a timestamp) no job may use."""
        envs = self.settings.envs_dir
        for folder in sorted(envs.iterdir()) if envs.is_dir() else []:
            match = _ENV_FOLDER.fullmatch(folder.name)
            if match is None or folder.is_symlink() or not folder.is_dir():
                continue
            marker = folder / MARKER_FILE  # none: a build killed midway, or a prune
            if (marker if marker.is_file() else folder).stat().st_mtime > cutoff:
                continue
            if match["slug"] in busy:
                self._skip(str(folder), "a job of its repository is open and may use it")
                continue
            lock = folder.with_name(folder.name + ".lock")  # made before every build
            removal = Removal(Kind.ENV_CACHE, str(folder))
            if not lock.exists():
                self._do(removal, partial(_delete_environment, folder))
                continue
            with lock.open("r") as handle:  # closing it releases the lock
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    self._skip(str(folder), "being built now (its lock is held)")
                    continue
                self._do(removal, partial(_delete_environment, folder))

    def _do(self, removal: Removal, action: Callable[[], object]) -> bool:
        """Record ``removal``; unless in a dry run, run ``action`` first (it raises if it fails)."""
        try:
            if not self.report.dry_run:
                action()
        except (OSError, GitError) as exc:
            self._skip(removal.target, f"could not remove: {exc}", removal.job_id)
            return False
        self.report.removed.append(removal)
        return True

    def _skip(self, target: str, reason: str, job_id: str | None = None) -> None:
        self.report.skipped.append(Skipped(target, reason, job_id))


def _worktree_list(repo: Path) -> list[tuple[Path, str | None]]:
    """Each worktree git lists in ``repo`` (its resolved path) and the branch it has out."""
    found: list[tuple[Path, str | None]] = []
    for line in git("worktree", "list", "--porcelain", cwd=repo).splitlines():
        if line.startswith("worktree "):
            found.append((Path(line.removeprefix("worktree ")).resolve(), None))
        elif line.startswith("branch ") and found:
            found[-1] = (found[-1][0], line.removeprefix("branch "))
    return found


def _attempt_refs(repo: Path, job_id: str) -> list[tuple[str, str]]:
    """The job's attempt refs and their commits: refs under ``refs/merlin/<job>/`` only."""
    prefix = f"refs/merlin/{job_id}/"
    listing = git("for-each-ref", "--format=%(objectname) %(refname)", prefix, cwd=repo)
    pairs = [line.split(" ", 1) for line in listing.splitlines()]
    return [(ref, commit) for commit, ref in pairs if ref.startswith(prefix)]


def _delete_branch(repository: JobRepository, branch: str, head: str) -> None:
    """Delete a job branch still at ``head``; for a URL on the remote too, then checked."""
    if repository.url is None:
        git("update-ref", "-d", f"refs/heads/{branch}", head, cwd=repository.path)
        return
    repository.drop_branch(branch)  # the cache's and the remote's, best effort
    if left := repository.branch_head(branch):
        raise GitError(f"{repository.url} still has it at {left[:10]}")


def _delete_worktree(repo: Path | None, path: Path) -> None:
    """``git worktree remove --force`` when the repository is here; the folder in any case."""
    if path.is_symlink():
        raise OSError("a symbolic link, not a worktree merlin made")
    if repo is not None:
        remove_worktree(repo, path)
    elif path.exists():
        shutil.rmtree(path)
    if path.exists():
        raise OSError("it is still there")


def _delete_environment(folder: Path) -> None:
    """Marker first (a step that looks now builds anew, after this), then the rest and its log."""
    (folder / MARKER_FILE).unlink(missing_ok=True)
    shutil.rmtree(folder)
    folder.with_name(folder.name + ".log").unlink(missing_ok=True)


def _env_slug(location: str) -> str:
    """The name prefix of a repository's environments (as checkout.ready_environment names it)."""
    name = location.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1].removesuffix(".git")
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:40] or "repo"
