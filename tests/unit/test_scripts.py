"""load_script: the scripted model's script files, read and validated."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.errors import ConfigError
from merlin_flow.models.scripted import reply_for
from merlin_flow.scripts import load_script


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# --- load_script -----------------------------------------------------------------------


def test_load_script_valid(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "rules:\n"
        "  - match: divide\n"
        "    reply:\n"
        "      tool_calls:\n"
        "        - name: write_file\n"
        "          arguments: {path: calc.py, content: x}\n"
    )
    loaded = load_script(path)
    found = reply_for(loaded, [user("divide")])
    assert found is not None
    assert found.tool_calls[0].name == "write_file"
    assert json.loads(found.tool_calls[0].arguments_json()) == {"path": "calc.py", "content": "x"}


def test_load_script_reloads_after_change(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("rules: []\n")
    assert load_script(path).rules == []
    path.write_text("rules:\n  - reply: {content: hi}\n")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert len(load_script(path).rules) == 1


def test_load_script_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_script(tmp_path / "nope.yaml")
    assert str(tmp_path / "nope.yaml") in str(info.value)


def test_load_script_bad_regex(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("rules:\n  - match: '(unclosed'\n    reply: {content: x}\n")
    with pytest.raises(ConfigError, match=r"invalid scripted model file .*rules\.0\.match") as info:
        load_script(path)
    assert "invalid regular expression" in str(info.value)


def test_load_script_unknown_key(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("rules:\n  - reply: {content: x}\n    when: always\n")
    with pytest.raises(ConfigError, match=r"rules\.0\.when"):
        load_script(path)


def test_load_script_unknown_reply_key(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("rules:\n  - reply: {text: x}\n")
    with pytest.raises(ConfigError, match=r"rules\.0\.reply\.text"):
        load_script(path)


def test_load_script_malformed_yaml(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("rules: [\n")
    with pytest.raises(ConfigError, match="cannot read scripted model file"):
        load_script(path)


def test_load_script_negative_turn(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("rules:\n  - turn: -1\n    reply: {content: x}\n")
    with pytest.raises(ConfigError, match=r"rules\.0\.turn"):
        load_script(path)
