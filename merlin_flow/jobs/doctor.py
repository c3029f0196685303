"""``merlin doctor``: can jobs run here, and if not, what to do about it.

Each check says what it found and, when it failed, how to fix it. A ``warn`` does not
stop a job (no worker yet, no sandbox by choice); a ``fail`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from merlin_flow.config import MerlinConfig
from merlin_flow.errors import MerlinError
from merlin_flow.models.credentials import tier_access
from merlin_flow.models.endpoints import pin_endpoints
from merlin_flow.models.llm import is_priced
from merlin_flow.settings import Settings
from merlin_flow.tool_config import SandboxMode
from merlin_flow.workspace.sandbox import sandbox_problem


class Verdict(StrEnum):
    """How a check came out."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    """One finding: what was checked, the verdict, what was seen and how to fix it."""

    name: str
    verdict: Verdict
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        """JSON-ready form (`merlin doctor --json`)."""
        return {**asdict(self), "verdict": self.verdict.value}


BrokerProbe = Callable[[], tuple[str | None, dict[str, int] | None]]
"""Asks the broker: why it cannot be reached (None: it answers), and how many workers
consume each queue (None: the broker cannot tell). ``workers.roles.broker_report``
gives one; the library itself never imports the worker package."""


def run_checks(
    settings: Settings, config: MerlinConfig, repo: Path | None, broker: BrokerProbe
) -> list[Check]:
    """Every check, in the order a user would fix them; ``broker`` asks the broker."""
    checks = [sandbox_check(config)]
    config = pin_endpoints(config)  # as a job submitted from here would call them
    problems = {tier.name: tier_access(tier) for tier in config.tiers}
    usable = any(problem is None for problem in problems.values())
    checks += [
        tier_check(
            tier.name,
            problems[tier.name],
            f"{tier.model} at {tier.api_base}" if tier.api_base else tier.model,
            usable,
            priced=is_priced(tier),
        )
        for tier in config.tiers
    ]
    checks.append(database_check(settings))
    checks += broker_checks(broker)
    if repo is not None:
        checks.append(environment_check(repo, config))
    return checks


def sandbox_check(config: MerlinConfig) -> Check:
    """The sandbox: bubblewrap present and able to start one, or mode none chosen."""
    if config.sandbox.mode is SandboxMode.NONE:
        return Check(
            "sandbox",
            Verdict.WARN,
            'mode "none": step commands run unconfined, with your files and network',
            'install bubblewrap and remove `mode = "none"` from [sandbox]',
        )
    problem = sandbox_problem()
    if problem:
        return Check("sandbox", Verdict.FAIL, problem, "see docs/security.md")
    return Check("sandbox", Verdict.OK, "bubblewrap starts a sandbox with no network")


def tier_check(
    name: str, problem: str | None, model: str, another_usable: bool, *, priced: bool = True
) -> Check:
    """One tier: its credentials present or its server answering, and its price known.

    An unusable tier fails only when no tier is usable: otherwise jobs pass over it
    (its attempts fail at once and escalate), which is worth a warning. So is a tier of
    unknown price: a job with a budget refuses it.
    """
    if problem:
        verdict = Verdict.WARN if another_usable else Verdict.FAIL
        return Check(f"tier {name}", verdict, problem, "see docs/models.md")
    if not priced:
        return Check(
            f"tier {name}",
            Verdict.WARN,
            f"{model}: credentials or server found, but its price is unknown, so a job with "
            "a budget refuses it",
            "set price_in and price_out on the tier (0 for a free local model); docs/models.md",
        )
    return Check(f"tier {name}", Verdict.OK, f"{model}: credentials or server found")


def database_check(settings: Settings) -> Check:
    """The store answers and is at the current migration."""
    from merlin_flow.store import open_database
    from merlin_flow.store.database import current_revision, head_revision

    try:
        db = open_database(settings.database)
        try:
            current = current_revision(db)
        finally:
            db.dispose()
    except MerlinError as exc:
        return Check("database", Verdict.FAIL, str(exc), "run `merlin db upgrade`")
    except Exception as exc:  # a driver's connection error
        return Check(
            "database", Verdict.FAIL, f"{type(exc).__name__}: {exc}", "check MERLIN_DATABASE_URL"
        )
    head = head_revision()
    if current != head:
        return Check(
            "database",
            Verdict.FAIL,
            f"schema at {current}, code expects {head}",
            "run `merlin db upgrade`",
        )
    return Check("database", Verdict.OK, f"reachable, schema at {head}")


def broker_checks(broker: BrokerProbe) -> list[Check]:
    """The broker answers; a worker consumes each queue (unknown on the embedded broker)."""
    problem, counts = broker()
    if problem:
        return [Check("broker", Verdict.FAIL, problem, "check MERLIN_BROKER_URL and the server")]
    checks = [Check("broker", Verdict.OK, "reachable")]
    if counts is None:
        checks.append(
            Check(
                "workers",
                Verdict.WARN,
                "unknown on the embedded broker (it has no remote control)",
                "`merlin run` works jobs itself; `merlin submit` needs `merlin worker`",
            )
        )
        return checks
    for queue, count in counts.items():
        verdict = Verdict.OK if count else Verdict.WARN
        fix = None if count else f"start `merlin worker -Q {queue}` (see Procfile)"
        checks.append(Check(f"queue {queue}", verdict, f"{count} worker(s) consuming", fix))
    return checks


def environment_check(repo: Path, config: MerlinConfig) -> Check:
    """The environment a job on ``repo`` would get, and whether it can be built here."""
    from merlin_flow.workspace.environment import describe_environment

    try:
        plan = describe_environment(repo, config)
    except MerlinError as exc:
        return Check("environment", Verdict.FAIL, str(exc), "give --repo a git work tree")
    if not plan.needed:
        kind = plan.kind.value if plan.kind else "unknown kind"
        return Check(
            "environment",
            Verdict.OK,
            f"{kind}: no setup; commands use the system's tools",
            None,
        )
    source = "default for " + plan.kind.value if plan.default and plan.kind else "merlin.toml"
    detail = f"setup ({source}): " + " && ".join(plan.setup)
    if config.sandbox.mode is SandboxMode.BWRAP and sandbox_problem():
        return Check("environment", Verdict.FAIL, detail, "fix the sandbox check first")
    return Check("environment", Verdict.OK, detail)
