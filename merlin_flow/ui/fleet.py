"""The fleet page (``/fleet``, ``/api/fleet``): live workers per queue, costs per tier and day.

Plain data, read through the functions the CLI reads, so that the page, its JSON and
the CLI never disagree:

- the workers are ``engine.presence.live_workers`` (the beats ``merlin status`` and
  ``merlin submit`` warn by), the queues ``workers.queues.ALL_QUEUES`` (imported when
  asked, as the CLI does); a queue no live worker consumes (``presence.missing_queues``,
  what the CLI's notice says) is a warning;
- the costs are ``jobs.costs.costs_since`` (``merlin costs --since 14d``, its totals
  and tiers as they are) and ``jobs.costs.costs_per_day``, the same calls per UTC day
  and tier. The period is that of ``--since``: its oldest day is a part of a day.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import TypedDict

from merlin_flow.engine.presence import WorkerSeen, live_workers, missing_queues, silence_limit
from merlin_flow.errors import InputError
from merlin_flow.jobs.costs import (
    NO_CALLS,
    CallCounts,
    DayCosts,
    TierCosts,
    cost_fields,
    costs_per_day,
    costs_since,
)
from merlin_flow.jobs.views import iso_utc
from merlin_flow.settings import Settings
from merlin_flow.store import Database, utcnow

MOST_DAYS = 366
"""The longest period the page shows, in days."""


class WorkerEntry(TypedDict):
    """A live worker, as of its last beat."""

    name: str
    queues: list[str]
    last_seen: str
    """UTC, ISO, ``Z``: as the job views write times."""
    seconds_since: float


class QueueWorkers(TypedDict):
    """A queue and the live workers consuming it (a worker of several queues is in each)."""

    queue: str
    merlin_queue: bool
    """One of merlin's queues; False for a queue only a worker names."""
    workers: list[WorkerEntry]


class QueueWarning(TypedDict):
    """One of merlin's queues that no live worker consumes: its tasks wait."""

    queue: str
    message: str


class Day(TypedDict):
    """One UTC day of the period: its calls per tier and in all."""

    day: str
    tiers: dict[str, CallCounts]
    """Every tier of the period, ``NO_CALLS`` on a day it made none."""
    total: CallCounts
    bar_percent: float
    """The day's known cost as a share of the costliest day's, 0 to 100."""


class FleetCosts(TypedDict):
    """What the period's calls cost: ``merlin costs --since``, and per day."""

    since: str
    jobs: int
    escalations: int
    total: CallCounts
    tiers: list[TierCosts]
    """``costs_since``'s tiers, by name (a tier seen only per day gets ``NO_CALLS``)."""
    days: list[Day]
    """Every day of the period, newest first."""


class FleetView(TypedDict):
    """What ``/fleet`` shows and ``/api/fleet`` gives."""

    as_of: str
    days: int
    silence_seconds: int
    """A worker silent for longer is taken for gone (``presence.silence_limit``)."""
    queues: list[QueueWorkers]
    warnings: list[QueueWarning]
    costs: FleetCosts


def parse_days(text: str | None) -> int:
    """``?days=``: a whole number of days from 1 to ``MOST_DAYS``, 14 when not given."""
    if text is None or text == "":
        return 14
    whole = text.isascii() and text.isdigit() and len(text) <= 6  # int() of no huge text
    if not whole or not 1 <= int(text) <= MOST_DAYS:
        raise InputError(f"days {text[:40]!r}: a whole number of days from 1 to {MOST_DAYS}")
    return int(text)


def merlin_queues() -> tuple[str, ...]:
    """The queues of merlin's tasks, where the CLI reads them (``workers.queues``)."""
    from workers.queues import ALL_QUEUES

    return tuple(ALL_QUEUES)


def fleet_view(db: Database, settings: Settings, days: int = 14) -> FleetView:
    """Live workers per queue, warnings for the queues none serves, costs of ``days`` days."""
    if not 1 <= days <= MOST_DAYS:
        raise InputError(f"days {days}: a whole number of days from 1 to {MOST_DAYS}")
    now = utcnow()
    seen = live_workers(db, settings)
    silence = int(silence_limit(settings).total_seconds())
    queues = merlin_queues()
    groups = workers_by_queue(seen, queues, now)
    return {
        "as_of": iso_utc(now) or "",
        "days": days,
        "silence_seconds": silence,
        "queues": groups,
        "warnings": queue_warnings(missing_queues(db, settings, queues), silence),
        "costs": fleet_costs(db, timedelta(days=days), now),
    }


def workers_by_queue(
    seen: list[WorkerSeen], queues: tuple[str, ...], now: datetime
) -> list[QueueWorkers]:
    """Each of ``queues``, then each other queue a worker names, with its live workers."""
    named = {queue for worker in seen for queue in worker.queues if queue}
    groups: list[QueueWorkers] = []
    for queue in [*queues, *sorted(named - set(queues))]:
        workers = [_entry(worker, now) for worker in seen if queue in worker.queues]
        groups.append({"queue": queue, "merlin_queue": queue in queues, "workers": workers})
    return groups


def _entry(worker: WorkerSeen, now: datetime) -> WorkerEntry:
    return {
        "name": worker.name,
        "queues": [queue for queue in worker.queues if queue],
        "last_seen": iso_utc(worker.last_seen) or "",
        "seconds_since": round(max(0.0, (now - worker.last_seen).total_seconds()), 1),
    }


def queue_warnings(missing: list[str], silence: int) -> list[QueueWarning]:
    """A warning for each queue of ``missing`` (``presence.missing_queues``)."""
    return [
        {
            "queue": queue,
            "message": f"no worker has served queue {queue} in the last {silence} s: its "
            f"tasks wait until one starts (`merlin worker -Q {queue}`)",
        }
        for queue in missing
    ]


def fleet_costs(db: Database, period: timedelta, now: datetime) -> FleetCosts:
    """``costs_since(period)`` as it is, and ``costs_per_day(period)`` laid out by day."""
    report = costs_since(db, period)
    per_day = costs_per_day(db, period)
    by_tier = {row["tier"]: row for row in report["tiers"]}
    names = sorted(by_tier.keys() | {row["tier"] for row in per_day})
    tiers: list[TierCosts] = [by_tier.get(name) or {"tier": name, **NO_CALLS} for name in names]
    first = datetime.fromisoformat(report["since"].removesuffix("Z")).date()
    return {
        "since": report["since"],
        "jobs": report["jobs"],
        "escalations": report["escalations"],
        "total": report["total"],
        "tiers": tiers,
        "days": lay_out_days(per_day, names, first, now.date()),
    }


def lay_out_days(rows: list[DayCosts], tiers: list[str], first: date, last: date) -> list[Day]:
    """Every day from ``last`` back to ``first`` (or to the rows' own), with each tier's calls."""
    cells = {(row["day"], row["tier"]): row for row in rows}
    seen = [date.fromisoformat(row["day"]) for row in rows]
    first, last = min([first, *seen]), max([last, *seen])
    days: list[Day] = []
    for back in range((last - first).days + 1):
        name = (last - timedelta(days=back)).isoformat()
        counts = {tier: _counts(cells.get((name, tier), NO_CALLS)) for tier in tiers}
        total = add_up(list(counts.values()))
        days.append({"day": name, "tiers": counts, "total": total, "bar_percent": 0.0})
    costliest = max(day["total"]["known_cost_usd"] for day in days)
    for day in days:
        if costliest > 0:
            day["bar_percent"] = round(day["total"]["known_cost_usd"] / costliest * 100, 1)
    return days


def _counts(row: CallCounts) -> CallCounts:
    """The counts of ``row`` alone (no ``day`` or ``tier``), a copy."""
    return add_up([row])


def add_up(groups: list[CallCounts]) -> CallCounts:
    """The calls, tokens and cost of several groups of calls together (a day's tiers)."""
    return {
        "calls": sum(group["calls"] for group in groups),
        "replayed_calls": sum(group["replayed_calls"] for group in groups),
        "cached_calls": sum(group["cached_calls"] for group in groups),
        "failed_calls": sum(group["failed_calls"] for group in groups),
        "prompt_tokens": sum(group["prompt_tokens"] for group in groups),
        "completion_tokens": sum(group["completion_tokens"] for group in groups),
        **cost_fields(
            sum(group["known_cost_usd"] for group in groups),
            sum(group["unpriced_calls"] for group in groups),
        ),
    }
