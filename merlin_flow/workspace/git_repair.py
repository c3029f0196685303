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

``index.lock`` (of the repository or of a worktree) goes only when the failed command
named it: ``git commit`` holds it while the user's editor is open, for minutes, and a
user's commit must never lose it. Merlin never takes the lock of a user's work tree.
A worktree left locked (``git worktree lock``, or "initializing" by a killed ``worktree
add``) blocks nothing: ``git.add_worktree`` and ``git.remove_worktree`` force twice.

Only debris is removed: half-made entries older than ``ENTRY_SECONDS`` (git writes an
entry's files first, in a moment), locks and temporary packs older than
``STALE_SECONDS`` (a live git command holds its locks for far less); never a worktree
that is whole, and never by a global ``git worktree prune`` (it would also drop the
entries of a user's worktrees on a disk that is not mounted). ``merlin_flow.workspace.
git.git`` calls ``repair`` when git fails on debris, and tries again until the debris is
old enough to be removed (``REPAIR_WAIT``).

A corrupt object store (a pack truncated by a killed fetch, a full disk or a crash) is
not debris: in merlin's cache of a git URL (never in a user's repository) ``recover``
re-clones it from the URL, and the command runs again. It is looked for only after a
command failed in a way that suggests it (``CORRUPTION_HINT``), and cheaply: each pack's
header and checksum against its index, and the loose objects git named; never a fsck.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from merlin_flow.workspace.git_command import run_git_process

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
_NAMED_LOCK = re.compile(r"Unable to create '([^']*\.lock)': File exists")


def common_dir(repo: Path) -> Path | None:
    """The git directory ``repo`` shares with its worktrees, or None if it has none."""
    proc = run_git_process(["rev-parse", "--path-format=absolute", "--git-common-dir"], repo)
    path = proc.stdout.strip()
    return Path(path) if proc.returncode == 0 and path else None


def repair(
    repo: Path, error: str = "", stale: float = STALE_SECONDS, entries: float = ENTRY_SECONDS
) -> list[str]:
    """Remove the debris of killed git commands from ``repo``'s git directory.

    ``error``: what the failed command said; an ``index.lock`` goes only if it names it.
    Returns what was removed (paths relative to the git directory), for the log.
    """
    git_dir = common_dir(repo)
    if git_dir is None:
        return []
    now = time.time()
    named = {os.path.realpath(path) for path in _NAMED_LOCK.findall(error)}
    removed = _broken_entries(git_dir, now - entries) + _stale_locks(git_dir, now - stale, named)
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


def _stale_locks(git_dir: Path, cutoff: float, named: set[str]) -> list[str]:
    """Lock files no live git holds any more (an ``index.lock`` only if ``named``)."""
    candidates = [git_dir / name for name in (*LOCKS, *LOCKS_TOO)]
    refs = git_dir / "refs"
    if refs.is_dir():
        candidates += refs.rglob("*.lock")
    worktrees = git_dir / "worktrees"
    if worktrees.is_dir():
        candidates += worktrees.glob("*/*.lock")
    removed = []
    for lock in candidates:
        if lock.name == "index.lock" and os.path.realpath(lock) not in named:
            continue  # perhaps a user's `git commit`, its editor open
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


# -- A corrupt cache of a git URL, re-cloned ----------------------------------------------

REMOTE_TIMEOUT = 600.0
"""Seconds one clone, fetch or push may take before git is killed (and tried again)."""
# No prompt, a bounded connect, and a dead connection noticed: a worker never hangs.
REMOTE_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_SSH_COMMAND": os.environ.get(
        "GIT_SSH_COMMAND",
        "ssh -o BatchMode=yes -o ConnectTimeout=30 -o ServerAliveInterval=15 "
        "-o ServerAliveCountMax=4",
    ),
    "GIT_HTTP_LOW_SPEED_LIMIT": "1000",
    "GIT_HTTP_LOW_SPEED_TIME": "60",
}
# No background gc: it would pack refs while other threads update them.
CLONE = ("clone", "--bare", "--quiet", "-c", "gc.auto=0", "-c", "maintenance.auto=false")
CORRUPTION_HINT = re.compile(
    r"packfile \S+ (does not match index|cannot be accessed)|index file \S+ is too small"
    r"|object \S+ \(stored in \S+\) is corrupt|object file \S+ is empty|inflate: data stream"
    r"|bad object|(could not|unable to) read [0-9a-f]{7}|unable to read tree|missing (blob|tree|"
    r"commit) |did not send all necessary objects|index-pack failed|early eof",
    re.IGNORECASE,
)
"""What git says, in a failure that may come of a corrupt object store."""
_NAMED_OBJECT = re.compile(r"(?:stored in|object file) (\S+?)\)? is (?:corrupt|empty)")
RECLONED = "merlin-recloned"
"""A file in a re-cloned cache: when it was put in place."""
_held = threading.local()


def cache_name(url: str) -> str:
    """The folder name of the cache of ``url``: readable, and unique per URL."""
    name = url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1].removesuffix(".git")
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:40] or "repo"
    return f"{slug}-{hashlib.sha256(url.encode()).hexdigest()[:12]}.git"


@contextmanager
def cache_lock(cache: Path) -> Iterator[None]:
    """One clone, fetch or re-clone at a time in a cache, across processes and threads.

    An flock; a thread that holds it already (a fetch that found the cache corrupt) goes on.
    """
    key = os.path.join(os.path.realpath(cache.parent), cache.name)
    held: set[str] = _held.__dict__.setdefault("caches", set())
    if key in held:
        yield
        return
    with cache.with_name(cache.name + ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        held.add(key)
        try:
            yield
        finally:
            held.discard(key)
            fcntl.flock(handle, fcntl.LOCK_UN)


def recover(repo: Path, error: str, since: float) -> bool:
    """Re-clone merlin's cache that ``repo`` belongs to if git failed on its corruption.

    ``error``: what the failed command said; ``since``: when it started. True when the
    command should run again: the cache was re-cloned, here or by another worker since.
    A user's repository, a healthy cache, or a remote that cannot be cloned: False.
    """
    local = "\n".join(line for line in error.splitlines() if not line.startswith("remote:"))
    if not CORRUPTION_HINT.search(local):
        return False
    found = merlin_cache(repo)
    if found is None:
        return False
    cache, url = found
    if _recloned_since(cache, since):
        return True
    if not damaged(cache, local):
        return False
    with cache_lock(cache):
        if _recloned_since(cache, since):
            return True
        broken = damaged(cache, local)
        if not broken:
            return False
        log.warning("cache %s is corrupt (%s): cloning %s again", cache, ", ".join(broken), url)
        return _reclone(cache, url)


def merlin_cache(repo: Path) -> tuple[Path, str] | None:
    """The cache ``repo`` is (or is a worktree of) and its URL; None for anything else.

    A cache is a bare clone named after its URL (``cache_name``) in a ``repos`` folder.
    """
    git_dir = common_dir(repo)
    if git_dir is None or git_dir.parent.name != "repos":
        return None
    proc = _git(["config", "--get", "remote.origin.url"], git_dir, timeout=30)
    url = proc.stdout.strip()
    return (git_dir, url) if url and cache_name(url) == git_dir.name else None


def damaged(git_dir: Path, error: str = "") -> list[str]:
    """What is corrupt in the object store (paths relative to ``git_dir``); [] if none seen.

    Each pack whose header or checksum does not match its index, and the loose objects
    and packs ``error`` names as corrupt or empty that still are.
    """
    found = {
        path for path in (git_dir / "objects" / "pack").glob("*.pack") if not _pack_whole(path)
    }
    for name in _NAMED_OBJECT.findall(error):
        path = Path(os.path.normpath(git_dir / name))  # an absolute name stays as it is
        inside = path.is_relative_to(git_dir / "objects") and path.is_file()
        if inside and (path.suffix == ".pack" or not _inflates(path)):
            found.add(path)
    return sorted(str(path.relative_to(git_dir)) for path in found)


def _pack_whole(pack: Path) -> bool:
    """True when a pack matches its index: object count, and the pack's checksum."""
    try:
        with pack.open("rb") as data, pack.with_suffix(".idx").open("rb") as index:
            head, data_tail = data.read(12), _tail(data, 32)
            fanout = 8 if index.read(4) == b"\xfftOc" else 0  # version 2 and later, or 1
            index.seek(fanout + 255 * 4)
            count, index_tail = index.read(4), _tail(index, 64)
    except FileNotFoundError:
        return True  # no index: git does not use the pack; or it is gone
    except OSError:
        return False
    if head[:4] != b"PACK" or head[8:12] != count:
        return False
    return any(data_tail[-size:] == index_tail[-2 * size : -size] for size in (20, 32))


def _tail(handle: BinaryIO, size: int) -> bytes:
    handle.seek(max(0, handle.seek(0, os.SEEK_END) - size))
    return handle.read()


def _inflates(loose: Path) -> bool:
    try:
        return bool(zlib.decompress(loose.read_bytes()))
    except (OSError, zlib.error):
        return False


def _recloned_since(cache: Path, since: float) -> bool:
    try:
        return (cache / RECLONED).stat().st_mtime >= since
    except OSError:
        return False


def _reclone(cache: Path, url: str) -> bool:
    """Clone ``url`` afresh and put it in the corrupt cache's place; False if it fails.

    The clone gets the jobs' refs too, and the cache's worktree entries, so the worktrees
    live on it keep working. The corrupt cache is moved aside, then removed.
    """
    partial = cache.with_name(cache.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    proc = _git([*CLONE, "--", url, str(partial)], cache.parent)
    if proc.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        log.warning("cache %s stays as it is: cannot clone %s: %s", cache, url, proc.stderr)
        return False
    jobs = _git(["fetch", "--quiet", url, "+refs/merlin/*:refs/merlin/*"], partial)
    if jobs.returncode != 0:  # fetched again when a job needs them
        log.warning("cache %s: the jobs' refs were not fetched: %s", cache, jobs.stderr)
    if (cache / "worktrees").is_dir():
        (cache / "worktrees").rename(partial / "worktrees")
    (partial / RECLONED).touch()
    cache.rename(cache.with_name(f"{cache.name}.corrupt-{time.time():.0f}"))
    partial.rename(cache)
    for old in cache.parent.glob(f"{cache.name}.corrupt-*"):  # and those of killed workers
        shutil.rmtree(old, ignore_errors=True)
    return True


def _git(
    args: list[str], cwd: Path, timeout: float = REMOTE_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """Git as merlin runs it (``git_command``), never prompting, killed past ``timeout``."""
    try:
        return run_git_process(args, cwd, REMOTE_ENV, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 128, "", f"timed out after {timeout:g} s")
