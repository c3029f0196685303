"""The dashboard's door: a foreign Host, a foreign Origin, another session's CSRF value.

The attacks of a page of another site: one DNS rebinding put on the dashboard's address
(its requests name the attacker's site in ``Host`` and ``Origin``), and one that posts to
the dashboard's own address with a CSRF value it got elsewhere. Each is refused, and
nothing is written: no approval, no event row.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import func, select
from starlette.applications import Starlette
from starlette.testclient import TestClient

import workers.canvas
from merlin_flow.jobs.requesting import submit_request
from merlin_flow.jobs.views import job_status, job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Event, JobStatus
from merlin_flow.ui.access import Access, Hosts
from merlin_flow.ui.server import create_app
from tests.unit.jobs.test_requesting import REQUEST, repo  # noqa: F401 (a fixture)
from tests.unit.ui.test_server import URL, csrf

TOKEN = "g" * 24
ATTACKER = "http://attacker.example:8700"
"""A site whose name resolves, after DNS rebinding, to the dashboard's address."""


def app_of(db: Database, settings: Settings, token: str | None = None, *allowed: str) -> Starlette:
    hosts = Hosts.serving("127.0.0.1", 8700, allowed)
    return create_app(db, settings, Access(token, hosts=hosts), read_only=False)


def browser(app: Starlette, url: str = URL) -> TestClient:
    """A browser on ``url``: it sends the Host and, with a POST, the Origin of that site."""
    return TestClient(app, base_url=url, headers={"origin": url})


def events_of(db: Database, job: str) -> int:
    with db.reader() as session:
        return int(session.scalar(select(func.count()).where(Event.job_id == job)) or 0)


@pytest.fixture
def plan(db: Database, settings: Settings, repo: Path, monkeypatch: pytest.MonkeyPatch) -> str:  # noqa: F811
    """A job whose plan waits for approval (its tasks, once approved, are not published)."""
    monkeypatch.setattr(workers.canvas, "enqueue_job", lambda _db, _job: None)
    return submit_request(db, settings, REQUEST, str(repo)).job_id


def assert_untouched(db: Database, job: str, events: int) -> None:
    assert job_status(db, job) == JobStatus.AWAITING_APPROVAL
    assert job_view(db, job)["plan"].get("approved_by") is None
    assert job_view(db, job)["plan"].get("rejected_by") is None
    assert events_of(db, job) == events  # no event row either


def test_a_foreign_host_gets_nothing_on_any_path(
    db: Database, settings: Settings, plan: str
) -> None:
    rebound = browser(app_of(db, settings), ATTACKER)  # the rebinding page's requests
    paths = ["/", f"/jobs/{plan}", f"/jobs/{plan}/body", f"/api/jobs/{plan}", "/fleet",
             "/api/fleet", "/events?after=0", "/api/events?after=0", "/login", "/static/live.js",
             f"/jobs/{plan}/steps/question/attempts/1", "/nope"]  # fmt: skip
    for path in paths:
        answer = rebound.get(path)
        assert answer.status_code == 403, path
        assert answer.text.startswith("this dashboard does not answer to Host"), path
        assert plan not in answer.text, path
        assert 'name="csrf"' not in answer.text, path
        assert "set-cookie" not in answer.headers, path
    assert rebound.get("/healthz").text == "ok"  # a probe asks by the pod's address


def test_the_rebinding_attack_approves_nothing(db: Database, settings: Settings, plan: str) -> None:
    """The attack as found: the page read with Host attacker.example, then posted back."""
    app = app_of(db, settings)
    events = events_of(db, plan)
    rebound = browser(app, ATTACKER)
    assert rebound.get(f"/jobs/{plan}").status_code == 403  # no page, no CSRF value
    mine = browser(app)
    value = csrf(mine.get(f"/jobs/{plan}").text)  # even given a real session and its value
    cookie = "; ".join(f"{name}={kept}" for name, kept in mine.cookies.items())
    posted = rebound.post(f"/jobs/{plan}/approve", data={"csrf": value},
                          headers={"cookie": cookie}, follow_redirects=False)  # fmt: skip
    assert posted.status_code == 403
    assert_untouched(db, plan, events)


@pytest.mark.parametrize(
    "headers",
    [{"origin": ATTACKER},  # another site's page posting to the dashboard's address
     {"origin": "null"},  # a sandboxed frame, a file
     {"origin": "http://127.0.0.1:3000"},  # another server on this machine
     {"referer": ATTACKER + "/x"},  # no Origin: the Referer says where it came from
     {}],  # neither: no browser posts so
)  # fmt: skip
def test_a_post_from_another_site_with_a_valid_csrf_value_is_refused(
    db: Database, settings: Settings, plan: str, headers: dict[str, str]
) -> None:
    web = TestClient(app_of(db, settings), base_url=URL)
    value = csrf(web.get(f"/jobs/{plan}").text)
    events = events_of(db, plan)
    for action in ("approve", "reject"):
        posted = web.post(f"/jobs/{plan}/{action}", data={"csrf": value}, headers=headers,
                          follow_redirects=False)  # fmt: skip
        assert posted.status_code == 403, action
        assert "must come from the dashboard's own pages" in posted.text
    assert_untouched(db, plan, events)
    own = web.post(f"/jobs/{plan}/approve", data={"csrf": value},
                   headers={"referer": f"{URL}/jobs/{plan}"}, follow_redirects=False)  # fmt: skip
    assert own.status_code == 303  # the same value, from the dashboard's page: approved


def test_the_csrf_value_is_the_sessions_and_changes_with_it(
    db: Database, settings: Settings, plan: str
) -> None:
    app = app_of(db, settings)
    one, two = browser(app), browser(app)
    page = one.get(f"/jobs/{plan}")
    cookie = page.headers["set-cookie"]
    assert "httponly" in cookie.lower()
    assert "samesite=strict" in cookie.lower()
    assert "secure" not in cookie.lower()  # plain http
    first, second = csrf(page.text), csrf(two.get(f"/jobs/{plan}").text)
    assert first != second  # each browser its own session, each session its own value
    assert csrf(one.get(f"/jobs/{plan}").text) == first  # the same session: the same value
    assert "set-cookie" not in one.get(f"/jobs/{plan}").headers  # kept, not started again
    events = events_of(db, plan)
    refused = one.post(f"/jobs/{plan}/approve", data={"csrf": second})  # another session's
    assert refused.status_code == 403
    bare = browser(app)  # no session cookie at all, a value that was good for another
    assert bare.post(f"/jobs/{plan}/approve", data={"csrf": first}).status_code == 403
    assert_untouched(db, plan, events)
    one.cookies.clear()  # the session is gone (it ended, the browser was closed)
    renewed = csrf(one.get(f"/jobs/{plan}").text)
    assert renewed not in (first, second)  # a new session: a new value
    stale = one.post(f"/jobs/{plan}/approve", data={"csrf": first})
    assert stale.status_code == 403  # the old page's value is no good any more
    assert_untouched(db, plan, events)
    done = one.post(f"/jobs/{plan}/reject", data={"csrf": renewed}, follow_redirects=False)
    assert done.status_code == 303
    assert job_status(db, plan) == JobStatus.REJECTED


def test_a_login_starts_a_new_session_and_the_token_acts_without_one(
    db: Database, settings: Settings, plan: str
) -> None:
    app = app_of(db, settings, TOKEN)
    web = browser(app)
    refused = web.post("/login", data={"token": TOKEN}, headers={"origin": ATTACKER})
    assert refused.status_code == 403  # a login posted by another site's page
    assert web.post("/login", data={"token": TOKEN}, follow_redirects=False).status_code == 303
    first = csrf(web.get("/").text)
    assert web.post("/login", data={"token": TOKEN}, follow_redirects=False).status_code == 303
    second = csrf(web.get("/").text)
    assert first != second  # a new login: a new session, a new value
    events = events_of(db, plan)
    assert web.post(f"/jobs/{plan}/approve", data={"csrf": first}).status_code == 403
    assert_untouched(db, plan, events)
    script = TestClient(app, base_url=URL)  # no cookie, no Origin
    assert script.post(f"/jobs/{plan}/approve").status_code == 403
    wrong = {"authorization": "Bearer " + "x" * 24}
    assert script.post(f"/jobs/{plan}/approve", headers=wrong).status_code == 403
    assert_untouched(db, plan, events)
    token = {"authorization": f"Bearer {TOKEN}"}  # no browser sends this from another site
    approved = script.post(f"/jobs/{plan}/approve", headers=token, follow_redirects=False)
    assert approved.status_code == 303
    assert job_status(db, plan) == JobStatus.PENDING


def test_an_allowed_host_is_answered_and_acts(db: Database, settings: Settings, plan: str) -> None:
    proxied = browser(
        app_of(db, settings, None, "merlin.example.com"), "https://merlin.example.com"
    )
    page = proxied.get(f"/jobs/{plan}")
    assert page.status_code == 200
    assert "secure" in page.headers["set-cookie"].lower()  # served over https
    approved = proxied.post(f"/jobs/{plan}/approve", data={"csrf": csrf(page.text)},
                            follow_redirects=False)  # fmt: skip
    assert approved.status_code == 303
    assert job_view(db, plan)["plan"]["approved_by"] == "merlin ui (testclient)"
    other = browser(app_of(db, settings, None, "merlin.example.com"), "https://merlin.example.org")
    assert other.get("/").status_code == 403


def test_no_page_may_be_framed_or_kept(db: Database, settings: Settings) -> None:
    page = browser(app_of(db, settings)).get("/")
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["content-security-policy"] == "frame-ancestors 'none'"
    assert page.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(
    ("path", "named"),
    [("/api/events?after=99999999999999999999999", "after"),
     ("/events?after=99999999999999999999999", "after"),
     ("/api/events?after=2147483648", "after"),  # past what events.id holds
     ("/api/events?after=%C2%B2", "after"),  # a digit to str.isdigit, not to int()
     ("/api/events?after=-1", "after"),
     ("/fleet?days=" + "9" * 5000, "days"),
     ("/fleet?days=%C2%B2", "days"),
     ("/?age=999999999d", "age"),  # before year 1
     ("/?age=" + "9" * 5000 + "d", "age"),
     ("/?repo=a%00b", "repo"),
     ("/api/events?job=%00", "job")],
)  # fmt: skip
def test_a_bad_query_parameter_is_a_400_naming_it(
    db: Database, settings: Settings, path: str, named: str
) -> None:
    answer = browser(app_of(db, settings)).get(path)
    assert (answer.status_code, answer.text.split()[0].rstrip(":")) == (400, named)


def test_a_bad_last_event_id_is_a_400_naming_it(db: Database, settings: Settings) -> None:
    answer = browser(app_of(db, settings)).get("/events", headers={"last-event-id": "9" * 30})
    assert answer.status_code == 400
    assert answer.text.startswith("Last-Event-ID '999")
    assert re.search(r"from 0 to \d+", answer.text)
