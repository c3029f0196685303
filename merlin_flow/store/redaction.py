"""Redaction of the worker's secrets from text before it is stored.

A secret is the value of an environment variable with a secret-looking name (see
:func:`merlin_flow.tool_config.is_secret_name`), or the credentials of a URL held in any
variable (``postgresql://user:pw@host/db``: the password and the whole URL). The store
runs every row it writes through :func:`current_redactor`, so agent output, exit-command
output, errors and transcripts never carry them into the database.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

from merlin_flow.errors import ConfigError
from merlin_flow.tool_config import is_secret_name

REDACTED = "[REDACTED]"
"""What a secret is replaced with."""
MIN_SECRET_LENGTH = 6
"""Shorter values are not redacted: they would mangle ordinary text."""

# scheme://userinfo@rest: userinfo runs up to the last '@' before the path (as in
# urlsplit), so an unescaped '@' inside a password stays in the password.
_URL_WITH_USERINFO = re.compile(
    r"(?P<url>[A-Za-z][A-Za-z0-9+.\-]*://(?P<userinfo>[^\s/?#]+)@[^\s,;]*)"
)


def url_credentials(text: str) -> list[str]:
    """Secrets of the URLs with credentials in ``text``: each URL and its password or token.

    ``scheme://user:password@host`` gives the password, ``https://token@host`` the
    token (a user name alone in other schemes is not a secret); a percent-encoded
    password is also given decoded.
    """
    found: list[str] = []
    for match in _URL_WITH_USERINFO.finditer(text):
        userinfo = match["userinfo"]
        user, colon, password = userinfo.partition(":")
        if colon:
            secret = password
        elif match["url"].split(":", 1)[0].lower() in ("http", "https"):
            secret = user  # a token in the user's place, as git hosts take them
        else:
            continue  # a user name alone (postgresql://postgres@host) is no secret
        found += [match["url"], secret, unquote(secret)]
    return found


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The secrets in ``environ`` (default: ``os.environ``), longest first, no duplicates.

    The values of secret-looking names, and the URL credentials of every value. Values
    shorter than :data:`MIN_SECRET_LENGTH` are left out.
    """
    env = os.environ if environ is None else environ
    candidates: list[str] = []
    for name, value in env.items():
        if is_secret_name(name):
            candidates += [value, value.strip()]
        candidates += url_credentials(value)
    return _longest_first(candidates)


SECRET_REFERENCE = re.compile(r"\$\{merlin-secret:([A-Za-z_][A-Za-z0-9_]*)\}")
"""How a stored exit command refers to a worker's secret: ``${merlin-secret:NAME}``."""


def refer_to_secrets(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with the value of each secret-looking variable replaced by a reference.

    An exit command the user wrote with a secret's value in it is stored this way: the
    store holds no secret, and ``fill_secrets`` gives the worker that runs it the
    command the user wrote.
    """
    env = os.environ if environ is None else environ
    named = {
        value: name
        for name, value in env.items()
        if is_secret_name(name) and len(value) >= MIN_SECRET_LENGTH
    }
    for value in _longest_first(named):
        text = text.replace(value, "${merlin-secret:" + named[value] + "}")
    return text


def fill_secrets(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with each ``${merlin-secret:NAME}`` replaced by NAME's value here.

    ConfigError naming the variable when this process's environment lacks it.
    """
    env = os.environ if environ is None else environ

    def value(match: re.Match[str]) -> str:
        name = match[1]
        if name not in env:
            raise ConfigError(
                f"the exit command refers to ${name} (it held its value when the job was "
                f"submitted), and this worker's environment has no {name}: set it for the "
                "worker, or submit the job again"
            )
        return env[name]

    return SECRET_REFERENCE.sub(value, text)


def _longest_first(values: Iterable[str]) -> list[str]:
    unique = {value for value in values if len(value) >= MIN_SECRET_LENGTH}
    return sorted(unique, key=lambda value: (-len(value), value))


class Redactor:
    """Replaces known secret values with ``[REDACTED]`` in text and JSON values."""

    def __init__(self, values: Iterable[str]) -> None:
        """Redact ``values`` (empty and too-short values are ignored)."""
        self.values: tuple[str, ...] = tuple(_longest_first(values))
        # Longest first: at a given position the alternation takes the first alternative
        # that matches, so a URL is replaced whole rather than the password inside it.
        self._pattern: re.Pattern[str] | None = (
            re.compile("|".join(re.escape(value) for value in self.values)) if self.values else None
        )

    def __bool__(self) -> bool:
        """True when there is something to redact."""
        return self._pattern is not None

    def __repr__(self) -> str:
        """The number of secrets, never the secrets."""
        return f"Redactor({len(self.values)} secrets)"

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced (``text`` itself when it holds none)."""
        if self._pattern is None:
            return text
        redacted, count = self._pattern.subn(REDACTED, text)
        return redacted if count else text

    def redact_json(self, value: Any) -> Any:
        """A redacted copy of a JSON value: strings in dicts (keys too) and lists.

        Parts without secrets are shared with ``value``, and ``value`` itself is returned
        when nothing needed redaction, so ``result is value`` tells whether it changed.
        ``value`` is never modified.
        """
        if self._pattern is None:
            return value
        return self._walk(value)

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            items = [(self._walk(key), self._walk(item)) for key, item in value.items()]
            if all(
                new_key is key and new_item is item
                for (new_key, new_item), (key, item) in zip(items, value.items(), strict=True)
            ):
                return value
            return dict(items)
        if isinstance(value, list | tuple):
            walked = [self._walk(item) for item in value]
            if all(new is old for new, old in zip(walked, value, strict=True)):
                return value
            return tuple(walked) if isinstance(value, tuple) else walked
        return value


@functools.cache
def current_redactor() -> Redactor:
    """The redactor of this process's environment, computed once.

    A worker's environment does not change while it runs; tests that change it call
    :func:`reset_redactor`.
    """
    return Redactor(secret_values())


def reset_redactor() -> None:
    """Forget the cached redactor: the next :func:`current_redactor` reads the environment."""
    current_redactor.cache_clear()
