"""Citations: found in text, checked against a commit (or a folder), marked where invalid."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from merlin_flow.errors import GitError
from merlin_flow.workspace.citations import (
    MAX_CITATIONS,
    Citation,
    CitationReport,
    check_citations,
    find_citations,
    reader_for_commit,
    reader_for_folder,
)
from tests.conftest import git, make_repo

APP = '''\
import os


def total(items):
    """Sum the items."""
    result = 0
    for item in items:
        result += item
    return result
'''  # 9 lines

FILES = {
    "src/app.py": APP,
    "Makefile": "test:\n\tpytest -q\n",
    "notes.txt": "first\n",
    "empty.txt": "",
}


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository at a commit, then changed without a commit (never seen at the commit)."""
    path = make_repo(tmp_path / "repo", FILES)
    commit = git(path, "rev-parse", "HEAD")
    (path / "notes.txt").write_text("first\nsecond\nthird\n")
    (path / "new.py").write_text("x = 1\n")
    (tmp_path / "secret.txt").write_text("password\n")
    return path, commit


FENCED_OK = 'See src/app.py:4-5:\n```python\ndef total(items):\n    """Sum the items."""\n```\n'
FENCED_WRONG = "See src/app.py:4-5:\n```python\ndef total(things):\n```\n"

PAST = "line 90 is past the end (9 lines)"

TABLE = [  # (text, [(citation, its problem or None)]): valid, invalid, no citation
    pytest.param("`total` is at `src/app.py:4`.", [("src/app.py:4", None)], id="valid line"),
    pytest.param("see src/app.py:4-9, it sums", [("src/app.py:4-9", None)], id="valid range"),
    pytest.param("(src/app.py#L6-L8)", [("src/app.py:6-8", None)], id="github range"),
    pytest.param("src/app.py:6:5: result", [("src/app.py:6", None)], id="column ignored"),
    pytest.param("./src/app.py:1", [("src/app.py:1", None)], id="dot slash"),
    pytest.param("Makefile:2 `pytest -q`", [("Makefile:2", None)], id="no extension"),
    pytest.param("src/app.py:9", [("src/app.py:9", None)], id="last line"),
    pytest.param("src/app.py:90", [("src/app.py:90", PAST)], id="out of range"),
    pytest.param(
        "src/app.py:8-12",
        [("src/app.py:8-12", "range 8-12 runs past the end (9 lines)")],
        id="range runs out",
    ),
    pytest.param(
        "src/app.py:0",
        [("src/app.py:0", "line 0 does not exist (lines count from 1)")],
        id="line zero",
    ),
    pytest.param("src/app.py:8-6", [("src/app.py:8-6", "range 8-6 is reversed")], id="reversed"),
    pytest.param(
        "empty.txt:1", [("empty.txt:1", "line 1 is past the end (0 lines)")], id="empty file"
    ),
    pytest.param("src/missing.py:1", [("src/missing.py:1", "no such file")], id="missing file"),
    pytest.param("src/app.py/x.py:1", [("src/app.py/x.py:1", "no such file")], id="a folder"),
    pytest.param(
        "../secret.txt:1", [("../secret.txt:1", "the path is outside the repository")], id="outside"
    ),
    pytest.param("src/app.py:9 `return result`", [("src/app.py:9", None)], id="right snippet"),
    pytest.param(
        "src/app.py:9 `return total`",
        [("src/app.py:9", "the quoted snippet is not in line 9")],
        id="wrong snippet",
    ),
    pytest.param(
        "`src/app.py:6-8`  `result=0 for item  in items :`",
        [("src/app.py:6-8", None)],
        id="snippet, other whitespace",
    ),
    pytest.param(
        "src/app.py:7-8 `result = 0`",
        [("src/app.py:7-8", "the quoted snippet is not in lines 7-8")],
        id="snippet outside range",
    ),
    pytest.param(
        "src/app.py:4-9 `def total(items): ... return result`",
        [("src/app.py:4-9", None)],
        id="snippet with ellipsis",
    ),
    pytest.param(
        "src/app.py:4-9 `return result ... def total`",
        [("src/app.py:4-9", "the quoted snippet is not in lines 4-9")],
        id="ellipsis out of order",
    ),
    pytest.param(FENCED_OK, [("src/app.py:4-5", None)], id="fenced snippet"),
    pytest.param(
        FENCED_WRONG,
        [("src/app.py:4-5", "the quoted snippet is not in lines 4-5")],
        id="wrong fenced snippet",
    ),
    pytest.param(
        "notes.txt:3",
        [("notes.txt:3", "line 3 is past the end (1 line)")],
        id="later change unseen",
    ),
    pytest.param("new.py:1", [("new.py:1", "no such file")], id="uncommitted file unseen"),
    pytest.param(
        "src/app.py:4 and src/app.py:40",
        [("src/app.py:4", None), ("src/app.py:40", "line 40 is past the end (9 lines)")],
        id="two, one bad",
    ),
    pytest.param("src/app.py:4, again src/app.py:4", [("src/app.py:4", None)], id="repeats once"),
    pytest.param(
        "`src/app.py:4` `src/app.py:90`",
        [("src/app.py:4", None), ("src/app.py:90", PAST)],
        id="a second citation is no snippet",
    ),
    pytest.param("served at http://localhost:80/src/app.py:90", [], id="url"),
    pytest.param("https://github.com/o/r/blob/main/src/app.py#L90", [], id="github url"),
    pytest.param("at 10:30, then 2024-01-01T10:30:00", [], id="time"),
    pytest.param("localhost:8080, db.example.com:5432, 127.0.0.1:8000", [], id="host and port"),
    pytest.param("C:\\src\\app.py:90 and C:/src/app.py:90", [], id="windows drive"),
    pytest.param("merlin_flow.cli:app, pkg.mod:main", [], id="entry point"),
    pytest.param("/usr/lib/python3/os.py:3", [], id="absolute path"),
    pytest.param("python:3.11 and ghcr.io/o/img:1.2", [], id="image tag"),
    pytest.param("src:3 and see:4", [], id="folder or word"),
    pytest.param("Output:\n```\nsrc/app.py:90: AssertionError\n```\n", [], id="inside a fence"),
]


@pytest.mark.parametrize(("text", "expected"), TABLE)
def test_citations_are_checked_at_the_commit(
    repo: tuple[Path, str], text: str, expected: list[tuple[str, str | None]]
) -> None:
    path, commit = repo
    report = check_citations(text, reader_for_commit(path, commit))
    assert [(str(r.citation), r.problem) for r in report.results] == expected
    assert [r.ok for r in report.results] == [problem is None for _c, problem in expected]
    assert report.all_hold is all(problem is None for _c, problem in expected)
    assert len(report.valid) + len(report.invalid) == len(expected)


def test_a_folder_reader_sees_the_files_on_disk(repo: tuple[Path, str]) -> None:
    path, _commit = repo
    report = check_citations("notes.txt:3 `third` and new.py:1", reader_for_folder(path))
    assert report.all_hold
    assert len(report.valid) == 2


def test_a_folder_reader_refuses_paths_that_leave_it(repo: tuple[Path, str]) -> None:
    path, _commit = repo
    read = reader_for_folder(path)
    (path / "out").symlink_to(path.parent / "secret.txt")
    (path / "out_dir").symlink_to(path.parent, target_is_directory=True)
    (path / "in").symlink_to(path / "notes.txt")
    assert read("notes.txt") == "first\nsecond\nthird\n"
    assert read("in") == read("notes.txt")  # a symlink that stays inside is followed
    assert read("../secret.txt") is None
    assert read(str(path.parent / "secret.txt")) is None
    assert read("out") is None
    assert read("out_dir/secret.txt") is None
    assert read("src") is None  # a folder is no file
    assert read("src/../notes.txt") is None


def test_a_commit_reader_refuses_symlinks_folders_and_escapes(tmp_path: Path) -> None:
    path = make_repo(tmp_path / "repo", {"a.py": "x = 1\n", "pkg/b.py": "y = 2\n"})
    os.symlink("../outside.txt", path / "link.txt")
    os.symlink("pkg", path / "pkg_link")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "links")
    read = reader_for_commit(path, git(path, "rev-parse", "HEAD"))
    assert read("a.py") == "x = 1\n"
    assert read("./pkg/b.py") == "y = 2\n"
    assert read("link.txt") is None
    assert read("pkg_link/b.py") is None
    assert read("pkg") is None
    assert read("pkg/") is None
    assert read("../repo/a.py") is None
    assert read(str(path / "a.py")) is None
    with pytest.raises(GitError):
        reader_for_commit(path, "0" * 40)("a.py")


def test_invalid_citations_are_marked_where_they_stand(repo: tuple[Path, str]) -> None:
    path, commit = repo
    text = (
        "It sums at `src/app.py:4`, returns at src/app.py:90 `return result` and reads "
        "gone.py:2. Again: src/app.py:90."
    )
    report = check_citations(text, reader_for_commit(path, commit))
    marked = report.annotate(text)
    assert marked == (
        "It sums at `src/app.py:4`, returns at src/app.py:90 `return result`"
        " [citation invalid: line 90 is past the end (9 lines)] and reads "
        "gone.py:2 [citation invalid: no such file]. Again: src/app.py:90"
        " [citation invalid: line 90 is past the end (9 lines)]."
    )
    assert report.annotate(marked) == marked  # marking twice adds nothing
    assert check_citations(marked, reader_for_commit(path, commit)) == report
    assert report.describe_invalid() == (  # with and without a snippet: two claims
        "src/app.py:90: line 90 is past the end (9 lines); gone.py:2: no such file; "
        "src/app.py:90: line 90 is past the end (9 lines)"
    )
    assert report.as_json() == [
        {"citation": "src/app.py:4", "ok": True, "problem": None, "snippet": None},
        {
            "citation": "src/app.py:90",
            "ok": False,
            "problem": "line 90 is past the end (9 lines)",
            "snippet": "return result",
        },
        {"citation": "gone.py:2", "ok": False, "problem": "no such file", "snippet": None},
        {
            "citation": "src/app.py:90",
            "ok": False,
            "problem": "line 90 is past the end (9 lines)",
            "snippet": None,
        },
    ]
    assert [r.render() for r in report.results][:3] == [
        "src/app.py:4",
        "src/app.py:90 [citation invalid: line 90 is past the end (9 lines)]",
        "gone.py:2 [citation invalid: no such file]",
    ]


def test_a_text_that_cites_nothing_holds_and_is_left_alone() -> None:
    report = check_citations("No citation here: 10:30, http://x:80.", lambda _path: None)
    assert report == CitationReport()
    assert report.all_hold
    assert report.annotate("As is.") == "As is."


def test_each_file_is_read_once_and_citations_past_the_limit_are_counted() -> None:
    reads: list[str] = []

    def read(path: str) -> str:
        reads.append(path)
        return "line\n" * 3

    text = " ".join(f"a.py:{n}" for n in range(1, MAX_CITATIONS + 6))
    report = check_citations(text, read)
    assert reads == ["a.py"]
    assert (len(report.results), report.unchecked) == (MAX_CITATIONS, 5)
    assert [str(r.citation) for r in report.valid] == ["a.py:1", "a.py:2", "a.py:3"]


def test_found_citations_keep_their_snippet() -> None:
    assert find_citations("a.py:2-3 ``x = `y` ``") == [Citation("a.py", 2, 3, "x = `y`")]
    assert find_citations("a.py:2 and `code`") == [Citation("a.py", 2, 2)]  # not right after
