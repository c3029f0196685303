"""Autodelegation: which agent's description best matches a step, by words alone.

Lexical and deterministic, with no model call. A text becomes **terms**: lower case,
split on anything that is not a letter or a digit, ``STOP_WORDS`` and one-letter words
and numbers dropped, then lightly stemmed (``stem``: tests, testing, tested -> test;
refactoring, refactorer -> refactor; docs, documentation -> doc; writes, writer, writing
-> writ, itself a stop word: every step writes). An agent's terms are those of its name
and description.

A term's **weight** says how well it tells the agents apart: ``ln(N / df) / ln(N)``, where
``N`` is the number of agents and ``df`` the number whose terms hold it. A term only one
agent has weighs 1, one every agent has weighs 0 (with a single agent, every term
weighs 1). An agent's **evidence** is the sum of the weights of the step's terms it
holds, and its **score** is ``1 - exp(-evidence)``, in [0, 1): one distinctive shared
term scores 0.63, two 0.86, three 0.95; a term half the agents share scores 0.39, one
three agents of four share 0.19. So the default ``[agents] min_score`` of 0.2 accepts
one distinctive word, 0.7 asks for two, 0.9 for three. The best score wins, ties by
name; the caller compares it with ``min_score``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from merlin_flow.agents.definitions import AgentDefinition

STOP_WORDS = frozenset(
    {
        "a", "an", "the", "and", "or", "but", "nor", "for", "to", "of", "in", "on", "at", "by",
        "with", "from", "into", "onto", "over", "under", "about", "as", "is", "are", "was",
        "were", "be", "been", "being", "it", "its", "this", "that", "these", "those", "there",
        "here", "then", "than", "so", "if", "else", "when", "where", "which", "who", "what",
        "how", "why", "all", "any", "each", "every", "some", "no", "not", "only", "also", "very",
        "do", "does", "did", "done", "can", "could", "should", "would", "will", "shall", "may",
        "might", "must", "has", "have", "had", "we", "you", "your", "our", "they", "them",
        "their", "i", "me", "my", "he", "she", "his", "her", "up", "out", "use", "uses", "used",
        "using", "make", "makes", "made", "new", "old", "get", "gets", "one", "two", "more",
        "most", "other", "such", "via", "per", "etc", "e", "g", "ie", "eg", "please", "need",
        "needs", "step", "steps", "task", "tasks", "agent", "agents", "code", "codebase",
        "file", "files", "change", "changes", "changed", "project", "repository", "repo",
        "work", "works", "thing", "things", "way", "ways", "like", "well", "without",
        "add", "create", "implement", "update", "improve", "extend", "ensure", "keep",
        "support", "allow", "write", "run", "give", "let", "want", "try", "include",
    }
)  # fmt: skip
"""Words that say nothing about which agent fits: English function words, and words any
step of a coding job may hold (code, file, change; add, write, run). Their stems are
dropped too: coding, files, writer, running."""
CANONICAL = {
    "docs": "doc",
    "document": "doc",
    "documentation": "doc",
    "written": "write",
    "wrote": "write",
}
"""Words stemming alone would not join to their family, mapped before (and after) it."""
_WORD = re.compile(r"[a-z0-9]+")
_KEEP_DOUBLE = frozenset("aeioulsfz")


@dataclass(frozen=True)
class Delegation:
    """The agent a step is given, its score in [0, 1], and the terms they share."""

    agent: AgentDefinition
    score: float
    terms: tuple[str, ...]


def stem(word: str) -> str:
    """A light stem of one lower-case word (see the module docstring).

    Not an English word, but the same for a word's plural, -ing, -ed, -er and -ion forms.
    """
    word = CANONICAL.get(word, word)
    if word.endswith(("ies", "ied")) and len(word) > 4:
        word = word[:-3] + "y"
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us")):
        # analysis and basis keep their s, apis does not
        word = word if word.endswith("is") and len(word) > 4 else word[:-1]
    for suffix in ("ing", "ion", "er", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            if word[-1] == word[-2] and word[-1] not in _KEEP_DOUBLE:
                word = word[:-1]  # running -> run, but installing -> install
            break
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return CANONICAL.get(word, word)


_STOP_STEMS = frozenset(stem(word) for word in STOP_WORDS)


def terms(text: str) -> set[str]:
    """The distinct stemmed terms of ``text`` that count for delegation."""
    found = set()
    for word in _WORD.findall(text.lower()):
        if len(word) > 1 and not word.isdigit() and word not in STOP_WORDS:
            found.add(stem(word))
    return found - _STOP_STEMS


def agent_terms(agent: AgentDefinition) -> set[str]:
    """The terms of an agent's name (``test-writer``: test, writ) and description."""
    return terms(f"{agent.name.replace('-', ' ').replace('_', ' ')} {agent.description}")


def ranked(text: str, agents: Iterable[AgentDefinition]) -> list[Delegation]:
    """Every agent with its score against ``text``, best first, ties by name."""
    pool = sorted(agents, key=lambda agent: agent.name)
    if not pool:
        return []
    vocab = [agent_terms(agent) for agent in pool]
    wanted = terms(text)
    count = len(pool)

    def weight(term: str) -> float:
        if count == 1:
            return 1.0
        holders = sum(term in mine for mine in vocab)
        return math.log(count / holders) / math.log(count)

    found = []
    for agent, mine in zip(pool, vocab, strict=True):
        shared = tuple(sorted(wanted & mine))
        evidence = sum(weight(term) for term in shared)
        found.append(Delegation(agent, round(1 - math.exp(-evidence), 4), shared))
    return sorted(found, key=lambda d: (-d.score, d.agent.name))


def delegate(text: str, agents: Iterable[AgentDefinition]) -> Delegation | None:
    """The agent whose name and description best match ``text``, with its score.

    ``text`` is a step's type and description. None when there is no agent, or when no
    agent shares a term of any weight with it.
    """
    best = next(iter(ranked(text, agents)), None)
    return best if best is not None and best.score > 0 else None
