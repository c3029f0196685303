"""Fixtures of the tools tests: a worktree with a way out of it, and a toolbox on it."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from merlin_flow.tools.toolbox import Toolbox
from tests.conftest import make_repo

SECRET = "TOP SECRET\n"


@dataclass
class World:
    """A worktree (a git repository) next to an outside folder holding a secret."""

    root: Path
    outside: Path
    secret: Path
    box: Toolbox


@pytest.fixture(scope="module")
def template_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One committed git repository, copied for each test (cheaper than git per test)."""
    return make_repo(
        tmp_path_factory.mktemp("template") / "repo",
        {
            "a.txt": "hello\nworld\n",
            "sub/b.py": "def f():\n    return 1\n",
            "sub/deep/c.py": "import os\n\n\ndef g():\n    return os.sep\n",
            "notes.md": "# notes\n",
        },
    )


@pytest.fixture
def world(tmp_path: Path, template_repo: Path) -> World:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text(SECRET)
    root = tmp_path / "repo"
    shutil.copytree(template_repo, root, symlinks=True)
    (root / "link_file").symlink_to(secret)
    (root / "link_dir").symlink_to(outside, target_is_directory=True)
    (root / "dangling").symlink_to(outside / "created-through-dangling.txt")
    (root / "git_link").symlink_to(root / ".git", target_is_directory=True)
    return World(root=root, outside=outside, secret=secret, box=Toolbox(root, command_timeout=10))
