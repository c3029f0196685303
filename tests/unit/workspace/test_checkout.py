"""permission_masks: what a checkout's sandbox hides and keeps read-only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.tool_config import PermissionRules
from merlin_flow.tools.permissions import Permissions
from merlin_flow.workspace.checkout import permission_masks


def perms(root: Path | None = None, **lists: Any) -> Permissions:
    return Permissions(PermissionRules(**lists), root=root)


# -- masks ---------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    files = [
        "secrets/key",
        "secrets/sub/deep",
        "src/app.py",
        "src/.env",
        ".env",
        "uv.lock",
        "pkg/Cargo.lock",
        "vault/v",
        "docs/a.md",
    ]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    (tmp_path / ".git").write_text("gitdir: /elsewhere\n")
    (tmp_path / "door").symlink_to("vault")
    (tmp_path / "out").symlink_to("/etc")
    return tmp_path


def rel(root: Path, paths: tuple[Path, ...]) -> list[str]:
    return [p.relative_to(root).as_posix() for p in paths]


def test_masks_are_the_fewest_existing_paths(tree: Path) -> None:
    rules = perms(
        deny=["Read(./secrets/**)", "Read(.env)", "Edit(*.lock)", "Read(door)", "Read(out)"],
        ask=["Write(./docs/**)", "Read(./missing/**)"],
        allow=["Read(./src/**)"],
    )
    masks = permission_masks(rules.rules, tree)
    assert rel(tree, masks.hidden) == [".env", "secrets", "src/.env", "vault"]  # door -> vault
    assert rel(tree, masks.read_only) == ["docs", "pkg/Cargo.lock", "uv.lock"]
    assert (
        permission_masks(
            perms(deny=["Bash(rm:*)", "read_file(.env)", "Grep(*)"]).rules, tree
        ).hidden
        == ()
    )


def test_a_rule_covering_everything_masks_the_root(tree: Path) -> None:
    masks = permission_masks(perms(deny=["Read"], ask=["Edit(./**)"]).rules, tree)
    assert masks.hidden == (tree.resolve(),)
    assert masks.read_only == (tree.resolve(),)


def test_masks_skip_git(tree: Path) -> None:
    assert rel(tree, permission_masks(perms(deny=["Read(.git)"]).rules, tree).hidden) == []


def test_masks_do_not_follow_symlinks_out_of_the_worktree(tree: Path) -> None:
    masks = permission_masks(perms(deny=["Read(out)"]).rules, tree)
    assert masks.hidden == ()
    assert os.path.isdir(tree / "out")  # the link is still there, pointing at /etc
