"""Benchmark: steps as a graph. Four equal steps at once, against the same steps chained.

Run: ``python -m tests.bench.dag [--runs 3] [--delay 2] [--workers 4]`` (about 70 s).
It writes its section of docs/BENCHMARKS.md (``--no-docs`` to leave the file alone;
``--smoke``: one job of each variant on 2 workers, 0.2 s delay, never writes it).

It starts ``--workers`` real ``merlin worker --concurrency 1`` processes (every queue,
the embedded SQLite store and broker in a temporary ``MERLIN_HOME``), then submits jobs
with ``merlin submit --json``, alternating two TaskLists of the same four steps:

- **parallel**: ``s1`` .. ``s4``, each ``depends_on: []``: four independent steps, run at
  once;
- **chained**: the same four steps as a plain list (no ``depends_on``): a sequence.

Each of ``s1`` .. ``s4`` is equal: its scripted model waits ``--delay`` seconds at turn 0,
then writes its own file; its exit command checks the file, then prints the time
(``sh -c 'grep -q S1 s1.txt && date +%s.%N'``), which the attempt's output keeps.

- **Wall time**: from calling ``merlin submit`` to the job's ``finished_at`` (so it
  includes the CLI's start, as a user waits for it); also from the job's ``created_at``.
- **Verify to complete**: for each step, from its own exit command passing (the printed
  time) to its ``step_completed`` event. For a step whose branch had not moved, that is
  the branch move and the database writes; for a step merged onto a branch its siblings
  moved (a ``step_integrated`` event), it adds ``git merge-tree`` and the exit commands
  run again on the merged tree (the event's ``commands``). The integration overhead of a
  step is its figure minus the chained steps' median.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from tests.bench.docs_section import write_section
from tests.bench.processes import READY_SECONDS, stop_group, terminated_as_exit, wait_until

STEPS = ("s1", "s2", "s3", "s4")
VARIANTS = ("chained", "parallel")
TARGET, FLOOR = 0.4, 0.25
HEADING = "## Steps as a graph: four steps at once against a chain"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md"

CONFIG = """\
[[tiers]]
name = "local"
model = "scripted/SCRIPT"

[limits]
max_parallel_steps = 4
"""


def exit_command(key: str) -> str:
    """Check the step's file, then print when the check passed (kept in the attempt)."""
    return f"sh -c 'grep -q {key.upper()} {key}.txt && date +%s.%N'"


def tasklist(variant: str) -> dict[str, Any]:
    """The four steps: a sequence (chained) or four at once (parallel)."""
    steps: list[dict[str, Any]] = []
    for key in STEPS:
        step: dict[str, Any] = {
            "id": key,
            "step_type": "Feature",
            "description": f"write {key}.txt",
            "exit_command": exit_command(key),
        }
        if variant == "parallel":
            step["depends_on"] = []
        steps.append(step)
    return {"title": f"dag bench, {variant}", "steps": steps}


def script(delay: float) -> dict[str, Any]:
    """The scripted model: each step writes its file after ``delay`` s."""

    def write(key: str, wait: float) -> dict[str, Any]:
        call = {"name": "write_file", "arguments": {"path": f"{key}.txt", "content": key.upper()}}
        reply = {"delay": wait, "tool_calls": [call]}
        return {"match": rf"Step {re.escape(key)} \(", "turn": 0, "reply": reply}

    rules = [write(key, delay) for key in STEPS]
    return {"rules": [*rules, {"reply": {"content": "done"}}]}


@dataclass
class StepRun:
    """One step of s1..s4 in one job."""

    key: str
    verify_to_complete: float  # its own exit command passed -> step_completed
    integrated: bool  # merged onto a branch its siblings moved (a step_integrated event)
    commands: int  # exit commands run again on the merged tree (0: not integrated)
    length: float  # step_started -> step_completed


@dataclass
class JobRun:
    """One measured job."""

    variant: str
    wall: float  # calling `merlin submit` -> finished_at
    engine: float  # created_at -> finished_at
    span: float  # first step_started of s1..s4 -> last step_completed of s1..s4
    at_once: int  # most attempts of s1..s4 running at the same time
    steps: list[StepRun]


def _epoch(moment: datetime) -> float:
    return moment.replace(tzinfo=UTC).timestamp()  # the store's times are naive UTC


class Bench:
    """A temporary MERLIN_HOME, its workers, and the job files of both variants."""

    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        from tests.e2e.helpers import merlin_env

        self.work, self.args = work, args
        self.home = work / "home"
        self.env = merlin_env(self.home)
        self.workers: list[subprocess.Popen[bytes]] = []
        files = work / "job"
        files.mkdir()
        (files / "local.yaml").write_text(json.dumps(script(args.delay)))
        self.config = files / "merlin.toml"
        self.config.write_text(CONFIG.replace("SCRIPT", str(files / "local.yaml")))
        self.tasklists = {}
        for variant in VARIANTS:
            self.tasklists[variant] = files / f"{variant}.json"
            self.tasklists[variant].write_text(json.dumps(tasklist(variant)))
        self.jobs = 0
        self._db: Any = None

    @property
    def logs(self) -> list[Path]:
        return [self.work / f"worker{n}.log" for n in range(self.args.workers)]

    def start_workers(self) -> None:
        from tests.e2e.helpers import start_worker

        for log in self.logs:
            self.workers.append(start_worker(self.env, log))
            time.sleep(self.args.stagger)
        self.wait(
            lambda: all("ready." in log.read_text(errors="replace") for log in self.logs),
            f"{len(self.logs)} `merlin worker` processes to log 'ready.'",
        )

    def wait(self, predicate: Any, what: str, timeout: float = READY_SECONDS) -> Any:
        """Poll ``predicate`` while every worker runs; an error with their logs' tails if not."""
        return wait_until(predicate, what, self.workers, self.logs, timeout=timeout)

    def stop_workers(self) -> None:
        """A warm shutdown of all at once, then each one's whole process group."""
        for worker in self.workers:
            with contextlib.suppress(ProcessLookupError):
                if worker.poll() is None:
                    os.kill(worker.pid, signal.SIGTERM)
        for worker in self.workers:
            stop_group(worker)
        if self._db is not None:
            self._db.dispose()

    @property
    def db(self) -> Any:
        from merlin_flow.store import open_database

        if self._db is None:
            self._db = open_database(f"sqlite:///{self.home / 'merlin.db'}")
        return self._db

    def run_job(self, variant: str) -> JobRun:
        """Submit one job of ``variant``, wait until it finished, and read its figures."""
        from merlin_flow.store import Job
        from tests.conftest import make_repo
        from tests.e2e.helpers import merlin

        self.jobs += 1
        repo = make_repo(self.work / f"repo{self.jobs}", {"README.md": "bench\n"})
        command = ["submit", str(self.tasklists[variant]), "--repo", str(repo)]
        started = time.time()
        result = merlin(self.env, *command, "--config", str(self.config), "--json")
        if result.returncode != 0:
            raise RuntimeError(f"merlin submit failed: {result.stderr}")
        job_id: str = json.loads(result.stdout)["job_id"]

        def finished() -> bool:
            with self.db.reader() as session:
                return session.get_one(Job, job_id).finished_at is not None

        self.wait(finished, f"job {job_id} to finish", 120 + 10 * self.args.delay)
        return self._read(variant, job_id, started)

    def _read(self, variant: str, job_id: str, started: float) -> JobRun:
        from sqlalchemy import select

        from merlin_flow.store import AttemptStatus, Event, Job

        with self.db.reader() as session:
            job = session.get_one(Job, job_id)
            if job.status != "completed" or job.finished_at is None:
                tail = "".join(log.read_text(errors="replace")[-1500:] for log in self.logs)
                raise RuntimeError(f"job {job_id} ended {job.status}\n{tail}")
            shape = {step.key: list(step.depends_on or []) for step in job.steps}
            if shape != tasklist_shape(variant):
                raise RuntimeError(f"{variant}: the engine ran {shape}, not its TaskList")
            events = session.scalars(select(Event).where(Event.job_id == job_id))
            at: dict[tuple[str, str | None], Event] = {(e.kind, e.step_key): e for e in events}

            def moment(kind: str, key: str) -> float:
                return _epoch(at[kind, key].created_at)

            steps, intervals = [], []
            for step in job.steps:
                passed = next(a for a in step.attempts if a.status == AttemptStatus.PASSED)
                verified = float((passed.output_tail or "").strip().splitlines()[-1])
                merged = at.get(("step_integrated", step.key))
                commands = len((merged.data or {}).get("commands", [])) if merged else 0
                completed = moment("step_completed", step.key)
                steps.append(
                    StepRun(
                        step.key,
                        completed - verified,
                        merged is not None,
                        commands,
                        completed - moment("step_started", step.key),
                    )
                )
                intervals += [
                    (_epoch(a.started_at), _epoch(a.finished_at or job.finished_at))
                    for a in step.attempts
                ]
            return JobRun(
                variant,
                wall=_epoch(job.finished_at) - started,
                engine=_epoch(job.finished_at) - _epoch(job.created_at),
                span=max(moment("step_completed", k) for k in STEPS)
                - min(moment("step_started", k) for k in STEPS),
                at_once=most_at_once(intervals),
                steps=steps,
            )


def tasklist_shape(variant: str) -> dict[str, list[str]]:
    """The dependencies the engine must store for ``variant``."""
    if variant == "parallel":
        return {key: [] for key in STEPS}
    return {key: ([STEPS[n - 1]] if n else []) for n, key in enumerate(STEPS)}


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at one moment."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, change in edges:
        running += change
        most = max(most, running)
    return most


def measure(args: argparse.Namespace) -> tuple[list[JobRun], float, float]:
    """Start the workers, warm them up, alternate the variants.

    Returns the runs, the seconds it all took, and the load average (1 minute) before.
    """
    load, begun = os.getloadavg()[0], time.monotonic()
    with tempfile.TemporaryDirectory(prefix="merlin-dag-") as tmp:
        work = Path(tmp)
        # Before merlin_flow reads its settings: a home of its own, embedded store and broker.
        os.environ["MERLIN_HOME"] = str(work / "home")
        for name in ("MERLIN_DATABASE_URL", "MERLIN_BROKER_URL"):
            os.environ.pop(name, None)
        bench = Bench(work, args)
        try:
            bench.start_workers()
            bench.run_job("parallel")  # warm up every worker; not counted
            runs = []
            for n in range(args.runs):
                for variant in VARIANTS if n % 2 == 0 else VARIANTS[::-1]:
                    runs.append(bench.run_job(variant))
                    print(f"  {variant}: {runs[-1].wall:.2f} s", file=sys.stderr)
        finally:
            bench.stop_workers()
    return runs, time.monotonic() - begun, load


@dataclass
class Summary:
    """The figures of the whole run: medians per variant, and per kind of step."""

    runs: list[JobRun]
    seconds: float  # the whole run, the workers' start and stop included
    load: float  # load average (1 minute) before the run

    def of(self, variant: str, figure: str) -> list[float]:
        return [getattr(r, figure) for r in self.runs if r.variant == variant]

    def median(self, variant: str, figure: str) -> float:
        return statistics.median(self.of(variant, figure))

    def ratio(self, figure: str) -> float:
        return self.median("parallel", figure) / self.median("chained", figure)

    def steps(self, variant: str) -> list[StepRun]:
        return [s for r in self.runs if r.variant == variant for s in r.steps]

    @property
    def length(self) -> float:
        """The median chained step, step_started to step_completed."""
        return statistics.median(s.length for s in self.steps("chained"))

    @property
    def baseline(self) -> float:
        """The median verify-to-complete of a chained step (never merged)."""
        return statistics.median(s.verify_to_complete for s in self.steps("chained"))

    def groups(self) -> list[tuple[str, list[StepRun]]]:
        """Steps by what happened between their verify and their completion."""
        parallel = self.steps("parallel")
        groups = [
            ("chained (never merged)", self.steps("chained")),
            ("parallel, branch not moved", [s for s in parallel if not s.integrated]),
        ]
        for count in sorted({s.commands for s in parallel if s.integrated}):
            merged = [s for s in parallel if s.integrated and s.commands == count]
            groups.append((f"parallel, merged, {count} commands run again", merged))
        return groups

    def integration_per_job(self) -> list[float]:
        """Per parallel job, the overhead summed over its merged steps."""
        return [
            sum(s.verify_to_complete - self.baseline for s in r.steps if s.integrated)
            for r in self.runs
            if r.variant == "parallel"
        ]

    def last_integration(self) -> float:
        """The median over parallel jobs of their largest overhead (the last merged step)."""
        return statistics.median(
            max(s.verify_to_complete - self.baseline for s in r.steps)
            for r in self.runs
            if r.variant == "parallel"
        )

    def ideal(self) -> float:
        """The ratio if the four steps overlapped perfectly with nothing to merge."""
        return 1 / len(STEPS)


JOB_COLUMNS = (
    "variant",
    "wall time (submit to finished_at)",
    "fastest / slowest",
    "created_at to finished_at",
    "s1..s4 (first started to last completed)",
)
STEP_COLUMNS = (
    "steps",
    "n",
    "median",
    "slowest",
    "overhead (median minus chained median)",
    "overhead per command run again",
)


def job_rows(summary: Summary) -> list[list[str]]:
    """One row per variant, then the ratios."""
    rows = []
    for variant in VARIANTS:
        walls = summary.of(variant, "wall")
        rows.append(
            [
                variant,
                f"{summary.median(variant, 'wall'):.2f} s",
                f"{min(walls):.2f} / {max(walls):.2f} s",
                f"{summary.median(variant, 'engine'):.2f} s",
                f"{summary.median(variant, 'span'):.2f} s",
            ]
        )
    ratios = [f"{summary.ratio(f):.2f}x" for f in ("wall", "engine", "span")]
    return [*rows, ["parallel / chained", ratios[0], "", *ratios[1:]]]


def step_rows(summary: Summary) -> list[list[str]]:
    """One row per kind of step: verify-to-complete times."""
    rows = []
    for label, group in summary.groups():
        if not group:
            continue
        times = [s.verify_to_complete for s in group]
        median = statistics.median(times)
        commands = group[0].commands if group else 0
        per = f"{(median - summary.baseline) / commands * 1000:.0f} ms" if commands else ""
        rows.append(
            [
                label,
                str(len(group)),
                f"{median * 1000:.0f} ms",
                f"{max(times) * 1000:.0f} ms",
                f"{(median - summary.baseline) * 1000:+.0f} ms",
                per,
            ]
        )
    return rows


def print_tables(summary: Summary, args: argparse.Namespace) -> None:
    """The figures as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for title, columns, rows in (
        (f"median of {args.runs} jobs per variant", JOB_COLUMNS, job_rows(summary)),
        ("own exit command passed to step_completed", STEP_COLUMNS, step_rows(summary)),
    ):
        table = Table(title=title)
        for n, column in enumerate(columns):
            table.add_column(column, justify="left" if n == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    console.print(
        f"wall time ratio {summary.ratio('wall'):.3f}x: "
        f"target <= {TARGET}x, floor {FLOOR}x; a chained step "
        f"{summary.length:.2f} s; perfect overlap would give {summary.ideal():.2f}x; "
        f"s1..s4 attempts at once: {[r.at_once for r in summary.runs if r.variant == 'parallel']}"
        "; integration per parallel job: "
        + ", ".join(f"{x:.2f} s" for x in summary.integration_per_job())
    )


def markdown(columns: tuple[str, ...], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(line) + " |" for line in (columns, *rows)]
    return "\n".join([lines[0], "|" + "---|" * len(columns), *lines[1:]])


def machine() -> str:
    """Cores, memory, Python, Celery."""
    from importlib.metadata import version

    memory = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
        memory = f", {kib / 1024**2:.0f} GB"
    return (
        f"{os.cpu_count()} cores{memory}, Python {platform.python_version()}, "
        f"celery {version('celery')}"
    )


def section(summary: Summary, args: argparse.Namespace) -> str:
    """The Markdown section of docs/BENCHMARKS.md."""
    options = f"--runs {args.runs} --delay {args.delay:g} --workers {args.workers}"
    met = "met" if summary.ratio("wall") <= TARGET else "not met"
    at_once = sorted({r.at_once for r in summary.runs if r.variant == "parallel"})
    length = summary.length
    per_job = ", ".join(f"{x:.2f} s" for x in summary.integration_per_job())
    cli = statistics.median(r.wall - r.engine for r in summary.runs)
    span_extra = summary.median("parallel", "span") - length
    parallel, chained = summary.of("parallel", "wall"), summary.of("chained", "wall")
    low, high = min(parallel) / max(chained), max(parallel) / min(chained)
    return f"""{HEADING}

Command (about {round(summary.seconds, -1):.0f} s, the workers' start included):

```
python -m tests.bench.dag    # {options} --stagger {args.stagger:g}
```

The benchmark starts {args.workers} real `merlin worker --concurrency 1` processes (every
queue, the embedded SQLite store and broker in a temporary `MERLIN_HOME`), then submits
jobs with `merlin submit --json`: one warm-up job, then {args.runs} of each variant,
alternating. Both variants have the same four steps, `s1` to `s4`:

- **parallel**: each `depends_on: []`, four independent steps, so the four run at once;
- **chained**: the same steps as a plain list, which runs as a sequence.

The four steps are equal: the scripted model waits
{args.delay:g} s, then writes the step's own file; the exit command checks the file and
prints the time (`sh -c 'grep -q S1 s1.txt && date +%s.%N'`). The wall time runs from
calling `merlin submit` to the job's `finished_at`, so it includes the CLI's start.

Run of {date.today().isoformat()} ({machine()}; load average {summary.load:.2f} before it):

{markdown(JOB_COLUMNS, job_rows(summary))}

- **The target (0.4x at most, floor 0.25x, on the wall time) is {met}: \
{summary.ratio("wall"):.3f}x** ({summary.median("parallel", "wall"):.2f} s / \
{summary.median("chained", "wall"):.2f} s). Between the fastest and the slowest jobs it \
ranges from {low:.2f}x to {high:.2f}x.
- The four steps ran at the same time in every parallel job (most attempts running at
  once: {", ".join(map(str, at_once))}).
- A chained step took {length:.2f} s from `step_started` to `step_completed`:
  {args.delay:g} s of waiting for the model, the rest orchestration (two broker hops at
  the 0.1 s polling interval, worktrees, the commit, the exit command). Four steps
  that overlapped perfectly, with nothing to merge, would give {summary.ideal():.2f}x.
- The CLI's start (`merlin submit` until the job row exists, about {cli:.1f} s) is in
  both wall times. It adds the same to both, which raises the ratio; without it
  (`created_at` to `finished_at`) the ratio is {summary.ratio("engine"):.2f}x.

**Integration overhead.** For each step: the time from its own exit command passing (the
time it printed) to its `step_completed` event. A step whose branch had not moved only
moves it and writes the database. A step that passed after a sibling moved the branch is
merged onto it (`git merge-tree`), and its own exit command and those of the steps that
passed while it ran run again on the merged tree, in one fresh worktree and sandbox,
before the branch moves (`step_integrated`, with the commands in its data). If the branch
moved again meanwhile, it merges again.

{markdown(STEP_COLUMNS, step_rows(summary))}

Summed over the merged steps of each parallel job: {per_job}.

What the figures mean:

- {args.workers} worker processes share 2 cores here. That is fair for this workload:
  the steps wait on the model, not on the CPU, so the four wait at the same time. Steps
  whose work or exit command needs the CPU (a test suite) would not overlap as well on
  2 cores.
- The later a sibling passes, the more exit commands it runs again: the n-th of n
  siblings that pass together runs n. The overhead grows faster than the number of
  commands (see the last column). Two things can add to the later ones, and this
  benchmark does not tell them apart: their re-runs share the 2 cores with their
  siblings' re-runs, and a step whose branch moves during its re-run merges and runs
  them again. With exit commands that take minutes (a test suite), the re-runs take
  minutes too.
- The last merged step's integration is on the job's critical path: in the parallel
  jobs, `s1` to `s4` took {summary.median("parallel", "span"):.2f} s from the first
  `step_started` to the last `step_completed`, {span_extra:.2f} s more than one chained
  step, and the last merged step's overhead was {summary.last_integration():.2f} s of it
  (medians). The rest is four steps at once on 2 cores and the hand-offs between them.
- The parallel job is the four steps side by side, then the job's finalization. The
  chained job pays each step's full length one after the other, and never merges.
"""


SMOKE = {"runs": 1, "delay": 0.2, "workers": 2, "stagger": 0.0, "no_docs": True}
"""The smallest run (``--smoke``): one job of each variant; docs/BENCHMARKS.md untouched."""


def main() -> None:
    """Measure both variants, print the tables, write the section of docs/BENCHMARKS.md."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="jobs of each variant")
    parser.add_argument("--delay", type=float, default=2.0, help="seconds each step's model waits")
    parser.add_argument("--workers", type=int, default=4, help="merlin worker processes")
    parser.add_argument("--stagger", type=float, default=0.5, help="seconds between worker starts")
    parser.add_argument("--docs", type=Path, default=DOCS, help="the file to write the section to")
    parser.add_argument("--no-docs", action="store_true", help="print only")
    parser.add_argument("--smoke", action="store_true", help=f"the smallest run: {SMOKE}")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    with terminated_as_exit():
        runs, seconds, load = measure(args)
    summary = Summary(runs, seconds, load)
    print_tables(summary, args)
    if not args.no_docs:
        write_section(args.docs, HEADING, section(summary, args))
        print(f"wrote the section {HEADING[3:]!r} of {args.docs}")


if __name__ == "__main__":
    main()
