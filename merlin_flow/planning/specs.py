"""The project's specs: Markdown files under ``[specs] paths``, scored against a request.

A spec is any ``*.md`` file under the configured paths (``specs/`` by default), read from
the commit a job starts at. Its **constraints** are the sections whose heading (any level)
is one of ``CONSTRAINT_HEADINGS``: Purpose, Invariants, Public API, Error Cases. Those,
not the whole file, are what a prompt is given.

Scoring is behind the ``Scorer`` protocol: one number per spec for a query, higher is more
relevant, 0 for a spec that has nothing to do with it. ``SCORERS`` names the scorers
``[specs] scorer`` chooses from (``ranked`` and the functions over it take the name or a
scorer). Both scorers tokenise every text the same way (``tokens``): lower case, split on
anything that is not a letter or a digit, words of fewer than 3 characters and the
``STOP_WORDS`` dropped, no stemming.

- ``overlap`` (``TokenOverlap``, the default) reads words, not counts. A spec scores the
  sum, over the distinct request words it contains, of ``1 / (number of specs containing
  the word)``: a word every spec has counts little, a word only one spec has counts fully.
- ``tfidf`` (``TfIdf``) counts words too: the cosine of the request's and the spec's TF-IDF
  vectors, so a spec about a word throughout beats one that mentions it once among many
  others, and a long spec gains nothing from its length alone (formulas in ``TfIdf``).

Either way a spec that shares no word with the request scores 0 and is never chosen, and
ties are broken by path. An embeddings scorer (where a tier offers embeddings) would be one
more class with ``score``: embed the query and each spec, return the cosines.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from merlin_flow.errors import GitError
from merlin_flow.workspace.commit_trees import root_entries
from merlin_flow.workspace.git import run_git

CONSTRAINT_HEADINGS = ("purpose", "invariants", "public api", "error cases")
STOP_WORDS = frozenset(
    {
        "the", "and", "for", "with", "that", "this", "from", "into", "are", "was", "were", "will",
        "shall", "should", "must", "can", "could", "not", "but", "all", "any", "each", "has",
        "have", "had", "its", "our", "your", "their", "them", "they", "then", "than", "when",
        "what", "which", "who", "how", "why", "where", "there", "here", "also", "only", "such",
        "been", "being", "does", "did", "done", "use", "used", "using", "make", "makes", "made",
        "add", "adds", "added", "new", "old", "one", "two", "more", "most", "some",
    }
)  # fmt: skip
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Spec:
    """One spec file."""

    path: str
    title: str
    text: str

    def constraints(self) -> dict[str, str]:
        """The constraint sections by heading (as written), each up to the next heading."""
        heads = list(HEADING.finditer(self.text))
        found = {}
        for index, head in enumerate(heads):
            if head.group(2).strip().lower() not in CONSTRAINT_HEADINGS:
                continue
            end = heads[index + 1].start() if index + 1 < len(heads) else len(self.text)
            found[head.group(2).strip()] = self.text[head.end() : end].strip()
        return found


def tokens(text: str) -> list[str]:
    """The words a text is scored by, in order and repeated (see the module docstring)."""
    return [w for w in WORD.findall(text.lower()) if len(w) >= 3 and w not in STOP_WORDS]


def words(text: str) -> set[str]:
    """The distinct words a text is scored by (see the module docstring)."""
    return set(tokens(text))


class Scorer(Protocol):
    """Scores specs against a query: one number per spec, higher is more relevant.

    0 means unrelated: a spec scoring 0 is never chosen. A scorer is a pure function of its
    arguments (the specs it is given are the whole collection, for what depends on it, such
    as how rare a word is), so the same query and specs always rank the same way.
    """

    def score(self, query: str, specs: list[Spec]) -> list[float]:
        """The score of each spec, in order."""
        ...


class TokenOverlap:
    """The default scorer (``overlap``): shared words, each weighted by how few specs have it.

    ``score(q, d) = sum(1 / df(w) for w in words(q) & words(d))``, where ``df(w)`` is the
    number of specs containing ``w``. How often a word occurs, and how long a spec is, do
    not count. The sum is ``math.fsum``: exact, so two specs with the same words tie exactly
    whatever order a set gives them in.
    """

    def score(self, query: str, specs: list[Spec]) -> list[float]:
        """See the class docstring."""
        spec_words = [words(spec.text) for spec in specs]
        scores = []
        for mine in spec_words:
            shared = words(query) & mine
            scores.append(math.fsum(1 / sum(w in other for other in spec_words) for w in shared))
        return scores


class TfIdf:
    """The ``tfidf`` scorer: cosine similarity of TF-IDF vectors, the specs as the corpus.

    With ``N`` specs, ``df(w)`` the number of specs containing ``w`` and ``n(w, t)`` the
    times ``w`` occurs in a text ``t``, the weight of ``w`` in ``t`` is::

        tf(w, t)  = 1 + ln(n(w, t))                  (sublinear; 0 when n is 0)
        idf(w)    = ln((1 + N) / (1 + df(w))) + 1    (smoothed)
        v(t)[w]   = tf(w, t) * idf(w)

    and ``score(q, d) = v(q) . v(d) / (|v(q)| |v(d)|)``, in [0, 1], 0 when either vector is
    empty. Sublinear tf lets a repeated word count more without letting it drown the
    others; smoothing keeps ``idf`` positive, so a word every spec has still counts a
    little, and a request word no spec has only lengthens ``v(q)`` (the same for every
    spec). Dividing by ``|v(d)|`` means a long spec is not favoured for having more words.
    Sums are ``math.fsum``: exact, so the order of the words never changes a score.
    """

    def score(self, query: str, specs: list[Spec]) -> list[float]:
        """See the class docstring."""
        counts = [Counter(tokens(spec.text)) for spec in specs]
        df = Counter(w for spec_counts in counts for w in spec_counts)

        def idf(word: str) -> float:
            return math.log((1 + len(specs)) / (1 + df[word])) + 1

        def vector(text_counts: Counter[str]) -> dict[str, float]:
            return {w: (1 + math.log(n)) * idf(w) for w, n in text_counts.items()}

        def norm(v: dict[str, float]) -> float:
            return math.sqrt(math.fsum(x * x for x in v.values()))

        q = vector(Counter(tokens(query)))
        q_norm = norm(q)
        scores = []
        for spec_counts in counts:
            d = vector(spec_counts)
            dot = math.fsum(q[w] * d[w] for w in q.keys() & d.keys())
            scores.append(dot / (q_norm * norm(d)) if dot > 0 else 0.0)
        return scores


SCORERS: dict[str, Callable[[], Scorer]] = {"overlap": TokenOverlap, "tfidf": TfIdf}
"""The scorers by the name ``[specs] scorer`` gives."""


def scorer_named(name: str) -> Scorer:
    """The scorer ``[specs] scorer`` names (``SCORERS``)."""
    if name not in SCORERS:
        raise ValueError(f"no spec scorer {name!r}; the scorers: {', '.join(SCORERS)}")
    return SCORERS[name]()


def load_specs(git_dir: Path, commit: str, paths: list[str]) -> list[Spec]:
    """Every ``*.md`` file under ``paths`` at ``commit``, in path order."""
    if not _may_hold_any(git_dir, commit, paths):
        return []  # most repositories have no `specs/`: no git process to say so
    listing = run_git(["ls-tree", "-r", "--name-only", commit, "--", *paths], git_dir)
    specs = []
    for path in sorted(p for p in listing.stdout.splitlines() if p.endswith(".md")):
        text = run_git(["show", f"{commit}:{path}"], git_dir).stdout
        head = HEADING.search(text)
        specs.append(Spec(path, head.group(2).strip() if head else Path(path).stem, text))
    return specs


def _may_hold_any(git_dir: Path, commit: str, paths: list[str]) -> bool:
    """False when none of ``paths`` can be in ``commit``.

    That is when each is a plain path whose first folder is not at the commit's root
    (read once per commit, ``workspace.commit_trees``); a pattern may match anywhere.
    """
    try:
        root = root_entries(git_dir, commit)
    except GitError:
        return True  # let `git ls-tree` say what it says
    for path in paths:
        first = path.strip("/").split("/", 1)[0]
        if any(c in path for c in "*?[:\\") or first in ("", ".", "..") or first in root:
            return True
    return False


def ranked(
    query: str, specs: list[Spec], scorer: Scorer | str = "overlap"
) -> list[tuple[Spec, float]]:
    """The specs by ``scorer`` (one, or its name in ``SCORERS``), best first (ties by path).

    Those scoring 0 come last.
    """
    chosen = scorer_named(scorer) if isinstance(scorer, str) else scorer
    scores = chosen.score(query, specs)
    return sorted(zip(specs, scores, strict=True), key=lambda pair: (-pair[1], pair[0].path))


def relevant(
    query: str, specs: list[Spec], top: int, scorer: Scorer | str = "overlap"
) -> list[Spec]:
    """The ``top`` best specs for ``query`` by ``scorer`` (see ``ranked``) scoring above 0."""
    return [spec for spec, score in ranked(query, specs, scorer)[:top] if score > 0]


def constraints_text(specs: list[Spec], limit_chars: int = 6000) -> str:
    """The specs' constraint sections as a prompt shows them, at most ``limit_chars``.

    A spec without constraint sections adds nothing: a prompt gets constraints, never a
    whole file.
    """
    parts = []
    for spec in specs:
        sections = spec.constraints()
        if sections:
            body = "\n".join(f"{head}:\n{text}" for head, text in sections.items())
            parts.append(f"--- {spec.path} ({spec.title}) ---\n{body}")
    text = "\n\n".join(parts)
    return text if len(text) <= limit_chars else text[:limit_chars] + "\n[... cut]"


def relevant_constraints(
    git_dir: Path,
    commit: str,
    paths: list[str],
    top: int,
    query: str,
    limit_chars: int,
    scorer: Scorer | str = "overlap",
) -> tuple[str, list[str]]:
    """The constraints of the ``top`` specs at ``commit`` most relevant to ``query``.

    Scored by ``scorer`` (``[specs] scorer``: see ``ranked``). As a prompt shows them
    (``constraints_text``, at most ``limit_chars``), with the paths of the specs that gave
    some; ``("", [])`` when none did.
    """
    specs = load_specs(git_dir, commit, paths)
    chosen = [spec for spec in relevant(query, specs, top, scorer) if spec.constraints()]
    return constraints_text(chosen, limit_chars), [spec.path for spec in chosen]
