"""``merlin agents``: the agent files in effect, shown, created, edited, removed, installed, run.

Agents are Markdown files with YAML front matter (``merlin_flow.agents.definitions``): the
project's in ``<repo>/.merlin/agents/`` and the user's in ``$MERLIN_HOME/agents/`` (written
to), the builtin starter agents. ``run`` works one step as ``merlin run`` works a job.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from merlin_flow.cli.agent_places import (
    DEFAULT_DESCRIPTION,
    TEMPLATE,
    NameArg,
    PromptArg,
    RepoOption,
    RunRepoOption,
    ScopeOption,
    WritableScope,
    config_places,
    files_of,
    folder,
    home,
    listing,
    load_catalog,
    not_found,
    project_root,
    runs_on,
    say,
    tools_text,
    warn,
)
from merlin_flow.cli.common import Command, ConfigOption, JsonOption, console, guarded, rule
from merlin_flow.errors import InputError, MerlinError

if TYPE_CHECKING:
    from merlin_flow.jobs.agent_runs import Preview
    from merlin_flow.tasklist import TaskList

agents_app = typer.Typer(
    help="Agents: Markdown files with YAML front matter that give a step its prompt and tools.",
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@agents_app.command("list", cls=Command)
def list_agents(
    repo: RepoOption = ".",
    for_: Annotated[
        str | None,
        typer.Option("--for", help="Score each agent against a step's text, as autodelegation."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """List the agents in effect: name, scope, tools, tier or model, description.

    A `!` marks an agent with warnings. After the table: the agents a higher scope hides,
    then every warning and every file that could not be loaded, with its problem.
    """

    def work() -> None:
        from rich.table import Table

        from merlin_flow.agents.delegation import ranked

        _, catalog = load_catalog(repo)
        agents = sorted(catalog.agents.values(), key=lambda agent: agent.name)
        scores: dict[str, float] = {}
        if for_ is not None:
            scored = ranked(for_, agents)
            scores = {d.agent.name: d.score for d in scored}
            agents = [d.agent for d in scored]
        if as_json:
            rows = [listing(a) | ({"score": scores[a.name]} if scores else {}) for a in agents]
            skipped = [{"file": file, "problem": problem} for file, problem in catalog.skipped]
            shadowed = [{"name": a.name, "scope": a.scope.value, "file": a.file}
                        for a in catalog.shadowed]  # fmt: skip
            data = {"agents": rows, "skipped": skipped, "shadowed": shadowed}
            console.print_json(json.dumps(data))
            return
        table = Table(title=f"agents for: {for_}" if for_ else "agents", title_justify="left")
        for column in ("name", "scope", "tools", "tier/model", "description", "!"):
            table.add_column(column, overflow="fold")
        if scores:
            table.add_column("score")
        for agent in agents:
            row = (agent.name, agent.scope.value, tools_text(agent), runs_on(agent),
                   " ".join(agent.description.split()), "!" if agent.warnings else "")  # fmt: skip
            extra = (f"{scores[agent.name]:.2f}",) if scores else ()
            table.add_row(*map(escape, row), *extra)
        console.print(table if agents else "no agents")
        if catalog.shadowed:
            hidden = ", ".join(f"{a.scope.value} {a.name}" for a in catalog.shadowed)
            say(f"hidden by a higher scope: {hidden}")
        for warning in catalog.warnings:
            warn(warning)

    guarded(work)


@agents_app.command("show", cls=Command)
def show(name: NameArg, repo: RepoOption = ".", as_json: JsonOption = False) -> None:
    """Show an agent's definition and the whole prompt it gives a step."""

    def work() -> None:
        _, catalog = load_catalog(repo)
        agent = catalog.get(name)
        hidden = catalog.definitions(name)[1:]
        if as_json:
            record = agent.to_record() | {"hides": [a.file for a in hidden]}
            console.print_json(json.dumps(record))
            return
        lines = [
            f"name: {agent.name}",
            f"scope: {agent.scope.value} ({agent.file})",
            f"description: {' '.join(agent.description.split())}",
            f"tools: {tools_text(agent)}",
            f"runs on: {runs_on(agent)}",
            f"memory: {agent.memory or '-'}",
            *(f"hides: the {a.scope.value} agent in {a.file}" for a in hidden),
            *(f"warning: {warning}" for warning in agent.warnings),
        ]
        say("\n".join(lines))
        say(f"── prompt ──\n{agent.prompt}")

    guarded(work)


@agents_app.command("create", cls=Command)
def create(
    name: NameArg,
    description: Annotated[
        str | None,
        typer.Option("--description", help="What the agent does and which steps it is for."),
    ] = None,
    scope: ScopeOption = WritableScope.PROJECT,
    repo: RepoOption = ".",
) -> None:
    """Write a new agent file from a template, to edit next; refuse if it exists."""

    def work() -> None:
        import yaml

        from merlin_flow.agents.definitions import NAME, AgentScope

        if not NAME.fullmatch(name):
            raise InputError(
                f"{name!r} is not a valid agent name: use lower-case letters, digits, - and _, "
                "starting with a letter or a digit"
            )
        root, catalog = load_catalog(repo)
        chosen = scope or WritableScope.PROJECT
        path = folder(chosen, root) / f"{name}.md"
        taken = [a.file for a in catalog.definitions(name) if a.scope.value == chosen.value]
        if path.exists() or path.is_symlink() or taken:
            where = taken[0] if taken else path
            raise InputError(
                f"the {chosen.value} agent {name} exists already ({where}): "
                f"change it with `merlin agents edit {name}`"
            )
        header = yaml.safe_dump(
            {"name": name, "description": description or DEFAULT_DESCRIPTION},
            sort_keys=False,
            allow_unicode=True,
            width=88,
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(TEMPLATE.format(header=f"---\n{header}"), encoding="utf-8")
        say(f"created {path}: edit it with `merlin agents edit {name}`")
        order = [scope.value for scope in AgentScope]
        for other in catalog.definitions(name):
            above = order.index(other.scope.value) < order.index(chosen.value)
            how = "it is hidden by" if above else "it hides"
            say(f"{how} the {other.scope.value} {name} ({other.file})")

    guarded(work)


@agents_app.command("edit", cls=Command)
def edit(name: NameArg, scope: ScopeOption = None, repo: RepoOption = ".") -> None:
    """Open an agent's file in $VISUAL or $EDITOR, then check that it still loads.

    Without --scope, the file in effect (the project's, when both scopes define it).
    """

    def work() -> None:
        import os
        import shlex
        import subprocess

        from merlin_flow.agents.definitions import AgentScope, parse_agent_file

        root, catalog = load_catalog(repo)
        files = files_of(name, root, catalog, scope)
        if not files:
            raise not_found(name, catalog, scope)
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
        if not editor:
            raise InputError(
                f"neither VISUAL nor EDITOR is set: set one (for example EDITOR=nano) or "
                f"edit {files[0][1]} yourself"
            )
        chosen, path = files[0]
        try:
            done = subprocess.run([*shlex.split(editor), str(path)], check=False)
        except OSError as exc:
            raise InputError(f"cannot start the editor {editor!r}: {exc}") from None
        if done.returncode != 0:
            raise MerlinError(f"the editor {editor!r} exited with code {done.returncode}")
        try:
            agent = parse_agent_file(path, AgentScope(chosen.value), root)
        except MerlinError as exc:
            warn(f"{path} does not load: {exc}")
            return
        say(f"{path}: the agent {agent.name} loads")
        for warning in agent.warnings:
            warn(warning)

    guarded(work)


@agents_app.command("rm", cls=Command)
def remove(name: NameArg, scope: ScopeOption = None, repo: RepoOption = ".") -> None:
    """Delete an agent's file; --scope says which when both the project and user have it.

    Builtin agents cannot be removed: a project or user agent of the same name hides one.
    """

    def work() -> None:
        from merlin_flow.agents.definitions import load_agents

        root, catalog = load_catalog(repo)
        files = files_of(name, root, catalog, scope)
        if not files:
            raise not_found(name, catalog, scope)
        if len({each for each, _ in files}) > 1:
            where = " and ".join(str(path) for _, path in files)
            raise InputError(
                f"the agent {name} is defined in both the project and the user scope ({where}): "
                "say which to remove with --scope project or --scope user"
            )
        for _, path in files:
            path.unlink()
            say(f"removed {path}")
        now = load_agents(root, home()).agents.get(name)
        if now is not None:
            say(f"in effect now: the {now.scope.value} agent {name} ({now.file})")

    guarded(work)


@agents_app.command("init", cls=Command)
def init(
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite agent files that exist already.")
    ] = False,
    scope: ScopeOption = WritableScope.PROJECT,
    repo: RepoOption = ".",
) -> None:
    """Copy the builtin starter agents into the project's agent folder, to edit them there.

    The reviewer, test-writer, refactorer and docs-writer go to <repo>/.merlin/agents/
    (or, with --scope user, to $MERLIN_HOME/agents/). Files that exist are kept unless
    --force.
    """

    def work() -> None:
        from merlin_flow.agents.definitions import AgentScope

        root = project_root(repo)
        target = folder(scope or WritableScope.PROJECT, root)
        target.mkdir(parents=True, exist_ok=True)
        for source in sorted(folder(AgentScope.BUILTIN, root).glob("*.md")):
            path = target / source.name
            if path.exists() and not force:
                say(f"kept {path}: it exists (--force overwrites it)")
                continue
            verb = "overwrote" if path.exists() else "created"
            path.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
            say(f"{verb} {path}")

    guarded(work)


@agents_app.command("run", cls=Command)
def run(
    name: NameArg,
    prompt: PromptArg,
    repo: RunRepoOption = ".",
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print what the agent would get (its prompts, tools and permissions); "
            "run nothing, write nothing.",
        ),
    ] = False,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run one step with an agent, in this process, as `merlin run` runs a TaskList.

    The step (id `run`) is the prompt. It is a Verify step when the agent is offered no
    tool that writes, else a Feature step; its exit command is the project's default for
    that type. The job's progress and result are printed as by `merlin run`, with its
    exit codes: 0 completed, 1 failed, 2 bad input. --dry-run prints the system prompt and
    first message the model would get, the tools it would be offered and the permissions
    in force.
    """

    def work() -> None:
        from merlin_flow.config import load_config
        from merlin_flow.jobs.agent_runs import one_step_tasklist, preview

        root, catalog = load_catalog(repo)
        agent = catalog.get(name)
        merged = load_config(root, config, *config_places())
        if not dry_run:
            for warning in agent.warnings:
                warn(f"{agent.file}: {warning}")
            _run_job(root, one_step_tasklist(agent, prompt, merged), config, as_json)
        elif as_json:
            console.print_json(json.dumps(preview(agent, catalog, prompt, root, merged).to_json()))
        else:
            _show_preview(preview(agent, catalog, prompt, root, merged))

    guarded(work)


def _run_job(root: Path, tasklist: TaskList, config: Path | None, as_json: bool) -> None:
    """Submit the TaskList and work it in this process: `merlin run`'s way, its output."""
    from merlin_flow.cli.common import state
    from merlin_flow.cli.following import finish, run_embedded
    from merlin_flow.cli.starting import _warn_when_unconfined
    from merlin_flow.jobs.submission import submit_job

    settings, db = state()
    submission = submit_job(db, settings, tasklist, str(root), config, works_here=True)
    _warn_when_unconfined(submission)
    job_id = submission.job_id
    run_embedded(db, job_id, as_json, until=lambda: finish(db, job_id, as_json, workers_here=True))


def _show_preview(shown: Preview) -> None:
    """The dry run, section by section; its warnings on stderr."""
    agent = shown.agent
    rule(f"agent {agent.name} (dry run: nothing runs, nothing is written)")
    _fields(
        ("scope", f"{agent.scope.value} ({agent.file})"),
        ("description", " ".join(agent.description.split())),
        ("tools asked for", tools_text(agent)),
        ("starts on", f"tier {shown.tier} ({shown.model})"),
        ("step", f"run, a {shown.step_type.value} step"),
        ("exit command", shown.exit_command),
    )
    rule("system prompt")
    say(shown.system_prompt.rstrip("\n"))
    rule("first user message")
    say(shown.user_prompt)
    rule("tools")
    _fields(
        ("offered", ", ".join(shown.offered)),
        *(("not offered", f"{name} ({why})") for name, why in shown.withheld),
        *((f"MCP server {s.name}", s.why) for s in shown.servers),
    )
    rule("permissions")
    rules = shown.rules
    _fields(("default", rules.default))
    for kind in ("deny", "ask", "allow"):
        listed: list[str] = getattr(rules, kind)
        _fields((kind, "" if listed else "-"))
        for each in listed:
            say(f"  {each}")
    read_only = ", ".join(shown.read_only) or "-"
    if not shown.writable:
        read_only = ". (the whole worktree: the agent has no tool that writes)"
    _fields(
        ("hidden from commands", ", ".join(shown.hidden) or "-"),
        ("read-only for commands", read_only),
    )
    for warning in shown.warnings:
        warn(warning)


def _fields(*pairs: tuple[str, str]) -> None:
    """``label: value`` lines, the labels bold, the values as written."""
    for label, value in pairs:
        console.print(
            f"[bold]{escape(label)}:[/]" + (f" {escape(value)}" if value else ""),
            highlight=False,
            soft_wrap=True,
        )
