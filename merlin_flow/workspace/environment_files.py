"""What the worker reads and writes of a built environment, never through a link setup left.

Setup runs the project's build code with the environment writable, so a build can leave
anything in it, symlinks to any host path among them. The worker is not confined: what
it takes from an environment, it takes through this module.

- ``check_built``, after the setup commands: an environment whose ``build``,
  ``node_modules`` or ``pyvenv.cfg`` is a symlink, or resolves outside it, is refused
  (SetupFailed), and so is one where setup wrote a name merlin keeps for its own files
  (``.merlin-env.json``, ``.merlin-workspace``). ``inside`` is the same check at each
  bind: the sandbox binds ``build`` and ``node_modules`` by their host paths.
- ``keep_generated_files``, then: the git-ignored files setup wrote in its checkout go
  into ``.merlin-workspace``, a folder the worker makes only now. Each is read beneath
  the checkout (``merlin_flow.workspace.beneath``): one reached through a symlink is
  not kept. Each is written with ``O_EXCL`` beneath the new folder.
- ``copy_generated_files``, into each worktree: the kept files are read with
  ``O_NOFOLLOW`` and written beneath the worktree, one name at a time. A file the commit
  has is never written over, and a path a symlink of the commit leads out of the
  worktree (a link to a user's ``.git/hooks``) or into its ``.git`` gets nothing.
- ``write_marker`` makes the marker new (``O_CREAT | O_EXCL``, which follows no link);
  ``touch_marker`` marks its use without following one.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from merlin_flow.errors import SetupFailed
from merlin_flow.workspace.beneath import (
    Top,
    in_git,
    open_beneath,
    overwrite,
    read_at_most,
)
from merlin_flow.workspace.git import run_git

log = logging.getLogger(__name__)

MARKER_FILE = ".merlin-env.json"
"""Written last by the worker: the environment is ready (its key, setup and commit)."""
OVERLAY_DIR = ".merlin-workspace"
"""Files setup generated in the (git-ignored) project tree, copied into every worktree."""
OVERLAY_MAX_BYTES = 20 * 2**20
OVERLAY_SKIPPED = frozenset(
    {"__pycache__", "node_modules", ".venv", "venv", ".tox", ".nox", "target", "dist"}
)
"""Folders of generated files that are environments or build output, not project files."""
BUILD_DIR = "build"
"""The environment's subfolder commands may write (a compiler's incremental output)."""
NODE_MODULES = "node_modules"
"""The environment's ``node_modules``, bound read-only inside each worktree."""
BOUND = (BUILD_DIR, NODE_MODULES, "pyvenv.cfg")
"""Names of the environment the worker binds or used to read by their host paths."""
RESERVED = (MARKER_FILE, OVERLAY_DIR)
"""Names in the environment only the worker writes, after setup."""


def check_built(folder: Path) -> None:
    """Refuse (SetupFailed) the environment setup just built in ``folder``; see the module."""
    for name in RESERVED:
        if os.path.lexists(folder / name):
            raise SetupFailed(
                f"environment setup wrote `$MERLIN_ENV/{name}`, a name merlin keeps for its "
                "own files: the environment is refused"
            )
    for name in BOUND:
        path = folder / name
        if os.path.lexists(path) and inside(folder, name) is None:
            where = f" to {os.readlink(path)}" if path.is_symlink() else ""
            raise SetupFailed(
                f"environment setup left `$MERLIN_ENV/{name}` as a symbolic link{where}: the "
                "sandbox binds it by its path, so the environment is refused"
            )
    if os.path.lexists(folder / BUILD_DIR) and not (folder / BUILD_DIR).is_dir():
        raise SetupFailed(
            f"environment setup left `$MERLIN_ENV/{BUILD_DIR}` as a file: it is the build "
            "cache's folder, so the environment is refused"
        )


def inside(env: Path, name: str) -> Path | None:
    """``env/name`` when it exists, is no symlink and resolves inside ``env``; else None."""
    path = env / name
    try:
        if path.is_symlink() or not path.exists():
            return None
        return path if path.resolve().is_relative_to(env.resolve()) else None
    except OSError:
        return None


def keep_generated_files(checkout: Path, folder: Path) -> list[str]:
    """Copy the git-ignored files setup wrote in ``checkout`` into ``folder``'s overlay.

    Bounded (``OVERLAY_MAX_BYTES`` in all); returns the paths kept. The overlay is made
    now: setup's own was refused by ``check_built``.
    """
    proc = run_git(
        ["status", "--porcelain", "-z", "--ignored=matching", "--untracked-files=all"], checkout
    )
    os.mkdir(folder / OVERLAY_DIR)
    kept: list[str] = []
    total = 0
    with Top(checkout) as source, Top(folder / OVERLAY_DIR) as target:
        for entry in proc.stdout.split("\0"):
            if not entry.startswith("!! "):
                continue
            relative = entry[3:]
            path = PurePosixPath(relative)
            if set(path.parts) & OVERLAY_SKIPPED or path.suffix in (".pyc", ".pyo"):
                continue
            found = _read_beneath(source, relative, OVERLAY_MAX_BYTES - total)
            if found is not None and _write_beneath(target, relative, *found):
                total += len(found[0])
                kept.append(relative)
    return kept


def copy_generated_files(folder: Path, worktree: Path) -> None:
    """Copy the files kept in ``folder``'s overlay into ``worktree``; see the module."""
    overlay = folder / OVERLAY_DIR
    if overlay.is_symlink() or not overlay.is_dir():
        return
    with Top(worktree) as into:
        # fwalk enters no symlinked folder (the overlay itself included).
        for at, _, names, at_fd in os.fwalk(overlay):
            for name in sorted(names):
                relative = Path(at, name).relative_to(overlay).as_posix()
                found = _read_at(at_fd, name)
                if found is not None:
                    _write_beneath(into, relative, *found)


def write_marker(folder: Path, marker: dict[str, Any]) -> None:
    """Make ``folder``'s marker, new: the environment is ready."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(folder / MARKER_FILE, flags, 0o644), "w", encoding="utf-8") as out:
        out.write(json.dumps(marker, indent=2) + "\n")


def touch_marker(folder: Path) -> None:
    """Mark the environment in ``folder`` used now (``merlin prune`` goes by it)."""
    os.utime(folder / MARKER_FILE, follow_symlinks=False)


def _read_beneath(top: Top, relative: str, budget: int) -> tuple[bytes, int] | None:
    """The bytes and mode of the regular file ``relative``, reached through no symlink."""
    try:
        with open_beneath(top, relative, os.O_RDONLY) as opened:
            if opened.rel != PurePosixPath(relative).as_posix():
                return None  # through a symlink: not a file setup generated here
            return _content(opened.fd, budget)
    except OSError:
        return None


def _read_at(folder_fd: int, name: str) -> tuple[bytes, int] | None:
    """The bytes and mode of the regular file ``name`` in the open folder, not a link."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd
        )
    except OSError:
        return None
    try:
        return _content(fd, OVERLAY_MAX_BYTES)
    finally:
        os.close(fd)


def _content(fd: int, budget: int) -> tuple[bytes, int] | None:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > budget:
        return None
    data = read_at_most(fd, budget)
    return (data, stat.S_IMODE(info.st_mode)) if len(data) <= budget else None


def _write_beneath(top: Top, relative: str, data: bytes, mode: int) -> bool:
    """Write a new file ``relative`` beneath ``top``; False where one is there or refused."""
    try:
        with open_beneath(top, relative, os.O_WRONLY, create=True, judge=_outside_git) as out:
            if not out.created:
                return False  # the commit's own file
            overwrite(out.fd, data)
            os.fchmod(out.fd, mode & 0o777)
            return True
    except OSError as exc:
        log.info("generated file %s not copied: %s", relative, exc.strerror or exc)
        return False


def _outside_git(relative: str) -> None:
    if in_git(relative):
        raise OSError(errno.EXDEV, "is inside .git")
