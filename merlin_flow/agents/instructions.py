"""``@path`` imports in prompt files, and the repository's instruction file (AGENTS.md).

A line that is exactly ``@some/path.md`` (not indented, outside a ``` or ~~~ fence, so
that ``@decorator`` lines in code samples stay) is replaced by that file's content,
itself expanded: paths are relative to the importing file, ``~/`` is the user's home.
A file importing itself back is an error naming the cycle (``a.md -> b.md -> a.md``);
imports nest at most ``MAX_IMPORT_DEPTH`` deep and add at most ``MAX_EXPANDED_CHARS``.

Confinement: a repository's files are as untrusted as its code, so with ``confine_to``
every file named must resolve (symlinks followed) inside that folder: ``~``, absolute
paths, ``..`` escapes and symlinks leading out are refused, the message naming the path.
The repository's instruction file is also held to `[permissions]`: a file a `Read` rule
hides from the step's agent is not imported into its prompt either (``readable``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from merlin_flow.errors import AgentFileError

Readable = Callable[[str], bool]
"""Whether a file (its path relative to the repository, posix) may reach the prompt."""

INSTRUCTION_FILES = ("AGENTS.md", "MERLIN.md")
"""The repository's own instructions for every agent, the first one found."""
INSTRUCTION_LIMIT = 20_000
"""The most characters of the instruction file a prompt gets (after its imports)."""
MAX_IMPORT_DEPTH = 10
MAX_EXPANDED_CHARS = 200_000
"""The most characters imports may add up to: a guard against files importing in bulk."""
_IMPORT_LINE = re.compile(r"^@(\S+)[ \t]*$")
_FENCE = re.compile(r"^(```|~~~)")


def expand_imports(text: str, file: Path, *, confine_to: Path | None) -> str:
    """``text`` (the content of ``file``) with its ``@path`` lines replaced, recursively.

    With ``confine_to``, every imported file must be inside that folder. AgentFileError
    for a file that cannot be read, leads outside, or imports itself back (the cycle named).
    """
    return _Expansion(file, confine_to, lenient=False).expand(text, (file.resolve(),))


def instruction_file(root: Path) -> str | None:
    """The name of the instruction file ``instruction_text`` reads, None when there is none."""
    return next((name for name in INSTRUCTION_FILES if (root / name).is_file()), None)


def instruction_text(root: Path, readable: Readable | None = None) -> str:
    """The repository's ``AGENTS.md`` (else ``MERLIN.md``), imports expanded; "" if none.

    Imports stay inside ``root`` and, with ``readable`` (the step's `[permissions]`),
    within what the agent may read; a bad one is left out with a note in the text. The
    text is cut at ``INSTRUCTION_LIMIT`` characters, with a note saying so.
    """
    name = instruction_file(root)
    if name is None:
        return ""
    path = root / name
    expansion = _Expansion(path, root, lenient=True, readable=readable)
    try:
        ensure_inside(path, root.resolve(), name)
        expansion.check_readable(path.resolve(), name)
        text = read_text(path, name)
    except AgentFileError as exc:
        return f"({name} left out: {exc})"
    text = expansion.expand(text, (path.resolve(),))
    if len(text) > INSTRUCTION_LIMIT:
        text = (
            text[:INSTRUCTION_LIMIT] + f"\n\n[{name} cut: {len(text):,} characters, "
            f"the first {INSTRUCTION_LIMIT:,} kept]"
        )
    return text


def locate(written: str, importer: Path, root: Path | None) -> Path:
    """The resolved file that ``written`` (an import or a memory path) names from ``importer``.

    With ``root`` (resolved), AgentFileError unless the file is inside it.
    """
    if written.startswith("~"):
        if root is not None:
            raise AgentFileError(f"{written}: a repository's file may not name the home folder (~)")
        try:
            path = Path(written).expanduser()
        except RuntimeError as exc:  # no home folder known
            raise AgentFileError(f"{written}: {exc}") from None
    elif Path(written).is_absolute():
        if root is not None:
            raise AgentFileError(f"{written}: a repository's file may not name an absolute path")
        path = Path(written)
    else:
        path = importer.parent / written
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a NUL byte, a symlink loop...
        raise AgentFileError(f"{_cut(repr(written))} is not a usable path: {exc}") from None
    if root is not None:
        ensure_inside(resolved, root, written)
    return resolved


def ensure_inside(path: Path, root: Path, shown: str) -> None:
    """AgentFileError unless ``path``, symlinks followed, is inside ``root`` (resolved)."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise AgentFileError(f"{shown} leads outside the repository (to {resolved})")


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of ``path``; AgentFileError starting with ``what`` if unreadable."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AgentFileError(f"{what}: {_cut(str(path))} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise AgentFileError(f"{what}: cannot read {_cut(str(path))}: {reason}") from None


def _cut(text: str) -> str:
    """A path for a message: a very long one (a huge import or memory field) cut short."""
    return text if len(text) <= 200 else f"{text[:120]}...{text[-60:]} ({len(text):,} characters)"


class _Expansion:
    """One expansion: the confinement, whether bad imports fail it, the size so far."""

    def __init__(
        self, top: Path, confine_to: Path | None, *, lenient: bool, readable: Readable | None = None
    ) -> None:
        self.base = top.resolve().parent
        self.root = confine_to.resolve() if confine_to is not None else None
        self.lenient = lenient
        self.readable = readable
        self.size = 0

    def check_readable(self, target: Path, written: str) -> None:
        """AgentFileError when `[permissions]` hide ``target`` from the step's agent."""
        if self.readable is None or self.root is None or not target.is_relative_to(self.root):
            return
        relative = target.relative_to(self.root).as_posix()
        if not self.readable(relative):
            raise AgentFileError(f"{written}: [permissions] hide {relative} from this agent")

    def expand(self, text: str, chain: tuple[Path, ...]) -> str:
        """``text`` of ``chain[-1]`` with its imports replaced (see ``expand_imports``)."""
        out: list[str] = []
        fenced = False
        for line in text.splitlines(keepends=True):
            if _FENCE.match(line):
                fenced = not fenced
            match = None if fenced else _IMPORT_LINE.match(line.rstrip("\r\n"))
            if match is None:
                out.append(line)
                continue
            try:
                content = self._imported(match.group(1), chain)
            except AgentFileError as exc:
                if not self.lenient:
                    raise
                content = f"({match.group(0)} left out: {exc})"
            out.append(content if content.endswith("\n") else content + "\n")
        return "".join(out)

    def _imported(self, written: str, chain: tuple[Path, ...]) -> str:
        target = locate(written, chain[-1], self.root)
        self.check_readable(target, f"@{written}")
        if target in chain:
            cycle = [*chain[chain.index(target) :], target]
            raise AgentFileError("import cycle: " + " -> ".join(map(self._shown, cycle)))
        if len(chain) > MAX_IMPORT_DEPTH:
            raise AgentFileError(f"@{written}: imports nest deeper than {MAX_IMPORT_DEPTH}")
        text = read_text(target, f"@{written}")
        self.size += len(text)
        if self.size > MAX_EXPANDED_CHARS:
            raise AgentFileError(
                f"@{written}: imports add up to more than {MAX_EXPANDED_CHARS:,} characters"
            )
        return self.expand(text, (*chain, target))

    def _shown(self, path: Path) -> str:
        return str(path.relative_to(self.base)) if path.is_relative_to(self.base) else str(path)
