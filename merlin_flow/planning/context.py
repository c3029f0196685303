"""What the planner is shown of a repository, within a token budget.

Read from the commit the job would start at (``git ls-tree``/``git show``: no checkout,
the same for a path and for a git URL's cache). In order of precedence, within
``[planning] context_tokens`` (4 characters a token):

1. the files the request names with ``@path``, whole when they fit, else each cut to an
   equal share (with a note saying so); a path the commit does not have is an input
   error naming it;
2. the README at the root (``README.md``, ``README.rst``, ``README.txt``, ``README``), at
   most a quarter of what is left;
3. the repository map (``workspace.repo_map``), at most half of what is left: the source
   files that matter to the request, ranked towards its words and ``@path`` files, each
   with its main definitions' signature lines; cached under ``$MERLIN_HOME/repo_map``,
   so a repository costs its changed files only after its first map. A map that cannot
   be made (a git or parser failure) is left out, never fatal;
4. the file tree: paths in ``git ls-tree`` order, as many as fit, then
   ``... and N more files``. Paths under vendored or generated folders
   (``node_modules/``, ``vendor/``, ``dist/``, ``build/``...) are left out first.

The relevant specs' constraint sections, when there are any, are taken first
(``specs.constraints_text`` bounds them) and shown last.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from merlin_flow.errors import InputError, MerlinError
from merlin_flow.models.tokens import CHARS_PER_TOKEN, count_tokens
from merlin_flow.settings import get_settings
from merlin_flow.workspace.git import run_git
from merlin_flow.workspace.repo_map import build_map

README_NAMES = ("README.md", "README.rst", "README.txt", "README")
MAP_SHARE = 2
"""The repository map takes at most 1/MAP_SHARE of what the files and README leave."""
MAP_HEADING = "--- repository map (the files that matter to the request, best first) ---"
SKIPPED_FOLDERS = ("node_modules/", "vendor/", "dist/", "build/", "third_party/", ".venv/")
"""Folders whose files the tree lists last (they are rarely where a plan's work is)."""


@dataclass(frozen=True)
class RepositoryContext:
    """The parts of a repository the planner's prompt holds."""

    files: dict[str, str] = field(default_factory=dict)
    """Attached ``@path`` files: path to (possibly cut) text."""
    readme: tuple[str, str] | None = None
    """The README's name and (possibly cut) text."""
    repo_map: str = ""
    """The repository map: ranked files and their definitions' signature lines."""
    tree: tuple[str, ...] = ()
    """The paths shown."""
    tree_total: int = 0
    """How many files the commit has."""
    constraints: str = ""
    """The relevant specs' constraint sections (``specs.constraints_text``)."""

    def text(self) -> str:
        """The context as the prompt shows it."""
        parts = [f"--- @{path} ---\n{body}" for path, body in self.files.items()]
        if self.readme is not None:
            parts.append(f"--- {self.readme[0]} ---\n{self.readme[1]}")
        if self.repo_map:
            parts.append(f"{MAP_HEADING}\n{self.repo_map}")
        hidden = self.tree_total - len(self.tree)
        more = [f"... and {hidden} more files"] if hidden else []
        parts.append(f"--- files ({self.tree_total}) ---\n" + "\n".join([*self.tree, *more]))
        if self.constraints:
            parts.append(f"Constraints from the project's specs:\n{self.constraints}")
        return "\n\n".join(parts)

    @property
    def tokens(self) -> int:
        """The context's size in tokens."""
        return count_tokens(self.text())


def read_context(
    git_dir: Path,
    commit: str,
    attached: tuple[str, ...],
    budget_tokens: int,
    constraints: str = "",
    readable: Callable[[str], bool] = lambda _path: True,
    request: str = "",
    map_cache: Path | None = None,
) -> RepositoryContext:
    """The context of ``commit`` within ``budget_tokens`` (see the module docstring).

    ``constraints`` (the relevant specs') come first and count against the budget.
    ``readable`` says which files may be shown (`[permissions]`): an attached file it
    refuses is an InputError; the README is left out, and so is the map's every file it
    refuses. The map is ranked towards ``request``'s words and paths and the attached
    files; ``map_cache`` is its cache folder (default ``$MERLIN_HOME/repo_map``).
    """
    budget = budget_tokens * CHARS_PER_TOKEN - len(constraints)
    paths = _tree(git_dir, commit)
    known = set(paths)
    missing = [path for path in attached if path not in known]
    if missing:
        raise InputError(
            f"the request names {', '.join('@' + p for p in missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not in the repository at {commit[:10]}"
        )
    refused = [path for path in attached if not readable(path)]
    if refused:
        raise InputError(
            f"the request names {', '.join('@' + p for p in refused)}, which [permissions] "
            "rules do not let merlin read"
        )
    files: dict[str, str] = {}
    if attached:
        share = budget * 3 // 4 // len(attached)  # a quarter stays for the README and tree
        for path in attached:
            files[path] = _cut(_show(git_dir, commit, path), share)
        budget -= sum(len(body) + len(path) + 10 for path, body in files.items())
    readme = None
    name = next((n for n in README_NAMES if n in known and readable(n)), None)
    if name is not None and budget > 0:
        readme = (name, _cut(_show(git_dir, commit, name), budget // 4))
        budget -= len(readme[1]) + 20
    repo_map = _repo_map(
        git_dir,
        commit,
        (budget // MAP_SHARE - len(MAP_HEADING) - 4) // CHARS_PER_TOKEN,
        attached,
        request,
        readable,
        map_cache,
    )
    budget -= len(repo_map) + len(MAP_HEADING) + 4 if repo_map else 0
    shown: list[str] = []
    for path in sorted(paths, key=lambda p: p.startswith(SKIPPED_FOLDERS) or "/." in "/" + p):
        if budget - (len(path) + 1) < 40:  # room for the "... and N more files" line
            break
        shown.append(path)
        budget -= len(path) + 1
    return RepositoryContext(files, readme, repo_map, tuple(shown), len(paths), constraints)


def _repo_map(
    git_dir: Path,
    commit: str,
    budget_tokens: int,
    attached: tuple[str, ...],
    request: str,
    readable: Callable[[str], bool],
    cache: Path | None,
) -> str:
    """The map of ``commit`` within ``budget_tokens``, or "" when none can be made."""
    if budget_tokens <= 0:
        return ""
    try:
        return build_map(
            git_dir,
            budget_tokens=budget_tokens,
            focus_files=attached,
            focus_words=[request],
            cache_dir=cache or get_settings().home_dir / "repo_map",
            count=count_tokens,
            commit=commit,
            include=readable,
        ).text
    except (MerlinError, OSError, ValueError, RuntimeError, sqlite3.Error):
        return ""


def _tree(git_dir: Path, commit: str) -> list[str]:
    listing = run_git(["ls-tree", "-r", "--name-only", "-z", commit], git_dir)
    if listing.returncode != 0:
        raise InputError(f"cannot list the files of {commit[:10]}: {listing.stderr.strip()}")
    return [path for path in listing.stdout.split("\0") if path]


def _show(git_dir: Path, commit: str, path: str) -> str:
    shown = run_git(["show", f"{commit}:{path}"], git_dir)
    if shown.returncode != 0:
        raise InputError(f"cannot read {path} at {commit[:10]}: {shown.stderr.strip()}")
    return shown.stdout


def _cut(text: str, chars: int) -> str:
    """``text``, or its first ``chars`` characters with a note that the rest was cut."""
    if len(text) <= chars:
        return text
    kept = text[: max(0, chars - 60)]
    return f"{kept}\n[... cut: {len(text) - len(kept)} more characters]"
