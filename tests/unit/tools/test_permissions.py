"""`[permissions]` rules: parsing, Bash and path matching, precedence, masks and writes."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.tool_config import PermissionRules
from merlin_flow.tools.permissions import ASK_NOTE, Permissions
from merlin_flow.tools.shell_commands import MAX_DEPTH


def perms(root: Path | None = None, **lists: Any) -> Permissions:
    return Permissions(PermissionRules(**lists), root=root)


# -- Bash matching -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "command", "denied"),
    [
        ("Bash(git push:*)", "git push", True),
        ("Bash(git push:*)", "git push origin main", True),
        ("Bash(git push:*)", "git pushx", False),
        ("Bash(git push:*)", "git   push   --force", True),
        ("Bash(git push:*)", 'git "push" origin', True),
        ("Bash(git push:*)", "echo git push", False),
        ("Bash(git push *)", "git push -f", True),
        ("Bash(git push *)", "git pushy", False),
        ("Bash(npm test)", "npm test", True),
        ("Bash(npm test)", "npm test --watch", False),
        ("Bash(npm run test*)", "npm run test:unit", True),
        ("Bash(git * main)", "git checkout main", True),
        ("Bash(git * main)", "git checkout dev", False),
        ("Bash", "anything at all", True),
        ("Bash(*)", "ls", True),
        # compound commands: any part
        ("Bash(git push:*)", "ls && git push", True),
        ("Bash(git push:*)", "false || git push", True),
        ("Bash(git push:*)", "ls; git push", True),
        ("Bash(git push:*)", "git log | git push", True),
        ("Bash(git push:*)", "sleep 1 & git push", True),
        ("Bash(git push:*)", "ls\ngit push", True),
        ("Bash(git push:*)", "(cd sub && git push)", True),
        ("Bash(git push:*)", "echo $(git push)", True),
        ("Bash(git push:*)", 'echo "$(git push)"', True),
        ("Bash(git push:*)", "echo `git push`", True),
        ("Bash(git push:*)", "diff <(git push) x", True),
        ("Bash(git push:*)", "if true; then git push; fi", True),
        ("Bash(git push:*)", "cat <<EOF\n$(git push)\nEOF", True),
        ("Bash(git push:*)", "cat <<'EOF'\ngit push\nEOF", False),  # a quoted here-doc is text
        ("Bash(git push:*)", "echo 'git push && x'", False),
        ("Bash(git push:*)", "echo ok # && git push", False),
        # prefixes and wrappers
        ("Bash(git push:*)", "GIT_TRACE=1 git push", True),
        ("Bash(git push:*)", "env A=1 B=2 git push", True),
        ("Bash(git push:*)", "env -u HOME git push", True),
        ("Bash(git push:*)", "command git push", True),
        ("Bash(git push:*)", "nohup git push &", True),
        ("Bash(git push:*)", "time git push", True),
        ("Bash(git push:*)", "sudo -u root git push", True),
        ("Bash(git push:*)", "timeout 30 git push", True),
        ("Bash(git push:*)", "/usr/bin/git push", True),
        ("Bash(git push:*)", "git push 2>&1 > log", True),
        ("Bash(git push:*)", "sh -c 'git push'", True),
        ("Bash(git push:*)", 'bash -lc "cd x && git push"', True),
        ("Bash(git push:*)", "sh -c \"sh -c 'git push'\"", True),
        ("Bash(git push:*)", "eval 'git push'", True),
        ("Bash(git push:*)", "env -S 'git push'", True),
        ("Bash(rm:*)", "find . -name x -exec rm {} \\;", True),
        ("Bash(rm:*)", "ls | xargs -n 1 rm", True),
        ("Bash(sudo:*)", "sudo ls", True),  # the wrapper itself is a reading too
        ("Bash(sh:*)", "sh -c 'ls'", True),
        ("Bash(python:*)", "python -c 'import os'", True),
    ],
)
def test_bash_deny_rules(rule: str, command: str, denied: bool) -> None:
    refusal = perms(deny=[rule]).check_command(command)
    assert (refusal is not None) == denied, refusal
    if denied:
        assert refusal is not None
        assert refusal.startswith(f"refused by [permissions] deny rule {rule}: ")


@pytest.mark.parametrize(
    ("command", "allowed"),
    [
        ("pytest -q", True),
        ("pytest -q && ruff check .", True),
        ("pytest | tee log", False),
        ("cd src && pytest", False),
        ("sh -c 'pytest -x'", True),  # the shell is judged by its script
        ("sh -c 'pytest; curl x'", False),
        ("FOO=1 pytest", True),
        ("pytest $(curl evil)", False),
        ("echo hi", False),
        ("", True),  # nothing runs
    ],
)
def test_default_deny_needs_an_allow_rule_for_every_part(command: str, allowed: bool) -> None:
    rules = perms(default="deny", allow=["Bash(pytest:*)", "Bash(ruff check:*)"])
    refusal = rules.check_command(command)
    assert (refusal is None) == allowed, refusal
    if not allowed:
        assert refusal is not None
        assert refusal.startswith('not allowed: [permissions] default = "deny" and no allow rule')


def test_a_command_that_cannot_be_read_is_refused_only_when_rules_must_read_it() -> None:
    refusal = perms(deny=["Bash(rm:*)"]).check_command("echo 'unclosed")
    assert refusal is not None
    assert "cannot be read" in refusal
    assert perms(deny=["Read(.env)"]).check_command("echo 'unclosed") is None
    assert perms().check_command("echo 'unclosed") is None
    deep = "ls"
    for _ in range(MAX_DEPTH):
        deep = f"sh -c {shlex.quote(deep)}"
    assert perms(deny=["Bash(rm:*)"]).check_command(deep) is None
    refusal = perms(deny=["Bash(rm:*)"]).check_command(f"sh -c {shlex.quote(deep)}")
    assert refusal is not None
    assert "nested too deeply" in refusal


# -- paths ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments", "refusal"),
    [
        ("read_file", {"path": "secrets/key"}, "deny rule Read(./secrets/**): secrets/key"),
        ("read_file", {"path": "./src/../secrets/key"}, "Read(./secrets/**): secrets/key"),
        ("list_files", {"path": "secrets"}, "deny rule Read(./secrets/**): secrets"),
        ("grep", {"pattern": "x", "path": "secrets/"}, "deny rule Read(./secrets/**): secrets"),
        ("grep", {"pattern": "x", "path": "secrets/sub"}, "deny rule Read(./secrets/**)"),
        ("grep", {"pattern": "x"}, None),  # the root: denied files are skipped, not the call
        ("list_files", {}, None),
        ("read_file", {"path": "src/.env"}, "deny rule Read(.env): src/.env"),
        ("read_file", {"path": "src/app.py"}, None),
        ("write_file", {"path": "secrets/new", "content": ""}, None),  # Read rules: reading
        ("edit_file", {"path": "secrets/key", "old": "a", "new": "b"}, "Read(./secrets/**)"),
        ("edit_file", {"path": "uv.lock", "old": "a", "new": "b"}, "deny rule Edit(*.lock)"),
        ("write_file", {"path": "a/b.lock", "content": ""}, "deny rule Edit(*.lock)"),
        ("write_file", {"path": "docs/x.md", "content": ""}, "deny rule Write(./docs/**)"),
        ("edit_file", {"path": "docs/x.md", "old": "a", "new": "b"}, None),  # Write: write_file
        ("run_command", {"command": "git push -f"}, "deny rule Bash(git push:*): git push -f"),
        ("run_command", {"command": "cat secrets/key"}, None),  # the sandbox masks it
        ("mcp__github__delete_repo", {}, "deny rule mcp__github__delete_repo"),
        ("mcp__github__list_issues", {}, None),
        ("read_file", {}, None),  # bad arguments: the tool says so
    ],
)
def test_check_call(tool: str, arguments: dict[str, Any], refusal: str | None) -> None:
    rules = perms(
        deny=[
            "Read(./secrets/**)",
            "Read(.env)",
            "Edit(*.lock)",
            "Write(./docs/**)",
            "Bash(git push:*)",
            "mcp__github__delete_repo",
        ]
    )
    found = rules.check_call(tool, arguments)
    if refusal is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith("refused by [permissions] ")
        assert refusal in found


def test_paths_are_judged_where_symlinks_lead(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text("k")
    (tmp_path / "alias").symlink_to("secrets/key")
    (tmp_path / "door").symlink_to("secrets")
    rules = perms(tmp_path, deny=["Read(./secrets/**)"])
    ways = ("alias", "door/key", str(tmp_path / "secrets/key"), f"../{tmp_path.name}/secrets/key")
    for path in ways:
        assert rules.check_call("read_file", {"path": path}) is not None, path
    assert rules.check_call("list_files", {"path": "door"}) is not None
    assert perms(deny=["Read(./secrets/**)"]).check_call("read_file", {"path": "alias"}) is None


def test_path_readable_lets_searches_skip_denied_files() -> None:
    rules = perms(deny=["Read(./secrets/**)", "Grep(*.min.js)"])
    assert not rules.path_readable("secrets/key")
    assert rules.path_readable("src/app.py")
    assert rules.path_readable("dist/a.min.js")
    assert not rules.path_readable("dist/a.min.js", tool="grep")
    only_src = perms(default="deny", allow=["Read(./src/**)"])
    assert only_src.path_readable("src/app.py")
    assert not only_src.path_readable("README.md")
    assert only_src.check_call("grep", {"pattern": "x"}) is None  # runs, skipping README
    refusal = only_src.check_call("read_file", {"path": "README.md"})
    assert refusal == (
        'not allowed: [permissions] default = "deny" and no allow rule matches README.md'
    )


# -- precedence and offering ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("lists", "expected"),
    [
        ({"allow": ["Bash(git:*)"], "deny": ["Bash(git push:*)"]}, "deny rule Bash(git push:*)"),
        ({"deny": ["Bash(git push:*)"], "ask": ["Bash(git:*)"]}, "deny rule Bash(git push:*)"),
        ({"ask": ["Bash(git:*)"], "allow": ["Bash(git push:*)"]}, f"rule Bash(git:*) {ASK_NOTE}"),
        ({"ask": ["Bash"], "allow": ["Bash(git push:*)"]}, "ask rule Bash "),
        ({"allow": ["Bash(git push:*)"], "default": "deny"}, None),
        ({"allow": ["Bash(git:*)"], "default": "deny"}, None),
        ({"allow": ["Bash(ls:*)"], "default": "deny"}, 'default = "deny"'),
        ({"default": "deny"}, 'default = "deny"'),
        ({}, None),
    ],
)
def test_deny_beats_ask_beats_allow_beats_default(
    lists: dict[str, Any], expected: str | None
) -> None:
    refusal = perms(**lists).check_call("run_command", {"command": "git push origin"})
    if expected is None:
        assert refusal is None
    else:
        assert refusal is not None
        assert expected in refusal
        assert refusal.endswith("git push origin")


def test_ask_refusal_says_nobody_can_answer() -> None:
    refusal = perms(ask=["Bash(git:*)"]).check_command("git push origin")
    assert refusal == (
        "refused by [permissions] ask rule Bash(git:*) (nobody can answer in a job, so it is "
        "refused): git push origin"
    )


@pytest.mark.parametrize(
    ("lists", "offered"),
    [
        ({"deny": ["Edit"]}, {"edit_file": False, "write_file": False, "read_file": True}),
        ({"deny": ["Write"]}, {"edit_file": True, "write_file": False}),
        ({"ask": ["Bash"]}, {"run_command": False, "grep": True}),
        ({"deny": ["Bash(*)"]}, {"run_command": False}),
        ({"deny": ["Bash(rm:*)"]}, {"run_command": True}),  # a specifier keeps the tool
        ({"deny": ["Read"]}, {"read_file": False, "list_files": False, "grep": False}),
        ({"deny": ["Glob"]}, {"list_files": False, "grep": True}),
        ({"deny": ["mcp__github"]}, {"mcp__github__list": False, "mcp__gitlab__list": True}),
        ({"deny": ["mcp__github__push"]}, {"mcp__github__push": False, "mcp__github__list": True}),
        (
            {"default": "deny", "allow": ["Read(./src/**)", "Bash(pytest:*)", "mcp__docs"]},
            {
                "read_file": True,
                "grep": True,
                "write_file": False,
                "run_command": True,
                "mcp__docs__search": True,
                "mcp__github__list": False,
            },
        ),
    ],
)
def test_tool_offered(lists: dict[str, Any], offered: dict[str, bool]) -> None:
    rules = perms(**lists)
    assert {name: rules.tool_offered(name) for name in offered} == offered


def test_a_tool_not_offered_is_refused_if_called_anyway() -> None:
    refusal = perms(deny=["Edit"]).check_call("edit_file", {"path": "a", "old": "", "new": ""})
    assert refusal == "refused by [permissions] deny rule Edit: a"
    assert perms(default="deny").check_call("mcp__x__y", {}) is not None


# -- writes ---------------------------------------------------------------------------------


def test_denied_writes() -> None:
    rules = perms(deny=["Edit(*.lock)", "Read(./secrets/**)"], ask=["Write(./docs/**)"])
    changed = ["uv.lock", "src/a.py", "docs/new.md", "secrets/key", "a/b/c.lock"]
    assert rules.denied_writes(changed) == [
        ("uv.lock", "Edit(*.lock)"),
        ("docs/new.md", "Write(./docs/**)"),
        ("a/b/c.lock", "Edit(*.lock)"),
    ]
    only_src = perms(default="deny", allow=["Edit(./src/**)", "Bash(make:*)"])
    assert only_src.denied_writes(["src/a.py", "Makefile"]) == [("Makefile", 'default = "deny"')]
