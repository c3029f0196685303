"""Benchmark: the embedded broker's polling interval, per-step overhead against idle CPU.

Run: ``python -m tests.bench.broker_poll`` (about 2 minutes; ``--smoke``: one interval,
one job, 1 s idle, under a minute). For each interval it starts a
real ``merlin worker`` (prefork, 2 processes) on a fresh MERLIN_HOME, measures the CPU the
idle worker burns over 10 s, then runs jobs of 5 steps whose scripted model answers at once
and whose exit command is ``true``, so the time per step is orchestration alone (two chain
hops, the lease claims, two git worktrees, the commit). Prints a Markdown table. The
worker is stopped, its whole process group, however the run ends (Ctrl-C and SIGTERM too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from merlin_flow.store import Job, open_database
from tests.bench.processes import stop_group, terminated_as_exit, wait_until
from tests.conftest import make_repo
from tests.e2e.helpers import merlin, merlin_env, start_worker, write_job_files

INTERVALS = [0.02, 0.05, 0.1, 0.25]
STEPS = 5
JOBS = 3
IDLE_SECONDS = 10.0
INSTANT = "rules:\n  - reply: {content: done}\n"
TASKLIST = "title: overhead\nsteps:\n" + "".join(
    f"  - {{id: s{i}, step_type: Verify, description: step {i}, exit_command: 'true'}}\n"
    for i in range(STEPS)
)


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in a process group."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def measure(interval: float, work: Path, idle_seconds: float, jobs: int) -> dict[str, float]:
    """Idle CPU and per-step time for one polling interval."""
    home = work / f"home-{interval}"
    env = merlin_env(home, MERLIN_BROKER_POLL_INTERVAL=str(interval), MERLIN_SWEEP_INTERVAL="15")
    tasklist, config = write_job_files(work / f"job-{interval}", local=INSTANT, tasklist=TASKLIST)
    repo = make_repo(work / f"repo-{interval}", {"README.md": "bench\n"})
    log = work / f"worker-{interval}.log"
    db = open_database(f"sqlite:///{home / 'merlin.db'}")
    worker = start_worker(env, log, "--concurrency", "2")
    try:
        what = f"`merlin worker` (polling every {interval:g} s) to log 'ready.'"
        wait_until(lambda: "ready." in log.read_text(errors="replace"), what, [worker], [log])
        time.sleep(2)
        cpu0 = group_cpu_seconds(worker.pid)
        time.sleep(idle_seconds)
        idle = (group_cpu_seconds(worker.pid) - cpu0) / idle_seconds * 100
        per_step = []
        for _ in range(jobs):
            out = merlin(
                env, "submit", str(tasklist), "--repo", str(repo), "--config", str(config), "--json"
            )
            if out.returncode != 0:
                raise RuntimeError(f"merlin submit failed: {out.stderr}")
            job_id = json.loads(out.stdout)["job_id"]

            def finished(job_id: str = job_id) -> Job | None:
                with db.session() as session:
                    job = session.get(Job, job_id)
                    return job if job is not None and job.finished_at is not None else None

            job = wait_until(finished, f"job {job_id} to finish", [worker], [log], 120, 0.05)
            if job.status != "completed":
                raise RuntimeError(f"job {job_id} ended {job.status}: {job.error}")
            per_step.append((job.finished_at - job.started_at).total_seconds() / STEPS)
    finally:
        stop_group(worker)
        db.dispose()
    return {"interval": interval, "idle_cpu": idle, "per_step": statistics.median(per_step)}


def main() -> None:
    """Run every interval and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="0.1 s, one job, 1 s idle")
    args = parser.parse_args()
    intervals, idle, jobs = ([0.1], 1.0, 1) if args.smoke else (INTERVALS, IDLE_SECONDS, JOBS)
    with terminated_as_exit(), tempfile.TemporaryDirectory(prefix="merlin-bench-") as tmp:
        rows = [measure(interval, Path(tmp), idle, jobs) for interval in intervals]
    print(
        "| polling interval | idle worker CPU (% of one core) "
        f"| time per step (median of {jobs} jobs x {STEPS} steps) |"
    )
    print("|---|---|---|")
    for row in rows:
        print(
            f"| {row['interval']:g} s | {row['idle_cpu']:.1f}% | {row['per_step'] * 1000:.0f} ms |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
