"""Toolbox: every path stays inside the worktree, and a tool call never raises."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.tools.toolbox import (
    GREP_STOPPED,
    MAX_GREP_MATCHES,
    MAX_READ_CHARS,
    READ_ONLY_TOOLS,
    Toolbox,
)
from tests.unit.tools.conftest import SECRET, World


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry below ``folder`` with its content (files) or kind (folders, links)."""
    state: dict[str, bytes | str] = {}
    for item in sorted(folder.rglob("*")):
        rel = item.relative_to(folder).as_posix()
        if item.is_symlink():
            state[rel] = "link -> " + os.readlink(item)
        elif item.is_dir():
            state[rel] = "dir"
        else:
            state[rel] = item.read_bytes()
    return state


# --- confinement -------------------------------------------------------------------------

# kind -> (file path, folder path); "{outside}" is replaced by the outside folder.
ESCAPES: dict[str, tuple[str, str]] = {
    "dotdot": ("../outside/secret.txt", "../outside"),
    "dotdot-through-subfolder": ("sub/../../outside/secret.txt", "sub/../../outside"),
    "dotdot-only": ("../outside/secret.txt", ".."),
    "absolute-sibling": ("{outside}/secret.txt", "{outside}"),
    "absolute-etc-passwd": ("/etc/passwd", "/etc"),
    "symlink-to-outside-file": ("link_file", "link_file"),
    "symlinked-folder": ("link_dir/secret.txt", "link_dir"),
}
GIT_PATHS: dict[str, tuple[str, str]] = {
    "git-config": (".git/config", ".git"),
    "git-dot-slash": ("./.git/HEAD", "./.git"),
    "git-through-subfolder": ("sub/../.git/HEAD", "sub/../.git/refs"),
    "symlink-to-git": ("git_link/HEAD", "git_link"),
}


def tool_call(tool: str, file_path: str, dir_path: str, world: World) -> dict[str, Any]:
    """Arguments that would read or change the target if the path were accepted."""
    if tool == "read_file":
        return {"path": file_path}
    if tool == "write_file":
        # For /etc/passwd, write its own content: harmless even if confinement broke.
        content = Path(file_path).read_text() if file_path == "/etc/passwd" else "pwned\n"
        return {"path": file_path, "content": content}
    if tool == "edit_file":
        if file_path == "/etc/passwd":
            return {"path": file_path, "old": "\x01merlin-absent\x01", "new": "x"}
        return {"path": file_path, "old": SECRET.strip(), "new": "pwned"}
    if tool == "list_files":
        return {"path": dir_path}
    if tool == "grep":
        return {"pattern": "SECRET|ref:|root:|core", "path": dir_path}
    raise AssertionError(tool)


CONFINED_TOOLS = ["read_file", "write_file", "edit_file", "list_files", "grep"]


@pytest.mark.parametrize("tool", CONFINED_TOOLS)
@pytest.mark.parametrize("kind", list(ESCAPES))
def test_paths_leaving_the_worktree_are_refused(world: World, tool: str, kind: str) -> None:
    file_path, dir_path = (p.format(outside=world.outside) for p in ESCAPES[kind])
    before_outside = snapshot(world.outside)
    before_git = snapshot(world.root / ".git")
    passwd_before = Path("/etc/passwd").read_bytes()

    reply = world.box.call(tool, json.dumps(tool_call(tool, file_path, dir_path, world)))

    assert isinstance(reply, str)
    assert reply.startswith("error:"), reply
    assert "outside the repository" in reply
    # Nothing from outside leaks into the reply, besides the echoed path argument.
    leaked = reply.replace(repr(file_path), "").replace(repr(dir_path), "")
    assert "SECRET" not in leaked
    assert "secret.txt" not in leaked
    assert "root:" not in leaked
    assert snapshot(world.outside) == before_outside
    assert snapshot(world.root / ".git") == before_git
    assert Path("/etc/passwd").read_bytes() == passwd_before


@pytest.mark.parametrize("tool", CONFINED_TOOLS)
@pytest.mark.parametrize("kind", list(GIT_PATHS))
def test_git_paths_are_refused(world: World, tool: str, kind: str) -> None:
    file_path, dir_path = GIT_PATHS[kind]
    before_git = snapshot(world.root / ".git")
    args = tool_call(tool, file_path, dir_path, world)
    if tool == "edit_file":
        args = {"path": file_path, "old": "ref:", "new": "pwned:"}

    reply = world.box.call(tool, args)

    assert reply.startswith("error:"), reply
    assert "inside .git" in reply
    assert "refs/heads" not in reply
    assert snapshot(world.root / ".git") == before_git


@pytest.mark.parametrize(
    "path",
    [
        "../outside/new.txt",
        "../new-folder/new.txt",
        "{outside}/new.txt",
        "link_dir/new.txt",
        "link_dir/deeper/new.txt",
        "dangling",
        ".git/new-file",
        "git_link/hooks/pre-commit",
    ],
)
def test_write_file_never_creates_files_outside_or_in_git(world: World, path: str) -> None:
    path = path.format(outside=world.outside)
    parent = world.root.parent
    before_parent = sorted(p.name for p in parent.iterdir())
    before_outside = snapshot(world.outside)
    before_git = snapshot(world.root / ".git")

    reply = world.box.call("write_file", {"path": path, "content": "#!/bin/sh\nexit 0\n"})

    assert reply.startswith("error:"), reply
    assert sorted(p.name for p in parent.iterdir()) == before_parent
    assert snapshot(world.outside) == before_outside
    assert snapshot(world.root / ".git") == before_git
    assert not (world.outside / "created-through-dangling.txt").exists()


def test_walks_do_not_follow_links_out_of_the_worktree_or_into_git(world: World) -> None:
    listing = world.box.call("list_files", {}).splitlines()
    assert listing == ["a.txt", "notes.md", "sub/b.py", "sub/deep/c.py"]

    assert world.box.call("grep", {"pattern": "SECRET"}) == "(no matches)"
    # .git/HEAD holds "ref: refs/heads/main"; the walk must skip .git entirely.
    assert world.box.call("grep", {"pattern": "refs/heads"}) == "(no matches)"


@pytest.mark.parametrize(
    "args",
    [
        {"path": "a\x00b"},
        {"path": 5},
        {"path": None},
        {"path": ["a.txt"]},
    ],
    ids=["nul", "int", "null", "list"],
)
def test_malformed_paths_are_refused(world: World, args: dict[str, Any]) -> None:
    reply = world.box.call("read_file", args)
    assert reply.startswith("error:"), reply


# --- happy paths ---------------------------------------------------------------------------


def test_write_then_read_creates_parent_folders(world: World) -> None:
    reply = world.box.call("write_file", {"path": "pkg/inner/mod.py", "content": "x = 1\n"})
    assert reply == "wrote 6 characters to pkg/inner/mod.py"
    assert (world.root / "pkg/inner/mod.py").read_text() == "x = 1\n"
    assert world.box.call("read_file", {"path": "pkg/inner/mod.py"}) == "x = 1\n"


def test_write_file_overwrites(world: World) -> None:
    world.box.call("write_file", {"path": "a.txt", "content": "new\n"})
    assert (world.root / "a.txt").read_text() == "new\n"


def test_absolute_path_inside_the_worktree_is_allowed(world: World) -> None:
    assert world.box.call("read_file", {"path": str(world.root / "a.txt")}) == "hello\nworld\n"


def test_symlink_that_stays_inside_is_allowed(world: World) -> None:
    (world.root / "alias.py").symlink_to(world.root / "sub/b.py")
    assert world.box.call("read_file", {"path": "alias.py"}).startswith("def f():")


def test_write_file_refuses_a_folder(world: World) -> None:
    assert world.box.call("write_file", {"path": "sub", "content": "x"}).startswith("error:")
    assert world.box.call("write_file", {"path": ".", "content": "x"}).startswith("error:")
    assert (world.root / "sub").is_dir()


def test_read_file_of_missing_file_is_an_error(world: World) -> None:
    reply = world.box.call("read_file", {"path": "missing.txt"})
    assert reply.startswith("error:")
    assert "not a file" in reply


def test_read_file_cuts_a_line_longer_than_a_read(world: World) -> None:
    (world.root / "big.txt").write_text("x" * (MAX_READ_CHARS + 50))
    reply = world.box.call("read_file", {"path": "big.txt"})
    header, body = reply.split("\n", 1)
    assert header == "big.txt: lines 1-1 of 1"
    assert body.startswith("1\t" + "x" * 1000)
    assert body.endswith(f"\n[line 1 cut at {MAX_READ_CHARS} characters]")
    assert len(reply) < MAX_READ_CHARS + 100


def test_a_smaller_read_budget_reads_a_file_in_numbered_windows(world: World) -> None:
    (world.root / "big.txt").write_text("".join(f"line {n}\n" for n in range(1, 301)))
    world.box.read_chars = 200
    first = world.box.call("read_file", {"path": "big.txt"})
    header, body = first.split("\n", 1)
    last_shown = int(body.splitlines()[-1].split("\t")[0])
    assert header == (
        f"big.txt: lines 1-{last_shown} of 300; the rest does not fit one read: "
        f"read on with start_line {last_shown + 1}"
    )
    assert 10 < last_shown < 30
    assert len(body) <= 200
    on = world.box.call("read_file", {"path": "big.txt", "start_line": last_shown + 1})
    assert on.splitlines()[1] == f"{last_shown + 1}\tline {last_shown + 1}"


def test_read_file_of_binary_file_is_an_error(world: World) -> None:
    (world.root / "blob.bin").write_bytes(b"\xff\xfe\x00\x81")
    assert world.box.call("read_file", {"path": "blob.bin"}).startswith("error:")


def test_edit_file_replaces_the_single_occurrence(world: World) -> None:
    reply = world.box.call("edit_file", {"path": "a.txt", "old": "world", "new": "there"})
    assert reply == "edited a.txt"
    assert (world.root / "a.txt").read_text() == "hello\nthere\n"


@pytest.mark.parametrize(
    ("content", "old", "expected"),
    [
        ("alpha beta\n", "gamma", "not found"),
        ("beta and beta\n", "beta", "found 2 times"),
        ("alpha\n", "", "not found"),
    ],
    ids=["zero", "two", "empty-old"],
)
def test_edit_file_needs_exactly_one_occurrence(
    world: World, content: str, old: str, expected: str
) -> None:
    (world.root / "e.txt").write_text(content)
    reply = world.box.call("edit_file", {"path": "e.txt", "old": old, "new": "CHANGED"})
    assert reply.startswith("error:"), reply
    assert expected in reply
    assert (world.root / "e.txt").read_text() == content


def test_edit_file_of_missing_file_is_an_error(world: World) -> None:
    reply = world.box.call("edit_file", {"path": "nope.txt", "old": "a", "new": "b"})
    assert reply.startswith("error:")
    assert not (world.root / "nope.txt").exists()


def test_list_files_with_pattern_and_folder(world: World) -> None:
    assert world.box.call("list_files", {"pattern": "*.py"}).splitlines() == [
        "sub/b.py",
        "sub/deep/c.py",
    ]
    # The pattern is matched against the relative path as well as the name.
    assert world.box.call("list_files", {"pattern": "sub/deep/*"}) == "sub/deep/c.py"
    assert world.box.call("list_files", {"path": "sub/deep"}) == "sub/deep/c.py"
    assert world.box.call("list_files", {"pattern": "*.rs"}) == "(no files)"


def test_list_files_of_a_file_or_missing_folder_is_an_error(world: World) -> None:
    assert world.box.call("list_files", {"path": "a.txt"}).startswith("error:")
    assert world.box.call("list_files", {"path": "missing"}).startswith("error:")


def test_grep_with_a_regex(world: World) -> None:
    reply = world.box.call("grep", {"pattern": r"^def \w+\(\):$"})
    assert reply.splitlines() == ["sub/b.py:1: def f():", "sub/deep/c.py:4: def g():"]


def test_grep_in_one_file_and_no_match(world: World) -> None:
    assert world.box.call("grep", {"pattern": "o", "path": "a.txt"}).splitlines() == [
        "a.txt:1: hello",
        "a.txt:2: world",
    ]
    assert world.box.call("grep", {"pattern": "zzz", "path": "sub"}) == "(no matches)"


def test_grep_skips_binary_files(world: World) -> None:
    (world.root / "blob.bin").write_bytes(b"\xff\xfehello\x81")
    assert world.box.call("grep", {"pattern": "hello"}) == "a.txt:1: hello"


def test_grep_with_an_invalid_regex_is_an_error(world: World) -> None:
    reply = world.box.call("grep", {"pattern": "(unclosed"})
    assert reply.startswith("error:")


# --- the call protocol ---------------------------------------------------------------------


def test_unknown_tool(world: World) -> None:
    reply = world.box.call("delete_everything", {})
    assert reply.startswith("error: unknown tool 'delete_everything'")
    assert "read_file" in reply


@pytest.mark.parametrize("arguments", ['{"path": "a.txt"', "not json", ""])
def test_invalid_json_arguments(world: World, arguments: str) -> None:
    reply = world.box.call("read_file", arguments)
    assert reply.startswith("error: arguments of read_file are not valid JSON")


@pytest.mark.parametrize("arguments", ["null", "[1, 2]", '"a.txt"', "3"])
def test_arguments_must_be_an_object(world: World, arguments: str) -> None:
    assert world.box.call("read_file", arguments) == (
        "error: arguments of read_file must be a JSON object"
    )


def test_missing_and_unexpected_arguments(world: World) -> None:
    missing = world.box.call("write_file", '{"path": "x.txt"}')
    assert missing.startswith("error: bad arguments for write_file")
    assert "content" in missing
    assert not (world.root / "x.txt").exists()

    unexpected = world.box.call("read_file", {"path": "a.txt", "mode": "rb"})
    assert unexpected.startswith("error: bad arguments for read_file")


def test_wrong_argument_types_are_errors_not_exceptions(world: World) -> None:
    assert world.box.call("write_file", {"path": "n.txt", "content": 5}).startswith("error:")
    assert not (world.root / "n.txt").exists()
    assert world.box.call("edit_file", {"path": "a.txt", "old": 1, "new": 2}).startswith("error:")
    assert world.box.call("grep", {"pattern": 5}).startswith("error:")


# --- run_command ---------------------------------------------------------------------------


def test_run_command_reports_exit_code_and_output(world: World) -> None:
    reply = world.box.call("run_command", {"command": "echo out; echo err >&2; exit 3"})
    assert reply.startswith("exit code: 3\n")
    assert "out" in reply
    assert "err" in reply


def test_run_command_runs_in_the_worktree(world: World, tmp_path: Path) -> None:
    reply = world.box.call("run_command", {"command": "pwd -P; ls"})
    lines = reply.splitlines()
    assert lines[0] == "exit code: 0"
    assert lines[1] == "/workspace"  # the worktree, as the sandbox shows it
    assert "a.txt" in lines


def test_run_command_cannot_read_outside_the_worktree(world: World) -> None:
    reply = world.box.call("run_command", {"command": f"cat {world.secret}"})
    assert not reply.startswith("exit code: 0")
    assert world.secret.read_text() not in reply


def test_run_command_environment(world: World) -> None:
    reply = world.box.call("run_command", {"command": 'echo "$PYTHONDONTWRITEBYTECODE|$PATH"'})
    flag, path = reply.splitlines()[1].split("|", 1)
    assert flag == "1"
    assert path.split(os.pathsep)[0] == str(Path(sys.executable).parent)


def test_run_command_timeout_is_capped_by_the_toolbox(world: World) -> None:
    box = Toolbox(world.root, command_timeout=0.5)
    started = time.monotonic()
    reply = box.call("run_command", {"command": "sleep 30", "timeout": 600})
    assert time.monotonic() - started < 10
    assert reply.startswith("exit code: 124\n")
    assert "timed out" in reply


def test_run_command_own_timeout_below_the_cap(world: World) -> None:
    started = time.monotonic()
    reply = world.box.call("run_command", {"command": "sleep 30", "timeout": 0.5})
    assert time.monotonic() - started < 5
    assert reply.startswith("exit code: 124\n")


def test_run_command_non_numeric_timeout_is_an_error_reply(world: World) -> None:
    reply = world.box.call("run_command", {"command": "true", "timeout": "soon"})
    assert reply.startswith("error:")


# --- finish ------------------------------------------------------------------------------


def test_finish_is_answered_and_always_offered(world: World) -> None:
    assert world.box.call("finish", {"summary": "done"}) == "finished"
    assert world.box.call("finish", {}).startswith("error: bad arguments for finish")
    assert world.box.call("finish", {"summary": 3}).startswith("error: bad arguments for finish")
    reading = Toolbox(world.root, only=READ_ONLY_TOOLS)
    assert reading.names == [*READ_ONLY_TOOLS, "finish"]
    assert [s["function"]["name"] for s in reading.schemas] == reading.names
    silent = Toolbox(world.root, offer_finish=False)
    assert "finish" not in silent.names
    assert silent.call("finish", {"summary": "x"}).startswith("error: unknown tool 'finish'")


# --- the gate and readable seams -----------------------------------------------------------


class Gate:
    """A gate that refuses writes to *.lock files and records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, arguments: dict[str, Any]) -> str | None:
        self.asked.append((name, arguments))
        if name == "write_file" and str(arguments.get("path", "")).endswith(".lock"):
            return "write_file refused: *.lock files are denied"
        return None


def test_gate_sees_every_call_and_its_refusal_stops_it(world: World) -> None:
    gate = Gate()
    box = Toolbox(world.root, gate=gate)
    refused = box.call("write_file", '{"path": "deps.lock", "content": "x"}')
    assert refused == "error: write_file refused: *.lock files are denied"
    assert not (world.root / "deps.lock").exists()
    assert box.call("write_file", {"path": "ok.txt", "content": "x"}).startswith("wrote")
    assert gate.asked == [
        ("write_file", {"path": "deps.lock", "content": "x"}),
        ("write_file", {"path": "ok.txt", "content": "x"}),
    ]


def test_gate_is_not_asked_about_unrunnable_calls_or_finish(world: World) -> None:
    gate = Gate()
    box = Toolbox(world.root, gate=gate)
    box.call("nope", {})
    box.call("read_file", "{bad json")
    assert box.call("finish", {"summary": "s"}) == "finished"
    assert gate.asked == []


def test_a_failing_gate_refuses(world: World) -> None:
    def broken(name: str, arguments: dict[str, Any]) -> str | None:
        raise RuntimeError("rules not loaded")

    box = Toolbox(world.root, gate=broken)
    reply = box.call("write_file", {"path": "x.txt", "content": "x"})
    assert reply == ("error: write_file refused: the permission check failed: rules not loaded")
    assert not (world.root / "x.txt").exists()


def test_readable_hides_files_from_grep_and_list(world: World) -> None:
    (world.root / "secret.env").write_text("hello=1\n")
    box = Toolbox(world.root, readable=lambda path: not path.endswith(".env"))
    assert "secret.env" not in box.call("list_files", {}).splitlines()
    assert box.call("grep", {"pattern": "hello"}) == "a.txt:1: hello"
    assert box.call("grep", {"pattern": "hello", "path": "secret.env"}) == "(no matches)"
    assert "secret.env" in world.box.call("list_files", {}).splitlines()


# --- extra tools ---------------------------------------------------------------------------


class Echo:
    """An external tool: echoes its arguments, or fails as told."""

    def __init__(self, name: str = "mcp__demo__echo") -> None:
        self.name = name
        self.schema = {
            "type": "function",
            "function": {"name": name, "description": "Echo.", "parameters": {"type": "object"}},
        }
        self.seen: list[dict[str, Any]] = []

    def call(self, arguments: dict[str, Any]) -> str:
        self.seen.append(arguments)
        if "boom" in arguments:
            raise ConnectionError("server went away")
        return json.dumps(arguments, sort_keys=True)


def test_extra_tools_are_offered_after_the_built_ins(world: World) -> None:
    echo = Echo()
    box = Toolbox(world.root, extra=[echo])
    assert box.names[-2:] == ["finish", "mcp__demo__echo"]
    assert box.schemas[-1] is echo.schema
    assert box.call("mcp__demo__echo", '{"b": 1, "a": 2}') == '{"a": 2, "b": 1}'
    assert echo.seen == [{"b": 1, "a": 2}]


def test_extra_tool_failures_are_replies(world: World) -> None:
    box = Toolbox(world.root, extra=[Echo()])
    assert box.call("mcp__demo__echo", {"boom": 1}) == (
        "error: mcp__demo__echo failed: server went away"
    )
    assert box.call("mcp__demo__echo", "[1]") == (
        "error: arguments of mcp__demo__echo must be a JSON object"
    )


def test_extra_tools_go_through_the_gate_and_only(world: World) -> None:
    echo = Echo()
    box = Toolbox(world.root, extra=[echo], gate=lambda name, args: f"{name} is denied")
    assert box.call("mcp__demo__echo", {}) == "error: mcp__demo__echo is denied"
    assert echo.seen == []
    reading = Toolbox(world.root, only=("read_file",), extra=[echo, Echo("mcp__demo__other")])
    assert reading.names == ["read_file", "finish"]
    kept = Toolbox(world.root, only=("mcp__demo__other",), extra=[echo, Echo("mcp__demo__other")])
    assert kept.names == ["finish", "mcp__demo__other"]
    assert kept.call("mcp__demo__echo", {}).startswith("error: unknown tool")


@pytest.mark.parametrize("name", ["read_file", "finish", "mcp__demo__echo"])
def test_extra_tool_names_must_be_unique(world: World, name: str) -> None:
    with pytest.raises(ValueError, match="two tools are named"):
        Toolbox(world.root, extra=[Echo(), Echo(name)] if name.startswith("mcp") else [Echo(name)])


def test_grep_stops_at_its_cap_and_asks_for_a_narrower_query(world: World) -> None:
    (world.root / "many.txt").write_text("hit\n" * (MAX_GREP_MATCHES + 5))
    lines = world.box.call("grep", {"pattern": "hit"}).splitlines()
    assert len(lines) == MAX_GREP_MATCHES + 1
    assert lines[-2] == f"many.txt:{MAX_GREP_MATCHES}: hit"
    assert lines[-1] == GREP_STOPPED
    assert "narrow the query" in GREP_STOPPED
