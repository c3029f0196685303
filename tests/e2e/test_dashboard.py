"""`merlin ui` in Debian's Chromium (Selenium with Debian's chromedriver), against a real
server process and a real worker: jobs appear and move without a reload (by the stream,
or by polling without it), the job page follows an escalation, a plan is approved from
the page and runs, reject asks first and then rejects, and the token guards every door."""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.e2e.helpers import (
    LOCAL_SCRIPT,
    MERLIN,
    merlin,
    merlin_env,
    start_worker,
    status_json,
    stop_worker,
    wait_for,
    write_job_files,
)
from tests.e2e.test_requests import PLANNER_RULES, REQUEST

pytestmark = pytest.mark.e2e
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
TOKEN = "a-dashboard-token-of-32-chars..."


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=5
        ) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError):
        return 0  # not listening yet


def _chromium(*arguments: str) -> WebDriver:
    """Debian's Chromium, headless, with ``arguments`` besides (or the test skipped)."""
    if not (os.path.exists(CHROMIUM) and shutil.which("chromedriver")):
        if os.environ.get("CI"):
            pytest.fail("the dashboard's browser tests need Debian's chromium and chromium-driver")
        pytest.skip("no Debian chromium and chromium-driver here")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", *arguments):  # fmt: skip
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(DRIVER))


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    driver = _chromium()
    try:
        yield driver
    finally:
        driver.quit()


class Dashboard:
    """`merlin ui` and a worker on one MERLIN_HOME."""

    def __init__(
        self,
        tmp_path: Path,
        *args: str,
        token: str | None = None,
        sleep_seconds: float = 2,
        **files: str,
    ) -> None:
        """``files``: the scripts and TaskList ``write_job_files`` writes (``local``...)."""
        files.setdefault("local", LOCAL_SCRIPT.replace("rules:\n", "rules:\n" + PLANNER_RULES, 1))
        self.tasklist, self.config = write_job_files(
            tmp_path / "job", sleep_seconds=sleep_seconds, **files
        )
        extra = {"MERLIN_UI_TOKEN": token} if token else {}
        self.env = merlin_env(tmp_path / "home", **extra)
        self.url = f"http://127.0.0.1:{_free_port()}"
        with (tmp_path / "ui.log").open("wb") as log:
            self.server = subprocess.Popen(
                [*MERLIN, "ui", "--port", self.url.rsplit(":", 1)[1], *args],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.worker = start_worker(self.env, tmp_path / "worker.log")
        wait_for(lambda: _status(f"{self.url}/healthz") == 200, 60, "merlin ui to answer")

    def submit(self, repo: Path, what: str) -> str:
        done = merlin(self.env, "submit", what, "--repo", str(repo), "--config", str(self.config))
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def stop(self) -> None:
        stop_worker(self.worker)
        self.server.terminate()
        self.server.wait(timeout=20)


def _texts(driver: WebDriver, selector: str) -> list[str]:
    """The elements' texts, read at once: the page re-renders the job as it moves."""
    found: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]),"
        " (cell) => cell.textContent.trim())",
        selector,
    )
    return found


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Dashboard]:
    board = Dashboard(tmp_path)
    try:
        yield board
    finally:
        board.stop()


def test_a_job_appears_and_moves_without_a_reload(
    browser: WebDriver, dashboard: Dashboard, py_repo: Path
) -> None:
    driver = browser
    driver.get(dashboard.url)
    driver.execute_script("window.loadedOnce = true")
    job = dashboard.submit(py_repo, str(dashboard.tasklist))
    note = wait_for(
        lambda: (n := driver.find_element(By.ID, "new-jobs")).is_displayed() and n,
        30,
        "the new-jobs control",
    )
    assert note.text.startswith("new jobs: 1")
    driver.get(f"{dashboard.url}/jobs/{job}")
    driver.execute_script("window.loadedOnce = true")

    texts = functools.partial(_texts, driver)
    assert texts('#job tr[data-step="fix"] td.status')[0] in ("Pending", "InProgress")
    steps = "#job tr[data-step] td.status"
    wait_for(lambda: texts(steps) == ["Completed"] * 3, 120, "the steps to pass on the page")
    assert driver.execute_script("return window.loadedOnce") is True
    assert status_json(dashboard.env, job)["status"] == "completed"
    wait_for(lambda: texts("#job p .status") == ["completed"], 30, "the job's status")


def _plan(board: Dashboard, repo: Path) -> str:
    """A request planned from the CLI: its job, awaiting approval."""
    planned = json.loads(merlin(board.env, "submit", REQUEST, "--repo", str(repo),
                                "--config", str(board.config), "--json").stdout)  # fmt: skip
    assert planned["status"] == "awaiting_approval"
    job: str = planned["job_id"]
    return job


def test_a_plan_is_approved_from_the_page_and_another_rejected_once_confirmed(
    browser: WebDriver, dashboard: Dashboard, py_repo: Path
) -> None:
    driver = browser
    job, other = _plan(dashboard, py_repo), _plan(dashboard, py_repo)
    driver.get(f"{dashboard.url}/jobs/{job}")
    assert "Fix answer()" in driver.find_element(By.TAG_NAME, "table").text
    driver.find_element(By.CSS_SELECTOR, 'form[action$="/approve"] button').click()
    approved = "approved by merlin ui (127.0.0.1)"  # the browser's address: it has no user
    wait_for(lambda: approved in " ".join(_texts(driver, "#job > p")), 20, "the approved page")
    # The other plan: Reject asks first; dismissed, nothing happens; accepted, it is rejected.
    driver.get(f"{dashboard.url}/jobs/{other}")
    reject = 'form[action$="/reject"] button'
    driver.find_element(By.CSS_SELECTOR, reject).click()
    alert = driver.switch_to.alert
    assert alert.text == f"reject job {other}?"
    alert.dismiss()
    assert status_json(dashboard.env, other)["status"] == "awaiting_approval"
    driver.find_element(By.CSS_SELECTOR, reject).click()
    driver.switch_to.alert.accept()
    wait_for(lambda: _texts(driver, "#job p .status") == ["rejected"], 20, "the rejected page")
    assert "rejected by merlin ui (127.0.0.1)" in driver.find_element(By.ID, "job").text
    assert driver.find_elements(By.CSS_SELECTOR, "#job form") == []  # nothing left to do
    rejected = status_json(dashboard.env, other)
    assert (rejected["status"], rejected["steps"]) == ("rejected", [])
    assert rejected["plan"]["rejected_by"] == "merlin ui (127.0.0.1)"
    wait_for(lambda: status_json(dashboard.env, job)["status"] == "completed", 120, "the job")
    view = status_json(dashboard.env, job)
    assert view["plan"]["approved_by"] == "merlin ui (127.0.0.1)"


def test_the_token_guards_pages_and_stream_and_read_only_offers_nothing(
    browser: WebDriver, tmp_path: Path, py_repo: Path
) -> None:
    board = Dashboard(tmp_path, "--host", "0.0.0.0", "--read-only", token=TOKEN)
    try:
        for path in ("/", "/events?after=0", "/api/jobs/x"):
            assert _status(board.url + path) == 401, path
        assert _status(board.url + "/", {"Authorization": f"Bearer {TOKEN}"}) == 200
        driver = browser
        driver.get(board.url)
        assert driver.current_url.endswith("/login")
        driver.find_element(By.NAME, "token").send_keys(TOKEN)
        driver.find_element(By.TAG_NAME, "button").click()
        wait_for(lambda: driver.find_elements(By.ID, "jobs"), 10, "the jobs page")
        assert "read-only" in driver.find_element(By.TAG_NAME, "header").text
        assert driver.find_elements(By.CSS_SELECTOR, 'form[method="post"]') == []  # no action
        driver.get(f"{board.url}/jobs/{_plan(board, py_repo)}")  # a plan waiting: no form either
        assert _texts(driver, "#job p .status") == ["awaiting_approval"]
        assert "Fix answer()" in driver.find_element(By.TAG_NAME, "table").text
        assert driver.find_elements(By.CSS_SELECTOR, "form, button") == []
    finally:
        board.stop()


def test_the_attempt_panel_follows_a_running_transcript_without_moving_the_reader(
    browser: WebDriver, tmp_path: Path, py_repo: Path
) -> None:
    driver = browser
    driver.set_window_size(1280, 420)  # a short window: the panel scrolls
    board = Dashboard(tmp_path, sleep_seconds=6)
    try:
        job = board.submit(py_repo, str(board.tasklist))
        driver.get(f"{board.url}/jobs/{job}")
        bar = 'a.bar.running[data-panel="slow#1"]'
        wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, bar), 60, "slow#1 to run")
        driver.find_element(By.CSS_SELECTOR, bar).click()
        wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#panel #transcript li"), 10,
                 "the panel")  # fmt: skip
        assert driver.current_url.endswith(f"/jobs/{job}")  # a panel, not a new page
        panel = driver.find_element(By.ID, "panel")
        script = "return [arguments[0].querySelectorAll('#transcript li').length," \
                 " arguments[0].scrollHeight, arguments[0].clientHeight]"  # fmt: skip
        first, height, shown = driver.execute_script(script, panel)
        assert height > shown + 40, "the panel should scroll in a short window"
        driver.execute_script("arguments[0].scrollTop = 20", panel)
        wait_for(lambda: driver.execute_script(script, panel)[0] > first, 30,
                 "the transcript to grow while the step runs")  # fmt: skip
        assert driver.execute_script("return arguments[0].scrollTop", panel) == 20
        wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, 'a.bar.passed[data-panel="slow#1"]'),
                 60, "slow#1 to pass")  # fmt: skip
        selected = driver.find_elements(By.CSS_SELECTOR, "a.bar.selected")
        assert [a.get_attribute("data-panel") for a in selected] == ["slow#1"]  # kept on re-render
    finally:
        board.stop()


SLOW_STEP = """\
title: Add double
steps:
  - id: slow
    step_type: Feature
    description: add double(x) with a test
    exit_command: python -m pytest -q test_double.py
"""


def test_without_a_stream_the_pages_poll_and_go_back_to_the_stream(
    browser: WebDriver, dashboard: Dashboard, py_repo: Path, tmp_path: Path
) -> None:
    driver = browser
    (tmp_path / "slow.yaml").write_text(SLOW_STEP)
    mode = "return [document.body.dataset.live, !document.getElementById('live-mode').hidden]"
    # A browser without EventSource: the jobs page polls, and a row still moves.
    script = driver.execute_cdp_cmd(
        "Page.addScriptToEvaluateOnNewDocument", {"source": "delete window.EventSource"}
    )
    job = dashboard.submit(py_repo, str(tmp_path / "slow.yaml"))  # a step of 2 s and more
    driver.get(dashboard.url)
    driver.execute_script("window.loadedOnce = true")
    assert driver.execute_script("return typeof window.EventSource") == "undefined"
    assert driver.execute_script(mode) == ["polling", True]
    row = f'tr[data-job="{job}"] td.status'
    assert _texts(driver, row) in (["pending"], ["running"])
    wait_for(lambda: _texts(driver, row) == ["completed"], 60, "the row to move by polling")
    assert _texts(driver, f'tr[data-job="{job}"] td.steps') == ["1/1"]
    assert driver.execute_script("return window.loadedOnce") is True
    # A stream that fails: the page polls (a new job is counted), then the stream is back.
    driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", script)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": [f"{dashboard.url}/events*"]})
    driver.get(dashboard.url)
    wait_for(lambda: driver.execute_script(mode) == ["polling", True], 10, "polling")
    dashboard.submit(py_repo, str(tmp_path / "slow.yaml"))
    note = wait_for(
        lambda: (n := driver.find_element(By.ID, "new-jobs")).is_displayed() and n,
        10,
        "the new-jobs control, by polling",
    )
    assert note.text.startswith("new jobs: 1")
    driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    wait_for(lambda: driver.execute_script(mode) == ["stream", False], 15, "the stream again")


# The cheap tier takes a while, then breaks the answer; the premium tier fixes it.
SLOW_WRONG = """\
rules:
  - turn: 0
    reply:
      tool_calls:
        - name: run_command
          arguments: {command: "sleep 3"}
  - turn: 1
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return 40"}
  - reply: {content: "done"}
"""


def test_the_job_page_follows_an_escalation(
    browser: WebDriver, tmp_path: Path, py_repo: Path
) -> None:
    from tests.e2e.test_run import ONE_STEP, PREMIUM_RIGHT

    driver = browser
    board = Dashboard(tmp_path, local=SLOW_WRONG, premium=PREMIUM_RIGHT, tasklist=ONE_STEP)
    try:  # no fix on the same tier: a failed verification escalates at once
        board.config.write_text(board.config.read_text() + "fix_attempts = 0\n")
        job = board.submit(py_repo, str(board.tasklist))
        driver.get(f"{board.url}/jobs/{job}")
        driver.execute_script("window.loadedOnce = true")
        bars = "#job a.bar"
        assert _texts(driver, bars) in ([], ["#1 execute@local: running"])
        second = '#job a.bar.passed[data-panel="fix#2"]'
        wait_for(lambda: _texts(driver, second), 60, "the escalated attempt's bar")
        assert _texts(driver, bars) == [
            "#1 execute@local: failed (exit 1)",
            "#2 escalate@premium: passed (exit 0)",
        ]
        assert driver.execute_script("return window.loadedOnce") is True
        wait_for(lambda: _texts(driver, "#job p .status") == ["completed"], 30, "the job's end")
    finally:
        board.stop()


ATTACK_PAGE = """<!doctype html><html><body>
<form id="f" method="post" action="{target}"><input name="csrf" value="{csrf}"></form>
<script>document.getElementById("f").submit()</script></body></html>"""
"""Another site's page: it posts the dashboard's form, with a CSRF value it was given."""


def _serve(page: str) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 that answers ``page`` to every GET."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page.encode())

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_page_of_another_site_reads_nothing_and_approves_nothing(
    tmp_path: Path, py_repo: Path
) -> None:
    # The browser resolves attacker.example to 127.0.0.1, as a DNS rebinding makes it.
    driver = _chromium("--host-resolver-rules=MAP attacker.example 127.0.0.1")
    board, attacker = Dashboard(tmp_path), None
    try:
        job = _plan(board, py_repo)
        driver.get(f"{board.url}/jobs/{job}")  # the user's own page: a session and its value
        value = driver.find_element(By.CSS_SELECTOR, 'meta[name="csrf"]').get_attribute("content")
        assert value
        port = board.url.rsplit(":", 1)[1]
        driver.get(f"http://attacker.example:{port}/jobs/{job}")  # rebound onto the dashboard
        shown = driver.find_element(By.TAG_NAME, "body").text
        assert shown.startswith("this dashboard does not answer to Host 'attacker.example:")
        assert "Fix answer()" not in shown
        assert value not in driver.page_source
        # A page of another site posts the user's form, even with the user's own value.
        target = f"{board.url}/jobs/{job}/approve"
        attacker = _serve(ATTACK_PAGE.format(target=target, csrf=value))
        driver.get(f"http://attacker.example:{attacker.server_port}/")
        wait_for(lambda: driver.current_url == target, 10, "the other site's form to post")
        refused = driver.find_element(By.TAG_NAME, "body").text
        assert "a POST must come from the dashboard's own pages" in refused
        view = status_json(board.env, job)
        assert (view["status"], view["plan"].get("approved_by")) == ("awaiting_approval", None)
        driver.get(f"{board.url}/jobs/{job}")  # the user's own page still acts
        driver.find_element(By.CSS_SELECTOR, 'form[action$="/approve"] button').click()
        approved = "approved by merlin ui (127.0.0.1)"
        wait_for(lambda: approved in " ".join(_texts(driver, "#job > p")), 20, "the approval")
    finally:
        if attacker is not None:
            attacker.shutdown()
            attacker.server_close()
        driver.quit()
        board.stop()
