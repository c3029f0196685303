"""split_command: a shell command read as the simple commands it runs."""

from __future__ import annotations

import contextlib

from hypothesis import given
from hypothesis import strategies as st

from merlin_flow.tools.shell_commands import split_command


def test_split_command_gives_what_runs_and_the_readings() -> None:
    parts = split_command("cd x && FOO=1 sudo -u root git push 2>&1 | tee log")
    assert [p.words for p in parts] == [("cd", "x"), ("git", "push"), ("tee", "log")]
    assert ("sudo", "-u", "root", "git", "push") in parts[1].readings
    runner, inner = split_command("bash -c 'make test'")
    assert runner.script_runner
    assert inner.words == ("make", "test")


@given(st.text(alphabet=" ab$`'\"()|&;<>\\\n#{}=-c", max_size=40))
def test_split_command_reads_or_raises_value_error(command: str) -> None:
    with contextlib.suppress(ValueError):
        split_command(command)
