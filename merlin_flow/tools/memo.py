"""What the toolbox remembers of earlier reads, to answer a repeated one without its text.

Models re-read files they read a few turns ago, often several times in a row; each read
re-sends the whole text and pays for it again. A read of the same path and line range
whose file is unchanged (same content hash) since it was last sent, within ``window``
turns, is answered "unchanged since turn N" instead. The turn is the one the file's text
was sent at: a suppressed read does not refresh it, so after ``window`` turns the text is
sent again (by then an earlier copy may have left the model's attention, or the context).
A file the toolbox writes or edits is forgotten: the next read of it sends its text, even
if the content is back to what was read before.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

DEFAULT_WINDOW = 8
"""Turns during which an unchanged file's text is not sent again."""

ReadKey = tuple[str, int | None, int | None]
"""A read: the file's path relative to the worktree, its first and last line (or None)."""


def digest(text: str) -> str:
    """The content hash a read is remembered by."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class ReadMemo:
    """The turn and content hash of each read whose text was sent to the model."""

    window: int = DEFAULT_WINDOW
    """Turns a read stays remembered; 0 or less: never suppress a read."""
    _sent: dict[ReadKey, tuple[int, str]] = field(default_factory=dict)

    def unchanged_since(self, key: ReadKey, content: str, turn: int) -> int | None:
        """The turn ``key`` was read at if ``content`` is unchanged since, within the window.

        Otherwise None, and ``content`` is remembered as sent at ``turn``.
        """
        hashed = digest(content)
        earlier = self._sent.get(key)
        if earlier is not None and self.window > 0:
            then, seen = earlier
            if seen == hashed and 0 <= turn - then <= self.window:
                return then
        self._sent[key] = (turn, hashed)
        return None

    def forget(self, path: str) -> None:
        """Forget every read of ``path``: the toolbox changed it."""
        for key in [key for key in self._sent if key[0] == path]:
            del self._sent[key]
