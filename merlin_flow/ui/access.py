"""Who may see the dashboard and act on it: the token, the session cookie, the CSRF check.

On a loopback address the dashboard may run without a token (the machine's users are its
users); on any other it refuses to start without ``MERLIN_UI_TOKEN``. With a token, every
request needs it, the event stream included: as ``Authorization: Bearer <token>``, or the
session cookie the login form sets (its value is an HMAC of the token, never the token).
Every action (a POST) also needs the CSRF token of the page it came from, whether or not
a token is set: a page of another site could otherwise post to a dashboard on loopback.
Both are HMACs by a key kept in ``MERLIN_HOME/ui.key``: they outlive a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

from merlin_flow.errors import InputError

COOKIE = "merlin_ui"
MIN_TOKEN_LENGTH = 16
MIN_KEY_BYTES = 32


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and names that resolve only there (``localhost``)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    addresses = [str(address).split("%")[0] for address in found]
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def check_bind(host: str, token: str | None) -> None:
    """InputError when the dashboard would be open on ``host`` to anyone who reaches it."""
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise InputError(
            f"MERLIN_UI_TOKEN must hold at least {MIN_TOKEN_LENGTH} characters "
            "(`openssl rand -hex 24`)"
        )
    if token is None and not is_loopback(host):
        raise InputError(
            f"--host {host} is not a loopback address: set MERLIN_UI_TOKEN so that the "
            "dashboard asks for it (docs/dashboard.md), or serve it on 127.0.0.1"
        )


KEY_FILE = "ui.key"
"""The dashboard's key in ``MERLIN_HOME``: cookies and forms outlive a restart."""


def home_key(home: Path) -> bytes:
    """The key kept in ``home``, made (32 random bytes, mode 0600) the first time."""
    path = home / KEY_FILE
    home.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) < MIN_KEY_BYTES:  # cut short by a crash as it was written
            raise InputError(
                f"{path} holds {len(key)} bytes, not a key: remove it and start again"
            ) from None
        return key
    key = secrets.token_bytes(32)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(key)
    return key


@dataclass(frozen=True)
class Access:
    """The dashboard's secrets: the user's token (or None) and the server's key.

    ``merlin ui`` keeps the key in ``MERLIN_HOME`` (``home_key``), so that a restart
    keeps every browser's session and every open page's forms; without one given, the
    key is this object's own.
    """

    token: str | None
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def session(self) -> str:
        """The session cookie's value for the token (its HMAC, not the token)."""
        return self._mac(b"session:" + (self.token or "").encode())

    def allows(self, authorization: str | None, cookie: str | None) -> bool:
        """Whether a request with these headers may see the dashboard."""
        if self.token is None:
            return True
        if authorization and authorization.startswith("Bearer "):
            return hmac.compare_digest(authorization[7:].encode(), self.token.encode())
        return cookie is not None and hmac.compare_digest(cookie, self.session())

    def accepts_login(self, token: str) -> bool:
        """Whether the login form's ``token`` is the dashboard's."""
        return self.token is not None and hmac.compare_digest(token.encode(), self.token.encode())

    def csrf(self) -> str:
        """The token every form of every page carries, and every action must bring back."""
        return self._mac(b"csrf")

    def csrf_holds(self, given: str | None) -> bool:
        """Whether an action brought this server's CSRF token."""
        return given is not None and hmac.compare_digest(given, self.csrf())

    def _mac(self, message: bytes) -> str:
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()
