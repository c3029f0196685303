"""Debris a killed git leaves in a repository, and its repair.

A worker SIGKILLed inside a git command leaves what the command had begun. None of it is
the step's fault, and none of it may end a job; each is removed once it is older than a
git command would take, so that the command that stumbled on it can run again:

- a half-made worktree entry under ``<git dir>/worktrees/<name>`` (``git worktree add``
  killed before it wrote ``gitdir``, ``commondir`` or ``HEAD``: every later ``worktree
  add`` of the repository then fails with "failed to read worktrees/.../commondir"), or
  one still locked "initializing" whose folder never got its ``.git``;
- lock files: ``index.lock``, ``shallow.lock``, ``packed-refs.lock``, ``config.lock``,
  ``HEAD.lock``, ``FETCH_HEAD.lock`` and ``refs/**/*.lock`` ("Unable to create
  '...lock': File exists");
- the temporary packs of a killed fetch (``objects/pack/tmp_pack_*``, ``.tmp-*``).

Only debris is removed: half-made entries older than ``ENTRY_SECONDS`` (git writes an
entry's files first, in a moment), locks and temporary packs older than
``STALE_SECONDS`` (a live git command holds its locks for far less); never a worktree
that is whole, and never by a global ``git worktree prune`` (it would also drop the
entries of a user's worktrees on a disk that is not mounted). ``merlin_flow.workspace.
git.git`` calls ``repair`` when git fails on debris, and tries again until the debris is
old enough to be removed (``REPAIR_WAIT``).
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)

STALE_SECONDS = 60.0
"""Age past which a lock or a temporary pack is a dead command's, not a live one's."""
ENTRY_SECONDS = 5.0
"""Age past which a half-made worktree entry is a dead ``worktree add``'s."""
REPAIR_WAIT = STALE_SECONDS + 15.0
"""How long a git command that fails on debris is tried again, repairing in between."""
LOCKS = ("index.lock", "shallow.lock", "packed-refs.lock", "config.lock", "HEAD.lock")
LOCKS_TOO = ("FETCH_HEAD.lock", "ORIG_HEAD.lock")
ENTRY_FILES = ("gitdir", "commondir", "HEAD")
"""What a whole worktree entry holds, each non-empty."""
DEBRIS_ERROR = re.compile(
    r"Unable to create '[^']*\.lock': File exists"
    r"|failed to read worktrees/|worktrees/[^/\s]+/(commondir|gitdir|HEAD)\b"
)
"""How git says a lock file or a broken worktree entry is in its way."""


def common_dir(repo: Path) -> Path | None:
    """The git directory ``repo`` shares with its worktrees, or None if it has none."""
    proc = subprocess.run(
        ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    path = proc.stdout.strip()
    return Path(path) if proc.returncode == 0 and path else None


def repair(repo: Path, stale: float = STALE_SECONDS, entries: float = ENTRY_SECONDS) -> list[str]:
    """Remove the debris of killed git commands from ``repo``'s git directory.

    Returns what was removed (paths relative to the git directory), for the log.
    """
    git_dir = common_dir(repo)
    if git_dir is None:
        return []
    now = time.time()
    removed = _broken_entries(git_dir, now - entries) + _stale_locks(git_dir, now - stale)
    removed += _temporary_packs(git_dir, now - stale)
    if removed:
        log.warning("repaired %s: removed %s", git_dir, ", ".join(removed))
    return removed


def is_debris_error(message: str) -> bool:
    """True when git failed on something ``repair`` can remove (a lock, a broken entry)."""
    return DEBRIS_ERROR.search(message) is not None


def _old(path: Path, cutoff: float) -> bool:
    try:
        return path.lstat().st_mtime < cutoff
    except FileNotFoundError:
        return False


def _broken_entries(git_dir: Path, cutoff: float) -> list[str]:
    """Worktree entries a killed ``worktree add`` left half-made."""
    removed = []
    folder = git_dir / "worktrees"
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        if not entry.is_dir() or not _old(entry, cutoff):
            continue
        if _whole(entry) and not _initializing(entry):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(str(entry.relative_to(git_dir)))
    return removed


def _whole(entry: Path) -> bool:
    """True when the entry holds its files, each non-empty."""
    for name in ENTRY_FILES:
        try:
            if not (entry / name).read_text(errors="replace").strip():
                return False
        except OSError:
            return False
    return True


def _initializing(entry: Path) -> bool:
    """True when ``worktree add`` locked the entry and died before its folder was made."""
    try:
        reason = (entry / "locked").read_text(errors="replace")
    except OSError:
        return False
    if "initializing" not in reason:
        return False
    pointer = Path((entry / "gitdir").read_text(errors="replace").strip())
    return not pointer.is_file()  # the worktree's `.git` file was never written


def _stale_locks(git_dir: Path, cutoff: float) -> list[str]:
    """Lock files no live git holds any more."""
    candidates = [git_dir / name for name in (*LOCKS, *LOCKS_TOO)]
    refs = git_dir / "refs"
    if refs.is_dir():
        candidates += refs.rglob("*.lock")
    worktrees = git_dir / "worktrees"
    if worktrees.is_dir():
        candidates += worktrees.glob("*/*.lock")
    removed = []
    for lock in candidates:
        if lock.is_file() and _old(lock, cutoff):
            lock.unlink(missing_ok=True)
            removed.append(str(lock.relative_to(git_dir)))
    return removed


def _temporary_packs(git_dir: Path, cutoff: float) -> list[str]:
    """The temporary packs and objects of a killed fetch or commit."""
    removed = []
    for pattern in ("objects/pack/tmp_*", "objects/pack/.tmp-*", "objects/incoming-*"):
        for path in git_dir.glob(pattern):
            if _old(path, cutoff):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
                removed.append(str(path.relative_to(git_dir)))
    return removed
