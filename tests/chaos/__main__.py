"""The chaos campaign: ``python -m tests.chaos [--jobs 100] [--backend both] ...``.

Jobs run on real workers while a driver SIGKILLs a random worker's process group at
random intervals (and, on Redis + Postgres, cuts every connection now and then); then
the invariants are checked from the database and git (``tests.chaos.invariants``). It
prints a report per backend (and machine setup): the invariants broken, the commands a
killed worker left running (orphans), and the longest a step sat after a kill before
its lease moved, against its bound (a lease). It exits 1
on any violation, job not completed, orphan, or step idle past the bound.
``--disk-full`` runs the disk-full campaign instead (``tests.chaos.disk_full``).
docs/RELIABILITY.md holds the figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.campaign import LEASE_SECONDS, SWEEP_SECONDS, Campaign, Tally, backend
from tests.chaos.invariants import Findings, check


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The campaign's options."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--jobs", type=int, default=100, help="jobs to submit")
    parser.add_argument("--steps", type=int, default=3, help="chained steps per job")
    parser.add_argument(
        "--workers", type=int, default=2,
        help="worker processes at a time, every queue (without --machines)",
    )  # fmt: skip
    parser.add_argument(
        "--concurrency", type=int, default=2,
        help="each worker's --concurrency (above 1, a worker prefetches several messages)",
    )  # fmt: skip
    parser.add_argument(
        "--machines", type=int, default=0,
        help="redis only: N simulated machines (own MERLIN_HOME and folder, an llm,control "
        "and a verify worker each) on one git URL per job",
    )  # fmt: skip
    parser.add_argument(
        "--namespaces", action="store_true",
        help="with --machines: each machine in a PID and mount namespace of its own (no "
        "machine sees another's processes: take-overs across machines wait for the lease)",
    )  # fmt: skip
    parser.add_argument(
        "--crash-every", type=int, default=0,
        help="with --namespaces: every N-th kill takes a whole machine down (its namespace's "
        "init: every process in it) and boots it again in a new namespace (0: never)",
    )  # fmt: skip
    parser.add_argument(
        "--backend", choices=("sqlite", "redis", "both"), default="both",
        help="sqlite: embedded store and broker; redis: Redis + Postgres",
    )  # fmt: skip
    parser.add_argument(
        "--kill-every", type=float, nargs=2, default=(5.0, 15.0), metavar=("MIN", "MAX"),
        help="seconds between kills, uniform between MIN and MAX",
    )  # fmt: skip
    parser.add_argument("--max-kills", type=int, default=1000, help="kills at most")
    parser.add_argument(
        "--outage-every", type=int, default=4,
        help="on redis: cut every connection after each N-th kill (0: never)",
    )  # fmt: skip
    parser.add_argument(
        "--poison", type=int, default=0,
        help="jobs (of --jobs) whose one step kills the process running it at every delivery",
    )  # fmt: skip
    parser.add_argument(
        "--lease", type=float, default=LEASE_SECONDS, help="the jobs' lease_seconds"
    )
    parser.add_argument(
        "--sweep", type=float, default=SWEEP_SECONDS,
        help="seconds between each worker's recovery sweeps (MERLIN_SWEEP_INTERVAL)",
    )  # fmt: skip
    parser.add_argument("--delay", type=float, default=0.5, help="seconds per scripted turn")
    parser.add_argument(
        "--command", type=float, default=1.0,
        help="seconds each step's run_command takes (its exit command: half that)",
    )  # fmt: skip
    parser.add_argument(
        "--sandbox", choices=("bwrap", "none"), default="bwrap",
        help="the jobs' [sandbox] mode (none: commands run as plain processes)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    parser.add_argument("--max-minutes", type=float, default=30.0, help="stop after this long")
    parser.add_argument(
        "--disk-full", action="store_true",
        help="the disk-full campaign (tests/chaos/disk_full.py): no kills; MERLIN_HOME and "
        "the repositories on a small tmpfs, filled then freed (root only)",
    )  # fmt: skip
    parser.add_argument("--disk-mb", type=int, default=300, help="--disk-full: the tmpfs's size")
    parser.add_argument(
        "--fills", type=int, default=2, help="--disk-full: times the disk is filled"
    )
    parser.add_argument(
        "--full-seconds", type=float, default=30.0,
        help="--disk-full: how long the disk stays full each time",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = int(time.time())
    if args.machines and args.backend != "redis":
        parser.error("--machines needs --backend redis (the machines share Postgres and Redis)")
    if args.namespaces and not args.machines:
        parser.error("--namespaces needs --machines (a namespace per simulated machine)")
    if args.crash_every and not args.namespaces:
        parser.error("--crash-every needs --namespaces (a crash kills a machine's namespace)")
    return args


@dataclass
class Result:
    """One campaign's figures: the invariants' findings and what the driver saw."""

    findings: Findings
    tally: Tally
    seconds: float
    bound: float
    """The longest a step may sit after a kill (a lease; across namespaces, and a sweep)."""
    idle: float = 0.0
    """The longest a step sat after a kill before its lease moved."""
    idle_step: str = ""
    timed: tuple[int, int] = (0, 0)
    """Steps timed after kills: run by the victim, queued with their message delivered."""
    over: list[str] = field(default_factory=list)
    """A line per step that sat longer than ``bound``."""
    unswept: float = 0.0
    """The longest time no worker swept (every live one starting, or cut off)."""
    spaces: dict[str, set[str]] = field(default_factory=dict)
    """The pid spaces of the lease tokens seen, by machine."""
    takeovers: tuple[list[float], list[float]] = ([], [])
    """The waits of running steps whose lease moved before it lapsed, and after."""
    logs: str = ""

    @property
    def orphans(self) -> int:
        """Commands that outlived their worker, after a kill or at the end."""
        return len(self.tally.orphans) + len(self.tally.orphans_at_end)

    def failed(self, jobs: int) -> bool:
        """Whether anything the campaign holds to failed."""
        found = self.findings
        return bool(
            found.violations or found.completed + found.parked < jobs or self.orphans or self.over
        )


def run(name: str, args: argparse.Namespace) -> Result:
    """One campaign on backend ``name``: its findings, what the driver saw, its logs."""
    with tempfile.TemporaryDirectory(prefix=f"merlin-chaos-{name}-") as tmp:
        work = Path(tmp)
        with backend(name, work) as target:
            campaign = Campaign(work, args, target)
            try:
                seconds = campaign.run()
            finally:
                campaign.stop()
            findings = check(
                campaign.db, campaign.job_ids, campaign.repos, campaign.homes, campaign.poisoned
            )
            findings.violations += campaign.namespace_violations()
            for failure in campaign.tally.submit_failures:
                findings.violations.append(f"submit failed: {failure}")
            missing = args.jobs - len(campaign.job_ids) - len(campaign.tally.submit_failures)
            if missing:
                findings.violations.append(f"{missing} jobs never submitted (time ran out)")
            result = measure(campaign, findings, seconds)
            if result.failed(args.jobs):
                result.logs = campaign.log_tail()
            campaign.stop()
            return result


def measure(campaign: Campaign, findings: Findings, seconds: float) -> Result:
    """The campaign's result: its findings, and the idle times of ``campaign.idle``."""
    bound = campaign.idle_bound
    idle, step = campaign.idle.longest()
    held = [h for stall in campaign.idle.stalls for h in stall.held]
    timed = (sum(not h.delivered for h in held), sum(h.delivered for h in held))
    over = campaign.idle.over(bound)
    unswept = campaign.idle.longest_unswept()
    spaces = campaign.token_spaces()
    return Result(
        findings, campaign.tally, seconds, bound, idle, step, timed, over, unswept, spaces,
        campaign.idle.takeovers(),
    )  # fmt: skip


def column(name: str, args: argparse.Namespace) -> str:
    """A backend's column title, with its machine setup."""
    if name == "redis" and args.machines:
        spaces = ", PID namespace each" if args.namespaces else ""
        return f"redis, {args.machines} machines{spaces}"
    return name


def report(results: dict[str, Result], args: argparse.Namespace) -> None:
    """The table of every backend's figures, then each failure."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"chaos campaign (seed {args.seed})")
    table.add_column("figure")
    for name in results:
        table.add_column(column(name, args), justify="right")
    columns = [_figures(result) for result in results.values()]
    for n, label in enumerate(LABELS):
        table.add_row(label, *(str(values[n]) for values in columns))
    console.print(table)
    workers = (
        f"{args.machines} machines x (llm,control + verify)"
        if args.machines
        else f"{args.workers} workers"
    )

    spaces = ""
    if args.machines:
        spaces = (
            " (each machine in a PID + mount namespace of its own)"
            if args.namespaces
            else " (all machines in one PID namespace)"
        )
    console.print(
        f"{args.jobs} jobs x {args.steps} steps, {workers} at --concurrency {args.concurrency}"
        f"{spaces}, "
        f"a kill every {args.kill_every[0]:g}-{args.kill_every[1]:g} s, lease {args.lease:g} s, "
        f"sweep {args.sweep:g} s, commands {args.command:g} s, sandbox {args.sandbox}; "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    for name, result in results.items():
        lines = [
            *result.findings.violations,
            *(f"orphan {line}" for line in result.tally.orphans),
            *(f"orphan at the end: {line}" for line in result.tally.orphans_at_end),
            *result.over,
        ]
        for line in lines:
            console.print(f"[red]{column(name, args)}: {line}[/red]", highlight=False)
        if result.idle_step:
            console.print(f"{column(name, args)}: longest idle after a kill: {result.idle_step}")
        for machine, counts in result.tally.isolation.items():
            seen = ", ".join(f"{n} of {other}'s" for other, n in counts.items())
            console.print(
                f"{column(name, args)}: {machine}'s PID namespace shows {seen} processes",
                highlight=False,
            )
        if result.logs:
            print(result.logs[-6000:], file=sys.stderr)


LABELS = (
    "jobs",
    "completed",
    "poison steps parked",
    "statuses",
    "kills (of an idle worker; unwatched)",
    "machine crashes (of the kills)",
    "outages (sessions, clients cut)",
    "submits retried after an outage",
    "steps taken over (counted against them)",
    "lost messages re-published",
    "paid / replayed model calls",
    "command processes at kills",
    "orphans (after kills + at the end)",
    "steps timed after kills (running + delivered)",
    "running steps moved before / after their lease lapsed",
    "longest idle after a kill (bound)",
    "PID spaces in lease tokens (machines)",
    "longest time without a sweep",
    "worktrees left (cleanup wait)",
    "longest silence of a running job",
    "time",
    "violations",
)


def _figures(result: Result) -> list[Any]:
    """The values of ``LABELS`` for one backend."""
    found, tally = result.findings, result.tally
    return [
        found.jobs,
        found.completed,
        found.parked,
        ", ".join(f"{k} {v}" for k, v in sorted(found.statuses.items())),
        f"{len(tally.kills)} ({tally.idle_kills}; {tally.snapshot_failures})",
        tally.crashes,
        f"{tally.outages} ({tally.cut_sessions}, {tally.cut_clients})",
        tally.submit_retries,
        f"{found.losses} ({found.counted})",
        found.lost_messages,
        f"{found.paid_calls} / {found.replayed_calls}",
        tally.commands_at_kills,
        f"{result.orphans} ({len(tally.orphans)} + {len(tally.orphans_at_end)})",
        f"{sum(result.timed)} ({result.timed[0]} + {result.timed[1]})",
        _split(result.takeovers),
        f"{result.idle:.1f} s ({result.bound:g} s)",
        f"{len(set().union(*result.spaces.values()))} ({len(result.spaces)})",
        f"{result.unswept:.1f} s",
        f"{found.worktrees_left} ({tally.cleanup_seconds:.1f} s)",
        f"{found.max_idle:.1f} s",
        f"{result.seconds:.0f} s",
        len(found.violations),
    ]


def _split(takeovers: tuple[list[float], list[float]]) -> str:
    """``early / late (longest of each)``."""
    early, late = takeovers
    longest = [f"{max(waits, default=0.0):.1f} s" for waits in (early, late)]
    return f"{len(early)} / {len(late)} ({longest[0]} / {longest[1]})"


def main(argv: list[str] | None = None) -> int:
    """Run the campaign on each backend asked for; 1 if anything failed."""
    args = parse(argv)
    names = ("sqlite", "redis") if args.backend == "both" else (args.backend,)
    if args.disk_full:
        from tests.chaos.disk_full import print_report, run_disk_full

        reports = {name: run_disk_full(name, args) for name in names}
        print_report(reports, args)
        return 1 if any(r.failed(args.jobs) for r in reports.values()) else 0
    results = {name: run(name, args) for name in names}
    report(results, args)
    return 1 if any(result.failed(args.jobs) for result in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
