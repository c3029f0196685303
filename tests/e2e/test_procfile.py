"""The Procfile as shipped, started by honcho: a job completes on the embedded defaults
and on Redis, and the dashboard lists it.

honcho stops every process when one exits, so each line must keep running on the set-up
the Procfile is for. On the embedded broker the `flower` line says why Flower cannot run
and stays idle; on Redis it serves Flower on 127.0.0.1:5555. The `ui` line serves the
dashboard on 127.0.0.1, on the port MERLIN_UI_PORT names (a free one for each test, so
that tests side by side do not meet).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.helpers import merlin, merlin_env, status_json, wait_for, write_job_files
from tests.redis_server import own_redis_server

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
HONCHO = [sys.executable, "-m", "honcho"]


@contextmanager
def honcho(env: dict[str, str], folder: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``honcho start`` on the shipped Procfile, its output in ``folder/honcho.log``."""
    log = folder / "honcho.log"
    # `merlin` as the Procfile names it: the one installed beside this Python.
    env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*HONCHO, "start", "-f", str(ROOT / "Procfile"), "-d", str(folder)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield process, log
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # honcho stops its processes
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str, accept: str = "*/*") -> str | None:
    """The body of ``url``, or None while nothing answers there."""
    request = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body: str = response.read().decode()
            return body
    except (urllib.error.URLError, OSError):
        return None


def _dashboard_lists(env: dict[str, str], job_id: str) -> None:
    """The `ui` line's dashboard is healthy and its jobs page shows ``job_id`` completed."""
    base = f"http://127.0.0.1:{env['MERLIN_UI_PORT']}"
    assert wait_for(lambda: _get(f"{base}/healthz") == "ok", 60, f"merlin ui on {base}")
    page = _get(f"{base}/", accept="text/html")
    assert page is not None
    row = re.search(rf'<tr data-job="{job_id}">.*?</tr>', page, re.DOTALL)
    assert row, page
    assert '<td class="status completed">completed</td>' in row[0]


def _complete_a_job(env: dict[str, str], tmp_path: Path, py_repo: Path) -> str:
    tasklist, config = write_job_files(tmp_path / "job")
    submitted = merlin(
        env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config)
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    done = wait_for(lambda: status_json(env, job_id)["finished_at"], 180, "the job to finish")
    assert done
    view = status_json(env, job_id)
    assert view["status"] == "completed", view["error"]
    return job_id


def test_honcho_runs_the_procfile_on_the_embedded_defaults(tmp_path: Path, py_repo: Path) -> None:
    env = merlin_env(tmp_path / "home", MERLIN_UI_PORT=str(_free_port()))
    with honcho(env, tmp_path) as (process, log):
        job_id = _complete_a_job(env, tmp_path, py_repo)
        _dashboard_lists(env, job_id)
        assert process.poll() is None, log.read_text()  # every line still runs
        text = log.read_text()
    assert "flower not started: Flower needs Redis or RabbitMQ as the broker" in text
    assert "llm.1" in text
    assert "verify.1" in text
    assert f"merlin ui on http://127.0.0.1:{env['MERLIN_UI_PORT']}/" in text


def test_honcho_runs_the_procfile_on_redis_with_flower(tmp_path: Path, py_repo: Path) -> None:
    with own_redis_server(tmp_path / "redis") as base:
        env = merlin_env(
            tmp_path / "home", MERLIN_BROKER_URL=f"{base}/2", MERLIN_UI_PORT=str(_free_port())
        )
        with honcho(env, tmp_path) as (process, log):
            job_id = _complete_a_job(env, tmp_path, py_repo)
            _dashboard_lists(env, job_id)

            def flower_answers() -> bool:
                try:
                    with urllib.request.urlopen("http://127.0.0.1:5555/workers", timeout=5) as r:
                        return bool(r.status == 200)
                except (urllib.error.URLError, OSError):
                    return False

            assert wait_for(flower_answers, 60, "Flower on 127.0.0.1:5555")
            assert process.poll() is None, log.read_text()
        assert "flower not started" not in log.read_text()
