"""A checkout: a worktree with its environment and sandbox; the permission masks it mounts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.errors import SetupFailed
from merlin_flow.settings import Settings
from merlin_flow.tool_config import Environment, PermissionRules, Sandbox, SandboxMode
from merlin_flow.tools.permissions import Permissions
from merlin_flow.workspace.checkout import Checkout, open_checkout, permission_masks
from merlin_flow.workspace.repository import JobRepository, repository_of
from merlin_flow.workspace.sandbox import unenforceable
from tests.conftest import git, require_bwrap


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


# -- a checkout ------------------------------------------------------------------------------


def _config(setup: list[str], **more: Any) -> MerlinConfig:
    """No model is called: a scripted tier only because a configuration needs one."""
    return MerlinConfig(
        tiers=[Tier(name="t", model="scripted/x.yaml")],
        environment=Environment(setup=setup),
        sandbox=Sandbox(mode=SandboxMode.NONE),
        **more,
    )


def _head(repo: Path, tmp_path: Path) -> tuple[Settings, JobRepository, str]:
    settings = Settings(home=tmp_path / "home")
    return settings, repository_of(str(repo), settings), git(repo, "rev-parse", "HEAD")


def test_a_checkout_of_a_commit_has_its_files_and_goes_at_the_end(
    py_repo: Path, tmp_path: Path
) -> None:
    config = _config([], permissions=PermissionRules(deny=["Read(.env)"], ask=["Edit(app.py)"]))
    (py_repo / ".env").write_text("KEY=1\n")
    git(py_repo, "add", ".env")
    git(py_repo, "commit", "-qm", "env")
    settings, repository, commit = _head(py_repo, tmp_path)
    worktree = tmp_path / "wt"
    with open_checkout(settings, config, repository, commit, worktree) as checkout:
        assert checkout.worktree == worktree
        assert checkout.environment is None  # setup = []: merlin's own interpreter
        assert (worktree / "app.py").read_text() == "def answer():\n    return 41\n"
        assert checkout.confinement.hidden == (worktree.resolve() / ".env",)
        assert checkout.confinement.read_only_paths == (worktree.resolve() / "app.py",)
        result = checkout.run(["/bin/sh", "-c", "pwd; cat app.py"], timeout=30)
        assert result.ok
        assert str(worktree) in result.output_tail
        assert "return 41" in result.output_tail
        assert checkout.run_exit_command("false", config).exit_code == 1
        warning = unenforceable(checkout.confinement, checkout.sandbox) or ""
        assert ".env" in warning  # mode none cannot hide it: said, not hidden
        reader = checkout.read_only()
        assert not reader.confinement.worktree_writable
        assert checkout.confinement.worktree_writable  # the original is unchanged
    assert not worktree.exists()
    assert str(worktree) not in git(py_repo, "worktree", "list")


def test_a_failed_setup_checks_nothing_out(py_repo: Path, tmp_path: Path) -> None:
    config = _config(["echo broken >&2; exit 3"])
    settings, repository, commit = _head(py_repo, tmp_path)
    built: list[object] = []
    with (
        pytest.raises(SetupFailed, match="exited with code 3"),
        open_checkout(settings, config, repository, commit, tmp_path / "wt", built.append),
    ):
        pytest.fail("a checkout opened without its environment")
    assert built == []
    assert not (tmp_path / "wt").exists()


def test_a_built_environment_is_told_once(py_repo: Path, tmp_path: Path) -> None:
    config = _config(['mkdir -p "$MERLIN_ENV/bin"'])
    settings, repository, commit = _head(py_repo, tmp_path)
    built: list[object] = []
    for name in ("one", "two"):
        with open_checkout(settings, config, repository, commit, tmp_path / name, built.append):
            pass
    assert len(built) == 1  # the second checkout reused it


def test_a_plain_folder_is_a_checkout_of_its_own(tmp_path: Path) -> None:
    checkout = Checkout.folder(tmp_path)
    assert (checkout.worktree, checkout.environment) == (tmp_path.resolve(), None)
    assert checkout.sandbox == Sandbox()  # the bubblewrap sandbox by default
    assert checkout.confinement.path  # merlin's interpreter first on PATH


def test_the_files_setup_generated_never_go_through_a_link_of_the_commit(
    py_repo: Path, tmp_path: Path
) -> None:
    """An attempt links ``hooklink`` to the user's ``.git/hooks``; its build makes a hook.

    The build replaces the link by a folder with an (ignored) ``post-commit`` in its
    checkout, so the file is kept; the old worker then copied it through the link of
    every worktree of the commit, into the user's repository, executable.
    """
    require_bwrap()
    hooks = py_repo / ".git" / "hooks"
    (py_repo / "hooklink").symlink_to(hooks)
    (py_repo / ".gitignore").write_text("post-commit\n")
    (py_repo / "build.sh").write_text(
        "rm hooklink && mkdir hooklink && printf '#!/bin/sh\\ntouch /tmp/owned\\n' "
        "> hooklink/post-commit && chmod +x hooklink/post-commit\n"
    )
    git(py_repo, "add", "-A")
    git(py_repo, "commit", "-qm", "a link and a build script")
    config = MerlinConfig(
        tiers=[Tier(name="t", model="scripted/x.yaml")],
        environment=Environment(setup=["sh build.sh"]),
    )
    settings, repository, commit = _head(py_repo, tmp_path)
    with open_checkout(settings, config, repository, commit, tmp_path / "wt") as checkout:
        assert checkout.environment is not None
        kept = checkout.environment.path / ".merlin-workspace" / "hooklink" / "post-commit"
        assert kept.is_file()  # generated, and kept: only never written through the link
        assert (checkout.worktree / "hooklink").is_symlink()
    assert not (hooks / "post-commit").exists()
