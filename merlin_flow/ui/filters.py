"""The jobs page's filters, kept in its URL so that a link shows the same jobs.

``?status=failed&repo=/srv/app&age=7d&before=JOB``: one status, one repository, jobs
created within an age (``parse_age``: ``30m``, ``12h``, ``7d``, ``2w``), and the page of
jobs older than job ``before`` (the last row of the page before it). Paging by that
cursor rather than by offset keeps a page's rows the same while new jobs arrive.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from urllib.parse import urlencode

from merlin_flow.errors import InputError
from merlin_flow.jobs.pruning import parse_age
from merlin_flow.store import JobStatus, utcnow

AGES = ("1h", "24h", "7d", "30d")
"""The ages the page offers (any ``parse_age`` age works in the URL)."""
MOST_AGE_CHARS = 20


@dataclass(frozen=True)
class JobsFilter:
    """Which jobs the page lists; empty strings for "any"."""

    status: JobStatus | None = None
    repo: str = ""
    age: str = ""
    before: str = ""

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> JobsFilter:
        """The filter a URL's query asks for; InputError naming a bad status or age."""
        status = query.get("status") or ""
        if status and status not in set(JobStatus):
            raise InputError(f"status {status!r} is not a job status: {', '.join(JobStatus)}")
        age = query.get("age") or ""
        try:
            if len(age) > MOST_AGE_CHARS:
                raise InputError(age)
            if age:  # one that reaches before year 1 is no age either
                _since = utcnow() - parse_age(age)
        except (InputError, OverflowError):
            raise InputError(f"age {age[:40]!r}: use a number and m, h, d or w, like 7d") from None
        return cls(JobStatus(status) if status else None, query.get("repo") or "", age,
                   query.get("before") or "")  # fmt: skip

    def query(self, **changed: str) -> str:
        """The filter as a URL query (``?...``, or "" when it asks for nothing)."""
        fields = {"status": self.status or "", "repo": self.repo, "age": self.age,
                  "before": self.before, **changed}  # fmt: skip
        kept = {name: value for name, value in fields.items() if value}
        return "?" + urlencode(kept) if kept else ""

    def next_page(self, last_job: str) -> str:
        """The URL query of the page after the one ending with ``last_job``."""
        return replace(self, before=last_job).query()

    @property
    def first_page(self) -> str:
        """The URL query of this filter's first page (the newest jobs)."""
        return self.query(before="")
