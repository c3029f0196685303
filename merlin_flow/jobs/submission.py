"""Submitting a job: every check first, then the job branch and the job's rows.

``submit_job`` is the one entry point for a TaskList from a user (``merlin run``,
``merlin submit``, a library caller): it loads and checks the TaskList, the repository,
the configuration read from the same commit, the tiers and the sandbox, and writes
nothing until all of it holds. ``create_job`` records a job from parts already checked
(``merlin demo``, ``merlin replay``). Enqueuing the job is the caller's business
(``workers.canvas.enqueue_job``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from merlin_flow.agents.choice import AgentChoice, agent_tier_index, choose_agents
from merlin_flow.agents.definitions import load_agents
from merlin_flow.config import MerlinConfig, load_config, scripts_inside
from merlin_flow.config_files import CONFIG_FILE_NAME
from merlin_flow.engine.budget import require_priced_tiers
from merlin_flow.engine.graph import dependencies, runnable
from merlin_flow.engine.leases import queued_values
from merlin_flow.errors import ConfigError, InputError, RecordInDoubt
from merlin_flow.failures import AttemptKind
from merlin_flow.models.credentials import require_a_usable_tier
from merlin_flow.models.endpoints import pin_endpoints
from merlin_flow.planning.route_learning import RouteBook, route_book
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, JobStatus, Phase, Step, StepStatus
from merlin_flow.store.database import write_patiently
from merlin_flow.store.events import EventKind, add_event
from merlin_flow.store.redaction import refer_to_secrets
from merlin_flow.tasklist import TaskList, load_tasklist
from merlin_flow.workspace.exit_commands import exit_command_for, refuse_shell_syntax
from merlin_flow.workspace.git import job_branch, uncommitted_files
from merlin_flow.workspace.repository import (
    JobRepository,
    refusals_as_input_errors,
    repository_for_input,
)

UNCOMMITTED = (
    "{repo} has uncommitted changes ({files}); the job starts from HEAD {head} without "
    "them: commit them first to include them"
)


@dataclass(frozen=True)
class Submission:
    """A job recorded and ready to enqueue, with the configuration it will run with."""

    job_id: str
    config: MerlinConfig
    warnings: tuple[str, ...] = ()
    """What the submitter should know (uncommitted changes left out of the job...)."""


def submit_job(
    db: Database,
    settings: Settings,
    tasklist: TaskList | Path,
    repo: str,
    config_path: Path | None = None,
    budget_usd: float | None = None,
    *,
    works_here: bool = False,
    check_tiers: bool = True,
) -> Submission:
    """Check a TaskList and its repository, then record the job. Writes nothing on error.

    ``repo`` is a work tree's path or a git URL; the configuration is ``config_path`` or
    the repository's ``merlin.toml``, read from the commit the job starts at.
    ``works_here``: this process works the job, so the sandbox must run here.
    ``check_tiers``: refuse when no tier's key or server can be reached from here (off
    when only the workers hold the keys). Raises InputError (exit code 2).
    """
    check_budget(budget_usd)
    tasklist_file = tasklist if isinstance(tasklist, Path) else None
    if isinstance(tasklist, Path):
        tasklist = load_tasklist(tasklist)
    tasklist.check_submittable()
    repository = repository_for_input(repo, settings)
    with refusals_as_input_errors(repository):
        base = repository.base_commit()
    with repository.files_at(base) as files:  # one checkout for a URL: config and exit commands
        config = load_config(files, config_path, settings.home_dir, settings.system_config)
        if repository.url is not None and scripts_inside(config, files):
            raise ConfigError(
                f"merlin.toml in {repo} names scripted models by paths inside the repository, "
                "and workers do not read files from a git URL's checkout: give --config"
            )
        commands = default_exit_commands(tasklist, config, files)
        agents = choose_agents(tasklist.steps, config, load_agents(files, settings.home_dir))
    check_exit_commands(tasklist, config, commands)
    if check_tiers:
        require_a_usable_tier(config)
    if works_here:
        from merlin_flow.workspace.sandbox import check_sandbox

        check_sandbox(config.sandbox)
    job_id = create_job(
        db,
        settings,
        tasklist,
        repository,
        config,
        budget_usd,
        base_commit=base,
        exit_commands=commands,
        agents=agents,
    )
    # The files that made the job are read as they are: no need to commit them.
    inputs = [p for p in (tasklist_file, config_path) if p is not None]
    inputs.append(repository.path / CONFIG_FILE_NAME)
    return Submission(job_id, config, left_out_warnings(repository, repo, base, inputs))


def left_out_warnings(
    repository: JobRepository, repo: str, base: str, inputs: list[Path]
) -> tuple[str, ...]:
    """Uncommitted changes the job leaves out (not counting its TaskList and config files)."""
    if repository.url is not None:
        return ()
    top = repository.path.resolve()
    own = {
        p.resolve().relative_to(top).as_posix() for p in inputs if p.resolve().is_relative_to(top)
    }
    files = [  # agent files are read from the work tree: they are in, committed or not
        f
        for f in uncommitted_files(repository.path)
        if f not in own and not f.startswith(".merlin/agents/")
    ]
    if not files:
        return ()
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return (UNCOMMITTED.format(repo=repo, files=shown, head=base[:10]),)


def check_budget(budget_usd: float | None) -> None:
    """InputError unless the budget is unset or more than 0 USD."""
    if budget_usd is not None and not budget_usd > 0:
        raise InputError(f"--budget must be more than 0 USD, not {budget_usd:g}")


def new_job_id() -> str:
    """A short unique job id (safe in branch names)."""
    return uuid.uuid4().hex[:12]


def create_job(
    db: Database,
    settings: Settings,
    tasklist: TaskList,
    repo: JobRepository | Path | str,
    config: MerlinConfig,
    budget_usd: float | None = None,
    *,
    base_commit: str | None = None,
    replay_of: str | None = None,
    exit_commands: list[str] | None = None,
    agents: list[AgentChoice] | None = None,
) -> str:
    """Validate and record a job; returns its id. Raises InputError and writes nothing.

    ``repo`` is a git work tree's path or a git URL (see ``merlin_flow.workspace.repository``).
    The job starts from ``base_commit`` (the repository's HEAD when unset). A job with
    ``replay_of`` takes its model answers from that job's journal (``merlin replay``),
    and the original's ``exit_commands`` (one per step) rather than today's defaults.
    ``agents``: each step's agent (``merlin_flow.agents.choice.choose_agents``); chosen
    here if unset.
    """
    tasklist.check_submittable()
    config = pin_endpoints(config)  # the submitter's endpoints, for every worker
    budget_usd = budget_usd if budget_usd is not None else config.budget_usd
    require_priced_tiers(config, tasklist, budget_usd)
    repository = (
        repo if isinstance(repo, JobRepository) else repository_for_input(str(repo), settings)
    )
    with refusals_as_input_errors(repository):
        base = base_commit or repository.base_commit()
        commands = exit_commands
        if not commands or agents is None:
            with repository.files_at(base) as files:
                commands = commands or default_exit_commands(tasklist, config, files)
                catalog = load_agents(files, settings.home_dir)
                agents = agents or choose_agents(tasklist.steps, config, catalog)
        job_id = new_job_id()
        branch = job_branch(job_id)
        book = learned_routes(db, repository.location, config)
        repository.start_branch(branch, base)

    def write(session: Session) -> None:
        job = Job(
            id=job_id,
            title=tasklist.title,
            repo=repository.location,
            status=JobStatus.PENDING,
            branch=branch,
            base_commit=base,
            head_commit=base,
            tasklist=tasklist.model_dump(mode="json"),
            config=config.model_dump(mode="json"),
            budget_usd=budget_usd,
            replay_of=replay_of,
        )
        session.add(job)
        add_steps(job, tasklist, config, commands, settings, agents, book)
        message = f"job submitted: {tasklist.title}"
        add_event(session, job_id, EventKind.JOB_SUBMITTED, message)

    try:  # one transaction, tried again if an outage cuts it (never recorded twice)
        write_patiently(db, write, lambda s: s.get(Job, job_id) is not None, f"job {job_id}")
    except RecordInDoubt:
        raise  # the job may exist: its branch stays
    except BaseException:
        repository.drop_branch(branch)
        raise
    return job_id


def add_steps(
    job: Job,
    tasklist: TaskList,
    config: MerlinConfig,
    commands: list[str],
    settings: Settings,
    agents: list[AgentChoice],
    book: RouteBook | None = None,
) -> None:
    """Give ``job`` a row per step, routed to its first tier; queue those that may start.

    ``book``: the repository's finished steps, to learn the first tier from (the rules
    alone when None). A step's agent may name its first tier (`tier:` or `model:`). The
    steps that need no other are queued (``graph.runnable``: at most
    ``max_parallel_steps`` of them).
    """
    routes = [(book or RouteBook([])).route(step, config) for step in tasklist.steps]
    needs = dependencies(tasklist.steps)
    for position, (step, route, command, depends_on, choice) in enumerate(
        zip(tasklist.steps, routes, commands, needs, agents, strict=True)
    ):
        agent = choice.agent
        start, record = route.tier, route.to_record(config)
        own = agent_tier_index(agent, config)
        if own is not None and step.tier is None:  # the step's own `tier:` wins
            start, record = own, {**record, "by": "agent", "tier": config.tiers[own].name}
        row = Step(
            position=position,
            key=step.id,
            step_type=step.step_type.value,
            description=step.description,
            verification=step.verification,
            exit_command=refer_to_secrets(command),  # the store holds no secret
            agent=agent.name if agent is not None else None,
            agent_spec=agent.to_record() if agent is not None else None,
            agent_choice=choice.how,
            agent_score=choice.score,
            depends_on=depends_on,
            on_failure=(step.on_failure or tasklist.on_failure).value,
            status=StepStatus.PENDING,
            phase=Phase.ATTEMPT,
            tier_index=start,
            complexity=route.complexity.value,
            route=record,
            next_kind=AttemptKind.EXECUTE,
        )
        job.steps.append(row)
    for row in runnable(job.steps, config.limits.max_parallel_steps):
        for key, value in queued_values(settings.handoff_seconds).items():
            setattr(row, key, value)


def learned_routes(db: Database, repo: str, config: MerlinConfig) -> RouteBook | None:
    """The finished steps of ``repo`` to route by, when ``[routing] learn`` is on."""
    if not config.routing.learn:
        return None
    with db.reader() as session:
        return route_book(session, repo)


def check_exit_commands(tasklist: TaskList, config: MerlinConfig, commands: list[str]) -> None:
    """InputError when a step's exit command would not run as written.

    It uses shell syntax without `shell = true`, or a `Bash(...)` deny or ask rule
    refuses it.
    """
    from merlin_flow.tools.permissions import Permissions

    permissions = Permissions(config.permissions)
    for step, command in zip(tasklist.steps, commands, strict=True):
        where = f"step {step.id}: its exit command"
        if step.exit_command is None and config.exit_commands.get(step.step_type) == command:
            where = f"[exit_commands] {step.step_type.value} in {config.source or 'merlin.toml'}:"
        refuse_shell_syntax(command, config.shell, where)
        refusal = permissions.check_command(command)
        if refusal is not None:
            raise InputError(f"step {step.id}: its exit command cannot run: {refusal}")


def default_exit_commands(tasklist: TaskList, config: MerlinConfig, files: Path) -> list[str]:
    """Each step's exit command, for the project whose files are in ``files``."""
    return [exit_command_for(step, config, files) for step in tasklist.steps]
