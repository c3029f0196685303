"""Git plumbing for jobs: worktrees, attempt commits, refs and the job branch.

The user's working tree, index and current branch are never touched. Each attempt works
in a detached worktree under ``$MERLIN_HOME/worktrees``; its commit is kept under
``refs/merlin/<job>/<step>/<n>``; a verified commit advances ``merlin/<job>`` by a
compare-and-swap ``git update-ref``, so two writers cannot both advance it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from merlin_flow.errors import GitError, RepositoryError
from merlin_flow.workspace.git_command import run_git_process
from merlin_flow.workspace.git_repair import REPAIR_WAIT, is_debris_error, recover, repair

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "merlin",
    "GIT_AUTHOR_EMAIL": "merlin@localhost",
    "GIT_COMMITTER_NAME": "merlin",
    "GIT_COMMITTER_EMAIL": "merlin@localhost",
}
# Caches that tools and exit commands leave behind; never part of an attempt's commit.
IGNORED_IN_COMMITS = ("__pycache__/", "*.py[co]", ".pytest_cache/", ".mypy_cache/", ".ruff_cache/")


REPAIR_PAUSE = 2.0
"""Seconds between tries of a git command that failed on debris it could not remove yet."""


def run_git(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """Run git with merlin's identity, as ``merlin_flow.workspace.git_command`` says.

    No hooks, fsmonitor, signing, recursion into submodules or diff programs, whatever a
    repository or a worktree configures, and an environment with no secret in it.
    ``env``: variables of merlin's own, on top. Past ``timeout`` seconds git is killed
    and TimeoutExpired raised.
    """
    return run_git_process(args, cwd, {**GIT_IDENTITY, **(env or {})}, timeout=timeout)


def git(*args: str, cwd: Path, check: bool = True, env: dict[str, str] | None = None) -> str:
    """Run git in ``cwd`` and return its stdout, stripped; GitError on failure.

    A failure on the debris of a killed git (a stale lock, a half-made worktree entry)
    is repaired and the command tried again, for up to ``git_repair.REPAIR_WAIT``; one on
    a corrupt cache of a git URL, once the cache is cloned again (``git_repair.recover``).
    """
    started = time.time()
    proc = run_git(list(args), cwd, env)
    deadline = time.monotonic() + REPAIR_WAIT
    while check and proc.returncode != 0 and is_debris_error(proc.stderr):
        if not repair(cwd, proc.stderr):
            if time.monotonic() > deadline:
                break
            time.sleep(REPAIR_PAUSE)  # a live command's lock, or debris too young to remove
        proc = run_git(list(args), cwd, env)
    if check and proc.returncode != 0 and recover(cwd, proc.stderr, started):
        proc = run_git(list(args), cwd, env)
    if check and proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def find_repository(path: Path) -> Path:
    """The top of the git work tree containing ``path``; RepositoryError if there is none."""
    path = path.expanduser()
    if not path.is_dir():
        raise RepositoryError(f"repository path does not exist or is not a folder: {path}")
    proc = run_git_process(["rev-parse", "--is-inside-work-tree", "--show-toplevel"], path)
    lines = proc.stdout.split()
    if "dubious ownership" in proc.stderr:  # a work tree another user owns
        raise RepositoryError(
            f"git refuses {path.resolve()}: it belongs to another user than this process "
            f"(uid {os.getuid()}); run merlin as its owner, or let git trust it: "
            f"git config --global --add safe.directory {path.resolve()}"
        )
    if proc.returncode != 0 or not lines or lines[0] != "true":
        raise RepositoryError(f"not a git work tree: {path.resolve()}")
    top = Path(lines[1])
    if git("rev-parse", "--verify", "--quiet", "HEAD^{commit}", cwd=top, check=False) == "":
        raise RepositoryError(f"git repository {top} has no commits yet: commit something first")
    return top


def head_commit(repo: Path) -> str:
    """The commit HEAD points at."""
    return git("rev-parse", "HEAD^{commit}", cwd=repo)


def uncommitted_files(repo: Path) -> list[str]:
    """Files of the work tree that differ from HEAD: changed, staged, or new and not ignored."""
    # -z: names as they are (git quotes names with unusual characters otherwise). No
    # optional locks: a diff refreshes the user's index under index.lock, and a worker
    # killed meanwhile would leave the lock in the user's way.
    changed = git("--no-optional-locks", "diff", "--name-only", "-z", "HEAD", cwd=repo, check=False)
    new = git("ls-files", "-z", "--others", "--exclude-standard", cwd=repo, check=False)
    return sorted({*changed.split("\0"), *new.split("\0")} - {""})


def job_branch(job_id: str) -> str:
    """The branch that carries a job's verified commits."""
    return f"merlin/{job_id}"


def attempt_ref(job_id: str, step_key: str, number: int) -> str:
    """The ref that keeps one attempt's commit inspectable."""
    return f"refs/merlin/{job_id}/{step_key}/{number}"


def create_branch(repo: Path, branch: str, commit: str) -> None:
    """Create ``branch`` at ``commit``; GitError if it exists already."""
    git("update-ref", f"refs/heads/{branch}", commit, "", cwd=repo)


def advance_branch(repo: Path, branch: str, new: str, expected_old: str) -> bool:
    """Move ``branch`` from ``expected_old`` to ``new``; False if it was elsewhere."""
    return run_git(["update-ref", f"refs/heads/{branch}", new, expected_old], repo).returncode == 0


def has_commit(repo: Path, commit: str) -> bool:
    """True when ``commit`` is in the repository's object store."""
    return run_git(["cat-file", "-e", f"{commit}^{{commit}}"], repo).returncode == 0


def resolve_ref(repo: Path, ref: str) -> str | None:
    """The commit a ref points at, or None."""
    value = git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=repo, check=False)
    return value or None


def set_ref(repo: Path, ref: str, commit: str) -> None:
    """Point ``ref`` at ``commit``."""
    git("update-ref", ref, commit, cwd=repo)


def add_worktree(repo: Path, path: Path, commit: str) -> Path:
    """Create a detached worktree of ``commit`` at ``path``, replacing a stale one."""
    if path.exists():  # worktree paths carry a lease token: almost always new
        remove_worktree(repo, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Forced twice: the path may still be registered to a locked worktree whose folder is
    # gone (a worker killed inside `worktree add` leaves it locked "initializing").
    git("worktree", "add", "--detach", "--force", "--force", str(path), commit, cwd=repo)
    return path


def remove_worktree(repo: Path, path: Path) -> None:
    """Remove a worktree and its administrative files, if present."""
    # Only this worktree's own metadata is removed: a global `git worktree prune` would
    # also drop the metadata of the user's own worktrees on an unmounted disk. Forced
    # twice: a worker killed inside `git worktree add` leaves it locked "initializing".
    git("worktree", "remove", "--force", "--force", str(path), cwd=repo, check=False)
    shutil.rmtree(path, ignore_errors=True)


def commit_all(worktree: Path, message: str, excludes_file: Path) -> str:
    """Stage everything in ``worktree`` and commit it on HEAD (an empty commit if nothing changed).

    For content merlin wrote itself (the demo's repository, tests): an attempt's change
    is staged by ``merlin_flow.workspace.staging`` and committed with ``commit_tree``.
    """
    git("-c", f"core.excludesFile={excludes_file}", "add", "-A", cwd=worktree)
    git("commit", "--allow-empty", "--no-verify", "-q", "-m", message, cwd=worktree)
    return git("rev-parse", "HEAD", cwd=worktree)


def commit_tree(repo: Path, tree: str, parent: str, message: str) -> str:
    """A commit of ``tree`` with the one parent ``parent``; no ref or worktree moves."""
    return git("commit-tree", tree, "-p", parent, "-m", message, cwd=repo)


def same_tree(repo: Path, one: str, other: str) -> bool:
    """True when commits ``one`` and ``other`` hold exactly the same files."""
    trees = git("rev-parse", f"{one}^{{tree}}", f"{other}^{{tree}}", cwd=repo).split()
    return trees[0] == trees[1]


def write_excludes_file(path: Path) -> Path:
    """Write the ignore patterns used for attempt commits; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text("\n".join(IGNORED_IN_COMMITS) + "\n")
    return path


def diff(repo: Path, old: str, new: str) -> str:
    """The patch from ``old`` to ``new``, to read: a byte that is not UTF-8 shows as U+FFFD.

    A binary file shows as ``Binary files ... differ``; ``patch_bytes`` is the patch to apply.
    """
    return patch_bytes(repo, old, new, binary=False).decode("utf-8", "replace")


def patch_bytes(repo: Path, old: str, new: str, binary: bool = True) -> bytes:
    """The patch from ``old`` to ``new`` exactly as git writes it, binary files included.

    ``git apply`` takes it whole: a binary file as a ``GIT binary patch``, a file in
    another encoding as its bytes.
    """
    exact = ["--binary"] if binary else []
    proc = run_git_process(["diff", "--no-color", *exact, old, new], repo, text=False)
    if proc.returncode != 0:
        error = proc.stderr.decode("utf-8", "replace").strip()
        raise GitError(f"git diff {old} {new} failed in {repo}: {error}")
    return proc.stdout


def changed_files(repo: Path, old: str, new: str) -> list[str]:
    """Paths changed between two commits."""
    out = git("diff", "--name-only", old, new, cwd=repo)
    return [line for line in out.splitlines() if line]


def commits_between(repo: Path, old: str, new: str) -> list[str]:
    """Commits reachable from ``new`` but not ``old``, oldest first."""
    out = git("rev-list", "--reverse", f"{old}..{new}", cwd=repo)
    return [line for line in out.splitlines() if line]


def is_ancestor(repo: Path, older: str, newer: str) -> bool:
    """True when ``older`` is ``newer`` or one of its ancestors."""
    proc = run_git(["merge-base", "--is-ancestor", older, newer], repo)
    return proc.returncode == 0


def merge_commit_onto(repo: Path, onto: str, commit: str, message: str) -> tuple[str | None, str]:
    """Apply the changes ``commit`` made since its merge base with ``onto``, onto ``onto``.

    A three-way merge (``git merge-tree --write-tree``) in the object store only: no
    worktree, no index. Returns the new commit (its single parent ``onto``) and "", or
    None and git's account of the conflicts (the files, and a line per conflict).
    """
    proc = run_git(["merge-tree", "--write-tree", "--no-messages", onto, commit], repo)
    if proc.returncode not in (0, 1):
        raise GitError(f"git merge-tree {onto} {commit} failed in {repo}: {proc.stderr.strip()}")
    if proc.returncode == 1:
        return None, _conflicts(repo, onto, commit)
    tree = proc.stdout.split()[0]
    new = git("commit-tree", tree, "-p", onto, "-m", message, cwd=repo)
    return new, ""


def _conflicts(repo: Path, onto: str, commit: str, chars: int = 3000) -> str:
    """Git's conflict messages, then each conflicted file's hunks with their markers."""
    proc = run_git(["merge-tree", "--write-tree", "--name-only", onto, commit], repo)
    tree, *rest = proc.stdout.split("\n")
    blank = rest.index("") if "" in rest else len(rest)
    files, messages = rest[:blank], [line for line in rest[blank:] if line.startswith("CONFLICT")]
    parts = ["\n".join(messages)]
    for name in files[:5]:
        text = git("cat-file", "-p", f"{tree}:{name}", cwd=repo, check=False)
        hunks, inside = [], False
        for line in text.splitlines():
            inside = inside or line.startswith("<<<<<<<")
            if inside:
                hunks.append(line)
            if line.startswith(">>>>>>>"):
                inside = False
        if hunks:
            parts.append(f"--- {name}\n" + "\n".join(hunks))
    return "\n".join(part for part in parts if part)[:chars]
