"""Finished steps written straight into the store, for what reads the journal back."""

from __future__ import annotations

import uuid
from typing import Any

from merlin_flow.store import Attempt, Database, Job, Step


def add_finished_step(
    db: Database,
    repo: str,
    description: str,
    attempts: list[tuple[str, str, float]],
    route: dict[str, Any] | None = None,
) -> None:
    """A finished one-step Debug job of ``repo``: ``attempts`` are (tier, status, cost)."""
    job_id = uuid.uuid4().hex[:12]
    passed = any(status == "passed" for _, status, _ in attempts)
    status = "Completed" if passed else "Failed"
    with db.session() as session:
        job = Job(
            id=job_id, title="t", repo=repo, status="completed", branch=f"merlin/{job_id}",
            base_commit="a" * 40, head_commit="a" * 40, tasklist={}, config={},
        )  # fmt: skip
        row = Step(
            position=0, key="fix", step_type="Debug", description=description,
            exit_command="true", status=status, tier_index=0, route=route,
        )  # fmt: skip
        job.steps.append(row)
        for number, (tier, outcome, cost) in enumerate(attempts, 1):
            row.attempts.append(
                Attempt(
                    number=number,
                    kind="execute",
                    tier=tier,
                    model="m",
                    status=outcome,
                    start_commit="a" * 40,
                    cost_usd=cost,
                )
            )
        session.add(job)
