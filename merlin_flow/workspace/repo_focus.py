"""What a step names, as a personalisation of the repository map's ranking.

A step's description is prose with some code in it. ``focus`` turns it (and the files
given explicitly) into weights on files, where the ranking's random surfer jumps to:

- a file given or a path the text names (``src/app.py``, or its ending ``app.py``): 1;
- an identifier the text holds that files define (``LatexPrinter``, ``as_expr``): 1,
  2 if it looks like code (``snake_case``, ``camelCase``, a capital), split among the
  files defining it, and a fifth of that when more than 5 do; the same word in another
  case (``latex`` for ``Latex``): half that. These names also weigh ten times more as
  edges of the ranking (``boosted``);
- a code-like identifier (``beforeError``, ``path_url``) that files use: 0.5 split
  among them (a name the text gives is often used where the fix goes, not defined);
- a word that is, after a light stemming (``merging`` ~ ``merge``, ``printer`` ~
  ``printing``), the name of files (``merge.ts``): 1 split among them; the name of a
  folder: 0.3 split among its files.

Each weight is divided among the files it names, so a word that names many files
says little about each: no stop-word list is needed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache

from merlin_flow.workspace.repo_rank import _SPECIFIC, RepoIndex

_WORD = re.compile(r"(`?)([A-Za-z_][A-Za-z0-9_]*)(`|\(\))?")
_PATH = re.compile(r"[\w.\-/]*\w\.\w+|[\w.\-]+/[\w.\-/]+")
_CODE_LIKE = re.compile(r"^_*[a-z0-9]+(?:_[a-z0-9]+)+$|^[a-z]+[A-Z]\w*$")
LEXICAL = 1.0
"""The weight of the files whose text best matches the words (BM25), shared among them."""
LEXICAL_FILES = 20
_SUFFIXES = ("ings", "ing", "ers", "er", "ed", "es", "s", "e")


@cache
def stem(word: str) -> str:
    """A word's light stem: lower case, no ``_`` or ``-``, one common ending removed."""
    word = word.lower().replace("_", "").replace("-", "")
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def focus(
    index: RepoIndex, focus_files: Iterable[str], focus_words: Iterable[str]
) -> tuple[dict[int, float], set[int]]:
    """The personalisation (file -> weight) and the boosted word ids of a focus."""
    personal: dict[int, float] = {}
    boosted: set[int] = set()

    def add(files: list[int], weight: float) -> None:
        for file in files:
            personal[file] = personal.get(file, 0.0) + weight / len(files)

    texts = list(focus_words)
    named = [*focus_files, *(p for text in texts for p in _PATH.findall(text))]
    paths = dict(zip(index.paths, range(len(index.paths)), strict=True)) if named else {}
    for name in dict.fromkeys(name.strip().strip("./") for name in named):
        exact = paths.get(name)
        ending = [n for n, path in enumerate(index.paths) if ("/" + path).endswith("/" + name)]
        if exact is not None or ending:
            add([exact] if exact is not None else ending, 1.0)
    words: dict[str, bool] = {}  # word -> written as code (in backticks, or called)
    for text in texts:
        for quoted, word, mark in _WORD.findall(text):
            if len(word) > 2:
                words[word] = words.get(word, False) or bool(mark) or quoted == "`"
    if not words:
        return personal, boosted
    import numpy as np

    defined = np.zeros(len(index.words), dtype=bool)
    defined[index.def_word] = True
    ids = _ids(index, {case for word in words for case in (word, *_cases(word))})
    places = _places(index.paths, {stem(word) for word in words})
    lexical = _lexical(index, list(words), ids)
    best = sorted(lexical, key=lambda n: -lexical[n])[:LEXICAL_FILES]
    total = sum(lexical[n] for n in best)
    for n in best:
        personal[n] = personal.get(n, 0.0) + LEXICAL * lexical[n] / total
    for word, as_code in words.items():
        word_id = ids.get(word, -1)
        code_like = as_code or bool(_CODE_LIKE.match(word))
        if word_id >= 0 and defined[word_id]:
            boosted.add(word_id)
            definers = _definers(index, word_id)
            specific = 2.0 if code_like or _SPECIFIC.match(word) or word[:1].isupper() else 1.0
            add(definers, specific * (0.2 if len(definers) > 5 else 1.0))
        elif len(word) > 3:  # the same word in another case: LaTeX, latex, Latex, LATEX
            variants = {ids.get(v, -1) for v in _cases(word)} - {-1, word_id}
            found = sorted({f for w in variants if defined[w] for f in _definers(index, w)})
            if found:
                add(found, 0.5 * (0.2 if len(found) > 5 else 1.0))
        if code_like and word_id >= 0:
            add(_users(index, word_id), 0.5)
        stems, folders = places.get(stem(word), ([], []))
        if stems:
            add(stems, 1.0)
        if folders:
            add(folders, 0.3)
    return personal, boosted


def _lexical(index: RepoIndex, words: list[str], ids: dict[str, int]) -> dict[int, float]:
    """BM25 of each file against ``words``.

    A file's text is its identifiers, comments included; each word counts in the case
    given, in lower case and capitalised.
    """
    import numpy as np

    files = len(index.paths)
    if not files:
        return {}
    length = np.bincount(index.ref_file, weights=index.ref_count, minlength=files)
    average = max(float(length.mean()), 1.0)
    scores = np.zeros(files)
    wanted = {ids[v] for w in words for v in (w, w.lower(), w.capitalize()) if v in ids}
    for word_id in wanted:
        rows = np.flatnonzero(index.ref_word == word_id)
        found = index.ref_file[rows]
        count = index.ref_count[rows].astype(np.float64)
        rarity = np.log(1 + (files - len(found) + 0.5) / (len(found) + 0.5))
        saturation = count * 2.2 / (count + 1.2 * (0.25 + 0.75 * length[found] / average))
        np.add.at(scores, found, rarity * saturation)
    return {int(n): float(scores[n]) for n in np.flatnonzero(scores > 0).tolist()}


def _cases(word: str) -> tuple[str, ...]:
    return (word.lower(), word.capitalize(), word.upper(), word[:1].lower() + word[1:])


def _definers(index: RepoIndex, word_id: int) -> list[int]:
    """The files defining a word."""
    return sorted(set(index.def_file[index.def_word == word_id].tolist()))


def _users(index: RepoIndex, word_id: int) -> list[int]:
    """The files referencing a word."""
    return sorted(set(index.ref_file[index.ref_word == word_id].tolist()))


def _ids(index: RepoIndex, words: set[str]) -> dict[str, int]:
    """The ids of those ``words`` the index has.

    One pass over its words, not a dictionary of them all: a large repository has
    hundreds of thousands.
    """
    if index._word_ids is not None:
        return {word: index._word_ids[word] for word in words if word in index._word_ids}
    return {word: n for n, word in enumerate(index.words) if word in words}


def _places(paths: list[str], stems: set[str]) -> dict[str, tuple[list[int], list[int]]]:
    """Each of ``stems`` -> (files with a name of that stem, files in a folder of it).

    A stem is the beginning of the word it stems, so only the paths holding it (a
    substring search) are split and stemmed.
    """
    squashed = [path.lower().replace("_", "").replace("-", "") for path in paths]
    result: dict[str, tuple[list[int], list[int]]] = {}
    for wanted in stems:
        if len(wanted) < 3:
            continue
        for n in [n for n, path in enumerate(squashed) if wanted in path]:
            *folders, name = paths[n].split("/")
            base = name.split(".")[0]
            if wanted in (stem(base), stem(base.removeprefix("test_").removesuffix("_test"))):
                result.setdefault(wanted, ([], []))[0].append(n)
            if wanted in {stem(folder) for folder in folders}:
                result.setdefault(wanted, ([], []))[1].append(n)
    return result
