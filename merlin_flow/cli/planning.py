"""``merlin plan``: a request in plain words, planned and shown, or written as a TaskList."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from merlin_flow.cli.common import (
    ConfigOption,
    JsonOption,
    RepoOption,
    check_report_paths,
    console,
    err_console,
    guarded,
    state,
)

if TYPE_CHECKING:
    from rich.console import RenderableType

    from merlin_flow.config import MerlinConfig
    from merlin_flow.planning.route_learning import RouteBook
    from merlin_flow.tasklist import TaskList


def plan(
    request: Annotated[str, typer.Argument(help="What to do, in plain words.", metavar="REQUEST")],
    repo: RepoOption = ".",
    config: ConfigOption = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the plan here as a TaskList YAML to edit and submit."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Plan a request and show the plan: steps, types, estimated tokens and cost.

    A question or a single action is not sent to the planner (see docs/concepts.md);
    anything else is planned by the tier `[planning] tier` names, and shown as a table.
    """

    def work() -> None:
        import yaml

        from merlin_flow.config import load_config
        from merlin_flow.errors import InputError
        from merlin_flow.jobs.reports import write_atomically
        from merlin_flow.jobs.requesting import plan_record, request_context
        from merlin_flow.planning.planner import make_plan, plan_json
        from merlin_flow.planning.reading import to_tasklist
        from merlin_flow.settings import get_settings
        from merlin_flow.workspace.repository import refusals_as_input_errors, repository_for_input

        if not request.strip():
            raise InputError("the request is empty: say what to do")
        check_report_paths(out)
        settings = get_settings()
        repository = repository_for_input(repo, settings)
        with refusals_as_input_errors(repository):
            base = repository.base_commit()
        with repository.files_at(base) as files:
            merlin_config = load_config(files, config, settings.home_dir, settings.system_config)
        book = _route_book(repository.location, merlin_config)  # before any model is paid
        made = make_plan(
            request, merlin_config, request_context(repository, base, merlin_config, request)
        )
        tasklist = to_tasklist(request, made.steps) if made.steps else None
        if out is not None:
            if tasklist is None:
                raise InputError("a question has no plan to write: ask it with `merlin run`")
            data = tasklist.model_dump(
                mode="json", exclude={"id"}, exclude_none=True, exclude_defaults=True
            )
            write_atomically(out, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        if as_json:
            dumped = tasklist.model_dump(mode="json") if tasklist is not None else {}
            console.print_json(json.dumps(plan_json(made, dumped)))
            return
        record = plan_record(made, tasklist.model_dump(mode="json") if tasklist else {"steps": []})
        console.print(plan_table(record, merlin_config, tasklist, book))
        if out is not None:
            again = submit_command(out, repo, config)
            console.print(f"written to {escape(str(out))}: edit it, then `{escape(again)}`")

    guarded(work)


def _route_book(location: str, config: MerlinConfig) -> RouteBook | None:
    """The journal's routes for ``location``; None, with a warning, when it cannot be read.

    A plan needs no store: one that is not migrated or not reachable leaves the steps to
    the rules.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from merlin_flow.errors import StoreError
    from merlin_flow.jobs.submission import learned_routes

    try:
        return learned_routes(state()[1], location, config)
    except (StoreError, SQLAlchemyError) as exc:
        first = str(exc).splitlines()[0]
        err_console.print(f"[yellow]the journal could not be read ({escape(first)}): "
                          "steps are shown on the rules' tiers[/]")  # fmt: skip
        return None


def submit_command(tasklist: Path, repo: str, config: Path | None) -> str:
    """``merlin submit FILE``, with the ``--repo`` and ``--config`` the plan was made with."""
    import shlex

    words = ["merlin", "submit", str(tasklist)]
    if repo != ".":
        words += ["--repo", repo]
    if config is not None:
        words += ["--config", str(config)]
    return shlex.join(words)


def plan_table(
    record: dict[str, Any],
    config: MerlinConfig,
    tasklist: TaskList | None,
    book: RouteBook | None = None,
) -> RenderableType:
    """The preview: how the plan was made, a row per step with its estimates, the routes.

    ``record`` is what the job keeps of its planning (``requesting.plan_record``);
    ``book`` the repository's finished steps the steps are routed by.
    """
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from merlin_flow.jobs.plan_preview import how_planned, plan_rows

    if record.get("kind") == "question" or tasklist is None:
        return Text(f"a question ({record.get('reason')}): it is answered, not planned")
    sentence, fallback = how_planned(record, config)
    how = Text(sentence, style="yellow" if fallback else "")
    table = Table(title=f"plan: {tasklist.title}", title_justify="left")
    for column in ("step", "type", "title", "depends on", "est. tokens", "est. cost (tier)"):
        table.add_column(column, overflow="fold")
    *rows, totals = plan_rows(record, config, tasklist, book)
    for row in rows:
        table.add_row(row.step, row.step_type, row.title, row.depends_on, row.tokens, row.cost)
    table.add_row("total", "", "", "", totals.tokens, totals.cost, style="bold")
    routes = [f"  {row.step}: {row.route}" for row in rows if row.route]
    if not routes:
        return Group(how, table)
    return Group(how, table, Text("\n".join(["starts on:", *routes])))


def _project_specs(repo: str, config: Path | None) -> tuple[list[Any], Any]:
    """The specs at the repository's HEAD, and its configuration."""
    from merlin_flow.config import load_config
    from merlin_flow.planning.specs import load_specs
    from merlin_flow.settings import get_settings
    from merlin_flow.workspace.repository import refusals_as_input_errors, repository_for_input

    settings = get_settings()
    repository = repository_for_input(repo, settings)
    with refusals_as_input_errors(repository):
        base = repository.base_commit()
    with repository.files_at(base) as files:
        merlin_config = load_config(files, config, settings.home_dir, settings.system_config)
    return load_specs(repository.path, base, merlin_config.specs.paths), merlin_config


def specs_list(
    for_: Annotated[
        str | None,
        typer.Option("--for", help="Score each spec against this request.", metavar="REQUEST"),
    ] = None,
    repo: RepoOption = ".",
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the specs; with --for, by score, best first, the ones a plan would get marked."""

    def work() -> None:
        from rich.table import Table

        from merlin_flow.planning.specs import ranked

        specs, merlin_config = _project_specs(repo, config)
        scorer = merlin_config.specs.scorer
        rows = ranked(for_, specs, scorer) if for_ else [(spec, 0.0) for spec in specs]
        chosen = {spec.path for spec, score in rows[: merlin_config.specs.top] if score > 0}
        if as_json:
            listing = [
                {"path": s.path, "title": s.title, "score": round(score, 4) if for_ else None,
                 "chosen": s.path in chosen, "constraints": sorted(s.constraints())}
                for s, score in rows
            ]  # fmt: skip
            console.print_json(json.dumps(listing))
            return
        if not specs:
            paths = ", ".join(merlin_config.specs.paths)
            console.print(f"no specs: no *.md file under {escape(paths)} at HEAD")
            return
        table = Table(title=f"specs for: {for_}" if for_ else "specs", title_justify="left")
        for column in ("path", "title", "constraints", *(("score", "chosen") if for_ else ())):
            table.add_column(column, overflow="fold")
        for spec, score in rows:
            extra = (f"{score:.2f}", "yes" if spec.path in chosen else "") if for_ else ()
            table.add_row(spec.path, spec.title, ", ".join(spec.constraints()) or "-", *extra)
        console.print(table)

    guarded(work)


def specs_show(
    path: Annotated[str, typer.Argument(help="The spec's path, as `specs list` shows it.")],
    repo: RepoOption = ".",
    config: ConfigOption = None,
) -> None:
    """Show a spec's constraint sections (Purpose, Invariants, Public API, Error Cases)."""

    def work() -> None:
        from merlin_flow.errors import InputError

        specs, _ = _project_specs(repo, config)
        spec = next((s for s in specs if s.path == path), None)
        if spec is None:
            known = ", ".join(s.path for s in specs) or "none"
            raise InputError(f"no spec {path!r}; the specs: {known}")
        console.print(f"{spec.path}: {spec.title}", markup=False, highlight=False)
        constraints = spec.constraints()
        if not constraints:
            console.print("no constraint sections (Purpose, Invariants, Public API, Error Cases)")
        for heading, body in constraints.items():
            console.print(f"\n## {heading}\n{body}", markup=False, highlight=False)

    guarded(work)
