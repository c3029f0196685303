"""A job worked and followed, its progress edited into one comment, its branch pushed.

The job runs on the embedded defaults, in this process (``workers.roles.EmbeddedWorker``),
as ``merlin run`` runs it; or, with ``merlin github --submit-to``, on the team's own
workers, the runner only following it. Every ``POLL`` seconds its view is rendered; the progress
comment is edited only when that text changed, so the thread sees one comment edited at
each step's start, pass, escalation or failure, and no more. The job branch is pushed to
the checkout's ``origin`` with the token in a header for that one command, never in the
URL or the repository's configuration.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from merlin_flow.github.api import Comment, GitHubApi
from merlin_flow.github.thread import progress_comment
from merlin_flow.jobs.reports import junit_xml, write_atomically
from merlin_flow.jobs.views import JobView, job_diff, job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.workspace.git import git

POLL = 0.5
"""Seconds between looks at the running job."""


@dataclass(frozen=True)
class Finished:
    """A job that ended: its last view and the comment that followed it."""

    view: JobView
    comment: Comment


def work_job(
    db: Database,
    job_id: str,
    api: GitHubApi,
    number: int,
    run_url: str | None,
    here: bool = True,
    publish: bool = True,
    sleep: Callable[[float], None] = time.sleep,
) -> Finished:
    """Work ``job_id`` until it ends, keeping its progress comment up to date.

    ``here``: in this process; otherwise the team's workers do. ``publish``: send what
    the job waits for (not for a job the workers already run).
    """
    from workers.app import app as celery_app
    from workers.canvas import enqueue_job
    from workers.roles import EmbeddedWorker

    worker = EmbeddedWorker(celery_app) if here else None
    if publish:
        enqueue_job(db, job_id)
    if worker is not None:
        worker.start()
    try:
        return follow_job(db, job_id, api, number, run_url, sleep)
    finally:
        if worker is not None:
            worker.stop()


def follow_job(
    db: Database,
    job_id: str,
    api: GitHubApi,
    number: int,
    run_url: str | None,
    sleep: Callable[[float], None] = time.sleep,
) -> Finished:
    """Post the job's progress comment, edit it as the job moves, return when it ends."""
    shown = progress_comment(job_view(db, job_id), run_url)
    comment = api.post(number, shown)
    while True:
        view = job_view(db, job_id)
        text = progress_comment(view, run_url)
        if text != shown:
            api.edit(number, comment.id, text)
            shown = text
        if view["finished_at"] is not None:
            return Finished(view, Comment(comment.id, comment.author, shown))
        sleep(POLL)


def write_reports(db: Database, settings: Settings, view: JobView, out: Path) -> None:
    """The job's patch, summary and JUnit report in ``out``, for the workflow's artifacts."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "merlin.patch", job_diff(db, settings, view["id"]))
    write_atomically(out / "junit.xml", junit_xml(view))
    write_atomically(out / "summary.md", summary_of(view))


def summary_of(view: JobView) -> str:
    """The job's summary (``summary.md`` beside its patch), or a line when there is none."""
    if view["patch"]:
        summary = Path(view["patch"]).with_name("summary.md")
        if summary.is_file():
            return summary.read_text()
    return f"# {view['title']}\n\nJob {view['id']} ended {view['status']}.\n"


def push(workspace: Path, token: str, source: str, target: str) -> None:
    """Push ``source`` (a local branch, or a commit) to ``origin``'s branch ``target``."""
    refspec = f"{source if len(source) == 40 else f'refs/heads/{source}'}:refs/heads/{target}"
    with_token(workspace, token, "push", "--quiet", "origin", refspec)


def with_token(workspace: Path, token: str, *args: str) -> str:
    """Run git with ``token`` as the HTTP authorization of this one command.

    The token goes in git's environment (``GIT_CONFIG_*``), so that no error message,
    which names the command's arguments, can carry it.
    """
    header = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    env = {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraheader",
        "GIT_CONFIG_VALUE_0": f"AUTHORIZATION: basic {header}",
    }
    return git(*args, cwd=workspace, env=env)
