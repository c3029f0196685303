"""Which files of a repository matter: a personalised PageRank over names.

``RepoIndex`` holds, in numpy arrays, every file's references (file, word, count) and
definitions (file, word). It is updated file by file: a file whose blob id is the same
is kept as it is, a changed or new file's tags are appended, a gone file's rows are
masked out. So a repository's index costs, after its first build, only its changed
files; ``repo_cache.py`` keeps it on disk between builds.

The ranking is aider's idea on a bipartite graph: a file hands its rank to the names
it references that some other file defines, each in proportion to ``weight(name) *
sqrt(count)``; a name hands what it received to the files defining it, in equal
shares. Weights: a long ``snake_case``/``camelCase`` name x10 (specific), a name of the
request x10, a ``_private`` name x0.1, a name defined in more than 5 files x0.1. The
random surfer jumps (from files that reference nothing, and otherwise 15% of the time
without a focus, 70% with one: FOCUSED_DAMPING keeps the focus's files and their
neighbours on top) to the personalisation: the files and names the step names
(``repo_focus.py``), or every file alike when it names none. Test files keep DEMOTED
of their rank at the end. A power iteration with ``numpy.bincount`` over the references (400,000 on
sympy) converges in a few milliseconds per round, where a pure Python loop took 0.2 s
a round (measured here): hence numpy, and no graph library.

A definition's score is the rank that flowed into it: the renderer shows each file's
best-scored definitions first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from merlin_flow.workspace.repo_files import SourceFile
    from merlin_flow.workspace.repo_tags import FileTags

DAMPING = 0.85
"""The chance the surfer follows a reference rather than jump, with no focus..."""
FOCUSED_DAMPING = 0.3
"""...and with one: lower, so that the focus's own files stay near the top."""
ROUNDS = 40
TOLERANCE = 1e-7
DEMOTED = 0.3
"""The share of its rank a test file keeps: a map is read to find code, tests come after."""
_SPECIFIC = re.compile(r"^(?=.{8,})(?:.*_.*|.*[a-z][A-Z].*)$")


SPECIFIC, PRIVATE = 1, 2
"""Bits of ``RepoIndex.word_flags``: a long snake/camel-case name, a ``_private`` one."""


def word_flags(words: list[str]) -> list[int]:
    """The flags (SPECIFIC, PRIVATE) of each word."""
    return [
        (SPECIFIC if _SPECIFIC.match(word) else 0) | (PRIVATE if word[:1] == "_" else 0)
        for word in words
    ]


@dataclass
class RepoIndex:
    """The references and definitions of each file of one listing of a repository."""

    paths: list[str]
    blobs: list[str]
    words: list[str]
    word_flags: NDArray[np.int8]
    ref_file: NDArray[np.int32]
    ref_word: NDArray[np.int32]
    ref_count: NDArray[np.int32]
    ref_own: NDArray[np.bool_]
    """Per reference: the file defines that name too (no edge: a file does not rank itself)."""
    def_file: NDArray[np.int32]
    def_word: NDArray[np.int32]
    _word_ids: dict[str, int] | None = field(default=None, repr=False)

    @classmethod
    def empty(cls) -> RepoIndex:
        """An index of no file."""
        import numpy as np

        none = np.zeros(0, dtype=np.int32)
        flags, own = np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.bool_)
        return cls([], [], [], flags, none, none, none, own, none, none)

    @property
    def word_ids(self) -> dict[str, int]:
        """Word -> its index in ``words``."""
        if self._word_ids is None:
            self._word_ids = dict(zip(self.words, range(len(self.words)), strict=True))
        return self._word_ids

    def updated(
        self,
        files: list[SourceFile],
        tags_of: Callable[[list[SourceFile]], dict[tuple[str, str], FileTags]],
    ) -> RepoIndex:
        """The index of ``files``; ``self`` when nothing changed.

        This index's rows for the files it has at the same blob id, and ``tags_of(missing)``
        ((blob id, kind) -> tags) for the others.
        """
        import numpy as np

        if [f.path for f in files] == self.paths and [f.blob for f in files] == self.blobs:
            return self
        known = {key: n for n, key in enumerate(zip(self.paths, self.blobs, strict=True))}
        kept = [known.get((file.path, file.blob), -1) for file in files]
        missing = [n for n, old in enumerate(kept) if old < 0]
        if not missing and len(files) == len(self.paths):
            return self
        tags = tags_of([files[n] for n in missing]) if missing else {}
        remap = np.full(len(self.paths) + 1, -1, dtype=np.int32)
        for new, old in enumerate(kept):
            if old >= 0:
                remap[old] = new
        ids = dict(self.word_ids)
        ref_words: list[str] = []
        ref_counts: list[int] = []
        ref_files: list[int] = []
        ref_own: list[bool] = []
        def_words: list[str] = []
        def_files: list[int] = []
        for new in missing:
            file_tags = tags[files[new].blob, files[new].kind]
            ref_words.extend(file_tags.references)
            ref_counts.extend(file_tags.references.values())
            ref_files.extend([new] * len(file_tags.references))
            names = {definition.name for definition in file_tags.definitions}
            ref_own.extend(word in names for word in file_tags.references)
            def_words.extend(names)
            def_files.extend([new] * len(names))
        added = sorted(set(ref_words).union(def_words).difference(ids))
        ids.update(zip(added, range(len(ids), len(ids) + len(added)), strict=False))

        def merged(old: NDArray[np.int32], more: list[int]) -> NDArray[np.int32]:
            return np.concatenate([old, np.asarray(more, dtype=np.int32)])

        keep_refs = remap[self.ref_file] >= 0
        keep_defs = remap[self.def_file] >= 0
        index = RepoIndex(
            [file.path for file in files],
            [file.blob for file in files],
            [*self.words, *added],
            np.concatenate([self.word_flags, np.asarray(word_flags(added), dtype=np.int8)]),
            merged(remap[self.ref_file[keep_refs]], ref_files),
            merged(self.ref_word[keep_refs], list(map(ids.__getitem__, ref_words))),
            merged(self.ref_count[keep_refs], ref_counts),
            np.concatenate([self.ref_own[keep_refs], np.asarray(ref_own, dtype=np.bool_)]),
            merged(remap[self.def_file[keep_defs]], def_files),
            merged(self.def_word[keep_defs], list(map(ids.__getitem__, def_words))),
            ids,
        )
        used = np.count_nonzero(np.bincount(index.ref_word, minlength=len(ids)))
        return index.compacted() if len(ids) > 2 * used + 10_000 else index

    def compacted(self) -> RepoIndex:
        """The same index without the words no file holds any more."""
        import numpy as np

        used, inverse = np.unique(
            np.concatenate([self.ref_word, self.def_word]), return_inverse=True
        )
        words: NDArray[np.int32] = inverse.astype(np.int32)
        refs = len(self.ref_word)
        return RepoIndex(
            self.paths,
            self.blobs,
            [self.words[n] for n in used.tolist()],
            self.word_flags[used],
            self.ref_file,
            words[:refs],
            self.ref_count,
            self.ref_own,
            self.def_file,
            words[refs:],
        )

    def rank(
        self,
        personal: dict[int, float],
        boosted: Iterable[int] = (),
        demoted: Iterable[int] = (),
    ) -> Ranking:
        """Each file's rank, and each definition's.

        The surfer jumps to ``personal`` (file -> weight; empty: every file alike); the
        words ``boosted`` (word ids) count ten times; the files ``demoted`` (tests) keep
        DEMOTED of their rank.
        """
        import numpy as np

        files, vocabulary = len(self.paths), len(self.words)
        definers = np.bincount(self.def_word, minlength=vocabulary).astype(np.float64)
        edges = (definers[self.ref_word] > 0) & ~self.ref_own
        ref_file, ref_word = self.ref_file[edges], self.ref_word[edges]
        weight = self._word_weights(definers, boosted)[ref_word] * np.sqrt(self.ref_count[edges])
        out = np.bincount(ref_file, weights=weight, minlength=files)
        share = weight / np.maximum(out[ref_file], 1e-300)
        jump = np.zeros(files)
        for file, value in personal.items():
            jump[file] += value
        jump = jump / jump.sum() if jump.sum() > 0 else np.full(files, 1 / max(files, 1))
        dangling = out == 0
        damping = FOCUSED_DAMPING if personal else DAMPING
        scores = jump.copy()
        mass = np.zeros(vocabulary)
        for _round in range(ROUNDS):
            flow = np.bincount(ref_word, weights=scores[ref_file] * share, minlength=vocabulary)
            mass = np.asarray(flow, dtype=np.float64)
            inflow = mass[self.def_word] / definers[self.def_word]
            gathered = np.bincount(self.def_file, weights=inflow, minlength=files)
            new = damping * (gathered + scores[dangling].sum() * jump) + (1 - damping) * jump
            done = float(np.abs(new - scores).sum()) < TOLERANCE
            scores = new
            if done:
                break
        inflow = mass[self.def_word] / definers[self.def_word]
        scores[np.asarray(list(demoted), dtype=np.int64)] *= DEMOTED
        return Ranking(self, scores, inflow)

    def _word_weights(
        self, definers: NDArray[np.float64], boosted: Iterable[int]
    ) -> NDArray[np.float64]:
        import numpy as np

        weights = np.ones(len(self.words))
        weights[(self.word_flags & SPECIFIC) > 0] *= 10
        weights[(self.word_flags & PRIVATE) > 0] *= 0.1
        weights[definers > 5] *= 0.1
        for word_id in boosted:
            weights[word_id] *= 10
        return weights


@dataclass(frozen=True)
class Ranking:
    """The rank of each file of an index, and of each of its definitions."""

    index: RepoIndex
    scores: NDArray[np.float64]
    """File -> rank (they sum to 1)."""
    inflow: NDArray[np.float64]
    """Per definition row of the index: the rank that flowed into it."""

    def order(self) -> list[int]:
        """The files, best first (ties by path)."""
        import numpy as np

        by_path = sorted(range(len(self.index.paths)), key=self.index.paths.__getitem__)
        ranked = np.asarray(by_path, dtype=np.int64)
        return ranked[np.argsort(-self.scores[ranked], kind="stable")].tolist()  # type: ignore[no-any-return]

    def definition_scores(self, files: Iterable[int]) -> dict[int, dict[str, float]]:
        """For each of ``files``, its defined names and their scores."""
        import numpy as np

        wanted = np.asarray(sorted(set(files)), dtype=np.int32)
        rows = np.flatnonzero(np.isin(self.index.def_file, wanted))
        result: dict[int, dict[str, float]] = {int(n): {} for n in wanted.tolist()}
        words = self.index.words
        for row in rows.tolist():
            file, word = int(self.index.def_file[row]), int(self.index.def_word[row])
            result[file][words[word]] = float(self.inflow[row])
        return result
