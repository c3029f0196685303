"""A job on a git URL, worked by two "machines" that share only Redis, Postgres and the
remote: different MERLIN_HOMEs (so different repository caches) and working directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from merlin_flow.store import Database, upgrade
from tests.conftest import git
from tests.e2e.helpers import merlin, merlin_env, start_worker, stop_worker, write_job_files

pytestmark = pytest.mark.e2e


def test_two_machines_work_one_job_through_a_git_url(
    tmp_path: Path, py_repo: Path, redis_url: str, postgres_url: str
) -> None:
    bare = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(py_repo), str(bare))
    url = f"file://{bare}"
    db = Database(postgres_url)
    upgrade(db)
    db.dispose()
    shared = {"MERLIN_BROKER_URL": redis_url, "MERLIN_DATABASE_URL": postgres_url}
    homes = {name: tmp_path / name for name in ("submitter", "llm-machine", "verify-machine")}
    tasklist, config = write_job_files(tmp_path / "job")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    log_a, log_b = tmp_path / "llm.log", tmp_path / "verify.log"
    llm = start_worker(
        merlin_env(homes["llm-machine"], **shared), log_a,
        "--queues", "llm,control", "--pool", "threads", cwd=tmp_path / "a",
    )  # fmt: skip
    verify = start_worker(
        merlin_env(homes["verify-machine"], **shared), log_b, "--queues", "verify",
        cwd=tmp_path / "b",
    )  # fmt: skip
    patch = tmp_path / "job.patch"
    try:
        waited = merlin(
            merlin_env(homes["submitter"], **shared), "submit", str(tasklist), "--repo", url,
            "--config", str(config), "--wait", "--json", "--patch", str(patch),
        )  # fmt: skip
    finally:
        stop_worker(llm)
        stop_worker(verify)
    logs = log_a.read_text()[-3000:] + log_b.read_text()[-3000:]
    assert waited.returncode == 0, waited.stderr + logs
    view = json.loads(waited.stdout)
    assert view["status"] == "completed", logs
    assert view["repo"] == url
    job_id, branch = view["id"], view["branch"]

    # The verified commits are on the remote's job branch, with every step's work.
    assert git(bare, "rev-parse", f"refs/heads/{branch}") == view["head_commit"]
    assert git(bare, "show", f"{branch}:app.py").endswith("return 42")
    assert git(bare, "show", f"{branch}:double.py").startswith("def double")
    attempts = git(bare, "for-each-ref", "--format=%(refname)", f"refs/merlin/{job_id}")
    assert len(attempts.splitlines()) == 3
    # Each machine worked from its own cache; the user's checkout was not touched.
    for name in homes:
        caches = list((homes[name] / "repos").glob("remote-*.git"))
        assert len(caches) == 1, name
    assert git(py_repo, "status", "--porcelain") == ""
    assert git(py_repo, "branch", "--list", branch) == ""
    # The verify machine ran the exit commands on commits it could only have fetched.
    assert log_b.read_text().count("merlin.verify[") >= 3
    assert "+    return 42" in patch.read_text()
