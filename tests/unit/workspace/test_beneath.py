"""beneath: paths walked a name at a time from a folder's descriptor, never led out."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from merlin_flow.config import load_config
from merlin_flow.tool_config import PermissionRules
from merlin_flow.workspace import beneath
from merlin_flow.workspace.beneath import (
    LOOP,
    NOT_KIND,
    OUTSIDE,
    TOO_LONG,
    Top,
    open_beneath,
    shown_files,
    unlink_beneath,
)
from tests.conftest import make_repo


@pytest.fixture
def top(tmp_path: Path) -> Path:
    """A folder ``top`` beside ``outside``: files, folders, symlinks in and out."""
    root, outside = tmp_path / "top", tmp_path / "outside"
    (root / "a" / "b").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text("secret\n")
    (root / "a" / "b" / "f.txt").write_text("f\n")
    (root / "a.txt").write_text("a\n")
    (root / "in").symlink_to("a/b")
    (root / "in_abs").symlink_to(root / "a")
    (root / "out").symlink_to(outside)
    (root / "out_file").symlink_to(outside / "secret")
    return root


def read(root: Path, path: str, **kwargs: object) -> tuple[str, str]:
    """What ``path`` holds and where it led, opened beneath ``root``."""
    with Top(root) as top, open_beneath(top, path, os.O_RDONLY, **kwargs) as opened:  # type: ignore[arg-type]
        return os.read(opened.fd, 100).decode(), opened.rel


def refusal(root: Path, path: str, flags: int = os.O_RDONLY, **kwargs: object) -> OSError:
    """The refusal of opening ``path`` beneath ``root`` (one of ``beneath.REFUSALS``)."""
    with Top(root) as top, pytest.raises(OSError, match=r"^\[Errno \d+\] ") as caught:
        open_beneath(top, path, flags, **kwargs)  # type: ignore[arg-type]
    assert caught.value.errno in beneath.REFUSALS, caught.value
    return caught.value


@pytest.mark.parametrize(
    ("path", "rel"),
    [
        ("a/b/f.txt", "a/b/f.txt"),
        ("./a//b/./f.txt", "a/b/f.txt"),
        ("in/f.txt", "a/b/f.txt"),
        ("in_abs/b/f.txt", "a/b/f.txt"),
        ("in/../../a.txt", "a.txt"),  # `..` after a symlink: the parent of where it led
        ("../top/a.txt", "a.txt"),  # above the top, and back in
        ("out/../top/a/b/f.txt", "a/b/f.txt"),
    ],
)
def test_symlinks_and_dots_are_walked_as_the_kernel_would(top: Path, path: str, rel: str) -> None:
    text, led = read(top, path)
    assert led == rel
    assert text == (top / rel).read_text()


def test_an_absolute_path_inside_the_top_is_walked_from_it(top: Path) -> None:
    assert read(top, str(top / "in" / "f.txt")) == ("f\n", "a/b/f.txt")


@pytest.mark.parametrize(
    "path", ["..", "../outside/secret", "out/secret", "out_file", "/etc/passwd", "a/../../x"]
)
def test_a_path_that_leads_out_is_refused(top: Path, path: str) -> None:
    problem = refusal(top, path, kind="file or folder")
    assert problem.errno == OUTSIDE
    assert problem.strerror == "is outside the repository"


def test_loops_depth_and_length_are_refusals_not_recursion(top: Path) -> None:
    (top / "l1").symlink_to("l2")
    (top / "l2").symlink_to("l1")
    assert refusal(top, "l1/x").errno == LOOP
    assert refusal(top, "x/" * 1000).errno == TOO_LONG
    assert "too deep" in str(refusal(top, "x/" * 1000).strerror)
    assert "PATH_MAX" in str(refusal(top, "x" * 4096).strerror)
    assert "a name of 256 bytes" in str(refusal(top, "x" * 256).strerror)
    (top / "up").symlink_to("../" * 5 + "top/" + "x/" * 300)
    assert refusal(top, "up").errno == TOO_LONG  # depth counted through symlinks too


def test_the_kind_asked_for_is_checked(top: Path) -> None:
    os.mkfifo(top / "pipe")
    assert refusal(top, "a").strerror == "is not a file"
    assert refusal(top, "pipe").strerror == "is not a file"
    assert refusal(top, "missing/x").errno == NOT_KIND
    assert refusal(top, "a.txt", beneath.FOLDER, kind="folder").strerror == "is not a folder"
    assert refusal(top, "a.txt/x").strerror == "is not a file"
    assert refusal(top, "a", os.O_RDWR, kind="file or folder").strerror == "is a folder"


def test_folders_are_made_only_after_the_judge_lets_the_path_through(top: Path) -> None:
    seen: list[str] = []

    def judge(rel: str) -> None:
        seen.append(rel)
        if rel.startswith("no"):
            raise PermissionError(errno.EPERM, "judged")

    with Top(top) as opened_top:
        with pytest.raises(PermissionError):
            open_beneath(opened_top, "no/such/x", os.O_RDWR, create=True, judge=judge)
        assert not (top / "no").exists()
        made = open_beneath(opened_top, "in/new/../deeper/x", os.O_RDWR, create=True, judge=judge)
        with made:
            assert made.created
            assert made.rel == "a/b/deeper/x"
    assert seen == ["no/such/x", "a/b/deeper/x"]
    assert (top / "a/b/deeper/x").is_file()
    assert not (top / "a/b/new").exists()  # `new/..` is walked as written, never made


def test_shown_files_are_sorted_and_never_enter_a_symlinked_folder(top: Path) -> None:
    (top / "a-b").mkdir()
    (top / "a-b" / "z").write_text("z\n")
    (top / "a" / ".git").mkdir()
    (top / "a" / ".git" / "config").write_text("x\n")
    (top / "alias").symlink_to("a/b/f.txt")
    (top / "git_alias").symlink_to("a/.git/config")
    os.mkfifo(top / "pipe")
    with (
        Top(top) as opened_top,
        open_beneath(opened_top, ".", beneath.FOLDER, kind="folder") as base,
    ):
        found = [rel for rel, _ in shown_files(opened_top, base, lambda rel: True, read=False)]
    expected = ["a-b/z", "a.txt", "a/b/f.txt", "alias"]  # in Path order: parts compared
    assert found == sorted(expected, key=lambda rel: Path(rel).parts)


def test_shown_files_judge_a_symlink_where_it_leads(top: Path) -> None:
    (top / "alias").symlink_to("a/b/f.txt")
    with (
        Top(top) as opened_top,
        open_beneath(opened_top, ".", beneath.FOLDER, kind="folder") as base,
    ):
        hidden = lambda rel: not rel.startswith("a/")  # noqa: E731
        found = [rel for rel, _ in shown_files(opened_top, base, hidden, read=True)]
    assert found == ["a.txt"]


def test_shown_files_stop_at_the_deepest_folder(top: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(beneath, "MAX_DEPTH", 1)
    with (
        Top(top) as opened_top,
        open_beneath(opened_top, ".", beneath.FOLDER, kind="folder") as base,
    ):
        found = [rel for rel, _ in shown_files(opened_top, base, lambda rel: True, read=False)]
    assert found == ["a.txt"]


def test_unlink_never_follows_a_folder_out(top: Path) -> None:
    with Top(top) as opened_top:
        assert not unlink_beneath(opened_top, "out/secret")
        assert unlink_beneath(opened_top, "out_file")  # the symlink, not where it leads
        assert not unlink_beneath(opened_top, "missing/x")
        assert unlink_beneath(opened_top, "in/f.txt")  # a symlinked folder inside: followed
    assert (top.parent / "outside" / "secret").read_text() == "secret\n"
    assert not os.path.lexists(top / "out_file")
    assert not (top / "a/b/f.txt").exists()


def test_drop_denied_writes_removes_nothing_outside_through_a_swapped_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from merlin_flow.agents import step_tools

    repo = make_repo(tmp_path / "repo", {"app.py": "x = 1\n"})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "deps.lock").write_text("theirs\n")
    (repo / "d").symlink_to(outside)  # a folder git saw, swapped for a symlink since
    monkeypatch.setattr(step_tools, "uncommitted_files", lambda worktree: ["d/deps.lock"])
    config = load_config(repo).model_copy(
        update={"permissions": PermissionRules(deny=["Write(**/*.lock)"])}
    )

    dropped = step_tools.drop_denied_writes(repo, config)

    assert dropped == [("d/deps.lock", "Write(**/*.lock)")]
    assert (outside / "deps.lock").read_text() == "theirs\n"
