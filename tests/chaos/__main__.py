"""The chaos campaign: ``python -m tests.chaos [--jobs 100] [--backend both] ...``.

Jobs run on real workers while a driver SIGKILLs a random worker's process group at
random intervals (and, on Redis + Postgres, cuts every connection now and then); then
the invariants are checked from the database and git (``tests.chaos.invariants``). It
prints a report per backend and exits 1 on any violation or job not completed.
docs/RELIABILITY.md holds the figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.chaos.campaign import LEASE_SECONDS, Campaign, Tally, backend
from tests.chaos.invariants import Findings, check


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The campaign's options."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--jobs", type=int, default=100, help="jobs to submit")
    parser.add_argument("--steps", type=int, default=3, help="chained steps per job")
    parser.add_argument("--workers", type=int, default=2, help="worker processes at a time")
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
    parser.add_argument("--delay", type=float, default=0.5, help="seconds per scripted turn")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    parser.add_argument("--max-minutes", type=float, default=30.0, help="stop after this long")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = int(time.time())
    return args


def run(name: str, args: argparse.Namespace) -> tuple[Findings, Tally, float, str]:
    """One campaign on backend ``name``: its findings, what the driver did, seconds, logs."""
    with tempfile.TemporaryDirectory(prefix=f"merlin-chaos-{name}-") as tmp:
        work = Path(tmp)
        with backend(name, work) as target:
            campaign = Campaign(work, args, target)
            try:
                seconds = campaign.run()
            finally:
                campaign.stop()
            findings = check(
                campaign.db, campaign.job_ids, campaign.repos, campaign.home, campaign.poisoned
            )
            for failure in campaign.tally.submit_failures:
                findings.violations.append(f"submit failed: {failure}")
            missing = args.jobs - len(campaign.job_ids) - len(campaign.tally.submit_failures)
            if missing:
                findings.violations.append(f"{missing} jobs never submitted (time ran out)")
            logs = campaign.log_tail() if findings.violations else ""
            campaign.stop()
            return findings, campaign.tally, seconds, logs


def report(
    results: dict[str, tuple[Findings, Tally, float, str]], args: argparse.Namespace
) -> None:
    """The table of every backend's figures, then each violation."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"chaos campaign (seed {args.seed})")
    table.add_column("figure")
    for name in results:
        table.add_column(name, justify="right")
    columns = [_figures(found, tally, seconds) for found, tally, seconds, _ in results.values()]
    for n, label in enumerate(LABELS):
        table.add_row(label, *(str(values[n]) for values in columns))
    console.print(table)
    console.print(
        f"{args.jobs} jobs x {args.steps} steps, {args.workers} workers, a kill every "
        f"{args.kill_every[0]:g}-{args.kill_every[1]:g} s, lease {LEASE_SECONDS:g} s; "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    for name, (found, _, _, logs) in results.items():
        for violation in found.violations:
            console.print(f"[red]{name}: {violation}[/red]", highlight=False)
        if logs:
            print(logs[-6000:], file=sys.stderr)


LABELS = (
    "jobs",
    "completed",
    "poison steps parked",
    "statuses",
    "kills (of an idle worker)",
    "outages (sessions, clients cut)",
    "submits retried after an outage",
    "steps taken over (counted against them)",
    "lost messages re-published",
    "paid / replayed model calls",
    "longest silence of a running job",
    "time",
    "violations",
)


def _figures(found: Findings, tally: Tally, seconds: float) -> list[Any]:
    """The values of ``LABELS`` for one backend."""
    return [
        found.jobs,
        found.completed,
        found.parked,
        ", ".join(f"{k} {v}" for k, v in sorted(found.statuses.items())),
        f"{len(tally.kills)} ({tally.idle_kills})",
        f"{tally.outages} ({tally.cut_sessions}, {tally.cut_clients})",
        tally.submit_retries,
        f"{found.losses} ({found.counted})",
        found.lost_messages,
        f"{found.paid_calls} / {found.replayed_calls}",
        f"{found.max_idle:.1f} s",
        f"{seconds:.0f} s",
        len(found.violations),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the campaign on each backend asked for; 1 if anything was violated."""
    args = parse(argv)
    names = ("sqlite", "redis") if args.backend == "both" else (args.backend,)
    results = {name: run(name, args) for name in names}
    report(results, args)
    bad = any(
        found.violations or found.completed + found.parked < args.jobs
        for found, *_ in results.values()
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
