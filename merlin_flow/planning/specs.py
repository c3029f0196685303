"""The project's specs: Markdown files under ``[specs] paths``, scored against a request.

A spec is any ``*.md`` file under the configured paths (``specs/`` by default), read from
the commit a job starts at. Its **constraints** are the sections whose heading (any level)
is one of ``CONSTRAINT_HEADINGS``: Purpose, Invariants, Public API, Error Cases. Those,
not the whole file, are what a prompt is given.

Scoring is behind the ``Scorer`` protocol, so that BM25 or embeddings can replace it.
The default, ``TokenOverlap``, tokenises both texts the same way: lower case, split on
anything that is not a letter or a digit, words of fewer than 3 characters and the
``STOP_WORDS`` dropped, no stemming. A spec scores the sum, over the distinct request
words it contains, of ``1 / (number of specs containing the word)``: a word every spec
has counts little, a word only one spec has counts fully. Specs that share no word with
the request score 0 and are never chosen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

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


def words(text: str) -> set[str]:
    """The distinct words a text is scored by (see the module docstring)."""
    return {w for w in WORD.findall(text.lower()) if len(w) >= 3 and w not in STOP_WORDS}


class Scorer(Protocol):
    """Scores specs against a query: one number per spec, higher is more relevant."""

    def score(self, query: str, specs: list[Spec]) -> list[float]:
        """The score of each spec, in order."""
        ...


class TokenOverlap:
    """The default scorer: shared words, each weighted by how few specs have it."""

    def score(self, query: str, specs: list[Spec]) -> list[float]:
        """See the module docstring."""
        spec_words = [words(spec.text) for spec in specs]
        scores = []
        for mine in spec_words:
            shared = words(query) & mine
            scores.append(sum(1 / sum(w in other for other in spec_words) for w in shared))
        return scores


def load_specs(git_dir: Path, commit: str, paths: list[str]) -> list[Spec]:
    """Every ``*.md`` file under ``paths`` at ``commit``, in path order."""
    listing = run_git(["ls-tree", "-r", "--name-only", commit, "--", *paths], git_dir)
    specs = []
    for path in sorted(p for p in listing.stdout.splitlines() if p.endswith(".md")):
        text = run_git(["show", f"{commit}:{path}"], git_dir).stdout
        head = HEADING.search(text)
        specs.append(Spec(path, head.group(2).strip() if head else Path(path).stem, text))
    return specs


def ranked(query: str, specs: list[Spec], scorer: Scorer | None = None) -> list[tuple[Spec, float]]:
    """The specs by score, best first (ties by path); those scoring 0 last."""
    scores = (scorer or TokenOverlap()).score(query, specs)
    return sorted(zip(specs, scores, strict=True), key=lambda pair: (-pair[1], pair[0].path))


def relevant(query: str, specs: list[Spec], top: int, scorer: Scorer | None = None) -> list[Spec]:
    """The ``top`` best specs for ``query`` that share at least one word with it."""
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
    git_dir: Path, commit: str, paths: list[str], top: int, query: str, limit_chars: int
) -> tuple[str, list[str]]:
    """The constraints of the ``top`` specs at ``commit`` most relevant to ``query``.

    As a prompt shows them (``constraints_text``, at most ``limit_chars``), with the paths
    of the specs that gave some; ``("", [])`` when none did.
    """
    specs = load_specs(git_dir, commit, paths)
    chosen = [spec for spec in relevant(query, specs, top) if spec.constraints()]
    return constraints_text(chosen, limit_chars), [spec.path for spec in chosen]
