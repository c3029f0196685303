"""A small chaos campaign (``python -m tests.chaos``) in CI: real workers killed at random.

Eight jobs of two steps on two `merlin worker --concurrency 2` processes, on the embedded
SQLite store and broker, while three workers in turn are SIGKILLed (their whole process
group) and replaced, each kill once the workers are settled (``Campaign.settled``);
then every invariant of ``tests.chaos.invariants`` holds, no command outlived its
worker, no worktree is left, and no step a kill stalled sat longer than a lease before
its lease moved. A third runs two simulated machines on Redis + Postgres, each in a PID
and mount namespace of its own (``--namespaces``), one kill of two a whole machine's
crash.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.__main__ import Result, measure, parse
from tests.chaos.campaign import Campaign, backend
from tests.chaos.invariants import check
from tests.chaos.namespaces import namespace_problem

pytestmark = pytest.mark.e2e


def run_campaign(tmp_path: Path, argv: list[str]) -> tuple[Campaign, Result]:
    """A campaign on ``argv``'s backend, checked (poison jobs and namespaces included)."""
    args = parse(argv)
    with backend(args.backend, tmp_path) as target:
        campaign = Campaign(tmp_path, args, target)
        try:
            seconds = campaign.run()
        finally:
            campaign.stop()
        found = check(
            campaign.db, campaign.job_ids, campaign.repos, campaign.homes, campaign.poisoned
        )
        if args.namespaces:
            found.violations += campaign.namespace_violations()
        result = measure(campaign, found, seconds)
        campaign.stop()
    return campaign, result


def test_jobs_complete_while_workers_are_killed(tmp_path: Path) -> None:
    campaign, result = run_campaign(
        tmp_path,
        ["--jobs", "8", "--steps", "2", "--workers", "2", "--backend", "sqlite",
         "--kill-every", "1", "2", "--max-kills", "3", "--seed", "7", "--max-minutes", "3",
         "--delay", "1"],
    )  # fmt: skip
    found, seconds = result.findings, result.seconds
    assert len(campaign.tally.kills) == 3
    assert campaign.tally.submit_failures == []
    assert found.violations == [], campaign.log_tail()
    assert (found.jobs, found.completed) == (8, 8)
    assert found.worktrees_left == 0
    assert (campaign.tally.orphans, campaign.tally.orphans_at_end) == ([], [])
    assert result.over == [], (result.idle_step, result.unswept)
    assert result.idle <= result.bound
    assert campaign.finished, f"unfinished after {seconds:.0f} s: {campaign.log_tail()}"


def test_a_poison_step_is_parked_and_the_other_jobs_complete(tmp_path: Path) -> None:
    """A step that kills the process running it at every delivery, with no other kill."""
    campaign, result = run_campaign(
        tmp_path,
        ["--jobs", "3", "--poison", "1", "--steps", "2", "--workers", "2",
         "--backend", "sqlite", "--max-kills", "0", "--seed", "8", "--max-minutes", "4"],
    )  # fmt: skip
    found, seconds = result.findings, result.seconds
    assert found.violations == [], campaign.log_tail()
    assert (found.jobs, found.completed, found.parked) == (3, 2, 1)
    assert campaign.finished, f"unfinished after {seconds:.0f} s: {campaign.log_tail()}"


def test_jobs_complete_across_pid_namespaces(tmp_path: Path) -> None:
    """Two machines that cannot see each other's processes: no machine's PID namespace
    shows another's workers, each writes lease tokens of its own pid space, and no step
    sits longer than a lease and a sweep after a kill, nor after a machine's crash (every
    process of its namespace killed at once; it boots again in a new one, a new pid
    space: its steps are taken over only once their lease lapsed)."""
    problem = namespace_problem()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"PID namespaces are required in CI: {problem}")
        pytest.skip(problem)
    argv = [
        "--jobs", "8", "--steps", "3", "--command", "2", "--machines", "2",
        "--backend", "redis", "--namespaces", "--crash-every", "2", "--kill-every", "2", "4",
        "--max-kills", "3", "--outage-every", "0", "--seed", "7", "--max-minutes", "3",
    ]  # fmt: skip
    campaign, result = run_campaign(tmp_path, argv)
    args = parse(argv)
    found, seconds = result.findings, result.seconds
    assert campaign.tally.submit_failures == []
    assert found.violations == [], campaign.log_tail()
    assert (found.jobs, found.completed) == (8, 8)
    assert found.worktrees_left == 0
    assert (campaign.tally.orphans, campaign.tally.orphans_at_end) == ([], [])
    assert result.over == [], (result.idle_step, result.unswept)
    assert result.bound == args.lease + args.sweep
    assert result.idle <= result.bound
    assert campaign.finished, f"unfinished after {seconds:.0f} s: {campaign.log_tail()}"
    # Each machine saw its own workers and none of the other's; their tokens' pid spaces
    # differ (namespace_violations holds each token to its machine's spaces).
    seen = campaign.tally.isolation
    assert seen["m0"]["m0"] > 0, seen
    assert seen["m1"]["m1"] > 0, seen
    assert seen["m0"]["m1"] == seen["m1"]["m0"] == 0, seen
    assert set(result.spaces) == {"m0", "m1"}, result.spaces
    assert not result.spaces["m0"] & result.spaces["m1"], result.spaces
    assert len(campaign.tally.kills) >= 2
    assert campaign.tally.crashes >= 1
    # A crashed machine came back in a new pid space (a reboot's new boot id).
    assert sum(len(machine.spaces) for machine in campaign.machines) == 2 + campaign.tally.crashes
