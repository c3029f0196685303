"""Who may see the dashboard and act on it: the Host, the token, the session, the CSRF check.

Every request but ``/healthz`` must name, in ``Host``, an address the dashboard serves
(``Hosts``): the one it is bound to with its port (for loopback also ``127.0.0.1``,
``localhost`` and ``[::1]``; for ``0.0.0.0`` or ``::`` any IP address), or a name given
with ``--allowed-host`` or ``MERLIN_UI_ALLOWED_HOSTS`` (a proxy's). A page that DNS
rebinding put on the dashboard's address names its own site there, and is refused.

On a loopback address the dashboard may run without a token (the machine's users are its
users); on any other it refuses to start without ``MERLIN_UI_TOKEN``. With a token, every
request needs it, the event stream included: as ``Authorization: Bearer <token>``, or a
session cookie. A session (``Session``) is a random id with an end, signed by an HMAC
that covers the token: the login form starts one, and without a token the first page
does. Every action (a POST) other than one with the bearer token needs an ``Origin`` (or,
without one, a ``Referer``) of the dashboard's own (``Hosts.admits_origin``), and the
CSRF value of the session it comes with: an HMAC of the session's id, so that it changes
with every session and a page of another session, or a page without its cookie, cannot
act. The HMACs are by a key kept in ``MERLIN_HOME/ui.key``: sessions outlive a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from merlin_flow.errors import InputError

MIN_TOKEN_LENGTH = 16
MIN_KEY_BYTES = 32
SESSION_SECONDS = 12 * 3600
"""How long a session lasts from its start (then a new one, with a new CSRF value)."""
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
"""The names a dashboard bound to a loopback (or every) address answers to, at its port."""
_AUTHORITY = re.compile(r"(\[[0-9a-f:.]+(?:%[\w.~-]+)?\]|[a-z0-9_.-]+)(?::([0-9]{1,5}))?")


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


def authority(text: str) -> str | None:
    """``host[:port]`` as ``Hosts`` keeps it (lower case, an IP address in its short form).

    None when ``text`` is no host: the Host header of a request no browser sends.
    """
    match = _AUTHORITY.fullmatch(text.strip().lower())
    if match is None:
        return None
    name, port = match[1], match[2]
    if port is not None and not 0 < int(port) < 65536:
        return None
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        if name.startswith("["):
            return None
    else:
        if (address.version == 6) != name.startswith("["):
            return None
        name = f"[{address}]" if address.version == 6 else str(address)
    return name if port is None else f"{name}:{int(port)}"


@dataclass(frozen=True)
class Hosts:
    """What the dashboard answers to in ``Host``, and the origins its actions may come from.

    ``names``: the exact ``host[:port]`` values (``authority``); ``port`` with
    ``any_address``: a dashboard bound to every address answers any IP address at its port
    (DNS rebinding brings a name, never an address).
    """

    names: frozenset[str]
    port: int
    any_address: bool = False

    @classmethod
    def serving(cls, host: str, port: int, allowed: Iterable[str] = ()) -> Hosts:
        """The Hosts of a dashboard bound to ``host`` and ``port``, with ``allowed`` names.

        Each allowed name is ``NAME`` or ``NAME:PORT`` and admits exactly that (a browser
        leaves out the port of ``https://NAME/``); InputError for one that is no host.
        """
        bound = authority(f"[{host}]" if ":" in host.strip("[]") else host)
        if bound is None:
            raise InputError(f"--host {host!r} is not a host name or an address")
        try:
            wildcard = ipaddress.ip_address(bound.strip("[]")).is_unspecified
        except ValueError:
            wildcard = False
        bound_names = [] if wildcard else [bound]
        if wildcard or is_loopback(host.strip("[]")):
            bound_names += [authority(f"[{n}]" if ":" in n else n) or n for n in LOOPBACK_NAMES]
        names = {f"{name}:{port}" for name in bound_names}
        if port == 80:  # the port a browser leaves out of http://NAME/
            names.update(bound_names)
        for entry in allowed:
            if not entry.strip():
                continue
            named = authority(entry)
            if named is None:
                raise InputError(
                    f"allowed host {entry!r}: give a host name, NAME or NAME:PORT "
                    "(merlin.example.com, merlin.example.com:8443), without a scheme or a path"
                )
            names.add(named)
        return cls(frozenset(names), port, wildcard)

    def admits(self, host: str | None) -> bool:
        """Whether a request with this ``Host`` header is for this dashboard."""
        named = authority(host) if host else None
        if named is None or named in self.names:
            return named is not None
        if not self.any_address:
            return False
        name, port = _split(named)
        if (port or "80") != str(self.port):
            return False
        try:
            ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            return False
        return True

    def admits_origin(self, origin: str | None, referer: str | None, host: str | None) -> bool:
        """Whether a POST's ``Origin`` (or, without one, ``Referer``) is this dashboard.

        It must be the request's own admitted ``host``, or a name of ``names`` (a proxy
        that sends the dashboard its own address as ``Host``). Neither header: refused
        (every browser sends ``Origin`` with a POST); ``Origin: null`` too.
        """
        given = origin if origin is not None else referer
        if not given:
            return False
        parts = urlsplit(given.strip())
        if parts.scheme not in ("http", "https"):
            return False
        named = authority(parts.netloc)
        if named is None:
            return False
        return named in self.names or (named == authority(host or "") and self.admits(host))


def _split(named: str) -> tuple[str, str | None]:
    """An ``authority`` as its name and its port (None without one)."""
    if named.startswith("["):
        name, _, port = named.partition("]")
        return name + "]", port.removeprefix(":") or None
    name, _, port = named.partition(":")
    return name, port or None


KEY_FILE = "ui.key"
"""The dashboard's key in ``MERLIN_HOME``: sessions outlive a restart."""


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
class Session:
    """One browser's session: a random id, when it ends, and its cookie's value."""

    id: str
    ends: int
    cookie: str


@dataclass(frozen=True)
class Access:
    """Who may see the dashboard: the user's token (or None), the server's key, the Hosts.

    ``merlin ui`` keeps the key in ``MERLIN_HOME`` (``home_key``), so that a restart
    keeps every browser's session and every open page's forms; without one given, the
    key is this object's own. ``hosts``: by default those of ``http://127.0.0.1/``.
    """

    token: str | None
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    hosts: Hosts = field(default_factory=lambda: Hosts.serving("127.0.0.1", 80))

    @property
    def cookie_name(self) -> str:
        """The session cookie's name, this key's: dashboards on one host keep apart.

        Browsers send a host's cookies to each of its ports.
        """
        return "merlin_ui_" + self._mac(b"cookie name")[:8]

    def new_session(self, now: float | None = None) -> Session:
        """A session of its own, for ``SESSION_SECONDS`` from ``now``."""
        sid = secrets.token_hex(16)
        ends = int(now if now is not None else time.time()) + SESSION_SECONDS
        return Session(sid, ends, f"{sid}.{ends}.{self._session_mac(sid, ends)}")

    def session_of(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session a cookie holds, if this server started it, for this token, and it lasts."""
        sid, _, rest = (cookie or "").partition(".")
        ends, _, mac = rest.partition(".")
        if not (re.fullmatch(r"[0-9a-f]{32}", sid) and re.fullmatch(r"[0-9]{1,12}", ends)):
            return None
        if not hmac.compare_digest(mac, self._session_mac(sid, int(ends))):
            return None
        if int(ends) <= (now if now is not None else time.time()):
            return None
        return Session(sid, int(ends), str(cookie))

    def bearer(self, authorization: str | None) -> bool:
        """Whether a request's ``Authorization`` header carries the token."""
        if self.token is None or not authorization or not authorization.startswith("Bearer "):
            return False
        return hmac.compare_digest(authorization[7:].encode(), self.token.encode())

    def allows(self, authorization: str | None, session: Session | None) -> bool:
        """Whether a request with this header and session (``session_of``) may see it."""
        return self.token is None or self.bearer(authorization) or session is not None

    def accepts_login(self, token: str) -> bool:
        """Whether the login form's ``token`` is the dashboard's."""
        return self.token is not None and hmac.compare_digest(token.encode(), self.token.encode())

    def csrf(self, session: Session) -> str:
        """The value every form of the session's pages carries, and its actions bring back."""
        return self._mac(b"csrf\0" + session.id.encode())

    def csrf_holds(self, session: Session | None, given: str | None) -> bool:
        """Whether an action brought its own session's CSRF value."""
        return (
            session is not None
            and given is not None
            and hmac.compare_digest(given.encode(), self.csrf(session).encode())
        )

    def _session_mac(self, sid: str, ends: int) -> str:
        # The token is signed in: a new token ends every session of the old one.
        return self._mac(f"session\0{sid}\0{ends}\0{self.token or ''}".encode())

    def _mac(self, message: bytes) -> str:
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()
