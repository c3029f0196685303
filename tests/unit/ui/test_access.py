"""Who may see the dashboard: its own Host, loopback or a token, signed sessions, CSRF."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from merlin_flow.errors import InputError
from merlin_flow.ui.access import (
    KEY_FILE,
    SESSION_SECONDS,
    Access,
    Hosts,
    check_bind,
    home_key,
    is_loopback,
)

TOKEN = "t" * 24


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("192.168.1.4", False), ("::", False), ("no-such-host.invalid", False)],
)  # fmt: skip
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_only_loopback_may_go_without_a_token() -> None:
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", TOKEN)
    with pytest.raises(InputError, match="not a loopback address: set MERLIN_UI_TOKEN"):
        check_bind("0.0.0.0", None)
    with pytest.raises(InputError, match="at least 16 characters"):
        check_bind("127.0.0.1", "short")


def test_the_token_or_a_session_lets_in() -> None:
    access = Access(TOKEN)
    assert access.allows(f"Bearer {TOKEN}", None)
    assert access.bearer(f"Bearer {TOKEN}")
    assert not access.allows("Bearer nope", None)
    started = access.new_session()
    assert access.allows(None, access.session_of(started.cookie))
    assert TOKEN not in started.cookie  # the cookie is not the token
    assert Access(TOKEN).session_of(started.cookie) is None  # another server's key
    assert Access("u" * 24, access.key).session_of(started.cookie) is None  # another token
    assert not access.allows(None, None)
    assert Access(None).allows(None, None)  # loopback without a token
    assert not Access(None).bearer("Bearer ")  # no token: no bearer to carry


def test_a_session_is_random_signed_and_ends() -> None:
    access = Access(None)
    one, two = access.new_session(now=1000), access.new_session(now=1000)
    assert one.id != two.id
    assert len(one.id) == 32
    assert access.session_of(one.cookie, now=1001) == one
    assert access.session_of(one.cookie, now=1000 + SESSION_SECONDS) is None  # ended
    sid, ends, mac = one.cookie.split(".")
    assert access.session_of(f"{sid}.{int(ends) + 9999}.{mac}", now=1001) is None  # stretched
    assert access.session_of(f"{two.id}.{ends}.{mac}", now=1001) is None  # another id
    for junk in (None, "", "x", "a.b.c", access.csrf(one), "..", f"{sid}.{ends}"):
        assert access.session_of(junk, now=1001) is None, junk


def test_the_csrf_value_is_its_sessions() -> None:
    access = Access(None)
    one, two = access.new_session(), access.new_session()
    assert access.csrf(one) != access.csrf(two)  # a new session, a new value
    assert access.csrf_holds(one, access.csrf(one))
    assert not access.csrf_holds(two, access.csrf(one))  # another session's value
    assert not access.csrf_holds(None, access.csrf(one))  # no session: no action
    assert not access.csrf_holds(one, None)
    assert not access.csrf_holds(one, "")
    assert not Access(None).csrf_holds(one, access.csrf(one))  # another server's key
    assert access.accepts_login("anything") is False
    assert Access(TOKEN).accepts_login(TOKEN)


def test_the_key_in_merlin_home_outlives_a_restart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    before = Access(TOKEN, home_key(home))
    started = before.new_session()
    after = Access(TOKEN, home_key(home))  # the server started again
    assert after.session_of(started.cookie) == started
    assert after.csrf_holds(started, before.csrf(started))
    assert after.cookie_name == before.cookie_name
    assert stat.S_IMODE((home / KEY_FILE).stat().st_mode) == 0o600
    elsewhere = Access(TOKEN, home_key(tmp_path / "other"))
    assert elsewhere.session_of(started.cookie) is None
    assert elsewhere.cookie_name != before.cookie_name  # two dashboards on one host


@pytest.mark.parametrize(
    ("bound", "port", "allowed", "host", "admitted"),
    [("127.0.0.1", 8700, (), "127.0.0.1:8700", True),
     ("127.0.0.1", 8700, (), "localhost:8700", True),
     ("127.0.0.1", 8700, (), "LocalHost:8700", True),
     ("127.0.0.1", 8700, (), "[::1]:8700", True),
     ("127.0.0.1", 8700, (), "[0:0::1]:8700", True),
     ("127.0.0.1", 8700, (), "attacker.example:8700", False),  # DNS rebinding
     ("127.0.0.1", 8700, (), "127.0.0.1:8701", False),
     ("127.0.0.1", 8700, (), "127.0.0.1", False),
     ("127.0.0.1", 8700, (), "192.168.1.4:8700", False),
     ("127.0.0.1", 8700, (), "127.0.0.1:8700/x", False),
     ("127.0.0.1", 8700, (), "127.0.0.1:8700@attacker.example", False),
     ("127.0.0.1", 8700, (), "", False),
     ("127.0.0.1", 8700, (), None, False),
     ("localhost", 8700, (), "127.0.0.1:8700", True),
     ("::1", 8700, (), "[::1]:8700", True),
     ("::1", 8700, (), "::1:8700", False),
     ("127.0.0.1", 80, (), "127.0.0.1", True),  # http://127.0.0.1/ has no port in Host
     ("127.0.0.1", 80, (), "localhost", True),
     ("0.0.0.0", 8700, (), "192.168.1.4:8700", True),  # every address: any IP at the port
     ("0.0.0.0", 8700, (), "[fe80::1]:8700", True),
     ("0.0.0.0", 8700, (), "localhost:8700", True),
     ("0.0.0.0", 8700, (), "192.168.1.4:9000", False),
     ("0.0.0.0", 8700, (), "attacker.example:8700", False),
     ("::", 8700, (), "10.0.0.3:8700", True),
     ("0.0.0.0", 80, (), "192.168.1.4", True),
     ("0.0.0.0", 8700, (), "192.168.1.4", False),
     ("192.168.1.4", 8700, (), "192.168.1.4:8700", True),
     ("192.168.1.4", 8700, (), "127.0.0.1:8700", False),
     ("127.0.0.1", 8700, ("merlin.example.com",), "merlin.example.com", True),
     ("127.0.0.1", 8700, ("merlin.example.com",), "Merlin.Example.COM", True),
     ("127.0.0.1", 8700, ("merlin.example.com",), "merlin.example.com:8443", False),
     ("127.0.0.1", 8700, ("merlin.example.com",), "evil.merlin.example.com", False),
     ("127.0.0.1", 8700, ("merlin.example.com:8443", ""), "merlin.example.com:8443", True),
     ("127.0.0.1", 8700, ("merlin.example.com:8443",), "merlin.example.com", False)],
)  # fmt: skip
def test_the_host_is_one_the_dashboard_serves(
    bound: str, port: int, allowed: tuple[str, ...], host: str | None, admitted: bool
) -> None:
    assert Hosts.serving(bound, port, allowed).admits(host) is admitted


@pytest.mark.parametrize("name", ["https://merlin.example.com", "merlin.example.com/ui", "*",
                                  "a b", "merlin.example.com:99999", "[nope]"])  # fmt: skip
def test_an_allowed_host_that_is_no_host_is_refused(name: str) -> None:
    with pytest.raises(InputError, match="give a host name, NAME or NAME:PORT"):
        Hosts.serving("127.0.0.1", 8700, [name])


@pytest.mark.parametrize(
    ("origin", "referer", "host", "ours"),
    [("http://127.0.0.1:8700", None, "127.0.0.1:8700", True),
     ("http://localhost:8700", None, "127.0.0.1:8700", True),  # another name of ours
     ("http://attacker.example:8700", None, "127.0.0.1:8700", False),
     ("http://attacker.example:8700", None, "attacker.example:8700", False),  # not admitted
     ("http://127.0.0.1:3000", None, "127.0.0.1:8700", False),  # another local server
     ("null", None, "127.0.0.1:8700", False),
     ("", "http://127.0.0.1:8700/jobs/j", "127.0.0.1:8700", False),
     (None, "http://127.0.0.1:8700/jobs/j", "127.0.0.1:8700", True),  # no Origin: Referer
     (None, "http://attacker.example/x", "127.0.0.1:8700", False),
     (None, None, "127.0.0.1:8700", False),
     ("file://", None, "127.0.0.1:8700", False),
     ("https://merlin.example.com", None, "127.0.0.1:8700", True),  # a proxy's name
     ("https://merlin.example.com", None, "merlin.example.com", True)],
)  # fmt: skip
def test_an_action_comes_from_the_dashboards_own_pages(
    origin: str | None, referer: str | None, host: str, ours: bool
) -> None:
    hosts = Hosts.serving("127.0.0.1", 8700, ["merlin.example.com"])
    assert hosts.admits_origin(origin, referer, host) is ours


def test_on_every_address_an_origin_is_the_requests_own_host() -> None:
    hosts = Hosts.serving("0.0.0.0", 8700)
    assert hosts.admits_origin("http://192.168.1.4:8700", None, "192.168.1.4:8700")
    assert not hosts.admits_origin("http://10.0.0.9:8700", None, "192.168.1.4:8700")


def test_a_key_file_cut_short_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / KEY_FILE).write_bytes(b"abc")
    with pytest.raises(InputError, match=r"ui.key holds 3 bytes, not a key: remove it"):
        home_key(tmp_path)
