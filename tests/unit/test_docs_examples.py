"""How ``tests.e2e.doc_examples`` reads a page: console blocks, file names, abridged output."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.doc_examples import FILE_HEADER, console_commands, file_path, shows

REAL = """\
agents for: a step
┃ name        ┃ scope   ┃ tools                  ┃ score ┃
│ test-writer │ builtin │ read_file, write_file  │ 0.63  │
│ reviewer    │ project │ read_file              │ 0.00  │
hidden by a higher scope: builtin reviewer
"""


def test_output_not_abridged_must_be_all_of_it() -> None:
    assert shows(REAL, REAL)
    assert not shows(REAL, REAL.replace("0.63", "0.64"))
    assert not shows(REAL, REAL.split("hidden")[0])  # a line left out, unsaid


def test_abridged_output_is_its_lines_in_order_with_any_text_for_the_ellipsis() -> None:
    shown = (
        "agents for: a step\n…\n│ test-writer │ builtin │ … │ 0.63 │\n│ reviewer │ … │ 0.00  │\n"
    )
    assert shows(REAL, shown)
    assert not shows(REAL, shown.replace("0.63", "0.64"))
    out_of_order = "│ reviewer │ … │\n│ test-writer │ … │\n"
    assert not shows(REAL, out_of_order)
    assert not shows(REAL, "│ test-writer │ … │\n│ test-writer │ … │\n")  # a line counts once


def test_a_console_block_is_commands_each_with_its_output() -> None:
    body = "$ merlin agents init\ncreated a\ncreated b\n$ EDITOR=nano merlin agents edit x\n"
    assert console_commands(body) == [
        ("merlin agents init\n", "created a\ncreated b\n"),
        ("EDITOR=nano merlin agents edit x\n", ""),
    ]


def test_files_are_named_by_their_first_comment(tmp_path: Path) -> None:
    env = {"MERLIN_HOME": str(tmp_path / "home")}
    named = {
        "# merlin.toml\n[agents]\n": tmp_path / "merlin.toml",
        "---\n# .merlin/agents/reviewer.md\nname: reviewer\n": (
            tmp_path / ".merlin/agents/reviewer.md"
        ),
        "<!-- .merlin/agents/shared/list.md -->\n- one\n": tmp_path
        / ".merlin/agents/shared/list.md",
        "# $MERLIN_HOME/merlin.toml\n": tmp_path / "home/merlin.toml",
    }
    for body, path in named.items():
        header = FILE_HEADER.match(body)
        assert header is not None, body
        assert file_path(header, tmp_path, env) == path
    for body in ("## Migration checklist\n", "---\nname: reviewer\n", "# A heading\n"):
        assert FILE_HEADER.match(body) is None, body
