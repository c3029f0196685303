"""The fleet page's data: live workers per queue, and costs as `merlin costs --since` says."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from jinja2 import Environment, FileSystemLoader, select_autoescape
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from merlin_flow.engine.presence import beat, missing_queues, silence_limit
from merlin_flow.errors import InputError
from merlin_flow.jobs.costs import costs_since, parse_since
from merlin_flow.settings import Settings
from merlin_flow.store import Database, WorkerBeat, utcnow
from merlin_flow.ui import fleet, formats
from merlin_flow.ui.fleet import fleet_view, parse_days
from tests.unit.jobs.test_costs import journal_on_three_days
from workers.queues import ALL_QUEUES


def _last_seen(db: Database, name: str, when: datetime) -> None:
    with db.session() as session:
        session.get_one(WorkerBeat, name).last_seen = when


def _workers(db: Database, settings: Settings) -> None:
    """``llm`` and ``control`` (with a queue of its own) served; ``verify``'s worker gone."""
    beat(db, "w-llm@a", ["llm"])
    beat(db, "w-control@b", ["control", "gpu"])
    beat(db, "w-gone@c", ["verify"])
    _last_seen(db, "w-llm@a", utcnow() - timedelta(seconds=5))
    _last_seen(db, "w-gone@c", utcnow() - silence_limit(settings) - timedelta(seconds=1))


def test_live_workers_are_grouped_by_queue_and_an_unserved_queue_is_a_warning(
    db: Database, settings: Settings
) -> None:
    _workers(db, settings)
    view = fleet_view(db, settings)
    groups = view["queues"]
    assert [(g["queue"], g["merlin_queue"]) for g in groups] == [
        *((queue, True) for queue in ALL_QUEUES),
        ("gpu", False),  # a queue only a worker names comes after merlin's
    ]
    assert {g["queue"]: [w["name"] for w in g["workers"]] for g in groups} == {
        "control": ["w-control@b"],
        "llm": ["w-llm@a"],
        "verify": [],  # its worker's last beat is too old
        "gpu": ["w-control@b"],
    }
    (llm,) = next(g["workers"] for g in groups if g["queue"] == "llm")
    assert llm["queues"] == ["llm"]
    assert 5 <= llm["seconds_since"] < silence_limit(settings).total_seconds()
    assert llm["last_seen"].endswith("Z")
    assert "w-gone@c" not in json.dumps(view)
    silence = int(silence_limit(settings).total_seconds())
    assert view["silence_seconds"] == silence
    warnings = view["warnings"]
    assert [w["queue"] for w in warnings] == missing_queues(db, settings, ALL_QUEUES) == ["verify"]
    assert f"in the last {silence} s" in warnings[0]["message"]
    assert "`merlin worker -Q verify`" in warnings[0]["message"]


def test_costs_per_tier_and_day_are_those_merlin_costs_since_reports(
    db: Database, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    days = journal_on_three_days(db)
    costs = fleet_view(db, settings, days=14)["costs"]
    report = costs_since(db, parse_since("14d"))
    assert (costs["jobs"], costs["escalations"]) == (report["jobs"], report["escalations"])
    assert report["jobs"] == 2  # the job created 20 days ago is not in the period
    assert costs["total"] == report["total"]
    assert costs["tiers"] == sorted(report["tiers"], key=lambda tier: tier["tier"])
    monkeypatch.setenv("MERLIN_HOME", str(tmp_path / "cli-home"))
    monkeypatch.setenv("MERLIN_DATABASE_URL", db.url)
    printed = CliRunner().invoke(app, ["costs", "--since", "14d", "--json"])
    assert printed.exit_code == 0, printed.output
    cli = json.loads(printed.output)
    assert cli["total"] == costs["total"]
    assert sorted(cli["tiers"], key=lambda tier: tier["tier"]) == costs["tiers"]

    table = {day["day"]: day for day in costs["days"]}
    today = utcnow().date()
    assert list(table) == [(today - timedelta(days=n)).isoformat() for n in range(15)]
    three, two, hour = table[days["three"]], table[days["two"]], table[days["hour"]]
    assert three["tiers"]["local"]["known_cost_usd"] == 0.01
    assert three["tiers"]["premium"]["known_cost_usd"] == 0.5
    assert (three["total"]["calls"], three["total"]["known_cost_usd"]) == (2, 0.51)
    assert three["bar_percent"] == 100.0  # the costliest day
    assert (two["tiers"]["local"]["cached_calls"], two["total"]["known_cost_usd"]) == (1, 0.2)
    assert two["bar_percent"] == round(0.2 / 0.51 * 100, 1)
    assert hour["tiers"]["premium"]["known_cost_usd"] == 0.25  # not the old job's call
    assert hour["tiers"]["local"]["failed_calls"] == 1
    assert (hour["total"]["unpriced_calls"], hour["total"]["cost_usd"]) == (1, None)
    quiet = table[(today - timedelta(days=10)).isoformat()]
    assert (quiet["total"]["calls"], quiet["bar_percent"]) == (0, 0.0)
    assert set(quiet["tiers"]) == {"local", "premium"}
    for tier in costs["tiers"]:  # the days add up to the CLI's tiers
        name = tier["tier"]
        assert sum(day["tiers"][name]["calls"] for day in costs["days"]) == tier["calls"]
        known = sum(day["tiers"][name]["known_cost_usd"] for day in costs["days"])
        assert known == pytest.approx(tier["known_cost_usd"])
    assert sum(day["total"]["calls"] for day in costs["days"]) == report["total"]["calls"]


def test_a_shorter_period_counts_only_the_jobs_created_in_it(
    db: Database, settings: Settings
) -> None:
    days = journal_on_three_days(db)
    costs = fleet_view(db, settings, days=1)["costs"]
    assert costs["total"] == costs_since(db, parse_since("1d"))["total"]
    assert costs["jobs"] == 1
    assert [day["day"] for day in costs["days"] if day["total"]["calls"]] == [days["hour"]]


def test_no_workers_and_no_calls_warn_of_every_queue(db: Database, settings: Settings) -> None:
    view = fleet_view(db, settings, days=3)
    assert [w["queue"] for w in view["warnings"]] == list(ALL_QUEUES)
    assert all(not group["workers"] for group in view["queues"])
    assert view["costs"]["tiers"] == []
    assert len(view["costs"]["days"]) == 4
    assert {day["bar_percent"] for day in view["costs"]["days"]} == {0.0}
    json.dumps(view)  # plain data: /api/fleet gives it as it is


def test_the_days_are_a_whole_number_within_a_year(db: Database, settings: Settings) -> None:
    assert (parse_days(None), parse_days(""), parse_days("30")) == (14, 14, 30)
    for wrong in ("0", "-1", "7d", "367"):
        with pytest.raises(InputError, match="a whole number of days"):
            parse_days(wrong)
    with pytest.raises(InputError, match="a whole number of days"):
        fleet_view(db, settings, days=0)


def test_the_page_shows_workers_warnings_and_costs(db: Database, settings: Settings) -> None:
    _workers(db, settings)
    days = journal_on_three_days(db)
    view = fleet_view(db, settings)
    templates = Environment(
        loader=FileSystemLoader(Path(fleet.__file__).parent / "templates"),
        autoescape=select_autoescape(),
    )
    templates.filters.update(cost=formats.cost, seconds=formats.seconds)
    page = templates.get_template("fleet.html").render(
        csrf="c", read_only=False, confirmed=(), fleet=view
    )
    assert '<tr data-queue="llm" data-worker="w-llm@a">' in page
    assert '<tr data-queue="verify"><td>verify</td><td colspan="4" class="failed">' in page
    assert '<div class="warning" data-queue="verify">no worker has served queue verify' in page
    assert "w-gone@c" not in page
    assert f'<tr data-day="{days["three"]}">' in page
    assert '<td class="num day-total">$0.5100</td>' in page
    assert 'style="width: 100.0%"' in page
    assert '<td class="num day-total">≥$0.2500 (+1 unpriced)</td>' in page
    assert '<td class="num period-total">≥$0.9600 (+1 unpriced)</td>' in page
    assert "merlin costs --since 14d" in page
