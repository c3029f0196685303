"""The repository map: the files that matter to a step, with their main definitions.

``build_map`` answers, within a token budget it never exceeds, "which files of this
repository should I look at, and what is in them", ranked towards the files and names
the step mentions. Aider's repository map is the model; its two known faults are
avoided: it rescans the whole tree for each request (here only the files whose blob id
changed are read), and it accepts a map 15% over its budget (here the text is counted
with the caller's ``count`` and only a text that fits is returned).

One build:

1. list the source files with their git blob ids (``repo_files.py``): a worktree's
   committed files cost nothing to list, its changed files are hashed;
2. bring the repository's ranking index (``repo_rank.RepoIndex``, kept by
   ``repo_cache.py``) up to date: only a file whose blob id is new to it is tagged,
   from the tag cache or by tree-sitter (``repo_tags.py``, in parallel when many);
3. turn the focus into a personalisation (``repo_focus.py``): ``focus_files`` and the
   paths the words name, the files defining or using the identifiers they hold, the
   files named as they are, the files whose text matches them best (BM25);
4. rank (a personalised PageRank) and render: each file's path, then its best-scored
   definitions' signature lines (a method under its class), files in rank order. The
   items (a file, a file's k-th definition, scored rank/(k+2)) enter best first, and
   a binary search finds the most that fit the budget.

``map_around`` is the same map centred on one file or one symbol, for an agent's
``repo_map`` tool.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from merlin_flow.workspace.git import git
from merlin_flow.workspace.repo_cache import TagStore, load_index, repository_key, save_index
from merlin_flow.workspace.repo_files import SourceFile, list_sources, read_blobs
from merlin_flow.workspace.repo_focus import focus
from merlin_flow.workspace.repo_grammars import REFERENCES_ONLY
from merlin_flow.workspace.repo_rank import Ranking
from merlin_flow.workspace.repo_tags import Definition, FileTags, extract_all

Count = Callable[[str], int]
_LINE_MARK = "│"
FIRST_FILES = 32
"""How many of the best files ``fit`` reads the definitions of first."""


def estimate_tokens(text: str) -> int:
    """The project's estimate of a text's tokens: one per 4 characters."""
    return math.ceil(len(text) / 4)


@dataclass(frozen=True)
class MapStats:
    """What one build cost."""

    files: int
    """Source files the map considered."""
    parsed: int
    """Files tagged by tree-sitter in this build (not in the cache)."""
    reused: int
    """Files whose tags came from the cache (the index or the tag store)."""
    skipped: int
    """Of the files parsed, those skipped (binary, huge, minified, unparsable)."""
    seconds: float


@dataclass(frozen=True)
class RepoMap:
    """A rendered map and the ranking behind it."""

    text: str
    """The map: paths and signature lines, at most the budget's tokens."""
    files: tuple[str, ...]
    """Every source file, best first."""
    shown: tuple[str, ...]
    """The files the text shows, in its order."""
    tokens: int
    """``count(text)``."""
    focused: tuple[str, ...]
    """The files the focus named (its paths, the definers of its names...), best first."""
    stats: MapStats


def build_map(
    worktree: Path,
    *,
    budget_tokens: int,
    focus_files: Iterable[str] = (),
    focus_words: Iterable[str] = (),
    cache_dir: Path | None = None,
    count: Count = estimate_tokens,
    commit: str | None = None,
    include: Callable[[str], bool] = lambda _path: True,
    workers: int | None = None,
    refresh: bool = True,
    min_files: int = 0,
) -> RepoMap:
    """The map of ``worktree`` (or, with ``commit``, of that commit of any git directory).

    ``focus_words`` may be whole sentences: their identifiers and paths are found in
    them. ``include`` says which paths may be shown (the ``[permissions]`` read rules).
    ``cache_dir`` keeps tags and the index between builds (``repo_cache.py``).
    ``refresh`` lets git update a worktree's index stats (``repo_files.list_sources``).
    With ``min_files`` source files or fewer, no file is read: the map is empty.
    """
    started = time.perf_counter()
    files, contents = list_sources(worktree, commit, include, refresh)
    if len(files) <= min_files:
        stats = MapStats(len(files), 0, 0, 0, time.perf_counter() - started)
        return RepoMap("", tuple(f.path for f in files), (), 0, (), stats)
    key = _repository_key(worktree)
    store = TagStore(cache_dir)
    parsed: list[FileTags] = []

    def tags_of(missing: list[SourceFile]) -> dict[tuple[str, str], FileTags]:
        found = store.get((file.blob, file.kind) for file in missing)
        todo = {(f.blob, f.kind): f for f in missing if (f.blob, f.kind) not in found}
        unread = [file for (blob, _kind), file in todo.items() if blob not in contents]
        contents.update(read_blobs(worktree, commit, unread))
        made = extract_all([(contents[blob], kind) for blob, kind in todo], workers)
        fresh = dict(zip(todo, made, strict=True))
        store.put(fresh)
        found.update({key: tags for key, (tags, _encoded) in fresh.items()})
        parsed.extend(tags for tags, _encoded in made)
        return found

    old = load_index(cache_dir, key)
    index = old.updated(files, tags_of)
    if index is not old:
        save_index(cache_dir, key, index)
    personal, boosted = focus(index, focus_files, focus_words)
    given = {path.strip().strip("./") for path in focus_files}
    tests = [  # the index lists ``files`` in their order
        n for n, f in enumerate(files) if f.kind.endswith(REFERENCES_ONLY) and f.path not in given
    ]
    ranking = index.rank(personal, boosted, tests)
    text, shown = fit(ranking, files, store, budget_tokens, count, boosted)
    stats = MapStats(
        files=len(files),
        parsed=len(parsed),
        reused=len(files) - len(parsed),
        skipped=sum(1 for tags in parsed if tags.skipped),
        seconds=time.perf_counter() - started,
    )
    order = ranking.order()
    focused = tuple(index.paths[n] for n in order if n in personal)
    return RepoMap(text, tuple(index.paths[n] for n in order), shown, count(text), focused, stats)


@cache
def _repository_key(worktree: Path) -> str:
    return repository_key(worktree / git("rev-parse", "--git-common-dir", cwd=worktree))


def fit(
    ranking: Ranking,
    files: list[SourceFile],
    store: TagStore,
    budget_tokens: int,
    count: Count,
    boosted: set[int] | None = None,
) -> tuple[str, tuple[str, ...]]:
    """The longest rendering of the best items whose ``count`` is within the budget.

    The definitions of the best FIRST_FILES files are read first, twice as many while
    the budget still has room after them: the rest could not change the result.
    """
    order = ranking.order()
    by_path = {file.path: file for file in files}
    focus_names = {ranking.index.words[w] for w in boosted or ()}
    chosen: list[SourceFile] = []
    definitions: list[tuple[Definition, ...]] = []
    items: list[tuple[float, int, int]] = []  # (-score, position, definition)
    size = max(FIRST_FILES, budget_tokens // 64)
    while True:
        more = order[len(chosen) : size]
        added = [by_path[ranking.index.paths[n]] for n in more]
        tags = store.get(((file.blob, file.kind) for file in added), references=False)
        scores = ranking.definition_scores(more)
        for n, file in zip(more, added, strict=True):
            found = tags.get((file.blob, file.kind), FileTags()).definitions
            rank, named, position = float(ranking.scores[n]), scores.get(n, {}), len(chosen)
            chosen.append(file)
            definitions.append(found)
            items.append((-rank, position, -1))
            best = sorted(
                range(len(found)),
                key=lambda d: (
                    found[d].name not in focus_names,
                    -named.get(found[d].name, 0.0),
                    found[d].line,
                ),
            )
            items.extend((-rank / (k + 2), position, d) for k, d in enumerate(best))
        items.sort()
        taken = _longest(items, chosen, definitions, budget_tokens, count)
        next_rank = float(ranking.scores[order[size]]) if size < len(order) else -1.0
        if (taken < len(items) and next_rank <= -items[taken][0]) or next_rank < 0:
            break
        size *= 2
    text, shown = _render(items[:taken], chosen, definitions)
    if count(text) > budget_tokens:  # a count that is not monotonic: show nothing
        return "", ()
    return text, shown


def _longest(
    items: list[tuple[float, int, int]],
    chosen: list[SourceFile],
    definitions: list[tuple[Definition, ...]],
    budget_tokens: int,
    count: Count,
) -> int:
    """How many of the first ``items`` fit the budget.

    A galloping search (16, 32, 64... items until one does not fit) then a binary one:
    the renderings tried stay near the size of the answer.
    """

    def fits(size: int) -> bool:
        return count(_render(items[:size], chosen, definitions)[0]) <= budget_tokens

    low, high = 0, min(len(items), max(budget_tokens, 0))  # ``low`` items always fit
    step = 16
    while low + step < high and fits(low + step):
        low, step = low + step, step * 2
    high = min(high, low + step)
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _render(
    items: list[tuple[float, int, int]],
    chosen: list[SourceFile],
    definitions: list[tuple[Definition, ...]],
) -> tuple[str, tuple[str, ...]]:
    """The map of ``items``: files in rank order, each with its lines in file order."""
    picked: dict[int, set[int]] = {}
    for _score, position, definition in items:
        picked.setdefault(position, set())
        if definition >= 0:
            picked[position].add(definition)
    blocks, shown = [], []
    for position in sorted(picked):
        found = definitions[position]
        lines: set[int] = set()
        for d in picked[position]:
            while d >= 0 and d not in lines:  # a method shows its class too
                lines.add(d)
                d = found[d].parent
        texts = [found[d].text for d in sorted(lines)]  # overloads alike are shown once
        body = "".join(f"{_LINE_MARK}{t}\n" for n, t in enumerate(texts) if t not in texts[:n][-1:])
        path = chosen[position].path
        blocks.append(f"{path}:\n{body}" if body else f"{path}\n")
        shown.append(path)
    return "".join(blocks), tuple(shown)


def map_around(
    worktree: Path,
    target: str,
    budget_tokens: int,
    cache_dir: Path | None = None,
    count: Count = estimate_tokens,
    commit: str | None = None,
    include: Callable[[str], bool] = lambda _path: True,
) -> str:
    """The map centred on ``target`` (a file's path or a symbol), within the budget.

    Its first line says what it is centred on, or that nothing is named so (the map is
    then the repository's most central files); "" when the budget holds not even that.
    ``include`` says which paths may be shown, as for ``build_map``.
    """
    target = target.strip()
    headers = (
        f"Files that connect to {target}, best first:\n",
        f"No file or definition is named {target}; the most central files:\n",
    )
    budget = budget_tokens - max(count(header) for header in headers)
    if budget <= 0:
        return ""
    found = build_map(
        worktree,
        budget_tokens=budget,
        focus_files=[target],
        focus_words=[target],
        cache_dir=cache_dir,
        count=count,
        commit=commit,
        include=include,
    )
    return headers[0 if found.focused else 1] + found.text if found.text else ""
