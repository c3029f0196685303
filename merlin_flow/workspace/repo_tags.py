"""The tags of one source file: what it defines, and which names it uses.

The repository map (``repo_map.py``) ranks files by the names they define and use.
This module reads one file's bytes and returns its ``FileTags``:

- **definitions**, found by tree-sitter: a small query per language, which visits the
  file's outline only (``repo_grammars.py``). Each definition keeps the line it starts
  on, as written (its signature), and the definition that encloses it (a method's
  class or ``impl``), which is all the map shows;
- **references**: every identifier the file's text holds, with its count, minus the
  language's keywords. A regular expression over the bytes finds them three times
  faster than a tree-sitter query for identifiers, and it also counts a name a
  docstring or comment mentions, as aider's pygments backfill does. A name counts in
  the ranking only if some file defines it (``repo_rank.py``); all of them make the
  file's text for the lexical match of a step's words (``repo_focus.py``).

A test file (``is_test``) is tagged by its references alone: its definitions are test
functions, which a map does not show, and leaving its parse out leaves out a third of
the parsing of a tested repository (10 MB of sympy's 28 MB of Python). Its tags are kept
apart from those of a file of the same content elsewhere (``kind`` ``python:refs``).

A file that is binary, huge, minified or that the parser refuses is skipped with its reason: its
tags are empty, it is never fatal.

``extract_all`` tags many files at once, on a pool of processes (spawned, never
forked: a worker may have threads) when there is enough to parse.
"""

from __future__ import annotations

import json
import os
import re
from array import array
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import NamedTuple

from merlin_flow.workspace.repo_grammars import GRAMMARS, REFERENCES_ONLY, parser_and_query

TAGS_VERSION = 1
"""Bumped when what a file's tags hold changes: cached tags of another version are unused."""
MAX_FILE_BYTES = 1_000_000
"""A larger file is skipped: generated code or data, rarely a file to read."""
MAX_LINE_AVERAGE = 300
"""A file whose lines average more characters than this is minified: skipped."""
SIGNATURE_CHARS = 100
"""A definition's line is cut to this many characters."""
PARALLEL_BYTES = 4_000_000
"""``extract_all`` uses a pool of processes once it has this many bytes to parse."""

_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]+")


class Definition(NamedTuple):
    """One name a file defines (a tuple: a map reads thousands of them at a time)."""

    name: str
    kind: str
    """``class``, ``function``, ``method``, ``type``, ``constant``, ``impl``..."""
    line: int
    """The line it starts on, from 0."""
    text: str
    """That line as written (right-stripped, tabs as 4 spaces, cut to SIGNATURE_CHARS)."""
    parent: int = -1
    """The index (in the file's definitions) of the definition enclosing it, or -1."""


@dataclass(frozen=True)
class FileTags:
    """What one file defines and which names it uses."""

    definitions: tuple[Definition, ...] = ()
    references: dict[str, int] = field(default_factory=dict)
    """Identifier -> how many times the file's text holds it."""
    skipped: str = ""
    """Why the file was not read (``binary``, ``huge``, ``minified``, ``unparsable``)."""

    def encode(self) -> Encoded:
        """The tags as the cache keeps them (and a worker process hands them over)."""
        defs = [list(definition) for definition in self.definitions]
        counts = array("i", self.references.values()).tobytes()
        return Encoded(json.dumps(defs), "\0".join(self.references), counts, self.skipped)

    @classmethod
    def decode(cls, encoded: Encoded, references: bool = True) -> FileTags:
        """Tags from ``encode``'s parts; without their references unless ``references``."""
        defs = tuple(map(Definition._make, json.loads(encoded.definitions)))
        refs: dict[str, int] = {}
        if references and encoded.words:
            counts = array("i")
            counts.frombytes(encoded.counts)
            refs = dict(zip(encoded.words.split("\0"), counts, strict=True))
        return cls(defs, refs, encoded.skipped)


class Encoded(NamedTuple):
    """A file's tags as the cache keeps them: compact, and quick to read back."""

    definitions: str
    """JSON: ``[name, kind, line, text, parent]`` per definition."""
    words: str
    """The referenced identifiers, joined by NUL characters."""
    counts: bytes
    """Their counts, as native ``int`` (``array("i")``)."""
    skipped: str


def skip_reason(data: bytes) -> str:
    """Why a file of these bytes is not read, or "" when it is."""
    if len(data) > MAX_FILE_BYTES:
        return "huge"
    if b"\0" in data[:8192]:
        return "binary"
    if len(data) > 2000 and len(data) / (data.count(b"\n") + 1) > MAX_LINE_AVERAGE:
        return "minified"
    return ""


def extract_tags(data: bytes, kind: str) -> FileTags:
    """The tags of a file of ``kind`` (``kind_of``: a language, maybe references only)."""
    reason = skip_reason(data)
    if reason:
        return FileTags(skipped=reason)
    language = kind.removesuffix(REFERENCES_ONLY)
    definitions: tuple[Definition, ...] = ()
    if language == kind:
        try:
            definitions = _definitions(data, language)
        except (ValueError, RuntimeError, UnicodeError):
            return FileTags(skipped="unparsable")
    keywords = GRAMMARS[language].keywords
    counts = Counter(_IDENTIFIER.findall(data))
    references = dict(zip(map(bytes.decode, counts), counts.values(), strict=True))
    for keyword in keywords.intersection(references):
        del references[keyword]
    return FileTags(definitions, references)


def _definitions(data: bytes, language: str) -> tuple[Definition, ...]:
    from tree_sitter import QueryCursor

    parser, query = parser_and_query(language)
    tree = parser.parse(data)
    cursor = QueryCursor(query)
    cursor.set_max_start_depth(GRAMMARS[language].depth)
    found: dict[tuple[int, int], tuple[int, str, str]] = {}  # (start, -end) -> ...
    for _pattern, captures in cursor.matches(tree.root_node):
        names = captures.get("name", [])
        kinds = [key for key in captures if key.startswith("definition.")]
        if not names or not kinds:
            continue
        node = captures[kinds[0]][0]
        name = (names[0].text or b"").decode("utf-8", "replace")
        key = (node.start_byte, -node.end_byte)
        if name and key not in found:
            found[key] = (node.start_point[0], name, kinds[0].removeprefix("definition."))
    lines = data.split(b"\n")
    definitions: list[Definition] = []
    open_scopes: list[tuple[int, int]] = []  # (end byte, index)
    for start, minus_end in sorted(found):
        line, name, kind = found[start, minus_end]
        while open_scopes and open_scopes[-1][0] <= start:
            open_scopes.pop()
        parent = open_scopes[-1][1] if open_scopes else -1
        text = lines[line].decode("utf-8", "replace").rstrip().expandtabs(4)
        definitions.append(Definition(name, kind, line, text[:SIGNATURE_CHARS], parent))
        open_scopes.append((-minus_end, len(definitions) - 1))
    return tuple(definitions)


def _extract_encoded(batch: list[tuple[bytes, str]]) -> list[Encoded]:
    return [extract_tags(data, kind).encode() for data, kind in batch]


def _extract_here(batch: list[tuple[bytes, str]]) -> list[tuple[FileTags, Encoded]]:
    return [(tags, tags.encode()) for tags in (extract_tags(*item) for item in batch)]


def extract_all(
    work: list[tuple[bytes, str]], workers: int | None = None
) -> list[tuple[FileTags, Encoded]]:
    """The tags of each ``(data, kind)`` in ``work``, in its order, each also encoded.

    With more than PARALLEL_BYTES to parse, ``workers`` processes share the work
    (default: the machine's cores, at most 4): this one and ``workers - 1`` spawned
    ones. The work is cut in batches, largest first; the spawned processes take them
    from the front, this one from the back, one at a time while they are busy. A pool
    that cannot start (a process that may not have children) leaves all to this one.
    Spawned processes import the main module as ``__mp_main__``: a script calling this
    needs the usual ``if __name__ == "__main__":`` guard.
    """
    workers = workers if workers is not None else min(4, os.cpu_count() or 1)
    total = sum(len(data) for data, _kind in work)
    if workers < 2 or total < PARALLEL_BYTES:
        return _extract_here(work)
    jobs: list[list[tuple[bytes, str]]] = [[]]
    size, target = 0, max(total // (workers * 8), 1)
    for item in sorted(work, key=lambda item: -len(item[0])):
        if size >= target:
            jobs.append([])
            size = 0
        jobs[-1].append(item)
        size += len(item[0])
    try:
        done = _share(jobs, workers - 1)
    except (OSError, AssertionError, RuntimeError):  # no children here: do it alone
        return _extract_here(work)
    found = {
        id(item): result
        for job, results in zip(jobs, done, strict=True)
        for item, result in zip(job, results, strict=True)
    }
    return [found[id(item)] for item in work]


def _share(
    jobs: list[list[tuple[bytes, str]]], children: int
) -> list[list[tuple[FileTags, Encoded]]]:
    import multiprocessing

    results: dict[int, list[tuple[FileTags, Encoded]]] = {}
    todo = list(range(len(jobs)))
    todo.reverse()  # pop() takes the largest job first
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(children, mp_context=context) as pool:
        running: dict[Future[list[Encoded]], int] = {}
        while todo or running:
            while todo and len(running) < 2 * children:  # one queued behind each
                n = todo.pop()
                running[pool.submit(_extract_encoded, jobs[n])] = n
            if todo:  # the children are busy: take the smallest job left
                n = todo.pop(0)
                results[n] = _extract_here(jobs[n])
            else:
                wait(running, return_when=FIRST_COMPLETED)
            for future in [future for future in running if future.done()]:
                encoded = future.result()
                results[running.pop(future)] = [(FileTags.decode(e), e) for e in encoded]
    return [results[n] for n in range(len(jobs))]
