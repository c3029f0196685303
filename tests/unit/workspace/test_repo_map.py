"""The repository map end to end: real git repositories, real tree-sitter, the cache."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merlin_flow.workspace.repo_map import RepoMap, build_map, estimate_tokens, map_around
from tests.conftest import git, make_repo

PROJECT = {
    "shop/cart.py": (
        "from shop.pricing import price_of\n\n\nclass Cart:\n    def total(self):\n"
        "        return sum(price_of(item) for item in self.items)\n\n"
        "    def add(self, item):\n        self.items.append(item)\n"
    ),
    "shop/pricing.py": (
        "from shop.tax import apply_tax\n\n\n"
        "def price_of(item):\n    return apply_tax(item.price)\n"
    ),
    "shop/tax.py": "RATE = 0.2\n\n\ndef apply_tax(amount):\n    return amount * (1 + RATE)\n",
    "shop/report.py": (
        "from shop.cart import Cart\n\n\ndef report(cart: Cart):\n    return cart.total()\n"
    ),
    "shop/tests/test_cart.py": "from shop.cart import Cart\n\n\ndef test_total():\n    Cart()\n",
    "web/app.ts": (
        "import { renderCart } from './view'\n"
        "export class App {\n  start(): void { renderCart() }\n}\n"
    ),
    "web/view.ts": "export function renderCart(): string { return 'cart' }\n",
    "api/server.go": (
        "package api\n\nfunc Serve() error { return handle() }\n\n"
        "func handle() error { return nil }\n"
    ),
    "engine/src/lib.rs": "pub struct Engine;\n\nimpl Engine {\n    pub fn run(&self) {}\n}\n",
    "scripts/build.js": "function build() { return 1 }\nmodule.exports = build\n",
    "notes.txt": "Cart pricing notes\n",
    "Makefile": "all:\n\ttrue\n",
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", PROJECT)


def shop_map(repo: Path, cache: Path | None, **kwargs: object) -> RepoMap:
    return build_map(repo, budget_tokens=kwargs.pop("budget", 2000), cache_dir=cache, **kwargs)  # type: ignore[arg-type]


def test_the_map_shows_paths_and_signature_lines(repo: Path, tmp_path: Path) -> None:
    made = shop_map(repo, tmp_path / "cache")
    assert made.tokens == estimate_tokens(made.text) <= 2000
    assert "shop/cart.py:\n│class Cart:\n│    def total(self):\n" in made.text
    assert "api/server.go:\n│func Serve() error { return handle() }\n" in made.text
    assert "│impl Engine {\n│    pub fn run(&self) {}\n" in made.text
    assert "notes.txt" not in made.text
    assert "Makefile" not in made.text
    assert set(made.files) == {
        p for p in PROJECT if p.endswith((".py", ".ts", ".go", ".rs", ".js"))
    }
    assert made.shown == tuple(re.findall(r"^(\S+?):?$", made.text, re.M))
    assert made.stats.parsed == made.stats.files == 10
    assert made.focused == ()


def test_a_repository_of_min_files_or_fewer_gets_no_map_and_reads_nothing(repo: Path) -> None:
    whole = build_map(repo, budget_tokens=1024)
    assert whole.text
    many = len(whole.files)
    small = build_map(repo, budget_tokens=1024, min_files=many)
    assert (small.text, small.shown, small.tokens, small.stats.parsed) == ("", (), 0, 0)
    assert sorted(small.files) == sorted(whole.files)
    assert build_map(repo, budget_tokens=1024, min_files=many - 1).text == whole.text


def test_a_focused_file_and_what_it_uses_come_first(repo: Path) -> None:
    made = shop_map(repo, None, focus_files=["shop/pricing.py"])
    assert made.files[0] == "shop/pricing.py"
    assert made.files[1] == "shop/tax.py"  # what it uses
    assert made.focused == ("shop/pricing.py",)


def test_the_words_of_a_step_focus_the_map(repo: Path) -> None:
    made = shop_map(repo, None, focus_words=["The tax is applied twice: fix `apply_tax`"])
    assert made.files[0] == "shop/tax.py"
    assert made.text.startswith("shop/tax.py:\n│RATE = 0.2\n│def apply_tax(amount):\n")
    small = shop_map(repo, None, budget=12, focus_words=["fix `apply_tax`"])
    assert small.text == "shop/tax.py:\n│def apply_tax(amount):\n"  # the named one first
    go = shop_map(repo, None, focus_words=["Serve returns the wrong error"])
    assert go.files[0] == "api/server.go"


def test_a_test_file_comes_after_the_code_it_tests(repo: Path) -> None:
    made = shop_map(repo, None, focus_words=["cart"])
    assert made.files.index("shop/cart.py") < made.files.index("shop/tests/test_cart.py")
    given = shop_map(repo, None, focus_files=["shop/tests/test_cart.py"])
    assert given.files[0] == "shop/tests/test_cart.py"


def test_a_second_build_parses_nothing_and_a_change_parses_one_file(
    repo: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = shop_map(repo, cache)
    assert (first.stats.parsed, first.stats.reused) == (10, 0)
    second = shop_map(repo, cache)
    assert (second.stats.parsed, second.stats.reused) == (0, 10)
    assert second.text == first.text
    with (repo / "shop/tax.py").open("a") as out:
        out.write("\n\ndef refund_tax(amount):\n    return -apply_tax(amount)\n")
    third = shop_map(repo, cache, focus_words=["refund_tax"])
    assert (third.stats.parsed, third.stats.reused) == (1, 9)
    assert third.files[0] == "shop/tax.py"
    assert "│def refund_tax(amount):\n" in third.text
    (repo / "shop/report.py").unlink()
    fourth = shop_map(repo, cache)
    assert fourth.stats.parsed == 0
    assert "shop/report.py" not in fourth.files


def test_another_worktree_of_the_repository_reuses_the_cache(repo: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shop_map(repo, cache)
    other = tmp_path / "other"
    git(repo, "worktree", "add", "-q", "--detach", str(other))
    assert shop_map(other, cache).stats.parsed == 0


def test_a_commit_maps_as_its_worktree_does(repo: Path, tmp_path: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    (repo / "shop/tax.py").write_text("def changed():\n    pass\n")  # not committed
    at_commit = shop_map(bare, tmp_path / "cache", commit=head)
    clean = make_repo(tmp_path / "clean", PROJECT)
    assert at_commit.text == shop_map(clean, None).text


def test_binary_huge_and_broken_files_are_skipped_not_fatal(repo: Path) -> None:
    (repo / "shop/blob.py").write_bytes(b"\x00\x01" * 100)
    (repo / "shop/generated.py").write_text("X = 1\n" * 200_000)
    (repo / "shop/broken.py").write_text("def ok():\n    pass\n\nclass (((:\n")
    made = shop_map(repo, None)
    assert made.stats.skipped == 2
    assert "shop/broken.py:\n│def ok():\n" in made.text
    assert "shop/cart.py" in made.text


def test_files_the_permissions_refuse_are_never_shown(repo: Path) -> None:
    made = shop_map(repo, None, include=lambda path: not path.startswith("shop/"))
    assert "shop/" not in made.text
    assert not any(path.startswith("shop/") for path in made.files)


@pytest.mark.parametrize("budget", [0, 1, 3, 10, 25, 60, 200])
def test_a_small_budget_is_never_exceeded(repo: Path, budget: int) -> None:
    made = shop_map(repo, None, budget=budget)
    assert made.tokens == estimate_tokens(made.text) <= budget
    if budget >= 10:
        assert made.text  # the best file fits


def words(text: str) -> int:
    return len(re.findall(r"\w+|[^\w\s]", text))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    budget=st.integers(min_value=0, max_value=400),
    counter=st.sampled_from([estimate_tokens, words, lambda text: math.ceil(len(text) / 2.5)]),
    focus=st.sampled_from([(), ("Cart",), ("apply_tax renderCart",)]),
)
def test_no_budget_and_no_counter_is_ever_exceeded(
    repo: Path, tmp_path: Path, budget: int, counter: object, focus: tuple[str, ...]
) -> None:
    made = build_map(
        repo,
        budget_tokens=budget,
        focus_words=focus,
        cache_dir=tmp_path / "cache",
        count=counter,  # type: ignore[arg-type]
    )
    assert made.tokens == counter(made.text) <= budget  # type: ignore[operator]


def test_more_budget_shows_more(repo: Path) -> None:
    sizes = [len(shop_map(repo, None, budget=budget).text) for budget in (20, 60, 150, 2000)]
    assert sizes == sorted(sizes)
    assert sizes[0] < sizes[-1]


def test_map_around_a_file_or_a_symbol(repo: Path, tmp_path: Path) -> None:
    around_file = map_around(repo, "shop/pricing.py", 400, tmp_path / "cache")
    assert around_file.startswith(
        "Files that connect to shop/pricing.py, best first:\nshop/pricing.py:"
    )
    around_symbol = map_around(repo, "renderCart", 400, tmp_path / "cache")
    assert around_symbol.startswith("Files that connect to renderCart, best first:\nweb/view.ts:")
    nothing = map_around(repo, "no_such_thing", 400, tmp_path / "cache")
    assert nothing.startswith("No file or definition is named no_such_thing;")
    assert map_around(repo, "renderCart", 5) == ""
    hidden = map_around(repo, "renderCart", 400, include=lambda path: path != "web/view.ts")
    assert "web/view.ts" not in hidden
    assert estimate_tokens(map_around(repo, "Cart", 30)) <= 30


def test_reading_the_best_files_first_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from merlin_flow.workspace import repo_map

    many = {f"pkg/mod_{n:02d}.py": f"def f{n}():\n    return g{n + 1}()\n" for n in range(60)}
    repo = make_repo(tmp_path / "many", many)
    for budget in (30, 300, 3000):
        whole = build_map(repo, budget_tokens=budget, focus_words=["f7"]).text
        monkeypatch.setattr(repo_map, "FIRST_FILES", 1)
        assert build_map(repo, budget_tokens=budget, focus_words=["f7"]).text == whole
        monkeypatch.setattr(repo_map, "FIRST_FILES", 1000)


def test_the_same_content_as_code_and_as_a_test_is_tagged_both_ways(tmp_path: Path) -> None:
    same = "def shared_helper():\n    return 1\n"
    repo = make_repo(tmp_path / "dup", {"pkg/dup.py": same, "pkg/tests/dup.py": same})
    made = build_map(repo, budget_tokens=500, cache_dir=tmp_path / "cache")
    assert made.stats.parsed == 2
    assert "pkg/dup.py:\n│def shared_helper():\n" in made.text
    assert "pkg/tests/dup.py\n" in made.text  # its path only: a test's definitions are not read


def test_overloads_alike_are_shown_once(tmp_path: Path) -> None:
    source = (
        "import typing as t\n\n\n@t.overload\ndef prompt(\n    text: str,\n) -> str: ...\n\n\n"
        "@t.overload\ndef prompt(\n    text: str, default: int\n) -> int: ...\n\n\n"
        "def prompt(\n    text, default=None\n):\n    return default\n\n\n"
        "def confirm(text):\n    return prompt(text)\n"
    )
    repo = make_repo(tmp_path / "repo", {"termui.py": source})
    shown = build_map(repo, budget_tokens=500).text.splitlines()
    assert shown == ["termui.py:", "│def prompt(", "│def confirm(text):"]
