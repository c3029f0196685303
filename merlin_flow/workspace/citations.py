r"""Citations: the ``path:line`` places a model's text rests on, checked against a commit.

**What is a citation.** A relative file path, then its lines, in one of these forms:

- ``src/app.py:12``, ``src/app.py:12-14`` (an en dash too), ``src/app.py:12:5`` (the
  column is ignored);
- GitHub's ``src/app.py#L12``, ``src/app.py#L12-L14``.

The path looks like a file of the repository: it has a ``/``, or its last part has an
extension beginning with a letter (``app.py``, ``.gitignore``), or it is a well-known
name without one (``Makefile``, ``Dockerfile``...). So these are never citations: URLs
(``http://x:80``: nothing right after ``/``, ``:``, ``@``, ``\\`` or a word character
starts a path), times (``10:30``), ``host:port`` (a name ending in a top-level domain
such as ``.com``), Windows drive letters (``C:\\src\\a.py:3``), Python entry points
(``pkg.cli:main``), versions (``img:1.2``), absolute paths (``/usr/lib/x.py:3``: not the
repository's), and anything inside a fenced code block. Backticks, brackets and
punctuation around a citation are not part of it. A ``..`` path is a citation, and never
holds: it is outside the repository.

**A quoted snippet** says what the lines hold, and is checked too. It is either a
backquoted span right after the citation on the same line, with nothing but spaces
between (``src/app.py:12 `return total` `` or `` `src/app.py:12` `return total` ``), or
a fenced code block opening on the line right after a line that ends with the citation
(only punctuation such as ``:`` may follow it). The snippet must occur within the cited
lines, whitespace ignored (spaces, indentation and line breaks never matter); ``...``
or ``…`` in it stands for any text between its parts.

**Checking.** ``check_citations(text, read)`` checks each distinct citation with
``read(path)``, the file's text at the commit (None: no such file), built by
``reader_for_commit`` (the object store: later changes in a worktree are not seen) or
``reader_for_folder`` (files on disk, never outside the folder). A citation holds when
its file exists, its range is in the file and the right way round, and its snippet is
there. ``CitationReport.annotate`` marks each one that does not hold where it stands,
as ``src/app.py:90 [citation invalid: line 90 is past the end (42 lines)]``.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from merlin_flow.errors import GitError
from merlin_flow.workspace.git_command import run_git_process

Reader = Callable[[str], str | None]
"""A file's text by its path in the repository, or None when there is no such file."""

MAX_CITATIONS = 200
"""The most distinct citations one text has checked; the rest are counted, unchecked."""
SNIPPET_CHARS = 200
"""The most of a snippet ``as_json`` keeps."""
MARK = " [citation invalid: {problem}]"

_LOCATION = re.compile(
    r"(?<![\w.+\-/:@\\#%~$])"
    r"(?P<path>[\w.+\-]+(?:/[\w.+\-]+)*)"
    r"(?::(?P<start>\d{1,7})(?:[-\u2013](?P<end>\d{1,7}))?(?::\d{1,5})?"
    r"|#L(?P<gh_start>\d{1,7})(?:-L?(?P<gh_end>\d{1,7}))?)"
    r"(?!\w|[.:]\d)"
)
_INLINE = re.compile(r"[ \t]+(?P<ticks>`{1,3})(?!`)(?P<code>[^\n]{0,999}?[^\n`])(?P=ticks)(?!`)")
_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[^\n`]*$")
_EXTENSION = re.compile(r"\.[A-Za-z][\w+\-]*$")
_ELLIPSIS = re.compile(r"\.\.\.|…")
# fmt: off
_TOP_LEVEL_DOMAINS = frozenset({
    "com", "org", "net", "io", "edu", "gov", "ai", "dev", "app", "cloud", "local", "lan",
    "localhost", "internal",
})
_NAMES_WITHOUT_EXTENSION = frozenset({
    "Makefile", "GNUmakefile", "Dockerfile", "Containerfile", "Justfile", "Procfile",
    "Gemfile", "Rakefile", "Vagrantfile", "Jenkinsfile", "Brewfile", "CODEOWNERS",
    "LICENSE", "README",
})
# fmt: on


@dataclass(frozen=True)
class Citation:
    """Lines ``start`` to ``end`` (from 1, both included) of ``path``, and what they hold."""

    path: str
    start: int
    end: int
    snippet: str | None = None
    """The quoted code the lines must hold, as written; None when none was quoted."""

    def __str__(self) -> str:
        lines = str(self.start) if self.start == self.end else f"{self.start}-{self.end}"
        return f"{self.path}:{lines}"


@dataclass(frozen=True)
class Found:
    """A citation where it stands in a text: the citation's span, and where a mark goes."""

    citation: Citation
    start: int
    end: int
    """Just past the citation (and a backquote closing it)."""
    mark_at: int
    """Where a mark goes: past an inline snippet, else ``end``."""


@dataclass(frozen=True)
class CitationResult:
    """One citation, checked: ``problem`` says why it does not hold (None: it holds)."""

    citation: Citation
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """True when the citation holds."""
        return self.problem is None

    def render(self) -> str:
        """The citation, marked when it does not hold."""
        mark = "" if self.problem is None else MARK.format(problem=self.problem)
        return f"{self.citation}{mark}"

    def as_dict(self) -> dict[str, Any]:
        """``citation``, ``ok``, ``problem`` and ``snippet`` (cut), for JSON."""
        snippet = self.citation.snippet
        return {
            "citation": str(self.citation),
            "ok": self.ok,
            "problem": self.problem,
            "snippet": None if snippet is None else snippet[:SNIPPET_CHARS],
        }


@dataclass(frozen=True)
class CitationReport:
    """Every distinct citation of a text, checked, in the order they first appear."""

    results: tuple[CitationResult, ...] = ()
    unchecked: int = 0
    """Distinct citations past ``MAX_CITATIONS``: not checked, not counted as invalid."""

    @property
    def valid(self) -> list[CitationResult]:
        """The citations that hold."""
        return [result for result in self.results if result.ok]

    @property
    def invalid(self) -> list[CitationResult]:
        """The citations that do not hold."""
        return [result for result in self.results if not result.ok]

    @property
    def all_hold(self) -> bool:
        """True when no checked citation is invalid (a text citing nothing included)."""
        return not self.invalid

    def annotate(self, text: str) -> str:
        """``text`` with each invalid citation marked where it stands (once: idempotent)."""
        problems = {r.citation: r.problem for r in self.results if r.problem is not None}
        parts, done = [], 0
        for found in find_all(text):
            problem = problems.get(found.citation)
            mark = "" if problem is None else MARK.format(problem=problem)
            if not mark or text.startswith(mark, found.mark_at):
                continue
            parts += [text[done : found.mark_at], mark]
            done = found.mark_at
        return "".join(parts) + text[done:]

    def as_json(self) -> list[dict[str, Any]]:
        """One dict per citation (``CitationResult.as_dict``)."""
        return [result.as_dict() for result in self.results]

    def describe_invalid(self) -> str:
        """The invalid citations and their problems, on one line."""
        return "; ".join(f"{r.citation}: {r.problem}" for r in self.invalid)


def find_citations(text: str) -> list[Citation]:
    """The citations in ``text``, in order, each once (see the module docstring)."""
    return list(dict.fromkeys(found.citation for found in find_all(text)))


def find_all(text: str) -> Iterator[Found]:
    """Every citation in ``text`` where it stands, repeats included."""
    fences = list(_fences(text))
    starts = [start for start, _end, _code in fences]
    blocks = {start: code for start, _end, code in fences}
    for match in _LOCATION.finditer(text):
        before = bisect_right(starts, match.start()) - 1
        if before >= 0 and match.start() < fences[before][1]:
            continue  # inside a fenced block
        path = _citable(match["path"])
        if path is None:
            continue
        start = int(match["start"] or match["gh_start"])
        end = int(match["end"] or match["gh_end"] or start)
        closed = text[match.start() - 1 : match.start()] == "`" and text[match.end() :][:1] == "`"
        stop = match.end() + closed
        snippet, mark_at = _snippet(text, stop, blocks)
        yield Found(Citation(path, start, end, snippet), match.start(), stop, mark_at)


def _citable(path: str) -> str | None:
    """``path`` without ``./`` parts if it looks like a repository's file, else None."""
    parts = path.split("/")
    if "" in parts:
        return None
    parts = [part for part in parts if part != "."]
    name = parts[-1] if parts else ""
    if not re.search(r"[A-Za-z]", name) or name == "..":
        return None
    extension = _EXTENSION.search(name)
    if len(parts) == 1:
        if name in _NAMES_WITHOUT_EXTENSION:
            return name
        if extension is None or extension.group()[1:].lower() in _TOP_LEVEL_DOMAINS:
            return None
    return "/".join(parts)


def _fences(text: str) -> Iterator[tuple[int, int, str]]:
    """Each fenced code block: its start, its end (past the closing fence), its code."""
    offset, opened, fence, body = 0, -1, "", 0
    for line in text.splitlines(keepends=True):
        stripped = line.rstrip("\r\n")
        if opened < 0:
            if match := _FENCE.match(stripped):
                opened, fence, body = offset, match["fence"], offset + len(line)
        elif stripped.strip().startswith(fence) and not stripped.strip().strip(fence[0]):
            yield opened, offset + len(line), text[body:offset]
            opened = -1
        offset += len(line)
    if opened >= 0:  # never closed: the block runs to the end
        yield opened, len(text), text[body:]


def _snippet(text: str, stop: int, blocks: dict[int, str]) -> tuple[str | None, int]:
    """The snippet quoted right after a citation ending at ``stop``, and where a mark goes."""
    if inline := _INLINE.match(text, stop):
        code = inline["code"].strip()
        located = _LOCATION.fullmatch(code)
        if code and not (located and _citable(located["path"])):  # a second citation
            return code, inline.end()
    line_end = text.find("\n", stop)
    if line_end + 1 in blocks and re.fullmatch(r"[\s:.,;)\]*_`]*", text[stop:line_end]):
        return blocks[line_end + 1], stop  # a fenced block opens on the next line
    return None, stop


def _squeeze(text: str) -> str:
    return "".join(text.split())


def problem_of(citation: Citation, text: str | None) -> str | None:
    """Why ``citation`` does not hold in a file of ``text`` (None: missing), or None."""
    if text is None:
        return "no such file"
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the last line's newline ends it; it starts no line
    count = f"{len(lines)} line" + ("" if len(lines) == 1 else "s")
    start, end = citation.start, citation.end
    if start < 1:
        return f"line {start} does not exist (lines count from 1)"
    if end < start:
        return f"range {start}-{end} is reversed"
    if start > len(lines):
        return f"line {start} is past the end ({count})"
    if end > len(lines):
        return f"range {start}-{end} runs past the end ({count})"
    if citation.snippet is not None:
        parts = [_squeeze(part) for part in _ELLIPSIS.split(citation.snippet)]
        cited, at = _squeeze("".join(lines[start - 1 : end])), 0
        for part in filter(None, parts):
            at = cited.find(part, at)
            if at < 0:
                where = f"line {start}" if start == end else f"lines {start}-{end}"
                return f"the quoted snippet is not in {where}"
            at += len(part)
    return None


def inside(path: str) -> str | None:
    """``path`` as the repository names it (no ``./``), or None when it leaves it."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts or "\\" in path:
        return None
    return pure.as_posix()


def check_citation(citation: Citation, read: Reader) -> CitationResult:
    """``citation``, checked with ``read``."""
    path = inside(citation.path)
    if path is None:
        return CitationResult(citation, "the path is outside the repository")
    return CitationResult(citation, problem_of(citation, read(path)))


def check_citations(text: str, read: Reader) -> CitationReport:
    """The citations in ``text``, each checked with ``read`` (each file read once)."""
    cited = find_citations(text)
    files: dict[str, str | None] = {}

    def cached(path: str) -> str | None:
        if path not in files:
            files[path] = read(path)
        return files[path]

    results = tuple(check_citation(c, cached) for c in cited[:MAX_CITATIONS])
    return CitationReport(results, max(0, len(cited) - MAX_CITATIONS))


def reader_for_commit(repo: Path, commit: str) -> Reader:
    """Files as ``commit`` holds them in ``repo`` (a work tree or a bare repository).

    A folder, a symlink or a submodule is no file; a path that leaves the repository is
    refused (None). GitError when git cannot read the commit at all.
    """

    def read(path: str) -> str | None:
        name = inside(path)
        if name is None:
            return None
        listing = _git(repo, "--literal-pathspecs", "ls-tree", "-z", commit, "--", name)
        entry = listing.decode("utf-8", "replace").split("\0")[0]
        meta, _tab, listed = entry.partition("\t")
        mode, kind, blob = [*meta.split(), "", "", ""][:3]
        if listed != name or kind != "blob" or mode == "120000":
            return None
        return _git(repo, "cat-file", "blob", blob).decode("utf-8", "replace")

    return read


def marked_at(text: str, repo: Path, commit: str) -> str:
    """``text`` with its citations that do not hold at ``commit`` marked.

    As it was when git cannot read the commit: a summary is never lost to a check.
    """
    try:
        return check_citations(text, reader_for_commit(repo, commit)).annotate(text)
    except GitError:
        return text


def reader_for_folder(folder: Path) -> Reader:
    """Files on disk in ``folder``: none outside it (``..``, absolute, a symlink out)."""
    root = folder.resolve()

    def read(path: str) -> str | None:
        name = inside(path)
        if name is None:
            return None
        target = (root / name).resolve()
        if not target.is_relative_to(root) or not target.is_file():
            return None
        return target.read_bytes().decode("utf-8", "replace")

    return read


def _git(repo: Path, *args: str) -> bytes:
    """Git's output as bytes (a file's text may not be UTF-8); GitError on failure."""
    proc = run_git_process(args, repo, text=False)
    if proc.returncode != 0:
        error = proc.stderr.decode("utf-8", "replace").strip()
        raise GitError(f"git {' '.join(args)} failed in {repo}: {error}")
    return proc.stdout
