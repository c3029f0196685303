"""The dashboard's pages, JSON, stream and actions through HTTP (Starlette's test client)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote_plus

import celery
import pytest
from starlette.testclient import TestClient

import workers.canvas
from merlin_flow.jobs.costs import job_costs
from merlin_flow.jobs.requesting import submit_request
from merlin_flow.jobs.views import job_status, job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database, JobStatus
from merlin_flow.ui.access import Access, Hosts
from merlin_flow.ui.server import create_app
from tests.unit.engine.finished_jobs import finished_job
from tests.unit.jobs.test_requesting import REQUEST, repo  # noqa: F401 (a fixture)
from workers.app import app as merlin_app

TOKEN = "s" * 24


ADDRESS = "192.0.2.7"
"""The address the test client's requests come from (an approver's, for the record)."""


URL = "http://127.0.0.1:8700"
"""Where the test client asks: the dashboard's own address, as ``merlin ui`` serves it."""
HOSTS = Hosts.serving("127.0.0.1", 8700)


def client(db: Database, settings: Settings, token: str | None = None, **kw: bool) -> TestClient:
    """A browser on the dashboard's own address: its POSTs come from the dashboard's pages."""
    app = create_app(db, settings, Access(token, hosts=HOSTS), kw.get("read_only", False))
    return TestClient(app, base_url=URL, client=(ADDRESS, 50000), headers={"origin": URL})


def csrf(page: str) -> str:
    found = re.search(r'name="csrf" content="(\w+)"', page)
    assert found is not None
    return found[1]


def test_the_jobs_page_lists_jobs_and_the_job_page_its_steps(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job = finished_job(db, settings, py_repo, tmp_path, "true", price_in=1.0, price_out=2.0)
    web = client(db, settings)
    jobs = web.get("/")
    assert jobs.status_code == 200
    assert f'<tr data-job="{job}">' in jobs.text
    assert '<td class="status completed">completed</td>' in jobs.text
    assert '<td class="steps">2/2</td>' in jobs.text
    assert '<td class="tier">local</td>' in jobs.text
    view = job_view(db, job)  # the page writes what `merlin status --json` says
    assert view["known_cost_usd"] > 0
    assert f'<td class="cost"><span>${view["known_cost_usd"]:.4f}</span></td>' in jobs.text
    assert f"?repo={quote_plus(str(py_repo))}" in jobs.text  # the repository is a filter link
    assert web.get("/?status=done").status_code == 400
    assert "no job matches these filters" in web.get("/?age=1m&status=failed").text
    page = web.get(f"/jobs/{job}")
    assert page.status_code == 200
    assert '<tr data-step="fix">' in page.text
    assert "#1 execute@local: passed (exit 0)</a>" in page.text
    assert web.get(f"/api/jobs/{job}").json()["status"] == "completed"
    assert web.get("/jobs/nope").status_code == 404
    assert web.get("/?status=failed").text.count("<tr data-job=") == 0


def test_an_attempt_shows_its_transcript_output_and_diff(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job = finished_job(db, settings, py_repo, tmp_path, "sh -c 'echo checked'")
    web = client(db, settings)
    page = web.get(f"/jobs/{job}/steps/fix/attempts/1")
    assert page.status_code == 200
    assert "<h2>fix · attempt 1: execute on local</h2>" in page.text
    assert "step_completed" in page.text  # what happened to the step
    panel = web.get(f"/jobs/{job}/steps/fix/attempts/1?panel=1").text
    assert panel.startswith('<div class="attempt" data-attempt="fix#1">')  # a fragment
    assert "-    return 41\n+    return 42" in panel
    assert "-    return 41\n+    return 42" in page.text  # the attempt's own diff
    assert "<pre>checked\n</pre>" in page.text or "<pre>checked</pre>" in page.text
    assert "→ edit_file(" in page.text  # the model's tool call
    calls = job_costs(db, job)["steps"][0]["attempts"][0]["calls"]
    assert calls == 2
    assert panel.count("</tr>", panel.index('<table class="calls">')) == calls + 1  # + header
    assert web.get(f"/jobs/{job}/steps/fix/attempts/9").status_code == 404
    assert web.get(f"/jobs/{job}/steps/nope/attempts/1").status_code == 404


def test_text_is_escaped(db: Database, settings: Settings, py_repo: Path, tmp_path: Path) -> None:
    job = finished_job(db, settings, py_repo, tmp_path, "true")  # a step says "<why> & how"
    page = client(db, settings).get(f"/jobs/{job}").text
    assert "<why>" not in page
    assert "&lt;why&gt; &amp; how" in page


def test_a_token_guards_pages_json_and_stream(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job = finished_job(db, settings, py_repo, tmp_path, "true")
    web = client(db, settings, TOKEN)
    for path in ("/", f"/jobs/{job}", f"/api/jobs/{job}", "/events?after=0", "/api/events"):
        assert web.get(path).status_code == 401, path
    assert (
        web.get("/", headers={"accept": "text/html"}, follow_redirects=False).headers["location"]
        == "/login"
    )
    assert web.get("/healthz").text == "ok"
    assert web.post("/login", data={"token": "wrong"}).status_code == 401
    signed_in = web.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert signed_in.status_code == 303
    assert web.get(f"/api/jobs/{job}").status_code == 200  # the session cookie
    bearer = client(db, settings, TOKEN)
    assert bearer.get("/", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_a_plan_is_shown_approved_and_rejection_is_confirmed(
    db: Database,
    settings: Settings,
    repo: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    published: list[tuple[str, object]] = []
    monkeypatch.setattr(  # the broker is not this test's business; which app publishes is
        workers.canvas,
        "enqueue_job",
        lambda _db, job_id: published.append((job_id, celery.current_app._get_current_object())),
    )
    made = submit_request(db, settings, REQUEST, str(repo))
    web = client(db, settings)
    page = web.get(f"/jobs/{made.job_id}").text
    assert "<h2>plan</h2>" in page
    assert "<td>core</td><td>Feature</td><td>Add Point</td><td>-</td><td>1000</td>" in page
    assert f'data-confirm="reject job {made.job_id}?"' in page
    assert 'action="/jobs/' + made.job_id + '/approve"' in page
    refused = web.post(f"/jobs/{made.job_id}/approve", data={"csrf": "forged"})
    assert refused.status_code == 403
    assert job_status(db, made.job_id) == JobStatus.AWAITING_APPROVAL
    approved = web.post(f"/jobs/{made.job_id}/approve", data={"csrf": csrf(page)},
                        follow_redirects=False)  # fmt: skip
    assert approved.status_code == 303
    assert job_status(db, made.job_id) == JobStatus.PENDING
    assert published == [(made.job_id, merlin_app)]
    approver = f"merlin ui ({ADDRESS})"  # the dashboard has no user: its client's address
    assert web.get(f"/api/jobs/{made.job_id}").json()["plan"]["approved_by"] == approver
    assert f"approved by {approver}" in web.get(f"/jobs/{made.job_id}").text
    again = web.post(f"/jobs/{made.job_id}/approve", data={"csrf": csrf(page)})
    assert again.status_code == 409


def test_read_only_shows_no_action_and_takes_none(
    db: Database,
    settings: Settings,
    repo: Path,  # noqa: F811
) -> None:
    made = submit_request(db, settings, REQUEST, str(repo))
    web = client(db, settings, read_only=True)
    page = web.get(f"/jobs/{made.job_id}").text
    assert "<button" not in page
    assert web.post(f"/jobs/{made.job_id}/reject", data={"csrf": csrf(page)}).status_code == 403
    assert job_status(db, made.job_id) == JobStatus.AWAITING_APPROVAL


@pytest.mark.parametrize("after", ["x", "-1"])
def test_a_bad_event_id_is_a_400(db: Database, settings: Settings, after: str) -> None:
    assert client(db, settings).get(f"/events?after={after}").status_code == 400


def test_the_workers_and_costs_page_and_its_json_agree(db: Database, settings: Settings) -> None:
    from merlin_flow.engine.presence import beat

    beat(db, "w-llm@a", ["llm", "control"])
    web = client(db, settings)
    page = web.get("/fleet?days=7")
    assert page.status_code == 200
    assert "w-llm@a" in page.text
    view = web.get("/api/fleet?days=7").json()
    served = {queue["queue"] for queue in view["queues"] if queue["workers"]}
    assert served == {"llm", "control"}
    assert "verify" in {warning["queue"] for warning in view["warnings"]}
    assert web.get("/fleet?days=x").status_code == 400
    assert client(db, settings, TOKEN).get("/api/fleet").status_code == 401


def test_a_questions_conversation_has_a_page_with_its_calls(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    from tests.unit.jobs.test_logs import _repo

    asked = _repo(tmp_path, {"content": "It returns 41."})
    made = submit_request(db, settings, "What does answer() return?", str(asked))
    page = client(db, settings).get(f"/jobs/{made.job_id}/steps/question/attempts/1")
    assert page.status_code == 200
    assert "It returns 41." in page.text
    assert page.text.count("<td>local</td>") == 2  # its two calls, made for the job


def test_a_plan_is_rejected_from_the_page_and_the_rejecter_recorded(
    db: Database,
    settings: Settings,
    repo: Path,  # noqa: F811
) -> None:
    made = submit_request(db, settings, REQUEST, str(repo))
    web = client(db, settings)
    token = csrf(web.get(f"/jobs/{made.job_id}").text)
    rejected = web.post(f"/jobs/{made.job_id}/reject", data={"csrf": token},
                        follow_redirects=False)  # fmt: skip
    assert (rejected.status_code, rejected.headers["location"]) == (303, f"/jobs/{made.job_id}")
    assert job_status(db, made.job_id) == JobStatus.REJECTED
    assert job_view(db, made.job_id)["plan"]["rejected_by"] == f"merlin ui ({ADDRESS})"
    page = web.get(f"/jobs/{made.job_id}").text
    assert f"rejected by merlin ui ({ADDRESS})" in page
    assert "<button" not in page  # nothing left to do to a rejected plan
    assert web.post(f"/jobs/{made.job_id}/approve", data={"csrf": token}).status_code == 409


def test_a_plan_shows_the_specs_it_drew_on_when_its_record_has_them(
    db: Database,
    settings: Settings,
    repo: Path,  # noqa: F811
) -> None:
    from merlin_flow.store import Job

    made = submit_request(db, settings, REQUEST, str(repo))
    web = client(db, settings)
    planned = web.get(f"/jobs/{made.job_id}").text  # the planner recorded what it drew on
    assert '<ul id="plan-specs"><li><code>specs/geo.md</code></li></ul>' in planned

    def record(specs: list[str] | None) -> str:
        with db.session() as session:
            job = session.get_one(Job, made.job_id)
            plan = dict(job.plan or {})
            plan.pop("specs", None)
            job.plan = plan if specs is None else dict(plan, specs=specs)
        return web.get(f"/jobs/{made.job_id}").text

    assert "specs it drew on" not in record(None)  # a plan made before they were recorded

    page = record(["specs/geo.md", "specs/<api>.md"])
    assert "<h3>specs it drew on</h3>" in page
    assert '<ul id="plan-specs"><li><code>specs/geo.md</code></li>' in page
    assert "<code>specs/&lt;api&gt;.md</code>" in page  # escaped
    assert "none: the planner's prompt held no spec's constraints" in record([])


def test_cancel_and_resume_from_the_page_are_the_clis_operations(
    db: Database,
    settings: Settings,
    py_repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.unit.scripted_jobs import scripted_job

    published: list[str] = []
    monkeypatch.setattr(workers.canvas, "enqueue_job", lambda _db, job_id: published.append(job_id))
    job = scripted_job(db, settings, py_repo, tmp_path)  # pending: no worker takes it
    web = client(db, settings)
    page = web.get(f"/jobs/{job}").text
    assert f'data-confirm="cancel job {job}?"' in page  # the page asks first
    assert 'action="/jobs/' + job + '/resume"' not in page
    token = csrf(page)
    assert web.post(f"/jobs/{job}/cancel", data={"csrf": "forged"}).status_code == 403
    assert job_status(db, job) == JobStatus.PENDING
    cancelled = web.post(f"/jobs/{job}/cancel", data={"csrf": token}, follow_redirects=False)
    assert cancelled.status_code == 303
    view = job_view(db, job)
    assert (view["status"], view["steps"][0]["status"]) == ("cancelled", "Skipped")
    assert web.post(f"/jobs/{job}/cancel", data={"csrf": token}).status_code == 409  # ended
    page = web.get(f"/jobs/{job}").text
    assert 'action="/jobs/' + job + '/resume"' in page
    assert 'action="/jobs/' + job + '/cancel"' not in page
    assert published == []
    resumed = web.post(f"/jobs/{job}/resume", data={"csrf": token}, follow_redirects=False)
    assert resumed.status_code == 303
    view = job_view(db, job)
    assert (view["status"], view["finished_at"], view["steps"][0]["status"]) == (
        "pending", None, "Pending")  # fmt: skip
    assert published == [job]  # its tasks published, as `merlin resume` does
    assert web.post(f"/jobs/{job}/resume", data={"csrf": token}).status_code == 409
    assert web.post(f"/jobs/{job}/nope", data={"csrf": token}).status_code == 409


def test_polling_gets_the_events_the_stream_would_send(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from merlin_flow.ui import server, stream

    job = finished_job(db, settings, py_repo, tmp_path, "true")
    web = client(db, settings)
    every = web.get("/api/events?after=0")
    assert every.headers["cache-control"] == "no-store"
    assert every.json() == stream.events_after(db, 0)
    ids = [event["id"] for event in every.json()]
    assert ids == sorted(ids)
    assert len(ids) > 3
    assert [e["id"] for e in web.get(f"/api/events?after={ids[2]}").json()] == ids[3:]
    assert web.get(f"/api/events?after={ids[-1]}").json() == []
    assert web.get(f"/api/events?after=0&job={job}").json() == every.json()
    assert web.get("/api/events?after=0&job=other").json() == []
    assert web.get("/api/events?after=x").status_code == 400
    # The stream itself asks proxies not to buffer it (nginx: X-Accel-Buffering).
    monkeypatch.setattr(server, "feed", lambda db, after, job_id: stream.feed(
        db, after, job_id, until=time.monotonic() + 0.2))  # fmt: skip
    streamed = web.get("/events?after=0")
    assert streamed.headers["x-accel-buffering"] == "no"
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.text.count("event: merlin") == len(ids)
