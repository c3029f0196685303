"""What a commit's tree holds, read once per process: a commit's files never change.

A step reads the same few facts of the same commit several times: the environment's
cache key and the project's kind (the names at the root, the object ids of the key
files) when the attempt starts, and again when its verify and the next step's attempt
start on the commit it made. Each read was a ``git ls-tree`` process (about 2 ms). A
commit id names its tree for good, so what was read of it is kept, keyed by the
repository and the full commit id; a name that can move (``HEAD``, a branch) is read
every time.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from pathlib import Path

from merlin_flow.errors import GitError
from merlin_flow.workspace.git import run_git

KEPT = 256
"""Commits whose root listing is kept, per process (a few kilobytes each)."""
_FULL_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_roots: OrderedDict[tuple[str, str], dict[str, str]] = OrderedDict()
_lock = threading.Lock()  # an `llm` worker runs steps in threads


def root_entries(git_dir: Path, commit: str) -> dict[str, str]:
    """The names at the root of ``commit``'s tree, each with its object id."""
    key = (str(git_dir), commit)
    with _lock:
        kept = _roots.get(key)
        if kept is not None:
            _roots.move_to_end(key)
            return dict(kept)
    listing = run_git(["ls-tree", "-z", commit], git_dir)
    if listing.returncode != 0:
        raise GitError(f"git ls-tree {commit} failed in {git_dir}: {listing.stderr.strip()}")
    entries = _parse(listing.stdout)
    if _FULL_ID.fullmatch(commit):
        with _lock:
            _roots[key] = entries
            while len(_roots) > KEPT:
                _roots.popitem(last=False)
    return dict(entries)


def object_ids(git_dir: Path, commit: str, paths: list[str]) -> dict[str, str | None]:
    """The object id of each path in ``commit`` (a blob or a tree), None where it is absent.

    Paths at the root come from ``root_entries``; a deeper path is looked up only when
    its top folder exists (one ``ls-tree`` for all of them).
    """
    root = root_entries(git_dir, commit)
    found: dict[str, str | None] = {path: root.get(path) for path in paths if "/" not in path}
    deeper = sorted(p for p in paths if "/" in p and p.split("/", 1)[0] in root)
    if deeper:
        # Each entry is `<mode> <type> <object>\t<path>`; a path not in the commit is absent.
        args = ["--literal-pathspecs", "ls-tree", "-z", "-t", commit, "--", *deeper]
        listed = run_git(args, git_dir)
        entries = _parse(listed.stdout) if listed.returncode == 0 else {}
        found.update((path, entries.get(path)) for path in deeper)
    return {path: found.get(path) for path in sorted(paths)}


def forget() -> None:
    """Drop what was kept (tests)."""
    with _lock:
        _roots.clear()


def _parse(listing: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    for entry in listing.split("\0"):
        meta, _, path = entry.partition("\t")
        if path:
            entries[path] = meta.split()[2]
    return entries


def _new_lock() -> None:
    """In a forked child: a lock of its own (a thread of the parent may have held it)."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)
