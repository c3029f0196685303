"""The source files the repository map reads, each named by its git blob id.

A file's blob id is the hash of its content, so it is the key of its cached tags: the
same bytes are parsed once, in any worktree and at any commit of any repository. Two
places the files come from:

- **a worktree** (``commit=None``): ``git ls-tree -r HEAD`` gives every committed file
  with its blob id, without reading one; the files that differ from HEAD (changed,
  staged, new and not ignored: ``git status``) are read from disk and their
  ids computed here, as ``git hash-object`` would. A worktree of 100,000 files with two
  changed costs two reads and the two git listings;
- **a commit** (``commit=SHA``, the planner's case: a bare cache of a git URL has no
  worktree): ``git ls-tree`` at that commit, and the contents a cache lacks read from
  the object store with one ``git cat-file --batch``.

Only files of a language the map reads (``repo_tags.LANGUAGES``) are listed, never
symlinks or submodules, never vendored or generated folders (``node_modules/``...),
and only those ``include`` accepts (the ``[permissions]`` read rules).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from merlin_flow.errors import GitError
from merlin_flow.workspace.beneath import Top, open_beneath, read_at_most
from merlin_flow.workspace.git import run_git
from merlin_flow.workspace.git_command import run_git_process
from merlin_flow.workspace.repo_grammars import LANGUAGES, kind_of
from merlin_flow.workspace.repo_tags import MAX_FILE_BYTES

SKIPPED_FOLDERS = (
    "node_modules/",
    "vendor/",
    "third_party/",
    "dist/",
    "build/",
    ".venv/",
    "venv/",
    "site-packages/",
    "target/",
)
"""Folders of vendored, built or installed code: never in the map, wherever they are."""


@dataclass(frozen=True)
class SourceFile:
    """One file the map reads."""

    path: str
    """Relative to the repository's top, with ``/``."""
    blob: str
    """The git blob id of its content."""
    kind: str
    """How it is tagged (``repo_tags.kind_of``): its language, or references only."""


def blob_id(data: bytes) -> str:
    """The id git gives a blob of these bytes (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


_SKIPPED_NAMES = frozenset(folder.rstrip("/") for folder in SKIPPED_FOLDERS)


def mapped(path: str, include: Callable[[str], bool]) -> str | None:
    """How the map tags ``path`` (``repo_grammars.kind_of``), or None if it skips it."""
    kind = kind_of(path)
    if kind is None or path[:1] == "." or "/." in path:
        return None
    if not _SKIPPED_NAMES.isdisjoint(path.split("/")[:-1]) or not include(path):
        return None
    return kind


def list_sources(
    root: Path, commit: str | None, include: Callable[[str], bool], refresh: bool = True
) -> tuple[list[SourceFile], dict[str, bytes]]:
    """The files the map reads, sorted by path, and the contents already read.

    ``root`` is a worktree (``commit=None``: the files as they are on disk) or any git
    directory (the files of ``commit``). The contents returned are those read to hash
    them: the files that differ from HEAD, keyed by blob id.

    ``refresh`` lets git bring the worktree index's file stats up to date as it finds
    the changed files (``git status``, which writes the index when it can take its
    lock). A new worktree's files are all as young as its index, so until then every
    ``git diff`` hashes each of them again (0.2 s on sympy, each time): pass False only
    for a checkout whose index is not merlin's (a ``git diff`` without optional locks is used then).
    """
    listed = _tree(root, commit or "HEAD", missing_ok=commit is None)
    read: dict[str, bytes] = {}
    if commit is None:
        with Top(root) as top:
            for path in _changed(root, refresh):
                listed.pop(path, None)
                data = _read(top, path) if mapped(path, include) is not None else None
                if data is not None:
                    blob = blob_id(data)
                    listed[path] = blob
                    read[blob] = data
    files = []
    for path in sorted(listed):
        kind = mapped(path, include)
        if kind is not None:
            files.append(SourceFile(path, listed[path], kind))
    return files, read


def _changed(root: Path, refresh: bool) -> list[str]:
    """The files of the worktree that differ from HEAD, renamed ones by both names."""
    if refresh:
        status = run_git(["status", "--porcelain=v1", "-z", "--untracked-files=all"], root)
        if status.returncode == 0:
            entries = status.stdout.split("\0")
            paths, n = [], 0
            while n < len(entries):
                entry = entries[n]
                n += 1
                if len(entry) > 3:
                    paths.append(entry[3:])
                    if "R" in entry[:2] or "C" in entry[:2]:  # then the old name
                        paths.append(entries[n])
                        n += 1
            return paths
    lockless = ["--no-optional-locks", "diff", "--name-only", "-z", "--no-renames", "HEAD"]
    changed = run_git(lockless, root).stdout.split("\0")
    new = run_git(["ls-files", "-z", "--others", "--exclude-standard"], root).stdout.split("\0")
    return sorted({*changed, *new} - {""})


_ENTRY = re.compile(
    r"(?:^|\0)100(?:644|755) blob ([0-9a-f]{40,64})\t([^\0]*\.(?:"
    + "|".join(ending[1:] for ending in LANGUAGES)
    + r"))(?=\0|$)",
    re.IGNORECASE,
)


def _tree(root: Path, commit: str, missing_ok: bool) -> dict[str, str]:
    listing = run_git(["ls-tree", "-r", "-z", "--full-tree", commit], root)
    if listing.returncode != 0:
        if missing_ok:  # a repository without commits: every file is new
            return {}
        raise GitError(f"git ls-tree {commit} failed in {root}: {listing.stderr.strip()}")
    # One pass of a regular expression over the listing keeps the regular files with an
    # ending the map reads: 100,000 entries cost no Python loop over the others.
    return {path: blob for blob, path in _ENTRY.findall(listing.stdout)}


def read_blobs(root: Path, commit: str | None, files: Iterable[SourceFile]) -> dict[str, bytes]:
    """The content of each file, keyed by blob id: from disk in a worktree, else from git.

    A blob larger than MAX_FILE_BYTES is not read: its content is given as a marker the
    tagger skips as binary.
    """
    wanted = {file.blob: file.path for file in files}
    if commit is None:
        with Top(root) as top:
            return {blob: _read(top, path) or b"\0unreadable" for blob, path in wanted.items()}
    return _cat_blobs(root, sorted(wanted))


def _read(top: Top, path: str) -> bytes | None:
    """The plain file ``path`` of the worktree, opened beneath it; None for anything else.

    Never through a symlink (a file or a folder of the path), whatever swaps what meanwhile:
    the map shows the model nothing outside the worktree. A file over MAX_FILE_BYTES is a
    marker the tagger skips as binary.
    """
    try:
        with open_beneath(top, path, os.O_RDONLY) as opened:
            if opened.rel != path:  # a symlink on the way
                return None
            if os.fstat(opened.fd).st_size > MAX_FILE_BYTES:
                return b"\0huge"
            return read_at_most(opened.fd, MAX_FILE_BYTES)
    except OSError:
        return None


def _cat_blobs(root: Path, blobs: list[str]) -> dict[str, bytes]:
    if not blobs:
        return {}
    sizes = _batch(root, ["--batch-check"], blobs)
    small = [blob for blob in blobs if int(sizes.get(blob, b"0")) <= MAX_FILE_BYTES]
    contents = {blob: b"\0huge" for blob in blobs if blob not in small}
    out = _batch(root, ["--batch"], small, with_content=True)
    contents.update(out)
    return contents


def _batch(
    root: Path, option: list[str], blobs: list[str], with_content: bool = False
) -> dict[str, bytes]:
    """``git cat-file`` over ``blobs``: each one's size (as digits), or its content."""
    stdin = "".join(blob + "\n" for blob in blobs).encode()
    proc = run_git_process(["cat-file", *option], root, text=False, stdin=stdin)
    if proc.returncode != 0:
        raise GitError(f"git cat-file failed in {root}: {proc.stderr.decode(errors='replace')}")
    out, found, position = proc.stdout, {}, 0
    while position < len(out):
        end = out.index(b"\n", position)
        header = out[position:end].split()
        position = end + 1
        if len(header) < 3 or header[1] == b"missing":
            continue
        size = int(header[2])
        if with_content:
            found[header[0].decode()] = out[position : position + size]
            position += size + 1
        else:
            found[header[0].decode()] = header[2]
    return found
