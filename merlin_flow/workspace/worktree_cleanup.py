"""Leftover worktrees: what this machine made for jobs that have ended, taken back.

A worker makes each attempt's and verification's worktree in
``$MERLIN_HOME/worktrees/<job>/`` of its own machine, registered in the job's repository:
the repository itself for a path, this machine's cache of it for a git URL
(``merlin_flow.workspace.repository``). A worker killed mid-task leaves its worktree there, and
every machine that worked on a job keeps the job's folder. The machine that finalizes a
job clears its own folder then (``clear_job``); every worker's sweep clears the folders
of ended jobs on its machine (``clear_ended``), whichever machine finalized them, and
``merlin prune`` uses the same pieces (``merlin_flow.jobs.pruning``). The rules:

- Only folders directly under ``worktrees_dir`` named like a job id: never the scratch
  worktrees made there (``files-…``, ``question-…``, ``_setup``), a link, or a worktree.
- Only for a job the store says is finished (``finished_at`` set): the folder of a job
  that has not finished is never touched. The folder of a job the store does not know
  goes once nothing in it has changed for ``UNKNOWN_AFTER`` (a process working for
  another store may be using it).
- Each worktree is removed with ``git worktree remove --force`` in the repository it is
  registered in (the job's, or for an unknown job the one its ``.git`` file names), then
  the folder. In this machine's caches, registrations whose folder is gone are dropped
  with ``git worktree prune``; in a user's repository only the job's own are removed
  (a global prune would drop the user's worktrees on an unmounted disk).
- One job's failure is logged, and tried again at the next sweep; the others go on.

Environment builds check the project out in ``worktrees_dir/_setup`` (and the build of
a step's own dependency change copies the package caches beside it, ``<checkout>.cache``)
and remove both when they end; a builder killed mid-build leaves them. Each sweep removes
those no build holds the lock of (``clear_setups``): the kernel dropped the killed
builder's. An attempt's quarantine (``merlin_flow.workspace.staging``), left by a worker
killed while it staged, lies in its job's folder and goes with it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from merlin_flow.errors import GitError
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job
from merlin_flow.workspace.environment import idle_build, setup_checkouts
from merlin_flow.workspace.git import git, remove_worktree
from merlin_flow.workspace.repository import cache_path, is_git_url

log = logging.getLogger(__name__)

UNKNOWN_AFTER = 3600.0
"""Seconds a job folder the store does not know must be left unchanged before it goes."""
_JOB_FOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
_SCRATCH = re.compile(r"(?:files|question)-[0-9a-f]{8}")
"""The temporary worktrees made directly in ``worktrees_dir`` (a submission, a question)."""


@dataclass(frozen=True)
class Leftover:
    """A job's worktree folder on this machine that no task will use again."""

    job_id: str
    folder: Path
    repo: Path | None
    """Where the job's worktrees are registered: its repository, or this machine's cache
    of its URL; None when neither is here, or when the store does not know the job."""
    location: str | None = None
    """The job's repository as the store records it; None for a job it does not know."""


def job_folders(settings: Settings) -> list[Path]:
    """The folders of ``worktrees_dir`` that may be a job's: one directory listing."""
    try:
        entries = list(settings.worktrees_dir.iterdir())
    except FileNotFoundError:
        return []
    return sorted(
        entry
        for entry in entries
        if _JOB_FOLDER.fullmatch(entry.name)
        and not _SCRATCH.fullmatch(entry.name)
        and not entry.is_symlink()
        and entry.is_dir()
        and not (entry / ".git").exists()
    )


def leftovers(
    db: Database, settings: Settings, unknown_before: float, skip: Iterable[str] = ()
) -> list[Leftover]:
    """The job folders here of finished jobs, and of jobs the store does not know.

    A folder of an unknown job only if unchanged since ``unknown_before`` (a timestamp,
    as ``time.time()``). One query, and none when there is no folder; ``skip`` names jobs
    to leave out.
    """
    folders = {folder.name: folder for folder in job_folders(settings)}
    for job_id in skip:
        folders.pop(job_id, None)
    if not folders:
        return []
    with db.reader() as session:
        rows = session.execute(
            select(Job.id, Job.repo, Job.finished_at).where(Job.id.in_(sorted(folders)))
        ).all()
    known = {row.id: row for row in rows}
    found = []
    for job_id, folder in folders.items():
        row = known.get(job_id)
        if row is None:
            if _last_change(folder) < unknown_before:
                found.append(Leftover(job_id, folder, None))
        elif row.finished_at is not None:
            found.append(Leftover(job_id, folder, registry(row.repo, settings), row.repo))
    return found


def registry(location: str, settings: Settings) -> Path | None:
    """Where this machine registers the worktrees of a job on ``location``; None if nowhere."""
    if is_git_url(location):
        cache = cache_path(location, settings)
        return cache if (cache / "HEAD").is_file() else None
    path = Path(location)
    return path if path.is_dir() else None


def worktrees_of(leftover: Leftover) -> list[tuple[Path, Path | None]]:
    """Each worktree of the folder, with the repository to remove it from (None: none here).

    The folder's entries, and the worktrees the job's repository still registers in the
    folder though their own folder is gone.
    """
    folder = leftover.folder
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    found = {entry: leftover.repo or _owner(entry) for entry in entries}
    if leftover.repo is not None:
        try:
            listed = registered(leftover.repo)
        except GitError as exc:  # not a repository any more: its entries still go
            log.debug("job %s: %s", leftover.job_id, exc)
            listed = []
        for path in listed:
            if path.parent == folder.resolve():
                found.setdefault(folder / path.name, leftover.repo)
    return sorted(found.items())


def remove(repo: Path | None, path: Path) -> None:
    """Remove one worktree (its registration in ``repo`` too); OSError if it is still there."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)  # a link is removed, never followed
    elif repo is not None:
        remove_worktree(repo, path)
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)
    if path.exists() or path.is_symlink():
        raise OSError(f"{path} is still there")


def remove_folder(folder: Path) -> None:
    """Remove an emptied job folder; gone already (another sweep) is fine."""
    with contextlib.suppress(FileNotFoundError):
        folder.rmdir()


def clear(leftover: Leftover, settings: Settings) -> set[Path]:
    """Remove the folder's worktrees, then the folder; the caches of this machine it used."""
    caches = set()
    for path, repo in worktrees_of(leftover):
        remove(repo, path)
        if repo is not None and is_cache(repo, settings):
            caches.add(repo)
    remove_folder(leftover.folder)
    return caches


def clear_job(settings: Settings, job_id: str, repo: Path) -> None:
    """The finalize's part: this machine's worktrees of ``job_id``, registered in ``repo``.

    A failure is logged: the job still ends, and a sweep here tries again.
    """
    leftover = Leftover(job_id, settings.worktrees_dir / job_id, repo)
    if not leftover.folder.is_dir():
        return
    try:
        for cache in clear(leftover, settings):
            drop_stale(cache)
    except Exception as exc:
        log.warning("job %s: worktrees left for the sweep: %s", job_id, exc)


def clear_ended(db: Database, settings: Settings) -> list[str]:
    """One sweep's part: clear the folders here of ended jobs; the jobs cleared.

    Cheap when there is nothing to do: a directory listing, and a query when it finds a
    job folder. A failure for one job is logged and does not stop the others.
    """
    caches: set[Path] = set()
    cleared = []
    for leftover in leftovers(db, settings, time.time() - UNKNOWN_AFTER):
        try:
            caches |= clear(leftover, settings)
        except Exception as exc:
            log.warning("job %s: its worktrees here could not be removed: %s", leftover.job_id, exc)
            continue
        cleared.append(leftover.job_id)
    for cache in sorted(caches):
        try:
            drop_stale(cache)
        except Exception as exc:
            log.warning("cache %s: stale worktrees left registered: %s", cache, exc)
    if cleared:
        log.info("removed the worktrees here of ended jobs %s", ", ".join(cleared))
    return cleared


def clear_setups(settings: Settings) -> list[Path]:
    """Remove the setup checkouts left by killed builds (see the module); the ones removed."""
    try:
        entries = sorted(setup_checkouts(settings).iterdir())
    except FileNotFoundError:
        return []
    removed = []
    for checkout in entries:
        try:
            with idle_build(settings, checkout) as free:
                if free:  # removed while holding the lock: no build can start on it meanwhile
                    remove(_owner(checkout), checkout)
                    removed.append(checkout)
        except Exception as exc:  # tried again at the next sweep; the others go on
            log.warning("setup checkout %s could not be removed: %s", checkout, exc)
    if removed:
        log.info("removed %d setup checkouts of killed builds", len(removed))
    return removed


def caches(settings: Settings) -> list[Path]:
    """The caches of git URLs on this machine."""
    folder = settings.home_dir / "repos"
    found = folder.glob("*.git") if folder.is_dir() else ()
    return sorted(cache for cache in found if is_cache(cache, settings))


def is_cache(repo: Path, settings: Settings) -> bool:
    """True for a bare clone merlin keeps under ``$MERLIN_HOME/repos``."""
    return repo.parent == settings.home_dir / "repos" and (repo / "HEAD").is_file()


def registered(repo: Path, prunable_only: bool = False) -> list[Path]:
    """The worktrees ``repo`` registers (resolved paths); ``prunable_only``: with no folder."""
    found: list[tuple[Path, bool]] = []
    for line in git("worktree", "list", "--porcelain", cwd=repo).splitlines():
        if line.startswith("worktree "):
            found.append((Path(line.removeprefix("worktree ")).resolve(), False))
        elif line.startswith("prunable") and found:
            found[-1] = (found[-1][0], True)
    return [path for path, prunable in found if prunable or not prunable_only]


def drop_stale(cache: Path) -> list[Path]:
    """``git worktree prune`` in one of this machine's caches; the registrations dropped."""
    stale = registered(cache, prunable_only=True)
    if not stale:
        return []
    git("worktree", "prune", cwd=cache)
    left = set(registered(cache, prunable_only=True))
    return [path for path in stale if path not in left]


def _owner(worktree: Path) -> Path | None:
    """The repository a worktree's ``.git`` file names, if it is here."""
    dot_git = worktree / ".git"
    try:
        text = dot_git.read_text() if dot_git.is_file() and not dot_git.is_symlink() else ""
    except (OSError, UnicodeDecodeError):
        return None
    gitdir = Path(text.removeprefix("gitdir:").strip()) if text.startswith("gitdir:") else None
    if gitdir is None or gitdir.parent.name != "worktrees":
        return None
    owner = gitdir.parent.parent  # <repo>/.git, or a bare <cache>
    if owner.name == ".git":
        owner = owner.parent
    return owner if owner.is_dir() else None


def _last_change(folder: Path) -> float:
    """When the folder or any of its entries last changed (a timestamp); now if it is gone."""
    try:
        return max(path.lstat().st_mtime for path in (folder, *folder.iterdir()))
    except OSError:  # removed meanwhile (another sweep)
        return time.time()
