"""Toolbox under a race: another process swaps a folder for a symlink out, over and over.

The attack found on the tools that checked a path and then opened it again by name: a
process living through the attempt (a repository's stdio MCP server) exchanges the
worktree's folder ``d`` with a symlink to a folder outside (``renameat2`` with
``RENAME_EXCHANGE``, so ``d`` is always there, a folder or a link) while the tools read
and write through ``d``. On the old tools, in 1,000 tries each (five runs), 8 to 45
writes and 5 to 225 edits landed outside, 1 to 156 reads answered with the outside file,
and 7 to 42 of 200 greps found it; here none does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.tool_config import PermissionRules, Sandbox, SandboxMode
from merlin_flow.tools.permissions import Permissions
from merlin_flow.tools.toolbox import Toolbox
from merlin_flow.workspace.checkout import Checkout

SECRET = "OUTSIDE-SECRET"
TRIES = 1000
WALKS = 200  # a walk costs more than one open: fewer tries, each over every file

SWAPPER = textwrap.dedent(
    """
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    os.chdir(sys.argv[1])
    os.symlink(sys.argv[2], "d.swap")
    def swap():  # RENAME_EXCHANGE (2): `d` is the folder, then the link, then the folder
        if libc.renameat2(-100, b"d", -100, b"d.swap", 2):
            print(f"renameat2: {os.strerror(ctypes.get_errno())}", flush=True)
            sys.exit(1)
    swap()  # and back: the exchange works here
    swap()
    print("ready", flush=True)
    while True:
        swap()
    """
)


def arena(tmp_path: Path) -> tuple[Path, Path]:
    """A worktree with the folder ``d``, and an outside folder with files of the same names."""
    root, outside = tmp_path / "repo", tmp_path / "outside"
    for folder, text in ((root / "d", "inside"), (outside, SECRET)):
        folder.mkdir(parents=True)
        (folder / "f.txt").write_text(f"{text}\n")
        (folder / "e.txt").write_text("ANCHOR\n")
    (outside / "outside-only.txt").write_text(f"{SECRET}\n")
    return root, outside


@contextmanager
def swapping(root: Path, outside: Path) -> Iterator[None]:
    """A separate process exchanging ``d`` and a symlink to ``outside`` until the end."""
    argv = [sys.executable, "-I", "-S", "-c", SWAPPER, str(root), str(outside)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as process:
        try:
            assert process.stdout is not None
            said = process.stdout.readline().decode()
            if said != "ready\n":
                pytest.skip(f"no atomic exchange of a folder and a symlink here ({said.strip()})")
            yield
        finally:
            process.kill()
    if (root / "d").is_symlink():  # put the folder back at `d`
        (root / "d").unlink()
        (root / "d.swap").rename(root / "d")


def one_try(tool: str, box: Any, i: int) -> str:
    """One call of ``tool`` through ``d``: its reply."""
    box.forget_reads()  # every read is answered whole (no "unchanged since")
    if tool == "write_file":
        return str(box.call("write_file", {"path": f"d/w{i}.txt", "content": "w\n"}))
    if tool == "read_file":
        return str(box.call("read_file", {"path": "d/f.txt"}))
    if tool == "edit_file":
        return str(box.call("edit_file", {"path": "d/e.txt", "old": "ANCHOR", "new": "ANCHOR."}))
    if tool == "list_files":
        return str(box.call("list_files", {"path": "d" if i % 2 else "."}))
    return str(box.call("grep", {"pattern": "OUTSIDE|inside", "path": "d" if i % 2 else "."}))


def race(tool: str, root: Path, outside: Path, make: Callable[[Path], Any]) -> Counter[str]:
    """Run ``tool`` through ``d`` while it is swapped: how many escaped, and the rest."""
    box = make(root)
    tries = TRIES if tool in ("write_file", "read_file", "edit_file") else WALKS
    seen: Counter[str] = Counter()
    with swapping(root, outside):
        for i in range(tries):
            reply = one_try(tool, box, i)
            seen["leaked" if SECRET in reply or "outside-only" in reply else "kept"] += 1
            seen["refused" if reply.startswith("error:") else "answered"] += 1
    seen["escaped"] = len(list(outside.glob("w*.txt"))) + count(outside / "e.txt", ".")
    seen["inside"] = len(list(root.rglob("w*.txt"))) + count(root / "d/e.txt", ".")
    return seen


def count(file: Path, mark: str) -> int:
    return file.read_text().count(mark)


def toolbox(root: Path) -> Toolbox:
    """The toolbox on ``root`` with a step's permission checks (no rules: all allowed)."""
    permissions = Permissions(PermissionRules(), root=root)
    return Toolbox(
        Checkout.folder(root, Sandbox(mode=SandboxMode.NONE)),
        gate=permissions.check_call,
        readable=permissions.path_readable,
    )


@pytest.mark.parametrize("tool", ["write_file", "read_file", "edit_file", "list_files", "grep"])
def test_a_folder_swapped_for_a_symlink_never_leads_a_tool_out(tmp_path: Path, tool: str) -> None:
    root, outside = arena(tmp_path)

    seen = race(tool, root, outside, toolbox)

    assert seen["escaped"] == 0, seen  # no write or edit landed outside
    assert seen["leaked"] == 0, seen  # no reply held what is outside
    assert (outside / "e.txt").read_text() == "ANCHOR\n"
    assert sorted(p.name for p in outside.iterdir()) == ["e.txt", "f.txt", "outside-only.txt"]
    # The race was on: some calls met the folder, some the symlink (and were refused).
    assert seen["refused"] > 0, seen
    assert seen["answered"] > 0, seen
    if tool in ("write_file", "edit_file"):
        assert seen["inside"] > 0, seen
