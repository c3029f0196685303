"""The agent's tools as the model is told of them: names, arguments, descriptions.

Each description teaches: what the tool is for, when to use another one instead, and a
short example call. They are sent with every request, so they stay short: the whole set
is about 4,000 characters of JSON (1,000 tokens). The tools are in ``merlin_flow.tools.toolbox``.
"""

from __future__ import annotations

from typing import Any

FINISH = "finish"
"""The tool that ends an attempt with a summary; offered whatever ``only`` says."""


def _schema(name: str, description: str, **params: tuple[str, str]) -> dict[str, Any]:
    required = [key for key, (_type, _doc) in params.items() if not _doc.startswith("optional")]
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    key: {"type": type_, "description": doc} for key, (type_, doc) in params.items()
                },
                "required": required,
            },
        },
    }


PATH = ("string", "path relative to the repository root")
TOOL_SCHEMAS: list[dict[str, Any]] = [
    _schema(
        "read_file",
        "Read a text file. Read before you edit, and copy `old` for edit_file from here. "
        "For part of a long file give start_line/end_line: numbered lines and the line "
        "count come back (the numbers are not part of the file). A file unchanged since "
        "a recent read is answered 'unchanged since turn N'. Folders: list_files; "
        'searching: grep. Example: {"path": "src/app.py", "start_line": 40, "end_line": 80}',
        path=PATH,
        start_line=("integer", "optional first line, from 1"),
        end_line=("integer", "optional last line, included"),
    ),
    _schema(
        "write_file",
        "Create a file, or replace a whole file; missing folders are made. To change "
        'part of an existing file use edit_file. Example: {"path": "tests/test_app.py", '
        '"content": "def test_answer():\\n    assert answer() == 42\\n"}',
        path=PATH,
        content=("string", "the whole new content"),
    ),
    _schema(
        "edit_file",
        "Replace one passage of a file. `old` must match the file exactly, indentation "
        "included, and occur once: add neighbouring lines to make it unique. If it does "
        "not match, the closest lines come back: retry with them. Example: "
        '{"path": "app.py", "old": "    return 41\\n", "new": "    return 42\\n"}',
        path=PATH,
        old=("string", "exact text to find; must occur exactly once"),
        new=("string", "replacement text"),
    ),
    _schema(
        "list_files",
        "List files below a folder, relative to the root (.git left out). Use it to find "
        'your way; to find text, use grep. Example: {"path": "src", "pattern": "*.py"}',
        path=("string", "optional folder (default: the root)"),
        pattern=("string", "optional glob on the relative path or the name"),
    ),
    _schema(
        "grep",
        "Search files for a Python regular expression; answers `path:line: text`. Use it "
        "to find definitions and uses before reading. "
        'Example: {"pattern": "def answer\\\\(", "path": "src"}',
        pattern=("string", "Python regular expression"),
        path=("string", "optional file or folder (default: the root)"),
    ),
    _schema(
        "run_command",
        "Run a shell command in the repository root, sandboxed (project environment, no "
        "network, no git); answers the exit code and the output's tail. For tests, "
        "linters, scripts; not for reading or editing files. "
        'Example: {"command": "python -m pytest -q tests/test_app.py"}',
        command=("string", "the shell command"),
        timeout=("number", "optional seconds before it is killed"),
    ),
    _schema(
        FINISH,
        "End your work on the step, with a short summary of what you changed. Call it "
        "last, once the step is done: calls after it are not run, and the exit command "
        'then checks your work. Example: {"summary": "answer() returns 42; added a test"}',
        summary=("string", "what you changed, in a sentence or two"),
    ),
]
