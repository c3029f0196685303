"""Toolbox paths: nested .git folders, hostile paths, and a path changed after its check."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.tool_config import PermissionRules
from merlin_flow.tools.permissions import Permissions
from merlin_flow.tools.toolbox import GIT_WRITES, Toolbox
from tests.unit.tools.conftest import World

# --- .git at any depth ---------------------------------------------------------------------


@pytest.fixture
def nested(world: World) -> World:
    """The world with a nested repository ``sub/inner/.git`` and a symlink ``cfg`` into it."""
    git = world.root / "sub" / "inner" / ".git"
    git.mkdir(parents=True)
    (git / "config").write_text("[core]\n\tfsmonitor = touch /tmp/pwned\n")
    (world.root / "cfg").symlink_to("sub/inner/.git")
    (world.root / "cfg_file").symlink_to(git / "config")
    return world


@pytest.mark.parametrize(
    ("tool", "path"),
    [
        ("write_file", "sub/.git/config"),
        ("write_file", "sub/inner/.git/config"),
        ("write_file", "new/.git/config"),
        ("write_file", "sub/.GIT/config"),
        ("write_file", "sub/.git"),
        ("write_file", "cfg/config"),
        ("write_file", "cfg/hooks/pre-commit"),
        ("write_file", "cfg_file"),
        ("edit_file", "sub/inner/.git/config"),
        ("edit_file", "cfg/config"),
        ("edit_file", "cfg_file"),
    ],
)
def test_nothing_is_written_inside_a_git_folder_at_any_depth(
    nested: World, tool: str, path: str
) -> None:
    args: dict[str, Any] = {"path": path, "content": "[core]\n\tbare = true\n"}
    if tool == "edit_file":
        args = {"path": path, "old": "fsmonitor", "new": "editor"}
    before = sorted(str(p.relative_to(nested.root)) for p in nested.root.rglob("*"))

    reply = nested.box.call(tool, args)

    assert reply == f"error: path {path!r} is inside .git: {GIT_WRITES}"
    assert "nested git repositories" in reply
    assert sorted(str(p.relative_to(nested.root)) for p in nested.root.rglob("*")) == before
    config = nested.root / "sub/inner/.git/config"
    assert config.read_text() == "[core]\n\tfsmonitor = touch /tmp/pwned\n"


@pytest.mark.parametrize("path", ["sub/inner/.git/config", "cfg/config", "cfg_file"])
def test_a_nested_git_folder_is_not_read(nested: World, path: str) -> None:
    reply = nested.box.call("read_file", {"path": path})
    assert reply == f"error: path {path!r} is inside .git, which tools may not touch"


def test_walks_skip_git_folders_at_any_depth(nested: World) -> None:
    (nested.root / "sub" / "module").mkdir()
    (nested.root / "sub" / "module" / ".git").write_text("gitdir: ../../.git/modules/m\n")
    listing = nested.box.call("list_files", {}).splitlines()
    assert listing == ["a.txt", "notes.md", "sub/b.py", "sub/deep/c.py"]
    assert nested.box.call("grep", {"pattern": "fsmonitor|gitdir"}) == "(no matches)"
    assert nested.box.call("list_files", {"path": "sub/inner"}) == "(no files)"


def test_a_refused_write_makes_no_folder(world: World) -> None:
    for path in ["new/deeper/.git/config", "new/deeper/../../../outside/x", "new/../link_dir/x"]:
        assert world.box.call("write_file", {"path": path, "content": "x"}).startswith("error:")
    assert not (world.root / "new").exists()


# --- hostile paths --------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["read_file", "write_file", "edit_file", "list_files", "grep"])
def test_a_path_of_a_thousand_folders_is_answered_too_deep(world: World, tool: str) -> None:
    path = "a/" * 1000 + "x.txt"
    args = {"read_file": {}, "write_file": {"content": "x"}, "list_files": {}}.get(tool, {})
    if tool == "edit_file":
        args = {"old": "a", "new": "b"}
    if tool == "grep":
        args = {"pattern": "x"}

    reply = world.box.call(tool, {"path": path, **args})

    assert reply.startswith("error: path 'a/a/a/"), reply
    assert "is too deep: 1001 levels, over the 256 a path may have" in reply
    assert len(reply) < 300
    assert not (world.root / "a").exists()


def test_a_tree_deeper_than_a_walk_goes_is_answered(world: World) -> None:
    bottom = world.root / ("d/" * 300)  # a process in the sandbox could make it
    bottom.mkdir(parents=True)
    (bottom / "leaf.txt").write_text("bottom\n")
    assert world.box.call("list_files", {}).splitlines()[0] == "a.txt"  # deeper is not walked
    assert world.box.call("grep", {"pattern": "bottom"}) == "(no matches)"
    reply = world.box.call("read_file", {"path": "d/" * 300 + "leaf.txt"})
    assert reply.startswith("error: path 'd/d/d/"), reply
    assert "is too deep: 301 levels" in reply


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("x" * 5000, "is too long: 5000 bytes, over PATH_MAX (4096)"),
        ("x" * 300, "is too long: a name of 300 bytes, over 255"),
        ("sub/" + "é" * 200, "is too long: a name of 400 bytes"),
    ],
    ids=["path", "name", "name-in-bytes"],
)
def test_a_path_too_long_is_answered_so(world: World, path: str, expected: str) -> None:
    for tool in ("read_file", "write_file"):
        reply = world.box.call(
            tool, {"path": path, "content": "x"} if tool == "write_file" else {"path": path}
        )
        assert reply.startswith("error: path "), reply
        assert expected in reply


def test_a_symlink_loop_is_answered_so(world: World) -> None:
    (world.root / "loop1").symlink_to("loop2")
    (world.root / "loop2").symlink_to("loop1")
    (world.root / "self").symlink_to("self/x")
    permissions = Permissions(PermissionRules(deny=["Read(./secrets/**)"]), root=world.root)
    gated = Toolbox(world.root, gate=permissions.check_call, readable=permissions.path_readable)
    for box in (world.box, gated):  # the permission check judges a loop as written
        for tool, args in [
            ("read_file", {"path": "loop1/a.txt"}),
            ("read_file", {"path": "loop1"}),
            ("write_file", {"path": "loop2", "content": "x"}),
            ("edit_file", {"path": "self", "old": "a", "new": "b"}),
            ("list_files", {"path": "loop1"}),
            ("grep", {"pattern": "a", "path": "loop1"}),
        ]:
            reply = box.call(tool, args)
            assert reply.startswith(f"error: path {args['path']!r} goes through a symlink loop")
        assert box.call("list_files", {}).splitlines()[0] == "a.txt"  # walks pass them over


def test_a_fifo_is_not_a_file_and_never_blocks(world: World) -> None:
    os.mkfifo(world.root / "pipe")
    started = time.monotonic()
    assert world.box.call("read_file", {"path": "pipe"}) == "error: path 'pipe' is not a file"
    assert world.box.call("write_file", {"path": "pipe", "content": "x"}).startswith("error:")
    assert world.box.call("grep", {"pattern": "x", "path": "pipe"}) == "(no matches)"
    assert "pipe" not in world.box.call("list_files", {})
    assert time.monotonic() - started < 5


def test_symlinks_inside_are_followed_however_they_are_written(world: World) -> None:
    (world.root / "rel").symlink_to("sub/deep")
    (world.root / "abs").symlink_to(world.root / "sub")
    (world.root / "sub" / "up").symlink_to("..")
    (world.root / "round").symlink_to(f"../{world.root.name}/sub/b.py")  # leaves, comes back
    for path, start in [
        ("rel/c.py", "import os"),
        ("abs/deep/c.py", "import os"),
        ("sub/up/a.txt", "hello"),
        ("round", "def f"),
    ]:
        world.box.forget_reads()
        assert world.box.call("read_file", {"path": path}).startswith(start), path
    assert world.box.call("write_file", {"path": "abs/new/n.txt", "content": "n"}) == (
        "wrote 1 characters to sub/new/n.txt"
    )
    assert world.box.call("edit_file", {"path": "rel/c.py", "old": "g()", "new": "h()"}) == (
        "edited sub/deep/c.py"
    )
    assert "round" in world.box.call("list_files", {}).splitlines()  # a link to a file inside


def test_no_descriptor_is_left_open(world: World) -> None:
    calls = [
        ("read_file", {"path": "a.txt"}),
        ("read_file", {"path": "link_dir/secret.txt"}),
        ("write_file", {"path": "x/y/z.txt", "content": "z"}),
        ("edit_file", {"path": "a.txt", "old": "nothere", "new": "b"}),
        ("list_files", {}),
        ("grep", {"pattern": "o"}),
        ("grep", {"pattern": "o", "path": "a.txt"}),
        ("list_files", {"path": "missing"}),
    ]
    before = len(os.listdir("/proc/self/fd"))
    for name, args in calls * 3:
        world.box.call(name, args)
    assert len(os.listdir("/proc/self/fd")) == before


# --- a path changed between its permission check and its open ------------------------------


def swapped_after_the_check(root: Path, folder: str, target: Path | str) -> Any:
    """A gate that lets the call through, then swaps ``folder`` for a symlink to ``target``.

    As a process in the sandbox could between the check and the open (deterministically).
    """
    permissions = Permissions(
        PermissionRules(deny=["Read(./secrets/**)", "Edit(./locked/**)"]), root=root
    )

    def gate(name: str, arguments: dict[str, Any]) -> str | None:
        refusal = permissions.check_call(name, arguments)
        if not (root / folder).is_symlink():
            shutil.rmtree(root / folder)
            (root / folder).symlink_to(target)
        return refusal

    return gate


@pytest.fixture
def guarded(world: World) -> World:
    for name, text in [("secrets", "the key\n"), ("locked", "locked\n"), ("pub", "public\n")]:
        (world.root / name).mkdir()
        (world.root / name / "key").write_text(text)
    return world


def test_a_read_through_a_folder_swapped_after_its_check_is_judged_where_it_leads(
    guarded: World,
) -> None:
    box = Toolbox(guarded.root, gate=swapped_after_the_check(guarded.root, "pub", "secrets"))
    reply = box.call("read_file", {"path": "pub/key"})
    assert reply == "error: refused by [permissions] deny rule Read(./secrets/**): secrets/key"


def test_an_edit_through_a_folder_swapped_after_its_check_is_judged_where_it_leads(
    guarded: World,
) -> None:
    box = Toolbox(guarded.root, gate=swapped_after_the_check(guarded.root, "pub", "locked"))
    reply = box.call("edit_file", {"path": "pub/key", "old": "public", "new": "x"})
    assert reply.startswith("error: refused by [permissions] deny rule Edit(./locked/**)")
    assert (guarded.root / "locked" / "key").read_text() == "locked\n"


def test_a_write_through_a_folder_swapped_after_its_check_stays_inside(guarded: World) -> None:
    box = Toolbox(guarded.root, gate=swapped_after_the_check(guarded.root, "pub", guarded.outside))
    reply = box.call("write_file", {"path": "pub/new.txt", "content": "pwned\n"})
    assert reply == "error: path 'pub/new.txt' is outside the repository"
    assert not (guarded.outside / "new.txt").exists()


def test_walks_judge_a_symlinked_file_where_it_leads(guarded: World) -> None:
    (guarded.root / "alias").symlink_to("secrets/key")
    permissions = Permissions(PermissionRules(deny=["Read(./secrets/**)"]), root=guarded.root)
    box = Toolbox(guarded.root, gate=permissions.check_call, readable=permissions.path_readable)
    assert "alias" not in box.call("list_files", {}).splitlines()
    assert box.call("grep", {"pattern": "the key"}) == "(no matches)"
    assert box.call("read_file", {"path": "alias"}).startswith("error: refused by")
