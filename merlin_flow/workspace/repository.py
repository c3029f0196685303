"""Where a job's commits live: a folder every worker shares, or a git URL.

A job's ``repo`` is either the path of a git work tree that every worker sees at the same
place (one machine, or a shared volume), or a git URL. For a URL each machine keeps a
bare clone, its *cache*, under ``$MERLIN_HOME/repos``, and the remote is where workers
meet:

- creating the job pushes the job branch ``merlin/<job>`` at the base commit;
- a step worker fetches the job's refs when it lacks the commit it starts from, and pushes
  its attempt's commit to ``refs/merlin/<job>/<step>/<n>`` before handing it to verify;
- a verify worker fetches that ref when it lacks the commit; a pass moves the job branch
  with ``git push --force-with-lease=<branch>:<expected>``, the same compare-and-swap
  ``git update-ref`` gives on a shared path.

Remote commands never prompt (ssh runs in batch mode) and are bounded in time. A remote
that does not answer (a network error, a timeout, an HTTP 5xx) is retried with backoff,
then reported as ``RemoteUnavailable``: the task fails without touching the job, and the
recovery sweep runs it again once the step's lease expires. Any other refusal (a
missing repository, a failed login, a rejected push) is a ``GitError``. The cache holds
nothing the remote lacks once a step has been handed on, so a cache git finds corrupt (a
pack truncated by a crash or a full disk) is cloned again (``git_repair.recover``).
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from merlin_flow.errors import GitError, RemoteUnavailable, RepositoryError
from merlin_flow.settings import Settings
from merlin_flow.workspace.git import (
    add_worktree,
    advance_branch,
    create_branch,
    find_repository,
    git,
    has_commit,
    head_commit,
    job_branch,
    remove_worktree,
    resolve_ref,
    run_git,
    set_ref,
)
from merlin_flow.workspace.git_repair import (
    CLONE,
    REMOTE_ENV,
    REMOTE_TIMEOUT,
    cache_lock,
    cache_name,
    is_debris_error,
    recover,
    repair,
)

log = logging.getLogger(__name__)

# `scheme://...` (https, ssh, git, file) or scp-like `user@host:path`; never `-...`.
_URL = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://|[^\s/@:-][^\s/@:]*@[^\s/:-][^\s/:]*:)")
RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)
"""Seconds between tries of a remote that does not answer."""
_TRANSIENT = re.compile(
    "|".join(
        (
            r"could not resolve host",  # DNS, http and ssh
            r"failed to connect|couldn't connect|connection refused|connection timed out",
            r"timed out|connection reset|broken pipe|network is unreachable|no route to host",
            r"remote end hung up unexpectedly|early eof|rpc failed|temporary failure",
            r"returned error: 5\d\d",  # HTTP 5xx
            r"kex_exchange_identification|connection closed by",
            r"cannot lock ref|unable to lock|\.lock': file exists",  # a concurrent git here
            # A pusher killed mid-push (a worker elsewhere): fetch again, it heals or is gone.
            r"did not send all necessary objects",
        )
    ),
    re.IGNORECASE,
)
UPSTREAM_HEAD = "refs/merlin-upstream/HEAD"
"""Where a cache keeps the remote's HEAD, the commit new jobs start from."""


def is_git_url(location: str) -> bool:
    """True for ``scheme://...`` and scp-like ``user@host:path`` locations."""
    return bool(_URL.match(location))


def cache_path(url: str, settings: Settings) -> Path:
    """Where this machine keeps its bare clone of ``url`` (a readable name, unique per URL)."""
    return settings.home_dir / "repos" / cache_name(url)


@dataclass(frozen=True)
class JobRepository:
    """A job's repository as this process reaches it: git runs in ``path``.

    ``location`` is what the job records (a work tree's path, or the URL); ``url`` is
    set for a URL, and then ``path`` is this machine's cache of it.
    """

    location: str
    path: Path
    scratch: Path
    url: str | None = None

    def base_commit(self) -> str:
        """The commit a new job starts from: HEAD of the work tree, or of the remote."""
        if self.url is None:
            return head_commit(self.path)
        with self._locked():
            self._remote(["fetch", "--quiet", self.url, f"+HEAD:{UPSTREAM_HEAD}"])
            return git("rev-parse", f"{UPSTREAM_HEAD}^{{commit}}", cwd=self.path)

    @contextmanager
    def files_at(self, commit: str, *, committed: bool = False) -> Iterator[Path]:
        """A folder of the repository's files to read ``merlin.toml`` and markers from.

        For a path, the work tree itself (as it is now, to submit from); for a URL, or
        with ``committed`` (what a job made earlier reads: its work tree may have moved
        on), a temporary worktree of ``commit``, removed afterwards.
        """
        if self.url is None and not committed:
            yield self.path
            return
        folder = add_worktree(self.path, self.scratch / f"files-{uuid.uuid4().hex[:8]}", commit)
        try:
            yield folder
        finally:
            remove_worktree(self.path, folder)

    def start_branch(self, branch: str, commit: str) -> None:
        """Create the job branch at ``commit`` (and on the remote); GitError if it exists."""
        create_branch(self.path, branch, commit)
        if self.url is not None:
            ref = f"refs/heads/{branch}"
            try:
                if not self._push([f"--force-with-lease={ref}:", f"{commit}:{ref}"]):
                    raise GitError(f"branch {branch} exists on {self.url} already")
            except BaseException:
                git("update-ref", "-d", ref, cwd=self.path, check=False)
                raise

    def drop_branch(self, branch: str) -> None:
        """Delete a job branch whose job could not be recorded; best effort."""
        git("update-ref", "-d", f"refs/heads/{branch}", cwd=self.path, check=False)
        if self.url is not None:
            try:
                self._push(["--delete", f"refs/heads/{branch}"])
            except GitError as exc:
                log.warning("could not delete %s on %s: %s", branch, self.url, exc)

    def have(self, job_id: str, *commits: str) -> None:
        """Make sure ``commits`` are here, fetching the job's refs from the remote if not."""
        if self.url is None or all(has_commit(self.path, c) for c in commits):
            return
        branch, attempts = f"refs/heads/{job_branch(job_id)}", f"refs/merlin/{job_id}/*"
        refspecs = [f"+{branch}:{branch}", f"+{attempts}:{attempts}"]
        with self._locked():
            self._remote(["fetch", "--quiet", self.url, *refspecs])
        missing = [commit for commit in commits if not has_commit(self.path, commit)]
        if missing:
            raise GitError(f"job {job_id}: commit {missing[0][:10]} is not on {self.url}")

    def publish(self, ref: str, commit: str) -> None:
        """Point ``ref`` at ``commit`` here and, for a URL, on the remote."""
        if self.url is None:
            set_ref(self.path, ref, commit)
            return
        self._push([f"+{commit}:{ref}"])
        self._mirror(ref, commit)

    def advance(self, branch: str, new: str, expected_old: str) -> bool:
        """Move ``branch`` from ``expected_old`` to ``new``; False if it was elsewhere."""
        if self.url is None:
            return advance_branch(self.path, branch, new, expected_old)
        ref = f"refs/heads/{branch}"
        if not self._push([f"--force-with-lease={ref}:{expected_old}", f"{new}:{ref}"]):
            return False
        self._mirror(ref, new)
        return True

    def _mirror(self, ref: str, commit: str) -> None:
        """Copy a ref the remote took into the cache; the remote's copy is the one that counts."""
        proc = run_git(["update-ref", ref, commit], self.path)
        if proc.returncode != 0:
            log.warning("cache %s: could not set %s: %s", self.path, ref, proc.stderr.strip())

    def branch_head(self, branch: str) -> str | None:
        """Where ``branch`` points: in the work tree, or on the remote."""
        if self.url is None:
            return resolve_ref(self.path, f"refs/heads/{branch}")
        listing = self._remote(["ls-remote", self.url, f"refs/heads/{branch}"])
        return listing.split()[0] if listing else None

    def _push(self, args: list[str]) -> bool:
        """``git push`` to the remote; False for a lease that no longer holds."""
        assert self.url is not None
        proc = self._tries(["push", "--porcelain", self.url, *args])
        if proc.returncode == 0:
            return True
        refused = [line for line in proc.stdout.splitlines() if line.startswith("!")]
        if refused and all("(stale info)" in line for line in refused):
            return False
        reason = refused[0].split("\t")[-1] if refused else _last_line(proc.stderr)
        raise GitError(f"{self.url} refused `git push {' '.join(args)}`: {reason}")

    def _remote(self, args: list[str]) -> str:
        """Run a git command that talks to the remote; its stdout."""
        proc = self._tries(args)
        if proc.returncode != 0:
            raise GitError(f"git {args[0]} {self.url} failed: {_last_line(proc.stderr)}")
        return proc.stdout.strip()

    def _tries(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        """Run git, again after each delay while the remote does not answer."""
        return _patiently(args, self.path, f"{self.url} did not answer `git {args[0]}`")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with cache_lock(self.path):
            yield


@contextmanager
def refusals_as_input_errors(source: JobRepository) -> Iterator[None]:
    """While a job is submitted: a remote's refusal is bad input (exit 2), not a crash."""
    try:
        yield
    except RemoteUnavailable:
        raise
    except GitError as exc:
        if source.url is None:
            raise
        raise RepositoryError(f"{source.location}: {exc}") from None


def repository_for_input(location: str, settings: Settings) -> JobRepository:
    """The repository a user named: a git work tree's path, or a git URL (cloned here).

    RepositoryError for a path that is not a work tree with a commit, a URL that carries
    a password (merlin records the URL with the job), or a URL that cannot be cloned.
    """
    if not is_git_url(location):
        top = find_repository(Path(location))
        return JobRepository(str(top), top, settings.worktrees_dir)
    parts = urlsplit(location)
    if parts.password is not None or (parts.scheme in ("http", "https") and "@" in parts.netloc):
        raise RepositoryError(
            f"{_redacted(location)}: the git URL carries credentials, and merlin records the "
            "URL with the job; give them with a git credential helper or an SSH key"
        )
    cache = cache_path(location, settings)
    _clone(location, cache, patient=False)
    return JobRepository(location, cache, settings.worktrees_dir, location)


def repository_of(location: str, settings: Settings) -> JobRepository:
    """A recorded job's repository, for a worker: its path, or this machine's cache."""
    if not is_git_url(location):
        return JobRepository(location, Path(location), settings.worktrees_dir)
    cache = cache_path(location, settings)
    _clone(location, cache, patient=True)
    return JobRepository(location, cache, settings.worktrees_dir, location)


def _clone(url: str, cache: Path, patient: bool) -> None:
    """Make ``cache`` a bare clone of ``url`` unless it is one; half a clone is never kept.

    ``patient`` (a worker) retries a remote that does not answer; a submission fails at
    once with RepositoryError.
    """
    if (cache / "HEAD").is_file():
        return
    cache.parent.mkdir(parents=True, exist_ok=True)
    with cache_lock(cache):
        if (cache / "HEAD").is_file():
            return
        partial = cache.with_name(cache.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        args = [*CLONE, "--", url, str(partial)]
        try:
            if patient:
                proc = _patiently(args, cache.parent, f"cannot clone {url}")
            else:
                proc = _once(args, cache.parent)
        except RemoteUnavailable:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        if proc.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            error = RepositoryError if not patient else GitError
            raise error(f"cannot clone {url}: {_last_line(proc.stderr)}")
        shutil.rmtree(cache, ignore_errors=True)  # a half-deleted cache, never a good one
        partial.rename(cache)


def _once(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a git command that talks to a remote, within REMOTE_TIMEOUT (exit 128 past it)."""
    try:
        return run_git(args, cwd, REMOTE_ENV, timeout=REMOTE_TIMEOUT)
    except subprocess.TimeoutExpired:
        message = f"fatal: timed out after {REMOTE_TIMEOUT:g} s"
        return subprocess.CompletedProcess(args, 128, "", message)


def _patiently(args: list[str], cwd: Path, failure: str) -> subprocess.CompletedProcess[str]:
    """Run ``_once``, again after each of RETRY_DELAYS while the failure is transient.

    A failure on a killed git's debris in the cache (``shallow.lock``, a ref's lock) is
    repaired first (``git_repair``), and tried again at once when something was removed;
    one on a corrupt cache (a truncated pack) the same, once the cache is cloned again.
    """
    for delay in (*RETRY_DELAYS, None):
        started = time.time()
        proc = _once(args, cwd)
        if proc.returncode != 0 and is_debris_error(proc.stderr) and repair(cwd, proc.stderr):
            proc = _once(args, cwd)
        if proc.returncode != 0 and recover(cwd, proc.stderr, started):
            proc = _once(args, cwd)
        if not _unreachable(proc):
            return proc
        if delay is None:
            tries = len(RETRY_DELAYS) + 1
            raise RemoteUnavailable(f"{failure} after {tries} tries: {_last_line(proc.stderr)}")
        time.sleep(delay)
    raise AssertionError("unreachable")


def _unreachable(proc: subprocess.CompletedProcess[str]) -> bool:
    """True for a failure worth trying again: the network, a timeout, a busy lock."""
    return proc.returncode != 0 and _TRANSIENT.search(proc.stderr) is not None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no error output"


def _redacted(url: str) -> str:
    """The URL with whatever stands before `@` in its authority replaced by `***`."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", r"\1***@", url)
