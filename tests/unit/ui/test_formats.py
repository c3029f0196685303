"""Costs and durations as the pages write them."""

from __future__ import annotations

from datetime import datetime

from merlin_flow.ui.formats import cost, duration, seconds, waterfall


def test_a_cost_with_unpriced_calls_is_a_lower_bound() -> None:
    assert cost({"known_cost_usd": 0.01234, "unpriced_calls": 0}) == "$0.0123"
    assert cost({"known_cost_usd": 0.5, "unpriced_calls": 2}) == "≥$0.5000 (+2 unpriced)"


def test_a_duration_runs_to_the_finish_or_to_now() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0)
    done = {"started_at": "2026-01-01T10:00:00Z", "finished_at": "2026-01-01T10:03:05Z"}
    assert duration(done, now) == "3m 05s"
    assert duration({"started_at": "2026-01-01T09:55:30Z", "finished_at": None}, now) == "2h 04m"
    assert duration({"started_at": None}, now) == "-"
    assert seconds(59.9) == "59s"


def test_the_waterfall_places_each_attempt_on_the_jobs_time_axis() -> None:
    def attempt(number: int, start: str, end: str | None) -> dict[str, object]:
        return {"number": number, "started_at": f"2026-01-01T10:{start}Z",
                "finished_at": f"2026-01-01T10:{end}Z" if end else None}  # fmt: skip

    view = {
        "steps": [
            {"id": "a", "attempts": [attempt(1, "00:00", "01:00"), attempt(2, "01:00", "02:00")]},
            {"id": "b", "attempts": [attempt(1, "02:00", None)]},  # running: to now
            {"id": "c", "attempts": []},
        ]
    }
    axis = waterfall(view, now=datetime(2026, 1, 1, 10, 4, 0))
    assert axis["seconds"] == 240
    assert axis["bars"]["a#1"] == {"left": 0.0, "width": 25.0, "seconds": 60.0}
    assert axis["bars"]["a#2"]["left"] == 25.0
    assert axis["bars"]["b#1"] == {"left": 50.0, "width": 50.0, "seconds": 120.0}
    instant = waterfall({"steps": [{"id": "a", "attempts": [attempt(1, "00:00", "00:00")]}]})
    assert instant["bars"]["a#1"]["width"] == 0.5  # still drawn
    assert waterfall({"steps": []}) == {"bars": {}, "seconds": 0.0}
