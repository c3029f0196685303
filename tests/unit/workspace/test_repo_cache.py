"""The tag store (SQLite, by blob id) and each repository's index file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from merlin_flow.workspace.repo_cache import (
    TagStore,
    load_index,
    repository_key,
    save_index,
)
from merlin_flow.workspace.repo_files import SourceFile
from merlin_flow.workspace.repo_rank import RepoIndex
from merlin_flow.workspace.repo_tags import Definition, FileTags

TAGS = FileTags((Definition("Engine", "class", 0, "class Engine:"),), {"Engine": 1, "run": 2})


def test_tags_are_kept_by_blob_and_kind(tmp_path: Path) -> None:
    store = TagStore(tmp_path / "cache")
    store.put({("a" * 40, "python"): (TAGS, TAGS.encode())})
    again = TagStore(tmp_path / "cache")
    assert again.get([("a" * 40, "python"), ("a" * 40, "python:refs")]) == {
        ("a" * 40, "python"): TAGS
    }
    bare = again.get([("a" * 40, "python")], references=False)[("a" * 40, "python")]
    assert bare.definitions == TAGS.definitions
    assert bare.references == {}


def test_without_a_folder_tags_live_in_memory(tmp_path: Path) -> None:
    store = TagStore(None)
    store.put({("b" * 40, "go"): (TAGS, TAGS.encode())})
    assert store.get([("b" * 40, "go")]) == {("b" * 40, "go"): TAGS}
    assert TagStore(None).get([("b" * 40, "go")]) == {}
    assert list(tmp_path.iterdir()) == []


def index_of(names: dict[str, FileTags]) -> RepoIndex:
    files = [SourceFile(path, f"{n:040d}", "python") for n, path in enumerate(names)]
    by_blob = {file.blob: names[file.path] for file in files}
    return RepoIndex.empty().updated(
        files, lambda missing: {(f.blob, f.kind): by_blob[f.blob] for f in missing}
    )


def test_an_index_is_saved_whole_and_read_back(tmp_path: Path) -> None:
    index = index_of({"a.py": TAGS, "b.py": FileTags((), {"Engine": 3})})
    save_index(tmp_path, "repo", index)
    loaded = load_index(tmp_path, "repo")
    assert (loaded.paths, loaded.blobs, loaded.words) == (index.paths, index.blobs, index.words)
    names = ("word_flags", "ref_file", "ref_word", "ref_count", "ref_own", "def_file", "def_word")
    for name in names:
        assert np.array_equal(getattr(loaded, name), getattr(index, name))
    folder = next(tmp_path.iterdir())
    assert [p.name for p in folder.iterdir()] == ["repo.npz"]  # no temporary file left
    assert load_index(tmp_path, "other").paths == []
    assert load_index(None, "repo").paths == []


def test_a_damaged_index_file_is_an_empty_index(tmp_path: Path) -> None:
    save_index(tmp_path, "repo", index_of({"a.py": TAGS}))
    (file,) = next(tmp_path.iterdir()).iterdir()
    file.write_bytes(b"not a zip file")
    assert load_index(tmp_path, "repo").paths == []


def test_an_index_that_does_not_hold_together_is_not_used(tmp_path: Path) -> None:
    index = index_of({"a.py": TAGS})
    index.ref_file[0] = 7  # a file it does not have
    save_index(tmp_path, "repo", index)
    assert load_index(tmp_path, "repo").paths == []


def test_all_worktrees_of_a_repository_share_its_key(tmp_path: Path) -> None:
    assert repository_key(tmp_path / "repo" / ".git") == repository_key(
        tmp_path / "repo" / "sub" / ".." / ".git"
    )
    assert repository_key(tmp_path / "a") != repository_key(tmp_path / "b")


WRITER = """
import sys
from pathlib import Path
from merlin_flow.workspace.repo_cache import TagStore
from merlin_flow.workspace.repo_tags import FileTags
store = TagStore(Path(sys.argv[1]))
for n in range(200):
    tags = FileTags((), {f"word{n}": n})
    store.put({(f"{n:040d}", sys.argv[2]): (tags, tags.encode())})
"""


def test_two_processes_write_the_same_store_at_once(tmp_path: Path) -> None:
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), kind])
        for kind in ("python", "go")
    ]
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0]
    keys = [(f"{n:040d}", kind) for n in range(200) for kind in ("python", "go")]
    found = TagStore(tmp_path).get(keys)
    assert len(found) == 400
    assert found[(f"{7:040d}", "go")].references == {"word7": 7}
