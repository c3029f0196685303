"""How the pages write costs and durations (Jinja filters ``cost`` and ``duration``).

The numbers come from the views (``merlin list --json``, ``status --json``); these only
write them, as the CLI's tables do: a cost with unpriced calls is a lower bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from merlin_flow.store import utcnow


def cost(view: Mapping[str, Any]) -> str:
    """``$0.0123``; ``≥$0.0123 (+2 unpriced)`` when some calls had no price."""
    known = f"${view['known_cost_usd']:.4f}"
    unpriced = view["unpriced_calls"]
    return f"≥{known} (+{unpriced} unpriced)" if unpriced else known


def duration(view: Mapping[str, Any], now: datetime | None = None) -> str:
    """From ``started_at`` to ``finished_at`` (or now): ``42s``, ``3m 05s``, ``2h 04m``."""
    if not view.get("started_at"):
        return "-"
    start = _parse(view["started_at"])
    end = _parse(view["finished_at"]) if view.get("finished_at") else (now or utcnow())
    return seconds(max(0.0, (end - start).total_seconds()))


def seconds(total: float) -> str:
    """A length of time in its two largest units."""
    whole = int(total)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def _parse(stamp: str) -> datetime:
    """A view's time (naive UTC, ISO, ``Z`` or not) as a naive datetime."""
    return datetime.fromisoformat(stamp.removesuffix("Z")).replace(tzinfo=None)


def waterfall(view: Mapping[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """Where each attempt's bar sits on the job's time axis, in percent of its width.

    Keyed ``"<step>#<number>"``: ``left`` and ``width`` (at least 0.5, so that a quick
    attempt still shows), and ``seconds``. The axis runs from the first attempt's start
    to the last one's end (now, while one runs).
    """
    spans: dict[str, tuple[datetime, datetime]] = {}
    for step in view["steps"]:
        for attempt in step["attempts"]:
            if not attempt.get("started_at"):
                continue
            start = _parse(attempt["started_at"])
            finished = attempt.get("finished_at")
            spans[f"{step['id']}#{attempt['number']}"] = (
                start, _parse(finished) if finished else (now or utcnow()))  # fmt: skip
    if not spans:
        return {"bars": {}, "seconds": 0.0}
    origin = min(start for start, _ in spans.values())
    total = max((end - origin).total_seconds() for _, end in spans.values()) or 1.0
    bars = {}
    for key, (start, end) in spans.items():
        length = max(0.0, (end - start).total_seconds())
        left = (start - origin).total_seconds() / total * 100
        width = max(length / total * 100, 0.5)
        bars[key] = {"left": round(min(left, 99.5), 2), "width": round(width, 2), "seconds": length}
    return {"bars": bars, "seconds": total}
