"""What the planner is shown of a repository, read from a real git commit, within budget."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from merlin_flow.errors import InputError
from merlin_flow.planning.context import read_context
from tests.conftest import git, make_repo


def big_repo(path: Path, files: int) -> tuple[Path, str]:
    contents = {f"src/pkg/module_{n:04d}.py": f"VALUE = {n}\n" for n in range(files)}
    contents["node_modules/lib/index.js"] = "x\n"
    contents["README.md"] = "# sample\n\n" + "A long readme line.\n" * 400
    contents["src/pkg/core.py"] = "def core():\n    return 1\n" * 1000
    repo = make_repo(path, contents)
    return repo, git(repo, "rev-parse", "HEAD")


def test_the_context_of_2000_files_stays_within_its_budget(tmp_path: Path) -> None:
    repo, head = big_repo(tmp_path / "repo", 2000)
    context = read_context(repo, head, ("src/pkg/core.py",), budget_tokens=6000)
    assert context.tree_total == 2003
    assert 0 < len(context.tree) < 2003
    assert context.tokens <= 6000
    text = context.text()
    assert f"... and {2003 - len(context.tree)} more files" in text
    assert text.startswith("--- @src/pkg/core.py ---\ndef core():")
    assert "[... cut:" in context.files["src/pkg/core.py"]  # 26,000 characters: over its 18,000
    assert context.readme is not None
    assert context.readme[0] == "README.md"
    assert "node_modules/lib/index.js" not in context.tree  # vendored files come last


def test_a_small_repository_is_shown_whole(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"app.py": "x = 1\n", "README": "hello\n"})
    context = read_context(repo, git(repo, "rev-parse", "HEAD"), (), budget_tokens=1000)
    assert context.tree == ("README", "app.py")
    assert context.readme == ("README", "hello\n")
    assert "more files" not in context.text()


def test_an_attached_file_the_commit_lacks_is_an_input_error_naming_it(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"app.py": "x = 1\n"})
    (repo / "new.py").write_text("uncommitted\n")
    with pytest.raises(InputError, match=r"names @new\.py, @gone\.py, which are not in"):
        read_context(repo, git(repo, "rev-parse", "HEAD"), ("new.py", "gone.py"), 1000)


def test_a_file_the_permissions_refuse_is_never_shown_to_the_planner(tmp_path: Path) -> None:
    from merlin_flow.tool_config import PermissionRules
    from merlin_flow.tools.permissions import Permissions

    repo = make_repo(tmp_path / "repo", {"README.md": "# app\n", "secrets/key": "K\n"})
    head = git(repo, "rev-parse", "HEAD")
    readable = Permissions(PermissionRules(deny=["Read(./secrets/**)", "Read(README.md)"]))
    with pytest.raises(InputError, match=r"@secrets/key, which \[permissions\]"):
        read_context(repo, head, ("secrets/key",), 2000, readable=readable.path_readable)
    context = read_context(repo, head, (), 2000, readable=readable.path_readable)
    assert context.readme is None
    assert "# app" not in context.text()


def shop(path: Path) -> tuple[Path, str]:
    repo = make_repo(
        path,
        {
            "shop/cart.py": "from shop.tax import apply_tax\n\nclass Cart:\n    def total(self):\n"
            "        return apply_tax(1)\n",
            "shop/tax.py": "def apply_tax(amount):\n    return amount\n",
            "web/view.ts": "export function renderCart(): string { return 'cart' }\n",
            "README.md": "# shop\n",
        },
    )
    return repo, git(repo, "rev-parse", "HEAD")


def test_the_repository_map_is_ranked_towards_the_request(tmp_path: Path) -> None:
    repo, head = shop(tmp_path / "repo")
    context = read_context(repo, head, (), 1000, request="the tax is applied twice")
    assert context.repo_map.startswith("shop/tax.py:\n│def apply_tax(amount):\n")
    text = context.text()
    assert (
        text.index("--- README.md ---")
        < text.index("--- repository map")
        < text.index("--- files (4) ---")
    )
    assert context.tokens <= 1000
    settings_home = Path(os.environ["MERLIN_HOME"])
    assert any((settings_home / "repo_map").iterdir())  # cached in MERLIN_HOME
    attached = read_context(repo, head, ("web/view.ts",), 1000, map_cache=tmp_path / "cache")
    assert attached.repo_map.startswith("web/view.ts:\n")


def test_the_map_shows_no_file_the_permissions_refuse(tmp_path: Path) -> None:
    repo, head = shop(tmp_path / "repo")
    context = read_context(
        repo, head, (), 1000, readable=lambda path: not path.startswith("shop/"), request="tax"
    )
    assert "shop/" not in context.repo_map
    assert context.repo_map.startswith("web/view.ts:")


def test_a_map_that_cannot_be_made_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from merlin_flow.errors import GitError
    from merlin_flow.planning import context as context_module

    def fail(*args: object, **kwargs: object) -> object:
        raise GitError("git cat-file failed")

    monkeypatch.setattr(context_module, "build_map", fail)
    repo, head = shop(tmp_path / "repo")
    context = read_context(repo, head, (), 1000, request="tax")
    assert context.repo_map == ""
    assert "repository map" not in context.text()
    assert context.tree == ("README.md", "shop/cart.py", "shop/tax.py", "web/view.ts")


def test_the_map_leaves_room_for_the_tree(tmp_path: Path) -> None:
    repo, head = big_repo(tmp_path / "repo", 300)
    context = read_context(repo, head, (), budget_tokens=2000, request="core")
    assert context.repo_map.startswith("src/pkg/core.py:\n│def core():\n")
    assert len(context.repo_map) <= 2000 * 4 // 2
    assert len(context.tree) > 50
    assert context.tokens <= 2000
