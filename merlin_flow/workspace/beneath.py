"""Files opened beneath a folder (the worktree), one name at a time: no symlink leads out.

A path is never opened by its whole name: ``open_beneath`` walks it from the folder's
descriptor (``Top``), each folder opened with ``O_NOFOLLOW | O_DIRECTORY`` beneath its
parent's descriptor (``os.open(name, flags, dir_fd=fd)``), the file last with
``O_NOFOLLOW | O_NONBLOCK`` (a FIFO never blocks). The check is the open: a process that
swaps a folder for a symlink between a check and an open has nothing to race.

A symlink on the way is read (``readlink`` beneath its folder) and its target walked the
same way: followed while it stays inside, refused when it leads out (an absolute target
elsewhere, ``..`` above the top; names above the top are taken as written, never opened,
and the path is refused unless it comes back in); over ``MAX_SYMLINKS`` is a loop. The
walk is a loop, not a recursion, and bounded (``MAX_DEPTH``, ``PATH_MAX``, ``NAME_MAX``).
Folders a write needs are made (``mkdir`` beneath their parent) only once the whole path
was walked and judged: a refused write makes none. ``shown_files`` walks a folder's files
(sorted, never entering a symlinked folder, skipping ``.git``); ``unlink_beneath``
removes a file without following a folder out.

Refusals are ``OSError``: ``errno`` one of ``REFUSALS``, ``strerror`` saying why in words
("is outside the repository"). Linux semantics; the top's own path is trusted.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

MAX_DEPTH = 256
"""Most folders a path may lead down from the top (and a walk of files descends)."""
PATH_MAX = 4096
"""Longest path (bytes, its NUL included) Linux opens."""
NAME_MAX = 255
"""Longest name (bytes) of one file or folder."""
MAX_SYMLINKS = 40
"""Most symlinks one walk follows (Linux's own limit); more is a loop."""
RETRIES = 8
"""Walks of one path before a path that keeps changing under them is refused."""

OUTSIDE = errno.EXDEV
LOOP = errno.ELOOP
TOO_LONG = errno.ENAMETOOLONG
CHANGING = errno.EAGAIN
NOT_KIND = errno.ENOENT
IS_FOLDER = errno.EISDIR
REFUSALS = frozenset({OUTSIDE, LOOP, TOO_LONG, CHANGING, NOT_KIND, IS_FOLDER})
"""The ``errno`` of this module's refusals (a missing file or a folder is one, in words)."""

FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""How each folder on a walk is opened."""
_FILE = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

Judge = Callable[[str], None]
"""Shown where a path leads (relative to the top, posix) before it is opened; may raise."""


class Top:
    """A folder opened once (a worktree): each walk starts from its descriptor."""

    def __init__(self, folder: Path) -> None:
        """Open ``folder`` (its real path: the top's own path is trusted)."""
        real = os.path.realpath(folder)
        self.parts = tuple(part for part in real.split("/") if part)
        self.fd = os.open(real, FOLDER)

    def __enter__(self) -> Top:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class Opened:
    """A file or folder opened beneath the top; the caller closes ``fd`` (``with``)."""

    fd: int
    rel: str
    """Where it is below the top (posix, "" for the top), as the walk found it."""
    created: bool = False

    def __enter__(self) -> Opened:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def open_beneath(
    top: Top,
    path: str,
    flags: int,
    *,
    kind: str = "file",
    create: bool = False,
    judge: Judge | None = None,
) -> Opened:
    """``path`` (relative to the top, or absolute inside it) opened with ``flags``.

    Symlinks are followed while they stay beneath the top; ``create`` makes the file
    and its missing folders. ``judge`` sees where the path leads before anything is
    opened or made (again if a walk is repeated because the path changed under it).
    ``kind`` ("file", "folder", "file or folder") is what it must be, else a refusal
    (``NOT_KIND``, or ``IS_FOLDER``) says so.
    """
    for _ in range(RETRIES):
        walk = _Walk(top)
        try:
            walk.run(path, follow_last=True)
            if judge is not None:
                judge(walk.rel)
            opened = walk.open(flags, create)
        except (FileNotFoundError, NotADirectoryError):
            raise OSError(NOT_KIND, f"is not a {kind}") from None
        except IsADirectoryError:
            raise OSError(IS_FOLDER, "is a folder") from None
        finally:
            walk.close()
        if opened is None:
            continue
        if kind == "file" and not stat.S_ISREG(os.fstat(opened.fd).st_mode):
            os.close(opened.fd)
            raise OSError(NOT_KIND, "is not a file")
        return opened
    raise OSError(CHANGING, "kept changing while it was opened (try again)")


def unlink_beneath(top: Top, path: str) -> bool:
    """Remove the file ``path`` names (a symlink itself); False when none is there.

    Its folders are walked as ``open_beneath`` walks them: a symlinked folder leading out
    of the top is never followed (nothing is removed).
    """
    walk = _Walk(top)
    try:
        walk.run(path, follow_last=False)
        if len(walk.tail) == 1:
            os.unlink(walk.tail[0], dir_fd=walk.fds[-1])
            return True
        return False
    except OSError as exc:
        if exc.errno in REFUSALS or isinstance(exc, NotADirectoryError):  # ENOENT: NOT_KIND
            return False
        raise
    finally:
        walk.close()


def _files(folder: int, rel: str) -> Iterator[tuple[str, int, str, bool]]:
    """The files below the open ``folder`` (``rel`` below the top), in path order.

    Each is ``(rel, its folder's fd, name, whether a symlink)``, not FIFOs, sockets or
    devices. Folders are entered by name with ``O_NOFOLLOW``: a symlinked one never is,
    even one swapped in during the walk; nor ``.git`` ones, nor any past ``MAX_DEPTH``.
    """
    stack = [(folder, rel, iter(_entries(folder)))]
    try:
        while stack:
            fd, at, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                if stack:  # the first folder is the caller's
                    os.close(fd)
                continue
            name, kind = entry
            path = f"{at}/{name}" if at else name
            if is_git(name):
                continue
            if kind != "dir":
                yield path, fd, name, kind == "link"
            elif len(stack) <= MAX_DEPTH:
                with suppress(OSError):
                    child = os.open(name, FOLDER, dir_fd=fd)
                    try:
                        stack.append((child, path, iter(_entries(child))))
                    except OSError:
                        os.close(child)
    finally:
        for fd, _, _ in stack[1:]:
            os.close(fd)


def shown_files(
    top: Top, base: Opened, shown: Callable[[str], bool], read: bool
) -> Iterator[tuple[str, int]]:
    """The files in ``base`` that ``shown`` lets be seen, in path order (or ``base``).

    Each is ``(rel, fd)``, opened to read when ``read`` (closed when the next is asked
    for), else ``fd`` is -1. A symlink is shown when it leads to a regular file beneath
    the top, outside ``.git``, that ``shown`` lets be seen too. A regular file ``base``
    is the one file, when ``shown``.
    """
    mode = os.fstat(base.fd).st_mode
    if stat.S_ISREG(mode) and shown(base.rel):
        yield base.rel, base.fd
    for rel, folder, name, link in _files(base.fd, base.rel) if stat.S_ISDIR(mode) else ():
        opened = None
        with suppress(OSError):
            if link:
                opened = open_beneath(top, rel, os.O_RDONLY)
            elif read:
                opened = Opened(os.open(name, os.O_RDONLY | _FILE, dir_fd=folder), rel)
        if opened is None and (read or link):
            continue
        target = rel if opened is None else opened.rel
        try:
            regular = opened is None or stat.S_ISREG(os.fstat(opened.fd).st_mode)
            seen = shown(rel) and (target == rel or (not in_git(target) and shown(target)))
            if regular and seen:
                yield rel, -1 if opened is None else opened.fd
        finally:
            if opened is not None:
                os.close(opened.fd)


def is_git(name: str) -> bool:
    """Whether ``name`` is a git folder's (``.git``, in any case)."""
    return name.casefold() == ".git"


def in_git(path: str) -> bool:
    """Whether any name on ``path`` (posix) is ``.git``: inside some git folder."""
    return any(is_git(name) for name in path.split("/"))


def read_at_most(fd: int, limit: int) -> bytes:
    """The open file's bytes from its start, at most ``limit + 1`` (more says: too large)."""
    data = b""
    while len(data) <= limit and (chunk := os.pread(fd, limit + 1 - len(data), len(data))):
        data += chunk
    return data


def overwrite(fd: int, data: bytes) -> None:
    """Make the open file hold ``data`` (truncated first, then written whole)."""
    os.ftruncate(fd, 0)
    view, done = memoryview(data), 0
    while done < len(data):
        done += os.pwrite(fd, view[done:], done)


def _entries(fd: int) -> list[tuple[str, str]]:
    """The open folder's entries, sorted: (name, "dir" | "link" | "file") each."""
    found = []
    with os.scandir(fd) as entries:
        for entry in entries:
            with suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    found.append((entry.name, "dir"))
                elif entry.is_symlink():
                    found.append((entry.name, "link"))
                elif entry.is_file(follow_symlinks=False):
                    found.append((entry.name, "file"))
    return sorted(found)


def _names(path: str) -> list[str]:
    """``path``'s names, last first (a stack to pop); a refusal when it is too long."""
    size = len(os.fsencode(path))
    if size >= PATH_MAX:
        raise OSError(TOO_LONG, f"is too long: {size} bytes, over PATH_MAX ({PATH_MAX})")
    names = [name for name in path.split("/") if name not in ("", ".")]
    if (deep := sum(name != ".." for name in names)) > MAX_DEPTH:
        raise OSError(TOO_LONG, f"is too deep: {deep} levels, over the {MAX_DEPTH} a path may have")
    if (longest := max((len(os.fsencode(name)) for name in names), default=0)) > NAME_MAX:
        raise OSError(TOO_LONG, f"is too long: a name of {longest} bytes, over {NAME_MAX}")
    return names[::-1]


class _Walk:
    """One walk down a path from a top: the folders opened, then the names not found."""

    def __init__(self, top: Top) -> None:
        self.top = top
        self.fds = [top.fd]
        self.names: list[str] = []  # the opened folders' names below the top
        self.tail: list[str] = []  # names after them: missing folders, then the leaf
        self.outer: list[str] | None = None  # where the walk is above the top (as written)
        self.links = 0

    @property
    def rel(self) -> str:
        return "/".join([*self.names, *self.tail])

    def run(self, path: str, follow_last: bool) -> None:
        todo = _names(path)
        if path.startswith("/"):
            self._leave([])
        while todo:
            name = todo.pop()
            if self.outer is not None:
                self._above(name)
            elif name == "..":
                self._up()
            elif self.tail or not (todo or follow_last):
                self._down(name, None)
            elif (target := self._step(name, last=not todo)) is not None:
                self.links += 1
                if self.links > MAX_SYMLINKS:
                    raise OSError(LOOP, f"goes through a symlink loop (over {MAX_SYMLINKS} links)")
                if target.startswith("/"):
                    self._leave([])
                todo.extend(_names(target))
        if self.outer is not None:
            raise OSError(OUTSIDE, "is outside the repository")

    def open(self, flags: int, create: bool) -> Opened | None:
        """The walked path opened (None: it changed under the walk, walk again)."""
        if not self.tail:  # a folder reached by `..`, or the top
            return Opened(os.open(".", flags | _FILE, dir_fd=self.fds[-1]), self.rel)
        if len(self.tail) > 1 and not create:
            raise FileNotFoundError(errno.ENOENT, self.rel)
        *folders, leaf = self.tail
        for name in folders:
            with suppress(FileExistsError):
                os.mkdir(name, dir_fd=self.fds[-1])
            try:
                self.fds.append(os.open(name, FOLDER, dir_fd=self.fds[-1]))
            except (FileNotFoundError, NotADirectoryError):
                return None  # a symlink (or gone) since it was made: walk again
        try:
            return Opened(os.open(leaf, flags | _FILE, dir_fd=self.fds[-1]), self.rel)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None  # a symlink since it was walked: walk again, following it
            raise
        with suppress(FileExistsError):
            made = os.open(leaf, flags | _FILE | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=self.fds[-1])
            return Opened(made, self.rel, created=True)
        return None

    def close(self) -> None:
        for fd in self.fds[1:]:
            os.close(fd)
        del self.fds[1:]

    def _step(self, name: str, last: bool) -> str | None:
        """Go down to ``name`` (a folder opened, unless last); its target if a symlink."""
        here, fd = self.fds[-1], None
        try:
            if last:
                return os.readlink(name, dir_fd=here)
            fd = os.open(name, FOLDER, dir_fd=here)
        except FileNotFoundError:
            pass  # missing: made by a write, else not found
        except OSError as exc:
            if not last or exc.errno != errno.EINVAL:  # EINVAL: there, and not a symlink
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                try:
                    return os.readlink(name, dir_fd=here)
                except OSError:  # not a symlink, not a folder (or it changed)
                    raise NotADirectoryError(errno.ENOTDIR, name) from None
        self._down(name, fd)
        return None

    def _down(self, name: str, fd: int | None) -> None:
        if fd is None:
            self.tail.append(name)
        else:
            self.fds.append(fd)
            self.names.append(name)
        if len(self.names) + len(self.tail) > MAX_DEPTH:
            raise OSError(TOO_LONG, f"is too deep: it leads over {MAX_DEPTH} folders down")

    def _up(self) -> None:
        if self.tail:
            self.tail.pop()
        elif self.names:
            os.close(self.fds.pop())
            self.names.pop()
        else:
            self._leave(list(self.top.parts[:-1]))

    def _leave(self, outer: list[str]) -> None:
        """Go above the top, to ``outer`` (names as written, never opened)."""
        self.close()
        self.names, self.tail, self.outer = [], [], outer
        self._above(None)

    def _above(self, name: str | None) -> None:
        assert self.outer is not None
        if name == "..":
            del self.outer[-1:]
        elif name is not None:
            self.outer.append(name)
        if tuple(self.outer) == self.top.parts:
            self.outer = None  # back at the top
