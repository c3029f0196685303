"""The jobs page's filters: kept in the URL, checked, and paged by a cursor over many jobs."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from merlin_flow.errors import InputError
from merlin_flow.jobs.views import list_jobs
from merlin_flow.store import Database, Job, JobStatus, utcnow
from merlin_flow.ui.filters import JobsFilter

SERIAL = itertools.count()


def add_jobs(db: Database, count: int, repo: str = "/srv/app", age_hours: float = 0) -> list[str]:
    """``count`` jobs a second apart, the last ``age_hours`` ago; their ids, newest first."""
    newest = utcnow() - timedelta(hours=age_hours)
    ids = []
    with db.session() as session:
        for number in range(count):
            job_id = f"{repo.rsplit('/', 1)[-1]}{age_hours:g}h{number:04d}-{next(SERIAL)}"
            session.add(
                Job(id=job_id, title=f"job {number}", repo=repo,
                    status=(JobStatus.FAILED if number % 3 == 0 else JobStatus.COMPLETED).value,
                    branch=f"merlin/{job_id}", base_commit="0" * 40, head_commit="0" * 40,
                    tasklist={}, config={},
                    created_at=newest - timedelta(seconds=count - 1 - number))
            )  # fmt: skip
            ids.append(job_id)
    return ids[::-1]


def test_a_filter_round_trips_through_its_url() -> None:
    wanted = JobsFilter.from_query({"status": "failed", "repo": "/srv/a b", "age": "7d"})
    assert wanted.status is JobStatus.FAILED
    assert wanted.query() == "?status=failed&repo=%2Fsrv%2Fa+b&age=7d"
    again = JobsFilter.from_query(dict(pair.split("=") for pair in wanted.query()[1:].split("&")))
    assert again.status is JobStatus.FAILED
    assert again.age == "7d"
    assert JobsFilter().query() == ""
    assert wanted.next_page("j9") == wanted.query() + "&before=j9"
    assert JobsFilter.from_query({"before": "j9", "age": "1h"}).first_page == "?age=1h"


@pytest.mark.parametrize(
    ("query", "problem"),
    [({"status": "done"}, "status 'done' is not a job status"),
     ({"age": "week"}, "age 'week': use a number and m, h, d or w")],
)  # fmt: skip
def test_a_bad_filter_is_named(query: dict[str, str], problem: str) -> None:
    with pytest.raises(InputError, match=problem):
        JobsFilter.from_query(query)


def test_pages_by_cursor_cover_every_job_once_even_while_jobs_arrive(db: Database) -> None:
    ids = add_jobs(db, 250)
    seen: list[str] = []
    before = None
    while True:
        page = list_jobs(db, 100, before=before)
        seen += [entry["id"] for entry in page]
        if len(page) < 100:
            break
        before = page[-1]["id"]
        add_jobs(db, 3, repo="/srv/new")  # newer jobs never shift the older pages
    assert seen == ids


def test_status_repository_and_age_narrow_the_list(db: Database) -> None:
    old = add_jobs(db, 4, age_hours=48)
    recent = add_jobs(db, 5, age_hours=1)
    other = add_jobs(db, 2, repo="/srv/other")
    listed = [e["id"] for e in list_jobs(db, 50, since=utcnow() - timedelta(hours=24))]
    assert listed == other + recent
    assert [e["id"] for e in list_jobs(db, 50, repo="/srv/other")] == other
    failed = list_jobs(db, 50, [JobStatus.FAILED], repo="/srv/app")
    assert {e["id"] for e in failed} == {j for j in old + recent if "h0000-" in j or "h0003-" in j}
    with pytest.raises(InputError, match="no job with id 'nope'"):
        list_jobs(db, 50, before="nope")
