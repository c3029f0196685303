"""The tools as the model is told of them: every tool described, with an example call."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from merlin_flow.tools.toolbox import TOOL_SCHEMAS, Toolbox
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


def test_schemas_cover_every_tool(world: World) -> None:
    names = [schema["function"]["name"] for schema in TOOL_SCHEMAS]
    assert names == world.box.names
    required = {
        s["function"]["name"]: s["function"]["parameters"]["required"] for s in TOOL_SCHEMAS
    }
    assert required["edit_file"] == ["path", "old", "new"]
    assert required["list_files"] == []
    assert required["grep"] == ["pattern"]
    assert required["run_command"] == ["command"]


# --- the schemas --------------------------------------------------------------------------


def test_every_description_teaches_with_an_example() -> None:
    for schema in TOOL_SCHEMAS:
        function = schema["function"]
        description = function["description"]
        example = json.loads(description.split("Example: ", 1)[1])
        assert set(example) <= set(function["parameters"]["properties"]), function["name"]
        assert set(function["parameters"]["required"]) <= set(example), function["name"]
    size = len(json.dumps(TOOL_SCHEMAS))
    assert size < 4500  # sent with every request: keep them short
