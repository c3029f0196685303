"""The journal: replaying paid calls, and the response cache across jobs."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.submission import create_job
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.tasklist import parse_tasklist
from tests.conftest import git
from tests.unit.scripted_jobs import ONE_STEP, priced_tier


def test_the_replayer_goes_live_at_the_first_different_request(tmp_path: Path) -> None:
    from merlin_flow.models.journal import JournalEntry, Replayer
    from merlin_flow.models.llm import request_hash
    from merlin_flow.tools.toolbox import TOOL_SCHEMAS

    script = tmp_path / "script.yaml"
    script.write_text("rules:\n  - reply: {content: live}\n")
    tier = Tier(name="local", model=f"scripted/{script}")
    asked = [{"role": "user", "content": "q"}]
    entry = JournalEntry(
        0,
        request_hash(tier.model, asked, TOOL_SCHEMAS),
        {"role": "assistant", "content": "old"},
        1,
        1,
    )
    replayer = Replayer([entry])
    replayed = replayer(tier, asked, TOOL_SCHEMAS)
    assert (replayed.message["content"], replayed.replayed, replayed.cost_usd) == ("old", True, 0.0)
    other = Replayer([entry])
    live = other(tier, [{"role": "user", "content": "different"}], TOOL_SCHEMAS)
    assert (live.message["content"], live.replayed) == ("live", False)
    # Once live, it stays live even for a request the journal knows.
    assert other(tier, asked, TOOL_SCHEMAS).replayed is False


def test_the_response_cache_answers_identical_requests_across_jobs_for_free(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.jobs.costs import job_costs
    from merlin_flow.store import LlmCall

    tier = priced_tier(tmp_path, price_out=2.0)
    tasklist = parse_tasklist(ONE_STEP)

    def run(config: MerlinConfig) -> str:
        job_id = create_job(db, settings, tasklist, py_repo, config)
        assert execute_step(db, settings, job_id, "s0", f"{job_id}:a") is Outcome.CONTINUE
        assert verify_step(db, settings, job_id, "s0", f"{job_id}:b")[0] is Outcome.CONTINUE
        assert finalize_job(db, settings, job_id) == "completed"
        return job_id

    cached = MerlinConfig(tiers=[tier], response_cache=True)
    first, second = run(cached), run(cached)
    uncached = run(MerlinConfig(tiers=[tier]))
    paid, hits, again = (job_costs(db, j)["total"] for j in (first, second, uncached))
    assert paid["calls"] == 2
    assert paid["cached_calls"] == 0
    assert paid["cost_usd"] > 0
    assert hits["calls"] == hits["cached_calls"] == 2
    assert hits["cost_usd"] == 0
    assert hits["prompt_tokens"] == 0
    assert again["cached_calls"] == 0
    assert again["cost_usd"] == paid["cost_usd"]
    # Same answers, so the same change; cached calls are marked in the journal.
    tree = [git(py_repo, "rev-parse", f"merlin/{j}^{{tree}}") for j in (first, second)]
    assert tree[0] == tree[1]
    with db.reader() as session:
        marks = session.execute(
            select(LlmCall.cached, LlmCall.replayed).where(LlmCall.job_id == second)
        ).all()
    assert marks == [(True, False), (True, False)]
