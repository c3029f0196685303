"""An attempt's change staged for its commit: no nested repository, no secret, nothing hashed first.

Once an attempt's agent is done (no sandboxed process of it is left), merlin stages every
change of its worktree since the attempt's start (``stage_change``). Two things never
reach the commit:

- **Nested git repositories.** A ``.git`` an attempt made below the worktree's top (``git
  init`` in a folder, a ``.git`` file pointing elsewhere, a populated submodule path) is
  a repository git would commit as a gitlink, and whose configuration merlin's own git
  would read (and one without a commit makes ``git add`` fail). Each is removed
  (``remove_nested``) and the folder staged as the files it holds; at a submodule's
  path, the submodule's entry stays as the start commit had it.
  The model is told so in its system prompt, and the attempt gets a
  ``nested_repository_removed`` event per repository.
- **Secrets** (``merlin_flow.workspace.secret_scan``): with a hit, every change of the
  attempt is discarded and the worktree goes back to the start.

Nothing reaches the repository's object store before the scan. The change is staged
first into a *quarantine*: a temporary index and object folder beside the worktree,
which reads the repository's objects as alternates (``GIT_OBJECT_DIRECTORY``,
``GIT_ALTERNATE_OBJECT_DIRECTORIES``). Only a change with no secret has its objects moved
into the repository's store (``migrate``, as git moves a push's out of its own
quarantine), and the tree committed is the tree scanned: a file written after the scan
is not in it. A refused attempt leaves no blob anywhere: the quarantine is removed at
once, and if a worker dies before that, with the job's worktree folder
(``merlin_flow.workspace.worktree_cleanup``, ``merlin prune``). The worktree's own index
is never written.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from merlin_flow.errors import GitError
from merlin_flow.workspace.git_command import run_git_process
from merlin_flow.workspace.secret_scan import SecretHit, scan_staged

NESTED_REMOVED = (
    "a nested git repository, removed before the commit: merlin commits files, never "
    "repositories inside the project (make scratch repositories under /tmp)"
)
"""What the event of a removed nested repository says of it."""
QUARANTINE_PREFIX = ".quarantine-"
"""How a quarantine folder, beside the worktree it stages, is named after the worktree."""
MOST_ROUNDS = 20
"""Most passes that look for nested repositories (each pass removes at least one)."""
GITLINK = b"160000 "


@dataclass(frozen=True)
class StagedChange:
    """An attempt's change, staged: the tree to commit, and what was kept out of it."""

    tree: str
    """The tree of the worktree as staged; the start's tree when secrets were found."""
    hits: tuple[SecretHit, ...] = ()
    """The secrets found: with any, nothing of the attempt is in ``tree``."""
    nested: tuple[str, ...] = ()
    """The folders whose nested repository (their ``.git``) was removed."""


def stage_change(
    worktree: Path,
    excludes_file: Path,
    allow: Sequence[str],
    base: str,
    environ: Mapping[str, str] | None = None,
) -> StagedChange:
    """Stage every change in ``worktree`` since ``base`` as the module doc says.

    ``base``: the attempt's start (not ``HEAD``: a command that was not confined could
    have committed in the worktree). ``allow``: `[secrets] allow`. ``environ``: the
    worker's environment, whose secrets are looked for (default ``os.environ``).
    """
    nested = remove_nested(worktree, excludes_file)
    with quarantine(worktree) as held:
        _add_all(worktree, excludes_file, held)
        hits = scan_staged(worktree, allow, environ, base, env=held)
        if hits:
            _discard(worktree, excludes_file, base, held)
            start = _git(worktree, ["rev-parse", f"{base}^{{tree}}"])
            return StagedChange(start, tuple(hits), nested)
        tree = _git(worktree, ["write-tree"], held)
        migrate(Path(held["GIT_OBJECT_DIRECTORY"]), _git_paths(worktree)[1])
    return StagedChange(tree, (), nested)


def remove_nested(worktree: Path, excludes_file: Path) -> tuple[str, ...]:
    """Remove the nested repositories in ``worktree``; the folders they were in.

    A nested repository is what git would stage as a gitlink: an untracked folder with a
    ``.git`` (``git ls-files --others`` names it with a trailing slash; one without a
    commit even makes ``git add`` fail), or a gitlink's folder of the index that holds a
    ``.git``. Its ``.git`` is removed; a repository inside it shows on the next pass.
    """
    removed: list[str] = []
    for _ in range(MOST_ROUNDS):
        found = _repositories(worktree, excludes_file)
        if not found:
            return tuple(removed)
        for path in found:
            _remove_git(worktree / path / ".git")
        removed += found
    raise GitError(f"{worktree}: nested repositories kept appearing: {', '.join(removed[:5])}")


@contextmanager
def quarantine(worktree: Path) -> Iterator[dict[str, str]]:
    """A temporary index and object folder for ``worktree``: the variables that use them.

    The index starts as a copy of the worktree's, its time of change included (so
    unchanged files are not hashed again, and git still checks the entries its own
    writing left racily clean: a file changed in the same tick as the index, to the same
    size, would pass for unchanged against a newer copy); new objects go to the
    quarantine; the repository's own are read through it.
    The folder lies beside the worktree and is removed on leaving. The worktree's own
    index is never written.
    """
    index, objects = _git_paths(worktree)
    prefix = f".{worktree.name}{QUARANTINE_PREFIX}"
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=worktree.parent))
    try:
        (folder / "objects").mkdir()
        if index.is_file():  # its time too: git's check of racily clean entries reads it
            shutil.copy2(index, folder / "index")
        yield {
            "GIT_INDEX_FILE": str(folder / "index"),
            "GIT_OBJECT_DIRECTORY": str(folder / "objects"),
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": _alternate(str(objects)),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def migrate(quarantined: Path, objects: Path) -> int:
    """Move a quarantine's objects into the repository's store, as git moves a push's; how many.

    Loose objects first, then packs (a large file is staged into one), each pack's index
    last, so that no reader sees an index before its pack. An object already in the store
    is left as it is (the same name is the same content). Hard links where the two
    folders share a file system, copies elsewhere.
    """
    moved = 0
    for folder in sorted(quarantined.iterdir()):
        if len(folder.name) == 2 and folder.is_dir():
            target = _folder(objects / folder.name, objects)
            moved += sum(_place(item, target / item.name) for item in sorted(folder.iterdir()))
    packs = quarantined / "pack"
    if packs.is_dir():
        target = _folder(objects / "pack", objects)
        for item in sorted(packs.iterdir(), key=lambda item: (item.suffix == ".idx", item.name)):
            moved += _place(item, target / item.name)
    return moved


def _folder(path: Path, objects: Path) -> Path:
    """``path``, made if need be with the object store's own mode (a shared repository's)."""
    if not path.is_dir():
        path.mkdir(exist_ok=True)
        path.chmod(stat.S_IMODE(objects.stat().st_mode))
    return path


def _place(source: Path, target: Path) -> bool:
    """Put ``source`` at ``target`` unless an object is there already; True if placed."""
    try:
        os.link(source, target)
        return True
    except FileExistsError:
        return False
    except OSError:  # another file system, or links not allowed: copy, then rename into place
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        shutil.copyfile(source, partial)
        partial.chmod(0o444)
        os.replace(partial, target)
        return True


def _git_paths(worktree: Path) -> tuple[Path, Path]:
    """The worktree's index and its repository's object folder, read from its ``.git``.

    A worktree's ``.git`` is a file naming its git directory, whose ``commondir`` names
    the repository's; a repository's own is that directory.
    """
    dot_git = worktree / ".git"
    if dot_git.is_dir():
        return dot_git / "index", dot_git / "objects"
    text = dot_git.read_text(errors="surrogateescape")
    if not text.startswith("gitdir:"):
        raise GitError(f"{dot_git} names no git directory")
    git_dir = (worktree / text.removeprefix("gitdir:").strip()).resolve()
    common = git_dir / "commondir"
    root = (git_dir / common.read_text().strip()).resolve() if common.is_file() else git_dir
    return git_dir / "index", root / "objects"


def _discard(worktree: Path, excludes_file: Path, base: str, held: Mapping[str, str]) -> None:
    """Put the worktree back at ``base`` (ignored files kept); GitError if a change stays.

    Checked by staging the worktree again in the quarantine ``held``: nothing of it is
    kept, whatever it holds.
    """
    _git(worktree, ["reset", "-q", "--hard", base])
    _git(worktree, ["-c", f"core.excludesFile={excludes_file}", "clean", "-ffdq"])
    index, _ = _git_paths(worktree)
    shutil.copy2(index, held["GIT_INDEX_FILE"])
    _add_all(worktree, excludes_file, held)
    if _git(worktree, ["diff", "--cached", "--name-only", "--no-renames", base], held):
        raise GitError(f"changes holding a secret could not be discarded in {worktree}")


def _repositories(worktree: Path, excludes_file: Path) -> list[str]:
    """The folders of ``worktree`` git takes for repositories, from one ``git ls-files``.

    Untracked ones it lists with a trailing slash; a gitlink (``160000``) of the index is
    one when its folder holds a ``.git``.
    """
    args = ["-c", f"core.excludesFile={excludes_file}", "ls-files", "-z", "--stage"]
    listing = _git_bytes(worktree, [*args, "--others", "--exclude-standard"])
    found = []
    for entry in listing.split(b"\0"):
        meta, tab, name = entry.partition(b"\t")
        if not tab and entry.endswith(b"/"):
            found.append(os.fsdecode(entry[:-1]))
        elif tab and meta.startswith(GITLINK) and _holds_git(worktree, os.fsdecode(name)):
            found.append(os.fsdecode(name))
    return found


def _holds_git(worktree: Path, path: str) -> bool:
    """Whether ``path`` is a real folder of the worktree (no symlink on the way) with a ``.git``."""
    here = worktree
    for part in Path(path).parts:
        here = here / part
        try:
            if not stat.S_ISDIR(os.lstat(here).st_mode):
                return False
        except OSError:
            return False
    return os.path.lexists(here / ".git")


def _remove_git(entry: Path) -> None:
    """Remove a ``.git`` folder, file or link, never following a link out of the worktree."""
    if stat.S_ISDIR(os.lstat(entry).st_mode):
        shutil.rmtree(entry)
    else:
        entry.unlink()


def _alternate(objects: str) -> str:
    """``objects`` as one entry of ``GIT_ALTERNATE_OBJECT_DIRECTORIES`` (quoted if need be)."""
    if ":" not in objects and not objects.startswith('"'):
        return objects
    return '"' + objects.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _add_all(worktree: Path, excludes_file: Path, env: Mapping[str, str] | None = None) -> None:
    _git(worktree, ["-c", f"core.excludesFile={excludes_file}", "add", "-A"], env)


def _git_bytes(worktree: Path, args: list[str]) -> bytes:
    proc = run_git_process(args, worktree, text=False)
    if proc.returncode != 0:
        error = proc.stderr.decode("utf-8", "replace").strip()
        raise GitError(f"git {' '.join(args)} failed in {worktree}: {error}")
    return proc.stdout


def _git(worktree: Path, args: list[str], env: Mapping[str, str] | None = None) -> str:
    proc = run_git_process(args, worktree, env)
    if proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed in {worktree}: {proc.stderr.strip()}")
    return proc.stdout.strip()
