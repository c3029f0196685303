"""merlin's own git against a worktree an attempt made hostile: nothing it configures runs.

The attempt makes a git repository inside the worktree (at a plain folder, at a
submodule's path, at a gitlink's path with a ``.gitmodules`` of its own asking git to
look inside) and gives it every setting that runs a program: a clean filter, an
fsmonitor command, a text converter, an external diff, hooks. Each program would write
a marker file outside the worktree, and the worker's secret with it. Every git command
merlin runs on a worktree is then run: none of the programs may start. A control runs
plain ``git status`` on the same worktree and sees the filter run, so the fixture is
hostile enough to catch a hole.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from merlin_flow.agents.condense import changes_so_far
from merlin_flow.workspace.git import (
    add_worktree,
    changed_files,
    diff,
    patch_bytes,
    remove_worktree,
    uncommitted_files,
    write_excludes_file,
)
from merlin_flow.workspace.git_command import git_argv, git_environment, run_git_process
from merlin_flow.workspace.repo_files import list_sources
from merlin_flow.workspace.staging import stage_change
from tests.conftest import git, make_repo

SECRET = "sk-nested-test-0123456789abcdef"
BASES = ("plain", "submodule", "gitlink")


def _hostile(tmp_path: Path, base: str) -> tuple[Path, Path, Path]:
    """A repository, a worktree of it with a hostile nested repository at ``sub``, the marker."""
    repo = make_repo(tmp_path / "repo", {"app.py": "a = 1\n"})
    if base != "plain":
        source = make_repo(tmp_path / "source", {"s.txt": "s\n"})
        if base == "submodule":
            git(
                repo,
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "add",
                "-q",
                str(source),
                "sub",
            )
        else:  # a gitlink the base commit holds, with no .gitmodules entry
            head = git(source, "rev-parse", "HEAD")
            git(repo, "update-index", "--add", "--cacheinfo", f"160000,{head},sub")
        git(repo, "commit", "-qm", "a submodule")
    worktree = add_worktree(repo, tmp_path / "wt", git(repo, "rev-parse", "HEAD"))
    marker = tmp_path / "ran"
    program = f"sh -c 'echo \"$OPENAI_API_KEY\" >> {marker}; cat'"
    nested = worktree / "sub"
    nested.mkdir(exist_ok=True)
    git(nested, "init", "-q")
    for key, value in {
        "core.fsmonitor": program,
        "filter.evil.clean": program,
        "filter.evil.smudge": program,
        "filter.evil.required": "true",
        "diff.evil.textconv": program,
        "diff.external": program,
        "core.hooksPath": str(tmp_path / "hooks"),
    }.items():
        git(nested, "config", key, value)
    (nested / ".gitattributes").write_text("* filter=evil diff=evil\n")
    (nested / "f.txt").write_text("one\n")
    git(nested, "-c", "core.fsmonitor=false", "-c", "filter.evil.clean=cat", "add", "-A")
    git(nested, "-c", "core.fsmonitor=false", "-c", "filter.evil.clean=cat", "commit", "-qm", "x")
    (nested / "f.txt").write_text("two\n")  # dirty: a status inside would run the filter
    if base != "plain":  # the attempt's own .gitmodules asks git to look inside
        (worktree / ".gitmodules").write_text(
            '[submodule "sub"]\n\tpath = sub\n\turl = ./x\n\tignore = none\n'
        )
    (worktree / "app.py").write_text("a = 2\n")
    marker.unlink(missing_ok=True)
    return repo, worktree, marker


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker holds an API key, as a real one does."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


@pytest.mark.parametrize("base", BASES)
def test_the_fixture_is_hostile_plain_git_runs_the_nested_filter(
    tmp_path: Path, base: str, secret_env: None
) -> None:
    """The control: git without merlin's options runs what the nested repository says.

    An untracked nested repository is not looked into by ``git status``, but ``git add``
    stages it as a gitlink, and the next attempt's worktree then has one at that path.
    """
    _repo, worktree, marker = _hostile(tmp_path, base)
    if base == "plain":
        git(worktree, "add", "-A")
        assert git(worktree, "ls-files", "--stage", "sub").startswith("160000 ")
        return
    if base == "gitlink":  # git looks into a gitlink's folder once it is a known submodule
        git(worktree, "config", "submodule.sub.url", "./x")
    subprocess.run(["git", "status"], cwd=worktree, capture_output=True, check=False)
    assert marker.is_file()
    assert SECRET in marker.read_text()


@pytest.mark.parametrize("base", BASES)
def test_no_git_command_of_merlins_runs_a_nested_repositorys_programs(
    tmp_path: Path, base: str, secret_env: None
) -> None:
    repo, worktree, marker = _hostile(tmp_path, base)
    if base == "gitlink":
        git(worktree, "config", "submodule.sub.url", "./x")  # as the control has it
    start = git(worktree, "rev-parse", "HEAD")
    excludes = write_excludes_file(tmp_path / "excludes")
    calls: dict[str, Callable[[], object]] = {
        "uncommitted_files": lambda: uncommitted_files(worktree),
        "the condenser's changes_so_far": lambda: changes_so_far(worktree),
        "the map's list_sources": lambda: list_sources(worktree, None, lambda path: True),
        "list_sources without refresh": lambda: list_sources(
            worktree, None, lambda path: True, refresh=False
        ),
        "git diff HEAD": lambda: run_git_process(["diff", "HEAD"], worktree),
        "git diff-files": lambda: run_git_process(["diff-files"], worktree),
        "git diff-index": lambda: run_git_process(["diff-index", "HEAD"], worktree),
        "stage_change": lambda: stage_change(worktree, excludes, [], start),
    }
    for name, call in calls.items():
        call()
        assert not marker.exists(), f"{name} ran a nested repository's program"
    tree = git(worktree, "write-tree")
    commit = git(worktree, "commit-tree", tree, "-p", start, "-m", "attempt")
    diff(repo, start, commit)
    patch_bytes(repo, start, commit)
    changed_files(repo, start, commit)
    assert not marker.exists()
    remove_worktree(repo, worktree)
    assert not marker.exists()


def test_status_and_diff_ignore_submodules_on_the_command_line() -> None:
    """Options a worktree's .gitmodules cannot override go right after the subcommand."""
    argv = git_argv(["--no-optional-locks", "-c", "x.y=z", "diff", "--stat", "HEAD"])
    at = argv.index("diff")
    assert argv[at + 1 : at + 4] == ["--ignore-submodules=all", "--no-ext-diff", "--no-textconv"]
    status = git_argv(["status", "--porcelain"])
    assert status[status.index("status") + 1] == "--ignore-submodules=all"
    assert git_argv(["add", "-A"])[-2:] == ["add", "-A"]


def test_no_secret_reaches_a_git_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What git and anything it starts see: the allowlist, never a key, token or URL password."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("MERLIN_DATABASE_URL", "postgresql://merlin:hunter2@db/merlin")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/agent.sock")
    make_repo(tmp_path / "repo", {"a": "a\n"})
    monkeypatch.setenv("GIT_DIR", "/elsewhere")
    shown = run_git_process(["-c", "alias.env=!env", "env"], tmp_path / "repo").stdout
    names = {line.split("=", 1)[0] for line in shown.splitlines()}
    assert SECRET not in shown
    assert "hunter2" not in shown
    assert not {"OPENAI_API_KEY", "MERLIN_DATABASE_URL", "SSH_AUTH_SOCK"} & names
    assert "/elsewhere" not in shown  # merlin says where git works, not the worker's GIT_DIR
    assert {"PATH", "HOME"} <= names
    remote = git_environment(remote=True)
    assert remote["SSH_AUTH_SOCK"] == "/tmp/agent.sock"  # a fetch or push may log in
    assert "OPENAI_API_KEY" not in remote
    assert "MERLIN_DATABASE_URL" not in remote


def test_a_remote_command_gets_the_transport_and_still_no_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/agent.sock")
    remote = make_repo(tmp_path / "remote", {"a": "a\n"})
    tracer = tmp_path / "ssh.sh"
    tracer.write_text(f"#!/bin/sh\nenv > {tmp_path / 'seen'}\nexit 1\n")
    tracer.chmod(0o755)
    monkeypatch.setenv("GIT_SSH_COMMAND", str(tracer))
    run_git_process(["fetch", "-q", "ssh://example.invalid/x", "HEAD"], remote)
    seen = (tmp_path / "seen").read_text()
    assert "SSH_AUTH_SOCK=/tmp/agent.sock" in seen
    assert SECRET not in seen
    assert os.environ["OPENAI_API_KEY"] == SECRET  # the worker's own is untouched


def test_filters_the_configuration_defines_never_run_on_a_worktrees_files(
    tmp_path: Path, secret_env: None
) -> None:
    """git-lfs's filter, say: a repository's or an attempt's .gitattributes cannot run it."""
    marker = tmp_path / "ran"
    program = f"sh -c 'echo \"$OPENAI_API_KEY\" >> {marker}; cat'"
    repo = make_repo(tmp_path / "repo", {".gitattributes": "*.bin filter=lfs\n", "a.bin": "a\n"})
    for key in ("clean", "smudge"):
        git(repo, "config", f"filter.lfs.{key}", program)  # as `git lfs install` writes it
    git(repo, "config", "filter.lfs.required", "true")
    marker.unlink(missing_ok=True)
    start = git(repo, "rev-parse", "HEAD")
    worktree = add_worktree(repo, tmp_path / "wt", start)  # checks a.bin out: smudge
    (worktree / ".gitattributes").write_text("* filter=lfs\n")  # the attempt's
    (worktree / "app.py").write_text("x = 1\n")
    uncommitted_files(worktree)
    staged = stage_change(worktree, write_excludes_file(tmp_path / "ex"), [], start)
    assert not marker.exists()
    commit = git(worktree, "commit-tree", staged.tree, "-p", start, "-m", "m")
    assert git(repo, "show", f"{commit}:app.py") == "x = 1"  # as written, not "cleaned"
    remove_worktree(repo, worktree)
    # The control: git as a user runs it does run the filter on the same files.
    subprocess.run(["git", "add", "--renormalize", "."], cwd=repo, capture_output=True, check=False)
    assert marker.is_file()
