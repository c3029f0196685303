"""A job on two real HTTP model servers, worked by a `merlin worker` process.

Both tiers are OpenAI-compatible (the same provider kind) at their own `api_base`; the
worker's environment names no endpoint and holds no key. The first tier only talks (it
changes no file), so the step escalates to the second, which edits the code over a
tool-call round trip.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from merlin_flow.jobs.views import job_view
from tests.e2e.helpers import merlin, merlin_env, start_worker, stop_worker, wait_for
from tests.e2e.test_run import ONE_STEP
from tests.model_server import ModelServer, text, tool_call

pytestmark = pytest.mark.e2e

ENDPOINT_VARIABLES = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY")

CONFIG = """\
[[tiers]]
name = "small"
model = "openai/small"
api_base = "{small}"
price_in = 0.0
price_out = 0.0

[[tiers]]
name = "large"
model = "openai/large"
api_base = "{large}"

[limits]
fix_attempts = 0
retry_base_delay = 0

[environment]
setup = []
"""


def test_two_tiers_on_two_endpoints_from_a_worker_without_endpoint_variables(
    tmp_path: Path, py_repo: Path
) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in merlin_env(home).items() if k not in ENDPOINT_VARIABLES}
    tasklist = tmp_path / "tasklist.yaml"
    tasklist.write_text(ONE_STEP)
    with ModelServer(model="small") as small, ModelServer(model="large") as large:
        small.queue(text("Looks fine to me."))
        large.queue(
            tool_call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 42"}),
            text("answer() returns 42"),
        )
        config = tmp_path / "merlin.toml"
        config.write_text(CONFIG.format(small=small.url, large=large.url))
        worker = start_worker(env, tmp_path / "worker.log")
        try:
            submitted = merlin(
                env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config),
                "--json",
            )  # fmt: skip
            assert submitted.returncode == 0, submitted.stdout + submitted.stderr
            job_id = json.loads(submitted.stdout)["job_id"]
            from merlin_flow.store import open_database

            db = open_database(f"sqlite:///{home / 'merlin.db'}")
            view = wait_for(
                lambda: (v := job_view(db, job_id))["finished_at"] and v, 180, "the job to end"
            )
            db.dispose()
        finally:
            stop_worker(worker)
        log = (tmp_path / "worker.log").read_text()[-3000:]
        assert view["status"] == "completed", log
        assert len(small.requests) == 1
        assert len(large.requests) == 2  # the tool call, then the follow-up turn
        assert all(r.headers["authorization"] == "Bearer no-key" for r in large.requests)
    first, second = view["steps"][0]["attempts"]
    assert (first["tier"], first["status"], first["exit_code"]) == ("small", "error", None)
    assert "changed no file" in first["error"]
    assert (second["kind"], second["tier"], second["status"]) == ("escalate", "large", "passed")

    costs = json.loads(merlin(env, "costs", job_id, "--json").stdout)
    tiers = {row["tier"]: row for row in costs["tiers"]}
    assert tiers["small"]["cost_usd"] == 0.0  # priced at 0 by its tier
    assert tiers["large"]["cost_usd"] is None  # no price: unknown, not $0
    assert tiers["large"]["unpriced_calls"] == 2
