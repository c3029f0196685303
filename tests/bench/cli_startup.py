"""Benchmark: how long the read commands take to answer, against ``merlin --help``.

Run: ``python -m tests.bench.cli_startup [--runs 10] [--smoke]``. It runs ``merlin demo``
once in a temporary ``MERLIN_HOME`` (a finished job of 3 steps, about a minute), then
times each command of ``COMMANDS`` ``--runs`` times, each in a fresh process, and prints
the median, the slowest run and each median as a ratio of ``--help``'s (issue 36's
target: ``list --json`` and ``status JOB`` within 2.5x). ``FLOOR`` and ``CORE_FLOOR``
are timed the same way: what any read pays before merlin's own work. Without
``--smoke`` it writes its section of docs/BENCHMARKS.md; ``--smoke`` runs each command
twice and writes nothing.

The commands run with bytecode written to a temporary ``PYTHONPYCACHEPREFIX`` (warmed
by one untimed run of each), as an installed merlin has its modules compiled: a
checkout run with ``PYTHONDONTWRITEBYTECODE`` would compile merlin's own modules on
every start and time that instead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from tests.bench.docs_section import write_section

HEADING = "## CLI start-up"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md"
TARGET = 2.5
COMMANDS = (
    "--help",
    "list --json",
    "status JOB --json",
    "status JOB",
    "logs JOB",
    "costs JOB",
)
"""The ``merlin`` commands timed; ``JOB`` stands for the demo's job. The first is the
yardstick."""
TARGETED = ("list --json", "status JOB --json", "status JOB")
RUN_ROW = "merlin run (1 scripted step): to its first model call"
RUN_TARGET = 1.5
"""Seconds a 1-step scripted ``merlin run`` may take to reach its first model call."""
FLOOR = "import sqlalchemy.orm"
"""Timed as ``python -c``: the ORM every read queries the store with, imported alone."""
CORE_FLOOR = "import merlin_flow.cli.app, sqlalchemy, merlin_flow.settings"
"""Timed as ``python -c``: what any read imports with no ORM at all: the CLI ``--help``
loads, SQLAlchemy Core (the store's library, fixed by the design) and the settings that
say where the store is (pydantic-settings)."""
PRELOAD = "from merlin_flow.models.llm import preload; preload()"
"""Timed as ``python -c``: litellm and what it loads on a first call, which every model
call of merlin goes through: the floor of a run's first call."""


def run(argv: list[str], env: dict[str, str]) -> str:
    """Run ``argv`` with this Python in a fresh process; its stdout (it must succeed)."""
    done = subprocess.run(
        [sys.executable, *argv], env=env, check=True, capture_output=True, text=True
    )
    return done.stdout


def merlin(args: list[str], env: dict[str, str]) -> str:
    """Run ``merlin ARGS`` in a fresh process; its stdout."""
    return run(["-m", "merlin_flow.cli", *args], env)


def bench_env(home: Path) -> dict[str, str]:
    """The environment of every timed run: an own MERLIN_HOME, bytecode kept in ``home``."""
    env = {**os.environ, "MERLIN_HOME": str(home / "merlin")}
    for name in ("MERLIN_DATABASE_URL", "MERLIN_BROKER_URL", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    env["PYTHONPYCACHEPREFIX"] = str(home / "pycache")
    env["TMPDIR"] = str(home / "tmp")  # where `merlin demo` makes its repository
    (home / "tmp").mkdir()
    return env


def finished_job(env: dict[str, str]) -> str:
    """Run ``merlin demo`` in the bench's MERLIN_HOME; the id of its finished job."""
    merlin(["demo"], env)
    jobs = json.loads(merlin(["list", "--json"], env))
    assert len(jobs) == 1, jobs
    assert jobs[0]["finished_at"], jobs
    return str(jobs[0]["id"])


def first_call(env: dict[str, str], folder: Path) -> float:
    """Seconds from starting a 1-step scripted ``merlin run`` to its first model call.

    The call's start is read from the journal (``llm_calls``: when it was recorded, less
    its latency), as the worker of ``merlin run`` made it.
    """
    import sqlite3
    from datetime import UTC, datetime

    from tests.conftest import make_repo

    repo = make_repo(folder / f"repo-{time.monotonic_ns()}", {"README.md": "one step\n"})
    (folder / "done.yaml").write_text("rules:\n  - reply: {content: done}\n")
    config = folder / "merlin.toml"
    config.write_text('[[tiers]]\nname = "local"\nmodel = "scripted/done.yaml"\n')
    tasklist = folder / "one.yaml"
    tasklist.write_text(
        "title: one\nsteps:\n  - id: s1\n    step_type: Verify\n    description: check\n"
        '    exit_command: "true"\n'
    )
    start = time.time()
    run(["-m", "merlin_flow.cli", "run", str(tasklist), "--repo", str(repo),
         "--config", str(config), "--quiet"], env)  # fmt: skip
    db = sqlite3.connect(Path(env["MERLIN_HOME"]) / "merlin.db")
    try:
        recorded, latency_ms = db.execute(
            "SELECT created_at, latency_ms FROM llm_calls ORDER BY id DESC LIMIT 1"
        ).fetchone()
    finally:
        db.close()
    made = datetime.fromisoformat(recorded).replace(tzinfo=UTC).timestamp() - latency_ms / 1000
    return made - start


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Wall-clock seconds of one fresh process running ``argv``."""
    start = time.perf_counter()
    run(argv, env)
    return time.perf_counter() - start


def measure(runs: int) -> dict[str, list[float]]:
    """Seconds of each command (and of FLOOR), ``runs`` times, after an untimed run of each."""
    with tempfile.TemporaryDirectory(prefix="merlin-bench-") as tmp:
        env = bench_env(Path(tmp))
        job = finished_job(env)
        argv = {
            f"merlin {command}": ["-m", "merlin_flow.cli", *command.replace("JOB", job).split()]
            for command in COMMANDS
        }
        argv[f"python -c '{FLOOR}'"] = ["-c", FLOOR]
        argv[f"python -c '{CORE_FLOOR}'"] = ["-c", CORE_FLOOR]
        argv[f"python -c '{PRELOAD}'"] = ["-c", PRELOAD]
        for args in argv.values():
            run(args, env)  # compiles what the command imports
        first_call(env, Path(tmp))  # compiles what a run imports
        # In turn, so that a burst of load on the shared machine hits every command.
        times: dict[str, list[float]] = {name: [] for name in argv}
        times[RUN_ROW] = []
        for _ in range(runs):
            for name, args in argv.items():
                times[name].append(timed(args, env))
            times[RUN_ROW].append(first_call(env, Path(tmp)))
        return times


def ratio(times: dict[str, list[float]], name: str) -> float:
    """The median of ``name`` as a multiple of ``merlin --help``'s."""
    return statistics.median(times[name]) / statistics.median(times[f"merlin {COMMANDS[0]}"])


def table(times: dict[str, list[float]]) -> str:
    """The Markdown table: median, slowest and the median's ratio to ``--help``'s."""
    runs = len(next(iter(times.values())))
    lines = [
        f"| command | median of {runs} | slowest | median / `--help` |",
        "|---|---|---|---|",
    ]
    for name, seconds in times.items():
        shown, times_help = (name, "-") if name == RUN_ROW else (f"`{name}`", None)
        lines.append(
            f"| {shown} | {statistics.median(seconds) * 1000:.0f} ms "
            f"| {max(seconds) * 1000:.0f} ms | {times_help or f'{ratio(times, name):.1f}x'} |"
        )
    return "\n".join(lines)


def verdict(times: dict[str, list[float]]) -> str:
    """Which of the targeted commands are within TARGET times ``--help``."""
    over = [c for c in TARGETED if ratio(times, f"merlin {c}") > TARGET]
    named = ", ".join(f"`{c}`" for c in over or TARGETED)
    reads = (
        f"Target met: {named} within {TARGET}x `--help`."
        if not over
        else f"Target ({TARGET}x `--help`) missed by {named}."
    )
    first = statistics.median(times[RUN_ROW])
    met = "met" if first <= RUN_TARGET else "missed"
    run = f"`merlin run` to its first model call: {first:.2f} s, target {RUN_TARGET} s {met}."
    return f"{reads} {run}"


def section(times: dict[str, list[float]], runs: int) -> str:
    """The section of docs/BENCHMARKS.md."""
    floor = f"python -c '{FLOOR}'"
    core = f"python -c '{CORE_FLOOR}'"
    return f"""{HEADING}

Command: `python -m tests.bench.cli_startup --runs {runs}` (2 to 5 minutes). It runs
`merlin demo` once in a temporary `MERLIN_HOME` (`JOB` is its finished job of 3 steps),
then times each command in a fresh process, in {runs} rounds of one run of each, after
one untimed run of each (bytecode kept, as an installed merlin has it). Output goes to a
pipe, so tables are drawn plain. The `python -c` rows are no merlin command: SQLAlchemy's
ORM imported alone, what every read queries the store with; what a read would import
with no ORM at all (the CLI of `--help`, SQLAlchemy Core and merlin's settings); and
litellm's import.

Run of {date.today().isoformat()}, Python {platform.python_version()}:

{table(times)}

{verdict(times)}

The `merlin run` row is no start-up: from starting a 1-step scripted `merlin run` on a
one-file repository (a fresh process) to its first model call, read from the journal.
litellm's import, with what litellm loads on a first call (the `preload()` row), is the
floor of the first call: every model call, the scripted model's too, goes through
litellm. The 1.5 s target cannot be met while that import takes longer. (Importing it
in a thread of its own while the job was submitted saved nothing measurable, and once
left a `merlin run` of a question hanging in CI: it is imported in the foreground.)

`merlin --help` imports neither litellm, Celery nor SQLAlchemy
(`tests/unit/test_public_api.py`). `list`, `status` (of a job finished or not, as a
table or `--json`), `logs`, `costs`, `reject` and the help of `approve` import neither
litellm, Celery, kombu, the agent stack (`merlin_flow.agents`, `merlin_flow.tools`) nor
Alembic (`tests/unit/cli/test_app_import_graph.py`): the schema check reads
`alembic_version` with one query and the head revision from the migration files, and
Alembic is imported only to migrate. The queue names `status` checks for a worker come
from `workers/queues.py` (no Celery); `reject` lives in `jobs/decisions.py` (no planner).

What a read adds to `--help` is pydantic (typer checks a command's arguments with it;
merlin's settings are pydantic-settings), SQLAlchemy's ORM with merlin's tables, and
the queries. SQLAlchemy's ORM imported alone (its `python -c` row) is {ratio(times, floor):.1f}x
`--help`: {ratio(times, floor) / TARGET:.0%} of the {TARGET}x target, before merlin's tables, its
settings or typer's checks. Reads written against SQLAlchemy Core instead would not
meet it either: the CLI, Core and the settings imported together, with no ORM, no table
and no query (its `python -c` row), are {ratio(times, core):.1f}x `--help`. Below that a read
would need a second way into the store beside SQLAlchemy (the `sqlite3` module and
psycopg by hand) and a second reading of the settings beside pydantic-settings, two
copies of what must stay one: not done.

The run of 2026-12-06 took pydantic's `use_attribute_docstrings` off merlin's settings
and configuration models. It made pydantic find each model's source file and parse it
as the class was defined, for field descriptions nothing reads (the docstrings stay,
for readers of the code). `python -X importtime`: `merlin_flow.settings`, which every
read imports, 26 ms to 10 ms; `merlin_flow.config`, which `run`, `plan` and the workers
import, 91 ms to 54 ms (with pydantic already imported). In an A/B of this benchmark
(each side run twice, alternating, on a busy machine) `list --json` went from 778 and
758 ms to 696 and 711 ms; the other reads moved inside the noise.

Before issue 36's cuts (Alembic imported by every schema check, the step graph, the
TaskList and the permission rules by `list`, Celery and the agent stack by `status` of
a finished job), a run of the same command on 2026-11-28 gave, as multiples of `--help`:
`list --json` 7.2x, `status JOB --json` 6.6x, `status JOB` 7.5x, `logs JOB` 6.8x,
`costs JOB` 5.9x.
"""


def main() -> None:
    """Time the commands, print the table, write the section of docs/BENCHMARKS.md."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="timed runs of each command")
    parser.add_argument("--smoke", action="store_true", help="2 runs each; no docs written")
    parser.add_argument("--docs", type=Path, default=DOCS, help="the file to write the section to")
    args = parser.parse_args()
    runs = 2 if args.smoke else args.runs
    times = measure(runs)
    print(table(times))
    print(verdict(times))
    if not args.smoke:
        write_section(args.docs, HEADING, section(times, runs))
        print(f"wrote the section {HEADING[3:]!r} of {args.docs}")


if __name__ == "__main__":
    main()
