"""``merlin doctor``: can jobs run here, and if not, what to do about it.

Each check says what it found and, when it failed, how to fix it. A ``warn`` does not
stop a job (no worker yet, no sandbox by choice); a ``fail`` does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from merlin_flow.config import MerlinConfig
from merlin_flow.config_files import ConfigFile
from merlin_flow.errors import MerlinError
from merlin_flow.models.credentials import tier_access
from merlin_flow.models.endpoints import pin_endpoints
from merlin_flow.models.llm import is_priced
from merlin_flow.settings import Settings
from merlin_flow.tool_config import SandboxMode
from merlin_flow.workspace.exit_commands import MARKERS, ProjectKind
from merlin_flow.workspace.network import HOST_NETWORK, OUTBOUND, PASTA_FIX, outbound_problem
from merlin_flow.workspace.sandbox import Confinement, run_confined, sandbox_problem
from merlin_flow.workspace.toolchains import (
    PROGRAMS,
    SEARCHED,
    VERSION_COMMANDS,
    Toolchain,
    find_toolchain,
    toolchain_mounts,
)

INSTALL: dict[ProjectKind, str] = {
    ProjectKind.RUST: "install Rust with rustup (https://rustup.rs) or `apt-get install cargo`",
    ProjectKind.NODE: "install Node.js with nvm, fnm or volta, or `apt-get install nodejs npm`",
    ProjectKind.GO: "install Go from https://go.dev/dl into /usr/local/go, or "
    "`apt-get install golang`",
}
"""How to get each kind's toolchain, for a failed `toolchain <kind>` check."""
TOOLCHAIN_TIMEOUT = 60.0
"""Seconds a toolchain's version command may take in the sandbox."""


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
    settings: Settings,
    config: MerlinConfig,
    repo: Path | None,
    broker: BrokerProbe,
    files: list[ConfigFile] | None = None,
) -> list[Check]:
    """Every check, in the order a user would fix them; ``broker`` asks the broker.

    ``files``: where ``config`` was read from (``config_files``), listed first.
    """
    checks = [config_check(files)] if files is not None else []
    checks += [sandbox_check(config), network_check(config)]
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
        checks += toolchain_checks(repo, config)
    return checks


def config_check(files: list[ConfigFile]) -> Check:
    """The configuration files read, lowest precedence first, then those that were not."""
    read = [f"{n}. {file.describe()}" for n, file in enumerate((f for f in files if f.read), 1)]
    skipped = [f"not read: {file.describe()}" for file in files if not file.read]
    return Check("config", Verdict.OK, "\n".join(read + skipped))


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


def network_check(config: MerlinConfig) -> Check:
    """What setup, and steps with `[sandbox] network`, reach: outbound only, or the host."""
    steps = {False: "none", True: "outbound only", "host": "the host's"}[config.sandbox.network]
    if config.sandbox.mode is SandboxMode.NONE:
        return Check("network", Verdict.WARN, f'mode "none": setup and steps get {HOST_NETWORK}')
    if config.sandbox.network == "host":
        detail = f'setup and steps get {HOST_NETWORK} (`[sandbox] network = "host"`)'
        return Check("network", Verdict.WARN, detail, "remove it to give them outbound only")
    if sandbox_problem():
        detail = "not tried: the sandbox cannot start"
        return Check("network", Verdict.FAIL, detail, "fix the sandbox check first")
    problem = outbound_problem()
    if problem:
        detail = f"setup gets {HOST_NETWORK}, and so do steps with `[sandbox] network = true`"
        fix = PASTA_FIX if "not installed" in problem else "see docs/security.md"
        return Check("network", Verdict.WARN, f"{problem}: {detail}", fix)
    return Check("network", Verdict.OK, f"setup: {OUTBOUND}; steps: {steps}")


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
        if plan.kind is None:
            detail = "unknown kind: no setup; commands see the system's tools (/usr) only"
        else:
            detail = f"{plan.kind.value}: no setup; commands use the {plan.kind.value} "
            detail += "toolchain found here (see its toolchain check)"
        return Check("environment", Verdict.OK, detail, None)
    source = "default for " + plan.kind.value if plan.default and plan.kind else "merlin.toml"
    detail = f"setup ({source}): " + " && ".join(plan.setup)
    if config.sandbox.mode is SandboxMode.BWRAP and sandbox_problem():
        return Check("environment", Verdict.FAIL, detail, "fix the sandbox check first")
    return Check("environment", Verdict.OK, detail)


def toolchain_checks(repo: Path, config: MerlinConfig) -> list[Check]:
    """A check of each toolchain ``repo`` needs: one per kind with a marker at its root.

    Python is left to the environment check: its environment is built by setup.
    """
    kinds = [
        kind
        for kind, markers in MARKERS
        if kind in PROGRAMS and any((repo / marker).exists() for marker in markers)
    ]
    return [toolchain_check(kind, config, find_toolchain(kind)) for kind in kinds]


def toolchain_check(kind: ProjectKind, config: MerlinConfig, found: Toolchain | None) -> Check:
    """The kind's toolchain ``found`` (None: not found), run in the sandbox as commands are."""
    name, program = f"toolchain {kind.value}", PROGRAMS[kind][0]
    if found is None:
        detail = f"no `{program}` found for this {kind.value} project"
        return Check(
            name,
            Verdict.FAIL,
            detail,
            f"{INSTALL[kind]}; merlin looks on {SEARCHED[kind]} and in asdf's and mise's shims",
        )
    where = f"{found.source}: {found.program}"
    problem = sandbox_problem() if config.sandbox.mode is SandboxMode.BWRAP else None
    if problem:
        detail = f"`{program}` found ({where}) but not tried: the sandbox cannot start"
        return Check(name, Verdict.FAIL, detail, "fix the sandbox check first")
    argv = VERSION_COMMANDS[kind]
    path, read_only, variables = toolchain_mounts([found])
    with tempfile.TemporaryDirectory(prefix="merlin-doctor-") as folder:
        confinement = Confinement(Path(folder), read_only=read_only, path=path, variables=variables)
        try:
            result = run_confined(argv, confinement, config.sandbox, TOOLCHAIN_TIMEOUT)
        except MerlinError as exc:
            return Check(name, Verdict.FAIL, str(exc), "fix the sandbox check first")
    lines = [line.strip() for line in result.output_tail.splitlines() if line.strip()]
    if result.ok:
        return Check(name, Verdict.OK, f"{lines[0] if lines else '(no output)'} ({where})")
    ended = f"exit code {result.exit_code}"
    if result.timed_out:
        ended = f"timed out after {TOOLCHAIN_TIMEOUT:g} s"
    command, last = " ".join(argv), lines[-1] if lines else "no output"
    detail = f"`{command}` failed in the sandbox ({ended}): {last} ({where})"
    seen = ", ".join(str(f) for f in read_only) or "nothing outside /usr"
    reach = f"the sandbox binds {seen} read-only, with {':'.join(path) or 'the system PATH'} first"
    if "execvp" in last or "No such file" in last:
        fix = (
            f"{reach} on PATH; `{program}` ({found.program.resolve()}) or a file it needs lies "
            f"outside them: install the toolchain under /usr or where merlin looks "
            f"({SEARCHED[kind]})"
        )
    else:
        fix = (
            f"{reach} on PATH; `{command}` runs there with HOME=/tmp/home and no network: "
            "run it yourself to see what it misses (a toolchain to install, a setting in your "
            "home) and install or set it where merlin looks"
        )
    return Check(name, Verdict.FAIL, detail, fix)
