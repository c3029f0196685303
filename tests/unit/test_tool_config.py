"""The `[permissions]` rules' grammar (parse_rule, path and folder patterns) and merging."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from merlin_flow.tool_config import (
    PermissionRules,
    SecretScan,
    merge_rules,
    parse_rule,
    path_glob,
)
from merlin_flow.tools.permissions import Permissions


def perms(root: Path | None = None, **lists: Any) -> Permissions:
    return Permissions(PermissionRules(**lists), root=root)


# -- parse_rule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "specifier"),
    [
        ("Bash", "Bash", None),
        ("Bash(*)", "Bash", None),  # any command: the same as the whole tool
        ("Bash(git push:*)", "Bash", "git push:*"),
        ("  Bash(npm test)  ", "Bash", "npm test"),
        ("Bash(echo $(date))", "Bash", "echo $(date)"),
        ("Read(./secrets/**)", "Read", "./secrets/**"),
        ("Edit(src/**)", "Edit", "src/**"),
        ("Write(**/*.lock)", "Write", "**/*.lock"),
        ("Read(~/.ssh/**)", "Read", "~/.ssh/**"),
        ("Read(//etc/passwd)", "Read", "//etc/passwd"),
        ("Grep(./vendor/**)", "Grep", "./vendor/**"),
        ("Glob", "Glob", None),
        ("read_file(.env)", "read_file", ".env"),
        ("run_command(make:*)", "run_command", "make:*"),
        ("list_files", "list_files", None),
        ("mcp__github", "mcp__github", None),
        ("mcp__github__create_issue", "mcp__github__create_issue", None),
        ("mcp__my-server__*", "mcp__my-server", None),
    ],
)
def test_valid_rules(text: str, kind: str, specifier: str | None) -> None:
    rule = parse_rule(text)
    assert (rule.kind, rule.specifier, rule.text) == (kind, specifier, text.strip())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Shell(ls)", "unknown tool 'Shell'"),
        ("bash(ls)", "did you mean Bash?"),
        ("WebFetch", "rules name Bash, Read, Edit, Write, Grep, Glob"),
        ("Bash(git push:*", "unbalanced parentheses"),
        ("Bash(a))", "unbalanced parentheses"),
        ("Bash)", "unbalanced parentheses"),
        ("Read(x)y", "unbalanced parentheses"),
        ("Bash()", "empty specifier"),
        ("Read(  )", "empty specifier"),
        ("mcp__github(create)", "MCP tools take no specifier"),
        ("mcp__", "unknown tool"),
        ("Bash(git:* push)", "`:*` goes at the end"),
        ("Bash(:*)", "`:*` goes at the end"),
        ("Bash(echo 'x)", "No closing quotation"),
        ("Read(../outside/**)", "`..`"),
        ("Read(a//b)", "`//` inside the path"),
        ("Read(./src/./x)", "`.`"),
    ],
)
def test_invalid_rules_name_the_rule_and_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="permission rule") as caught:
        parse_rule(text)
    assert repr(text.strip()) in str(caught.value)
    assert message in str(caught.value)


def test_the_config_model_refuses_a_bad_rule() -> None:
    with pytest.raises(ValidationError, match=r"unknown tool 'Shell'"):
        PermissionRules(deny=["Shell(rm:*)"])


def test_secret_scan_globs_match_as_path_rules_do_and_bad_ones_are_refused() -> None:
    fixtures = path_glob("tests/fixtures/**")
    assert fixtures.matches_path("tests/fixtures/keys/aws.json")
    assert not fixtures.matches_path("src/tests/fixtures/aws.json")  # anchored: it has a `/`
    assert not fixtures.matches_path("tests/aws.json")
    assert path_glob("*.pem").matches_path("deep/in/key.pem")  # no `/`: any folder
    assert path_glob("tests/fixtures").matches_path("tests/fixtures/a/b.txt")  # the folder
    for bad, problem in [
        ("", "empty"),
        ("  ", "empty"),
        ("~/keys/**", "outside the repository"),
        ("a/../b", "`.`, `..` or `//`"),
    ]:
        expected = re.escape(f"path glob {bad!r}: ") + ".*" + re.escape(problem)
        with pytest.raises(ValueError, match=expected):
            path_glob(bad)
    assert SecretScan().allow == []
    with pytest.raises(ValidationError, match=r"allow\n.*path glob 'a//b'"):
        SecretScan(allow=["ok/**", "a//b"])


# -- paths ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("./secrets/**", "secrets/key", True),
        ("./secrets/**", "secrets/a/b/c", True),
        ("./secrets/**", "src/secrets/key", False),
        ("/secrets/**", "secrets/key", True),
        ("secrets/**", "secrets/key", True),  # a slash inside anchors it
        ("./secrets", "secrets/key", True),  # a folder covers what it holds
        ("secrets/", "deep/secrets/key", True),  # no slash inside: any depth
        (".env", ".env", True),
        (".env", "a/b/.env", True),
        (".env", ".env.example", False),
        ("*.lock", "uv.lock", True),
        ("*.lock", "pkg/sub/Cargo.lock", True),
        ("**/*.lock", "pkg/x.lock", True),
        ("**/*.lock", "x.lock", True),
        ("src/**/*.py", "src/a/b/c.py", True),
        ("src/**/*.py", "src/c.py", True),
        ("src/**/*.py", "lib/src/c.py", False),
        ("src/*.py", "src/a/c.py", False),
        ("file?.txt", "file1.txt", True),
        ("file?.txt", "file10.txt", False),
        ("app/[id]/page.tsx", "app/[id]/page.tsx", True),  # brackets are literal
        ("app/[id]/page.tsx", "app/i/page.tsx", False),
        ("~/.ssh/**", ".ssh/id_rsa", False),  # host paths never match in a worktree
        ("//etc/**", "etc/passwd", False),
        ("./", "anything/at/all", True),
    ],
)
def test_path_patterns(pattern: str, path: str, matches: bool) -> None:
    assert parse_rule(f"Read({pattern})").matches_path(path) is matches


@pytest.mark.parametrize(
    ("pattern", "folder", "whole"),
    [
        ("./secrets/**", "secrets", True),
        ("./secrets/**", "secrets/sub", True),
        ("./secrets/*", "secrets", True),  # every child, so all they hold
        ("./secrets/*.pem", "secrets", False),
        ("./secrets/**", "", False),
        ("**", "", True),
        ("*", "", True),
        (".env", "", False),
        ("./src", "src", True),
        ("src/**/*.py", "src", False),
    ],
)
def test_folder_coverage(pattern: str, folder: str, whole: bool) -> None:
    assert parse_rule(f"Read({pattern})").covers_folder(folder) is whole


# -- merging ---------------------------------------------------------------------------------


def test_merge_rules_keeps_every_rule_and_the_stricter_default() -> None:
    user = PermissionRules(deny=["Read(~/.ssh/**)", "Bash(git push:*)"], default="deny")
    project = PermissionRules(allow=["Bash(git push:*)", "Bash(pytest:*)"], ask=["Edit"])
    merged = merge_rules(user, project)
    assert merged.deny == ["Read(~/.ssh/**)", "Bash(git push:*)"]
    assert merged.allow == ["Bash(git push:*)", "Bash(pytest:*)"]
    assert merged.ask == ["Edit"]
    assert merged.default == "deny"
    assert perms(**merged.model_dump()).check_command("git push") is not None
    assert merge_rules(PermissionRules(), PermissionRules()).default == "allow"
    assert merge_rules(PermissionRules(), PermissionRules(default="deny")).default == "deny"
