"""Who may see the dashboard: loopback or a token, sessions as HMACs, CSRF on actions."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from merlin_flow.errors import InputError
from merlin_flow.ui.access import KEY_FILE, Access, check_bind, home_key, is_loopback

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


def test_the_token_or_its_session_lets_in() -> None:
    access = Access(TOKEN)
    assert access.allows(f"Bearer {TOKEN}", None)
    assert not access.allows("Bearer nope", None)
    assert access.allows(None, access.session())
    assert TOKEN not in access.session()  # the cookie is not the token
    assert not access.allows(None, Access(TOKEN).session())  # another server's key
    assert not access.allows(None, None)
    assert Access(None).allows(None, None)  # loopback without a token


def test_csrf_is_this_servers() -> None:
    access = Access(None)
    assert access.csrf_holds(access.csrf())
    assert not access.csrf_holds(Access(None).csrf())
    assert not access.csrf_holds(None)
    assert access.accepts_login("anything") is False
    assert Access(TOKEN).accepts_login(TOKEN)


def test_the_key_in_merlin_home_outlives_a_restart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    before = Access(TOKEN, home_key(home))
    after = Access(TOKEN, home_key(home))  # the server started again
    assert after.allows(None, before.session())
    assert after.csrf_holds(before.csrf())
    assert stat.S_IMODE((home / KEY_FILE).stat().st_mode) == 0o600
    elsewhere = Access(TOKEN, home_key(tmp_path / "other"))
    assert not elsewhere.allows(None, before.session())


def test_a_key_file_cut_short_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / KEY_FILE).write_bytes(b"abc")
    with pytest.raises(InputError, match=r"ui.key holds 3 bytes, not a key: remove it"):
        home_key(tmp_path)
