"""Where the repository map keeps what it read: tags by blob id, and each repository's index.

Under the cache folder (the callers give ``$MERLIN_HOME/repo_map``):

- ``tags-v<N>.sqlite3``: one row per (blob id, kind) with the file's definitions (JSON)
  and references (compact), apart (``repo_tags.Encoded``): rendering reads only the
  former. A blob id names content, so the rows serve every worktree, commit and
  repository alike. SQLite in WAL mode with a busy timeout: two processes
  building maps at once both read and write it; a row written twice holds the same
  tags, so ``INSERT OR REPLACE`` is safe;
- ``index-v<N>/<repository>.npz``: the ranking's arrays for the last listing of a
  repository (``repo_rank.RepoIndex``), one file per repository (named by a hash of its
  shared git directory, so all its worktrees share it), written to a temporary file
  and renamed: a reader sees the old file or the new one, never half of one. Two
  builders racing leave one of the two, each a whole index of a real listing; the next
  build brings it up to date with the files that differ.

Without a cache folder (``None``) the tags live in memory for one build.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from merlin_flow.store.wal import enable_wal
from merlin_flow.workspace.repo_rank import RepoIndex

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray
from merlin_flow.workspace.repo_tags import TAGS_VERSION, Encoded, FileTags

INDEX_VERSION = 2
"""Bumped when the index's arrays change meaning: older index files are left unread."""
_CHUNK = 500


class TagStore:
    """Each blob's tags, in SQLite under ``cache_dir`` (or in memory without one)."""

    def __init__(self, cache_dir: Path | None) -> None:
        self.memory: dict[tuple[str, str], FileTags] = {}
        self.path = None if cache_dir is None else cache_dir / f"tags-v{TAGS_VERSION}.sqlite3"
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                db.execute(
                    "CREATE TABLE IF NOT EXISTS tags (blob TEXT NOT NULL, kind TEXT NOT NULL, "
                    "definitions TEXT NOT NULL, words TEXT NOT NULL, counts BLOB NOT NULL, "
                    "skipped TEXT NOT NULL, PRIMARY KEY (blob, kind)) WITHOUT ROWID"
                )

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        assert self.path is not None
        db = sqlite3.connect(self.path, timeout=60)
        try:
            enable_wal(db, 60)
            db.execute("PRAGMA synchronous=NORMAL")
            with db:
                yield db
        finally:
            db.close()

    def get(
        self, keys: Iterable[tuple[str, str]], references: bool = True
    ) -> dict[tuple[str, str], FileTags]:
        """The stored tags of those (blob id, kind) keys that have them.

        Without their references unless ``references``: rendering needs the definitions.
        """
        wanted = sorted(set(keys))
        found = {key: self.memory[key] for key in wanted if key in self.memory}
        wanted = [key for key in wanted if key not in found]
        if self.path is None or not wanted:
            return found
        columns = "words, counts" if references else "'', x''"
        with self._connect() as db:
            for start in range(0, len(wanted), _CHUNK):
                chunk = wanted[start : start + _CHUNK]
                blobs = sorted({blob for blob, _kind in chunk})
                rows = db.execute(  # by blob alone: the primary key's index serves it
                    f"SELECT blob, kind, definitions, {columns}, skipped FROM tags "
                    f"WHERE blob IN ({','.join('?' for _ in blobs)})",
                    blobs,
                )
                asked = set(chunk)
                for blob, kind, *encoded in rows:
                    if (blob, kind) in asked:
                        found[blob, kind] = FileTags.decode(Encoded(*encoded), references)
        return found

    def put(self, tags: dict[tuple[str, str], tuple[FileTags, Encoded]]) -> None:
        """Keep these tags (in memory too, for the rest of this build)."""
        self.memory.update((key, value[0]) for key, value in tags.items())
        if self.path is None or not tags:
            return
        with self._connect() as db:
            db.executemany(
                "INSERT OR REPLACE INTO tags (blob, kind, definitions, words, counts, skipped) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(blob, kind, *encoded) for (blob, kind), (_tags, encoded) in tags.items()],
            )


def repository_key(common_dir: Path) -> str:
    """The name of a repository's index file: a hash of its shared git directory."""
    return hashlib.sha256(str(common_dir.resolve()).encode()).hexdigest()[:24]


def _index_file(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"index-v{INDEX_VERSION}-tags-v{TAGS_VERSION}" / f"{key}.npz"


def load_index(cache_dir: Path | None, key: str) -> RepoIndex:
    """The index last saved for repository ``key``, or an empty one."""
    import numpy as np

    if cache_dir is None:
        return RepoIndex.empty()
    try:
        with np.load(_index_file(cache_dir, key), allow_pickle=False) as data:
            texts = {name: _split(data[name]) for name in ("paths", "blobs", "words")}
            arrays = {
                name: data[name].astype(np.int32)
                for name in ("ref_file", "ref_word", "ref_count", "def_file", "def_word")
            }
            flags = data["word_flags"].astype(np.int8)
            own = data["ref_own"].astype(np.bool_)
    except (OSError, KeyError, ValueError):
        return RepoIndex.empty()
    index = RepoIndex(texts["paths"], texts["blobs"], texts["words"], flags, ref_own=own, **arrays)
    if not _consistent(index):
        return RepoIndex.empty()
    return index


def save_index(cache_dir: Path | None, key: str, index: RepoIndex) -> None:
    """Keep ``index`` for repository ``key``, replacing the last one at once."""
    import numpy as np

    if cache_dir is None:
        return
    target = _index_file(cache_dir, key)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{key}.", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as out:
            np.savez(
                out,
                paths=_joined(index.paths),
                blobs=_joined(index.blobs),
                words=_joined(index.words),
                word_flags=index.word_flags,
                ref_file=index.ref_file,
                ref_word=index.ref_word,
                ref_count=index.ref_count,
                ref_own=index.ref_own,
                def_file=index.def_file,
                def_word=index.def_word,
            )
        os.replace(temporary, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _joined(texts: list[str]) -> NDArray[np.uint8]:
    import numpy as np

    return np.frombuffer("\0".join(texts).encode(), dtype=np.uint8)


def _split(array: object) -> list[str]:
    import numpy as np

    text = np.asarray(array, dtype=np.uint8).tobytes().decode()
    return text.split("\0") if text else []


def _consistent(index: RepoIndex) -> bool:
    files, words = len(index.paths), len(index.words)
    if len(index.blobs) != files or len(index.word_flags) != words:
        return False
    sizes = {len(index.ref_file), len(index.ref_word), len(index.ref_count), len(index.ref_own)}
    if len(sizes) != 1 or len(index.def_file) != len(index.def_word):
        return False
    for array, limit in (
        (index.ref_file, files),
        (index.def_file, files),
        (index.ref_word, words),
        (index.def_word, words),
    ):
        if len(array) and (int(array.min()) < 0 or int(array.max()) >= limit):
            return False
    return True
