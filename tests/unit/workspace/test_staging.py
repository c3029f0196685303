"""An attempt's change staged for its commit: nested repositories and secrets kept out."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from merlin_flow.workspace import staging
from merlin_flow.workspace.git import add_worktree, commit_tree, write_excludes_file
from merlin_flow.workspace.staging import QUARANTINE_PREFIX, stage_change
from tests.conftest import git, make_repo

OPENAI = "sk-test-staging-0123456789abcdefXYZ"
AWS = "AKIAIOSFODNN7EXAMPLE"
ENV = {"OPENAI_API_KEY": OPENAI, "PATH": "/usr/bin", "HOME": "/home/me"}


def _worktree(tmp_path: Path, files: dict[str, str] | None = None) -> tuple[Path, Path, str]:
    repo = make_repo(tmp_path / "repo", files or {"app.py": "a = 1\nb = 2\nc = 3\n"})
    start = git(repo, "rev-parse", "HEAD")
    return repo, add_worktree(repo, tmp_path / "jobs" / "wt", start), start


def _stage(worktree: Path, start: str, tmp_path: Path) -> staging.StagedChange:
    return stage_change(worktree, write_excludes_file(tmp_path / "excludes"), [], start, ENV)


def _files(repo: Path, commit: str) -> dict[str, str]:
    """Each path of ``commit`` with its mode."""
    listing = git(repo, "ls-tree", "-r", commit)
    return {line.split("\t")[1]: line.split()[0] for line in listing.splitlines()}


def objects_holding(repo: Path, text: str) -> list[str]:
    """The objects of ``repo``'s store (and every alternate) whose content holds ``text``."""
    out = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    return [line.decode() for line in out.split(b"\n") if text.encode() in line]


def test_a_nested_repository_is_removed_and_its_folder_committed_as_files(
    tmp_path: Path,
) -> None:
    repo, worktree, start = _worktree(tmp_path)
    (worktree / "vendor" / "lib").mkdir(parents=True)
    (worktree / "vendor" / "lib" / "lib.py").write_text("x = 1\n")
    git(worktree / "vendor" / "lib", "init", "-q")
    git(worktree / "vendor" / "lib", "config", "core.fsmonitor", "touch /tmp/never")
    staged = _stage(worktree, start, tmp_path)
    assert staged.nested == ("vendor/lib",)
    assert not (worktree / "vendor" / "lib" / ".git").exists()
    commit = commit_tree(worktree, staged.tree, start, "attempt")
    files = _files(repo, commit)
    assert files["vendor/lib/lib.py"] == "100644"
    assert "160000" not in files.values()  # no gitlink reaches the branch


def test_nested_repositories_inside_one_another_all_go(tmp_path: Path) -> None:
    repo, worktree, start = _worktree(tmp_path)
    outer, inner = worktree / "outer", worktree / "outer" / "inner"
    inner.mkdir(parents=True)
    (inner / "i.txt").write_text("i\n")
    git(inner, "init", "-q")
    git(outer, "init", "-q")
    staged = _stage(worktree, start, tmp_path)
    assert set(staged.nested) == {"outer", "outer/inner"}
    assert _files(repo, commit_tree(worktree, staged.tree, start, "m")) == {
        "app.py": "100644",
        "outer/inner/i.txt": "100644",
    }


def test_a_git_file_or_link_is_removed_without_following_it(tmp_path: Path) -> None:
    """A ``.git`` file or link naming a repository outside: the entry goes, the target stays."""
    repo, worktree, start = _worktree(tmp_path)
    outside = make_repo(tmp_path / "outside", {"o.txt": "o\n"})
    (worktree / "a").mkdir()
    (worktree / "a" / ".git").write_text(f"gitdir: {outside / '.git'}\n")
    (worktree / "a" / "a.txt").write_text("a\n")
    (worktree / "b").mkdir()
    (worktree / "b" / ".git").symlink_to(outside / ".git")
    (worktree / "b" / "b.txt").write_text("b\n")
    staged = _stage(worktree, start, tmp_path)
    assert set(staged.nested) == {"a", "b"}
    assert (outside / ".git" / "HEAD").is_file()
    assert (outside / "o.txt").is_file()
    files = _files(repo, commit_tree(worktree, staged.tree, start, "m"))
    assert files["a/a.txt"] == files["b/b.txt"] == "100644"


def test_at_a_submodules_path_the_submodule_stays_as_the_start_had_it(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"app.py": "a = 1\n"})
    source = make_repo(tmp_path / "source", {"s.txt": "s\n"})
    recorded = git(source, "rev-parse", "HEAD")
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{recorded},sub")
    git(repo, "commit", "-qm", "a submodule")
    start = git(repo, "rev-parse", "HEAD")
    worktree = add_worktree(repo, tmp_path / "jobs" / "wt", start)
    (worktree / "sub").mkdir(exist_ok=True)
    (worktree / "sub" / "planted.txt").write_text("p\n")
    git(worktree / "sub", "init", "-q")
    git(worktree / "sub", "add", "-A")
    git(worktree / "sub", "commit", "-qm", "another commit")  # the gitlink would move
    staged = _stage(worktree, start, tmp_path)
    assert staged.nested == ("sub",)
    commit = commit_tree(worktree, staged.tree, start, "m")
    assert git(repo, "rev-parse", f"{commit}:sub") == recorded
    assert "sub/planted.txt" not in _files(repo, commit)


def test_a_refused_secret_is_in_no_object_store(tmp_path: Path) -> None:
    """The acceptance test: `git cat-file --batch-all-objects` finds no blob holding it."""
    repo, worktree, start = _worktree(tmp_path)
    (worktree / "app.py").write_text(f"a = 1\nKEY = '{OPENAI}'\n")
    (worktree / "new.txt").write_text(f"aws {AWS}\n")
    staged = _stage(worktree, start, tmp_path)
    assert [str(hit) for hit in staged.hits] == [
        "app.py:2: the value of OPENAI_API_KEY",
        "new.txt:1: an AWS Access Key",
    ]
    assert staged.tree == git(repo, "rev-parse", f"{start}^{{tree}}")
    assert objects_holding(repo, OPENAI) == []
    assert objects_holding(repo, AWS) == []
    assert not [p for p in worktree.parent.iterdir() if QUARANTINE_PREFIX in p.name]
    # The control: staged as before, the secret's blob lands in the user's repository.
    (worktree / "app.py").write_text(f"KEY = '{OPENAI}'\n")
    git(worktree, "add", "-A")
    assert objects_holding(repo, OPENAI) != []


def test_a_hit_discards_every_change_and_keeps_ignored_files(tmp_path: Path) -> None:
    _repo, worktree, start = _worktree(tmp_path)
    (worktree / "app.py").write_text("a = 10\n")
    (worktree / "new").mkdir()
    (worktree / "new" / "notes.txt").write_text(f"{OPENAI}\n")
    (worktree / "__pycache__").mkdir()
    (worktree / "__pycache__" / "app.pyc").write_bytes(b"cache")
    staged = _stage(worktree, start, tmp_path)
    assert [str(hit) for hit in staged.hits] == ["new/notes.txt:1: the value of OPENAI_API_KEY"]
    assert (worktree / "app.py").read_text() == "a = 1\nb = 2\nc = 3\n"
    assert not (worktree / "new").exists()
    assert (worktree / "__pycache__" / "app.pyc").exists()  # ignored in commits: left alone


def test_what_a_command_committed_in_the_worktree_is_scanned_from_the_start(
    tmp_path: Path,
) -> None:
    """An unconfined command may commit: the change is everything since the attempt's start."""
    _repo, worktree, start = _worktree(tmp_path)
    (worktree / "keys.py").write_text(f'KEY = "{AWS}"\n')
    git(worktree, "add", "keys.py")
    git(worktree, "commit", "-qm", "a commit the attempt made itself")
    (worktree / "app.py").write_text("a = 10\n")
    staged = _stage(worktree, start, tmp_path)
    assert [str(hit) for hit in staged.hits] == ["keys.py:1: an AWS Access Key"]
    assert git(worktree, "rev-parse", "HEAD") == start  # back at the start: nothing to commit
    assert not (worktree / "keys.py").exists()


def test_without_a_hit_the_commit_holds_exactly_the_change(tmp_path: Path) -> None:
    repo, worktree, start = _worktree(tmp_path)
    (worktree / "app.py").write_text("a = 10\n")
    (worktree / "new.txt").write_text("fine\n")
    staged = _stage(worktree, start, tmp_path)
    assert staged.hits == ()
    assert staged.nested == ()
    commit = commit_tree(worktree, staged.tree, start, "m")
    assert git(repo, "diff", "--name-only", start, commit).splitlines() == ["app.py", "new.txt"]
    assert git(worktree, "diff", "--cached", "--name-only") == ""  # its own index: untouched


def test_what_is_committed_is_what_was_scanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file written after the scan (by a process still alive) is not in the tree."""
    repo, worktree, start = _worktree(tmp_path)
    (worktree / "app.py").write_text("a = 10\n")
    scan = staging.scan_staged

    def scan_then_change(*args: object, **kwargs: object) -> object:
        found = scan(*args, **kwargs)  # type: ignore[arg-type]
        (worktree / "late.txt").write_text(f"{OPENAI}\n")
        (worktree / "app.py").write_text(f"KEY = '{OPENAI}'\n")
        return found

    monkeypatch.setattr(staging, "scan_staged", scan_then_change)
    staged = _stage(worktree, start, tmp_path)
    commit = commit_tree(worktree, staged.tree, start, "m")
    assert git(repo, "show", f"{commit}:app.py") == "a = 10"
    assert "late.txt" not in _files(repo, commit)
    assert objects_holding(repo, OPENAI) == []


def test_objects_are_moved_into_the_store_once_and_packs_index_last(tmp_path: Path) -> None:
    quarantined, objects = tmp_path / "q", tmp_path / "objects"
    (quarantined / "ab").mkdir(parents=True)
    (quarantined / "ab" / "cdef").write_bytes(b"new")
    (quarantined / "12").mkdir()
    (quarantined / "12" / "3456").write_bytes(b"quarantined copy")
    (quarantined / "pack").mkdir()
    for name in ("pack-1.idx", "pack-1.pack"):
        (quarantined / "pack" / name).write_bytes(name.encode())
    (objects / "12").mkdir(parents=True)
    (objects / "12" / "3456").write_bytes(b"already there")
    placed: list[str] = []
    real_place = staging._place
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(staging, "_place", lambda s, t: placed.append(t.name) or real_place(s, t))
    try:
        assert staging.migrate(quarantined, objects) == 3
    finally:
        monkeypatch.undo()
    assert (objects / "ab" / "cdef").read_bytes() == b"new"
    assert (objects / "12" / "3456").read_bytes() == b"already there"
    assert placed[-2:] == ["pack-1.pack", "pack-1.idx"]


def test_the_quarantine_reads_the_repositorys_objects_and_writes_its_own(tmp_path: Path) -> None:
    repo, worktree, _start = _worktree(tmp_path)
    (worktree / "q.txt").write_text("only in the quarantine\n")
    with staging.quarantine(worktree) as env:
        proc = subprocess.run(
            ["git", "add", "-A"], cwd=worktree, env={**os.environ, **env}, check=True
        )
        assert proc.returncode == 0
        folder = Path(env["GIT_OBJECT_DIRECTORY"])
        assert any(folder.rglob("*")), "the new blob went to the quarantine"
        assert git(worktree, "diff", "--cached", "--name-only") == ""  # the real index: as it was
    assert not folder.exists()
    assert objects_holding(repo, "only in the quarantine") == []


def test_the_quarantines_index_keeps_the_time_of_the_worktrees(tmp_path: Path) -> None:
    """Git re-reads an entry written in the same tick as its index (racily clean) by the
    index file's time: a copy with a newer time would let a change of the same size, in
    that tick, pass for no change (seen under load: an attempt's edit not committed)."""
    _repo, worktree, _start = _worktree(tmp_path)
    index = staging._git_paths(worktree)[0]
    os.utime(index, ns=(1_000_000_000, 1_000_000_000))
    with staging.quarantine(worktree) as env:
        assert os.stat(env["GIT_INDEX_FILE"]).st_mtime_ns == 1_000_000_000
