"""The GitHub loop: what ``merlin github`` does with one event's outcome.

- a label or ``/merlin plan`` (or ``/merlin <request>`` on an issue): the request is
  planned and the plan posted with its signed block; a question is answered instead.
  With the ``merlin:auto`` label the plan runs at once;
- ``/merlin approve`` (or ``retry``): the thread's plan, checked, runs as a job on the
  runner; its progress is one comment edited in place; the branch is pushed as
  ``merlin/<number>-<job>`` and a draft pull request opened (a failed job's branch is
  pushed too, for inspection, and no pull request opened);
- ``/merlin reject``: the plan is marked rejected and cannot be approved;
- ``/merlin <request>`` on a pull request: a job on the pull request's own branch,
  approved by asking, pushed to that branch; rounds per pull request are capped;
- ``/merlin cancel``: the thread's job on the team's workers is cancelled; a job on the
  runner stops with its workflow run, which is said.

Nothing is pushed to the repository's default branch: a pull request whose branch it is
is refused. A pull request's jobs take their configuration from ``--config``, else from
the default branch's ``merlin.toml``, never from the pull request's head, which may hold
the model's commits of an earlier round (``_base_config``). What merlin reads back from
the thread (its signed plan, its progress marks, what it said) is read from the comments
of its own identity only (``own_comments``).

Returns the exit code: 0 done, 1 the job failed, 2 bad input (answered in the thread).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from merlin_flow.config import load_config
from merlin_flow.config_files import CONFIG_FILE_NAME
from merlin_flow.errors import InputError, JobNotFoundError, PlanRefused
from merlin_flow.github.api import Comment, GitHubApi
from merlin_flow.github.events import (
    Command,
    Ignore,
    Outcome,
    Reply,
    Thread,
    Trigger,
    fork_refusal,
)
from merlin_flow.github.plan_block import BLOCK, SignedPlan, read_plan, write_block
from merlin_flow.github.running import push, with_token, work_job, write_reports
from merlin_flow.github.thread import followed_job, plan_comment, pull_request_body
from merlin_flow.jobs.control import cancel_job, resume_job
from merlin_flow.jobs.requesting import plan_record, request_context, submit_request
from merlin_flow.jobs.submission import default_exit_commands, submit_job
from merlin_flow.jobs.views import job_status, job_view
from merlin_flow.planning.planner import make_plan
from merlin_flow.planning.reading import to_tasklist
from merlin_flow.settings import Settings
from merlin_flow.store import FINAL_JOB_STATUSES, Database, JobStatus, StepStatus
from merlin_flow.tasklist import TaskList
from merlin_flow.workspace.git import add_worktree, git, remove_worktree
from merlin_flow.workspace.repository import refusals_as_input_errors, repository_for_input

REJECTED = "<!-- merlin-rejected -->"


@dataclass(frozen=True)
class Place:
    """Where this run works: the repository's API, its checkout, and the team's choices."""

    api: GitHubApi
    workspace: Path
    """The checkout (``GITHUB_WORKSPACE``): the job's repository, pushed to its origin."""
    token: str
    plan_key: str | None
    out: Path
    """Where the job's patch, summary and JUnit report go, for the workflow's artifacts."""
    run_url: str | None = None
    config_path: Path | None = None
    budget: float | None = None
    auto_label: str = "merlin:auto"
    max_rounds: int = 3
    submit_to: bool = False
    """Approved plans go to the team's workers (``MERLIN_BROKER_URL``,
    ``MERLIN_DATABASE_URL``) on the repository's URL; the runner follows them."""


def handle(outcome: Outcome, place: Place, db: Database, settings: Settings) -> int:
    """Act on ``outcome``; InputError answers are posted in the thread before they exit 2."""
    if isinstance(outcome, Ignore):
        return 0
    if isinstance(outcome, Reply):
        if outcome.thread.from_fork:
            return _refuse_fork(outcome, place)
        place.api.post(outcome.thread.number, outcome.text)
        return outcome.exit_code
    try:
        return _act(outcome, place, db, settings)
    except InputError as exc:
        place.api.post(outcome.thread.number, f"merlin cannot do that: {exc}")
        raise


def _act(trigger: Trigger, place: Place, db: Database, settings: Settings) -> int:
    thread, command = trigger.thread, trigger.command
    if thread.is_pull_request and thread.head_repository is None:  # an issue_comment
        pull = place.api.pull(thread.number)
        thread = Thread(**{**vars(thread), "head_ref": pull.head_ref,
                           "head_repository": pull.head_repository})  # fmt: skip
        if thread.from_fork:
            return _refuse_fork(fork_refusal(thread), place)
    if command is Command.CANCEL:
        job = _team_job(thread, place, db) if place.submit_to else None
        said = _CANCEL if job is None else f"Job `{job}`: {cancel_job(db, settings, job)}."
        place.api.post(thread.number, said)
        return 0
    if thread.is_pull_request and command is not Command.REJECT:
        default = place.api.default_branch()
        if thread.head_ref == default:
            place.api.post(thread.number, _DEFAULT.format(branch=default))
            return 0
        with _base_config(place, default, settings) as config_path:
            return _obey(trigger, thread, replace(place, config_path=config_path), db, settings)
    return _obey(trigger, thread, place, db, settings)


def _obey(trigger: Trigger, thread: Thread, place: Place, db: Database, settings: Settings) -> int:
    """Do what ``trigger`` asks in ``thread``, an issue or a pull request of this repository."""
    command = trigger.command
    if command is Command.REQUEST and thread.is_pull_request:
        return _review_round(trigger, thread, place, db, settings)
    if command in (Command.PLAN, Command.REQUEST):
        if thread.is_pull_request:  # planned on the pull request's branch, not a merge
            _check_out(place, thread.head_ref or "")
        request = f"{thread.title}\n\n{thread.body}".strip()
        if trigger.text:
            request += f"\n\n{trigger.text}"
        return _plan(thread, request, place, db, settings)
    if command is Command.RETRY and place.submit_to and (job := _team_job(thread, place, db)):
        return _resume(thread, job, place, db, settings)
    plan, comment = _thread_plan(thread, place)
    if command is Command.REJECT:
        place.api.edit(thread.number, comment.id, f"{comment.body}\n\n~~Rejected by "
                       f"@{trigger.author}.~~ {REJECTED}\n")  # fmt: skip
        return 0
    if command is Command.APPROVE and _already_run(thread, place, comment):
        raise InputError("this plan has run already; `/merlin retry` runs it again")
    return _run_plan(thread, plan, place, db, settings)


_CANCEL = (
    "A job merlin runs on a workflow runner stops with its run: cancel the workflow run "
    "(Actions > the run > Cancel workflow). Its branch keeps what passed so far."
)
_DEFAULT = (
    "merlin does not work on this pull request: its branch is `{branch}`, the "
    "repository's default branch, and merlin never pushes to the default branch. Open "
    "the pull request from another branch and ask again."
)


def _refuse_fork(reply: Reply, place: Place) -> int:
    """Post the refusal of a fork's pull request, or say on stderr that it could not be.

    GitHub gives a fork's pull request events a read-only token: then nothing is said
    in the thread, and the exit code is 0 all the same.
    """
    if place.api.post_if_allowed(reply.thread.number, reply.text) is None:
        print(
            f"merlin github: said nothing in #{reply.thread.number}: the token may not "
            f"comment there (HTTP 403, a fork's read-only token); {reply.text.splitlines()[0]}",
            file=sys.stderr,
        )
        return 0
    return reply.exit_code


def _plan(thread: Thread, request: str, place: Place, db: Database, settings: Settings) -> int:
    key = _key(place)
    repository = repository_for_input(str(place.workspace), settings)
    with refusals_as_input_errors(repository):
        base = repository.base_commit()
    with repository.files_at(base) as files:
        config = load_config(files, place.config_path, settings.home_dir, settings.system_config)
    made = make_plan(request, config, request_context(repository, base, config, request))
    if not made.steps:  # a question: answered here, no branch
        asked = submit_request(db, settings, request, str(place.workspace), place.config_path)
        answer = job_view(db, asked.job_id)["answer"] or "(no answer)"
        place.api.post(thread.number, f"### merlin's answer\n\n{answer}\n")
        return 0
    tasklist = to_tasklist(request, made.steps)
    with repository.files_at(base) as files:  # each step's exit command, as the job's
        defaults = default_exit_commands(tasklist, config, files)
    commands = dict(zip([step.id for step in tasklist.steps], defaults, strict=True))
    dumped = tasklist.model_dump(mode="json", exclude={"id"}, exclude_none=True,
                                 exclude_defaults=True)  # fmt: skip
    text = yaml.safe_dump(dumped, sort_keys=False, allow_unicode=True)
    signed = SignedPlan(place.api.repository, thread.number, request, text, base)
    auto = place.auto_label in thread.labels
    record = plan_record(made, tasklist.model_dump(mode="json"))
    comment = plan_comment(record, config, tasklist, commands, write_block(signed, key), auto)
    place.api.post(thread.number, comment)
    return _run_plan(thread, signed, place, db, settings) if auto else 0


def _thread_plan(thread: Thread, place: Place) -> tuple[SignedPlan, Comment]:
    """The latest plan merlin posted in the thread, checked; PlanRefused if there is none."""
    me = place.api.identity()
    mine = [c for c in place.api.own_comments(thread.number) if BLOCK.search(c.body)]
    if not mine:
        raise PlanRefused("there is no plan in this thread yet: ask for one with /merlin plan")
    comment = mine[-1]
    if REJECTED in comment.body:
        raise PlanRefused("this plan was rejected: ask for a new one with /merlin plan")
    plan = read_plan(comment.body, comment.author, me, place.api.repository, thread.number,
                     _key(place))  # fmt: skip
    return plan, comment


def _already_run(thread: Thread, place: Place, plan_comment: Comment) -> bool:
    later = [c for c in place.api.own_comments(thread.number) if c.id > plan_comment.id]
    return any(followed_job(c.body) for c in later)


def _run_plan(
    thread: Thread, plan: SignedPlan, place: Place, db: Database, settings: Settings
) -> int:
    team = place.submit_to and not thread.is_pull_request
    if team:  # the workers fetch and push where the runner's checkout came from
        repo = git("remote", "get-url", "origin", cwd=place.workspace)
        if "://" not in repo and "@" not in repo:  # a path: a URL the workers clone
            repo = (place.workspace / repo).resolve().as_uri()
    else:
        git("checkout", "--quiet", "--detach", plan.base, cwd=place.workspace)
        repo = str(place.workspace)
    with tempfile.TemporaryDirectory(prefix="merlin-plan-") as folder:
        tasklist = Path(folder) / "tasklist.yaml"
        tasklist.write_text(plan.tasklist)
        TaskList.model_validate(yaml.safe_load(plan.tasklist))  # a clear error if it broke
        job = submit_job(db, settings, tasklist, repo, place.config_path, place.budget,
                         works_here=not team, check_tiers=not team)  # fmt: skip
    onto = thread.head_ref if thread.is_pull_request else None  # never a second pull request
    return _finish(thread, job.job_id, onto, place, db, settings, here=not team)


def _team_job(thread: Thread, place: Place, db: Database) -> str | None:
    """The job the thread's last progress comment follows, if the team's database has it."""
    comments = place.api.own_comments(thread.number)
    followed = [job for c in comments if (job := followed_job(c.body))]
    if not followed:
        return None
    try:
        job_status(db, followed[-1])
    except JobNotFoundError:
        return None
    return followed[-1]


def _reported(thread: Thread, place: Place, job_id: str) -> bool:
    """Whether the end of ``job_id`` was said in the thread (its runner lived to say it)."""
    ends = ("Draft pull request: ", "Pushed to `", f"`merlin/{thread.number}-{job_id}`")
    comments = place.api.own_comments(thread.number)
    follows = [c.id for c in comments if followed_job(c.body) == job_id]
    later = [c.body for c in comments if follows and c.id > follows[0]]
    return any(end in body for body in later for end in ends)


def _resume(thread: Thread, job_id: str, place: Place, db: Database, settings: Settings) -> int:
    """Follow a job of the team's workers again (its runner died), resumed if it ended."""
    status = job_status(db, job_id)
    if status == JobStatus.COMPLETED and _reported(thread, place, job_id):
        place.api.post(thread.number, f"Job `{job_id}` completed already.")
        return 0
    ended = status in FINAL_JOB_STATUSES
    if ended:
        resume_job(db, settings, job_id, check_tiers=False)
    return _finish(thread, job_id, None, place, db, settings, here=False, publish=ended)


def _rounds(thread: Thread, place: Place) -> int:
    """The jobs merlin ran in the thread: its own progress comments."""
    return sum(1 for c in place.api.own_comments(thread.number) if followed_job(c.body))


def _review_round(
    trigger: Trigger, thread: Thread, place: Place, db: Database, settings: Settings
) -> int:
    if _rounds(thread, place) >= place.max_rounds:
        place.api.post(thread.number, f"This pull request has had its {place.max_rounds} "
                       "rounds of merlin (the cap): a person takes it from here.")  # fmt: skip
        return 0
    branch = thread.head_ref or ""
    _check_out(place, branch)
    request = trigger.text
    if trigger.path:
        lines = trigger.lines or (0, 0)
        request += f"\n\n(On {trigger.path}, lines {lines[0]}-{lines[1]}.)"
    made = submit_request(db, settings, request, str(place.workspace), place.config_path,
                          place.budget, approved_by=trigger.author)  # fmt: skip
    if made.status == JobStatus.COMPLETED:  # a question about the pull request
        answer = job_view(db, made.job_id)["answer"] or "(no answer)"
        place.api.post(thread.number, f"### merlin's answer\n\n{answer}\n")
        return 0
    return _finish(thread, made.job_id, branch, place, db, settings)


def _finish(
    thread: Thread,
    job_id: str,
    onto: str | None,
    place: Place,
    db: Database,
    settings: Settings,
    here: bool = True,
    publish: bool = True,
) -> int:
    """Work (``here``) or follow the job, push its branch, and report.

    The branch goes ``onto`` a pull request's, or to a new one for a new pull request.
    """
    api, number = place.api, thread.number
    view = work_job(db, job_id, api, number, place.run_url, here, publish).view
    if not here:  # the workers pushed it to the remote
        branch = f"refs/heads/merlin/{job_id}"
        with_token(
            place.workspace, place.token, "fetch", "--quiet", "origin", f"+{branch}:{branch}"
        )
    write_reports(db, settings, view, place.out)
    completed = view["status"] == JobStatus.COMPLETED
    target = onto if onto is not None and completed else f"merlin/{thread.number}-{job_id}"
    tried = [a["commit"] for step in view["steps"] if step["status"] == StepStatus.FAILED
             for a in step["attempts"] if a["commit"]]  # fmt: skip
    if not completed and tried and here:  # what the failed step's last attempt made
        push(place.workspace, place.token, tried[-1], target)
        place.api.post(number, f"`{target}` holds the failed step's last attempt, to inspect.")
        return 1
    push(place.workspace, place.token, f"merlin/{job_id}", target)
    if not completed:
        place.api.post(number, f"The job's branch is `{target}`, for inspection.")
        return 1
    if onto is not None:
        place.api.post(thread.number, f"Pushed to `{onto}`: {view['title']}.")
        return 0
    base = place.api.default_branch()
    title = f"merlin: {view['title']}"
    body = pull_request_body(thread.number, view)
    pull = place.api.open_draft(title, body, target, base)
    place.api.post(thread.number, f"Draft pull request: {pull.url}")
    return 0


def _check_out(place: Place, branch: str) -> None:
    """Put the checkout at the tip of the pull request's ``branch`` (detached)."""
    with_token(place.workspace, place.token, "fetch", "--quiet", "origin", f"refs/heads/{branch}")
    git("checkout", "--quiet", "--detach", "FETCH_HEAD", cwd=place.workspace)


@contextmanager
def _base_config(place: Place, branch: str, settings: Settings) -> Iterator[Path]:
    """The configuration file of a pull request's jobs: ``--config``, else ``branch``'s.

    A pull request's head may hold the model's own commits (merlin pushes its rounds
    there), so no file of it is read. The default ``branch``'s head is checked out beside
    the workspace; its ``merlin.toml``, checked as a repository's own (``refuse_loosening``),
    is handed to the jobs as their ``--config``: the same settings, and the pull request's
    file is not read. A ``--config`` inside the workspace (the workflow's), which moves to
    the pull request's head, is read from there too. The checkout stays until the job
    ends: a scripted tier's script is read at each call.
    """
    given, top = place.config_path, Path(os.path.abspath(place.workspace))
    chosen = None if given is None else Path(os.path.abspath(given.expanduser()))
    if chosen is not None and not chosen.is_relative_to(top):
        yield chosen
        return
    with_token(place.workspace, place.token, "fetch", "--quiet", "origin", f"refs/heads/{branch}")
    commit = git("rev-parse", "FETCH_HEAD^{commit}", cwd=place.workspace)
    with tempfile.TemporaryDirectory(prefix="merlin-base-") as folder:
        tree = add_worktree(place.workspace, Path(folder) / "base", commit)
        try:
            own = tree / (CONFIG_FILE_NAME if chosen is None else chosen.relative_to(top))
            if chosen is None:  # the repository's own file, checked as such
                load_config(tree, None, settings.home_dir, settings.system_config)
                if not own.is_file():  # none: the shipped defaults and the system file
                    own = Path(folder) / CONFIG_FILE_NAME
                    own.write_text("")
            yield own
        finally:
            remove_worktree(place.workspace, tree)


def _key(place: Place) -> str:
    if not place.plan_key:
        raise InputError(
            "MERLIN_PLAN_KEY is not set: plans travel signed with it between workflow runs; "
            "add it as a repository secret (`openssl rand -hex 32`)"
        )
    return place.plan_key
