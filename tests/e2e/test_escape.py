"""Escape attempts from a step's commands, through `run_command` and through an exit command.

One script (committed to the repository, so it is "the repository's own test code") tries
every way out the sandbox must close: writing to the worker's home, the host's /tmp and
the user's checkout; reading MERLIN_HOME's database and the worker's API key from the
environment or /proc; connecting to Redis and Postgres on 127.0.0.1; signalling a process
of the worker's user; installing a git hook that merlin's next commit would run. The scripted
model runs it with `run_command` and it is also the step's exit command. Afterwards the
host shows no trace of any attempt, and no secret is in the database or `merlin logs`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import make_repo
from tests.e2e.helpers import merlin, merlin_env, write_job_files

pytestmark = pytest.mark.e2e

API_KEY = "sk-escape-test-" + uuid.uuid4().hex
TOKEN = "ghp_escapetest" + uuid.uuid4().hex[:16]

# Writes may succeed inside the sandbox (its private /tmp, where a host path under /tmp
# resolves): whether they reached the host is checked on the host afterwards. A read,
# connect or signal that succeeds inside is an escape by itself, and says so.
ATTACK = """\
echo pwned > "HOST_HOME/pwned"
echo pwned > "/tmp/HOST_TMP_NAME"
echo pwned > "CHECKOUT/pwned"
head -c 16 "MERLIN_HOME/merlin.db" >/dev/null 2>&1 && echo ESCAPED-read-database
env | grep -q "API_KEY" && echo ESCAPED-environment
cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -q "API_KEY" && echo ESCAPED-proc
for port in 6379 5432; do
  python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 2)" \\
    2>/dev/null && echo "ESCAPED-connect-$port"
done
kill -9 VICTIM_PID 2>/dev/null && echo ESCAPED-signal
gitdir=$(sed 's/^gitdir: //' .git)
mkdir -p "$gitdir/../../hooks" 2>/dev/null
printf '#!/bin/sh\\ntouch HOOK_MARKER\\n' > "$gitdir/../../hooks/post-commit" 2>/dev/null \\
  && echo tried-hook-via-gitdir
printf '#!/bin/sh\\ntouch HOOK_MARKER\\n' > "CHECKOUT/.git/hooks/post-commit" 2>/dev/null \\
  && echo tried-hook-in-checkout
echo "gitdir: CHECKOUT/.git" > .git 2>/dev/null && echo ESCAPED-git-pointer
if [ ! -e nested/.git ]; then  # a repository inside the worktree, its settings run programs
  mkdir -p nested && git init -q nested && echo one > nested/f.txt
  git -C nested config core.fsmonitor 'env > NESTED_MARKER; false'
  git -C nested config filter.evil.clean 'sh -c "env > NESTED_MARKER; cat"'
  echo '* filter=evil' > nested/.gitattributes
  git -C nested -c core.fsmonitor=false -c filter.evil.clean=cat add -A
  git -C nested -c core.fsmonitor=false -c filter.evil.clean=cat -c user.name=m \\
    -c user.email=m@m commit -qm x && echo two > nested/f.txt && echo tried-nested-repository
fi
echo contained > attack-report.txt  # the step's work (an unchanged tree is not verified)
echo attack-finished
"""
SCRIPT = """\
rules:
  - turn: 0
    reply:
      tool_calls:
        - name: run_command
          arguments: {command: "sh attack.sh"}
  - reply: {content: "I found the key API_KEY and the token TOKEN"}
"""
TASKLIST = """\
title: Escape
steps:
  - id: escape
    step_type: Test
    description: run the attack
    exit_command: sh attack.sh
"""


def test_step_commands_cannot_escape_the_sandbox(tmp_path: Path) -> None:
    home = tmp_path / "merlin-home"
    host_home = tmp_path / "worker-home"
    host_home.mkdir()
    host_tmp_name = f"merlin-escape-{uuid.uuid4().hex}"
    hook_marker = tmp_path / "hook-ran"
    nested_marker = tmp_path / "nested-repository-ran"
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    checkout = tmp_path / "checkout"
    attack = ATTACK
    for name, value in {
        "HOST_HOME": str(host_home),
        "HOST_TMP_NAME": host_tmp_name,
        "CHECKOUT": str(checkout),
        "MERLIN_HOME": str(home),
        "API_KEY": API_KEY,
        "VICTIM_PID": str(victim.pid),
        "HOOK_MARKER": str(hook_marker),
        "NESTED_MARKER": str(nested_marker),
    }.items():
        attack = attack.replace(name, value)
    make_repo(checkout, {"attack.sh": attack, "README.md": "# target\n"})
    script = SCRIPT.replace("API_KEY", API_KEY).replace("TOKEN", TOKEN)
    tasklist, config = write_job_files(tmp_path / "job", local=script, tasklist=TASKLIST)
    with config.open("a") as handle:
        handle.write("\n[environment]\nsetup = []\n")
    env = merlin_env(
        home,
        HOME=str(host_home),
        OPENAI_API_KEY=API_KEY,
        MERLIN_PR_TOKEN=TOKEN,
        MERLIN_DATABASE_URL=f"sqlite:///{home / 'merlin.db'}",
    )
    try:
        result = merlin(
            env, "run", str(tasklist), "--repo", str(checkout), "--config", str(config), "--json"
        )
        assert result.returncode == 0, result.stdout + result.stderr
        view = json.loads(result.stdout)
        assert view["status"] == "completed"
        logs = merlin(env, "logs", view["id"]).stdout

        # The attack ran through both paths, and every attempt was contained.
        assert logs.count("attack-finished") == 2, logs
        assert "ESCAPED" not in logs
        assert victim.poll() is None, "a sandboxed command killed a process of the worker's user"
        assert not (host_home / "pwned").exists()
        assert not (Path("/tmp") / host_tmp_name).exists()
        assert not (checkout / "pwned").exists()
        assert not (checkout / ".git" / "hooks" / "post-commit").exists()
        assert not hook_marker.exists()
        assert "tried-nested-repository" in logs
        assert not nested_marker.exists(), "merlin's git ran a nested repository's program"
        tree = subprocess.run(
            ["git", "ls-tree", "-r", view["branch"]], cwd=checkout, capture_output=True, text=True
        ).stdout
        assert "nested/f.txt" in tree
        assert "160000" not in tree  # committed as files, never as a gitlink

        # No secret is stored: not in the database, not in `merlin logs`.
        assert API_KEY not in logs
        assert TOKEN not in logs
        assert "[REDACTED]" in logs  # the model's reply named both; they were redacted
        raw = (home / "merlin.db").read_bytes()
        assert API_KEY.encode() not in raw
        assert TOKEN.encode() not in raw
    finally:
        victim.kill()
        victim.wait()
        stray = Path("/tmp") / host_tmp_name
        if stray.exists():
            os.unlink(stray)
