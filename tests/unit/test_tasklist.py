"""TaskList / TaskStep: loading, validation messages, record-only fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merlin_flow.errors import InputError, TaskListError
from merlin_flow.tasklist import (
    StepType,
    load_tasklist,
    parse_tasklist,
)

VALID_YAML = """\
title: Fix the divide bug
steps:
  - id: fix
    step_type: Debug
    description: Make divide() raise ZeroDivisionError for a zero divisor.
    verification: the tests in test_calc.py pass
    exit_command: python -m pytest -q
  - id: test
    step_type: Test
    description: Add a test.
    depends_on: [fix]
    tier: fast
"""


def step(step_id: str, *depends_on: str, step_type: str = "Feature") -> dict[str, object]:
    return {
        "id": step_id,
        "step_type": step_type,
        "description": f"do {step_id}",
        "depends_on": list(depends_on),
    }


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- loading ---------------------------------------------------------------------------


def test_valid_yaml_loads(tmp_path: Path) -> None:
    tasklist = load_tasklist(write(tmp_path, "t.yaml", VALID_YAML))
    assert tasklist.title == "Fix the divide bug"
    assert [s.id for s in tasklist.steps] == ["fix", "test"]
    fix, test = tasklist.steps
    assert fix.step_type is StepType.DEBUG
    assert fix.exit_command == "python -m pytest -q"
    assert fix.verification == "the tests in test_calc.py pass"
    assert test.step_type is StepType.TEST
    assert test.depends_on == ["fix"]
    assert test.tier == "fast"
    assert test.exit_command is None
    # a generated id is valid in git ref names
    assert len(tasklist.id) == 12


def test_valid_json_loads(tmp_path: Path) -> None:
    data = {"id": "job-1", "title": "JSON list", "steps": [step("a"), step("b", "a")]}
    tasklist = load_tasklist(write(tmp_path, "t.json", json.dumps(data)))
    assert tasklist.id == "job-1"
    assert [s.id for s in tasklist.steps] == ["a", "b"]
    assert tasklist.steps[1].depends_on == ["a"]


def test_yaml_and_json_give_equal_lists(tmp_path: Path) -> None:
    from_yaml = load_tasklist(write(tmp_path, "t.yml", VALID_YAML))
    data = from_yaml.model_dump(mode="json")
    from_json = load_tasklist(write(tmp_path, "t.json", json.dumps(data)))
    assert from_json == from_yaml


def test_malformed_yaml_names_line_and_column(tmp_path: Path) -> None:
    text = "title: x\nsteps:\n  - id: a\n    description: [unclosed\n"
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(TaskListError) as info:
        load_tasklist(path)
    message = str(info.value)
    assert "malformed YAML" in message
    assert str(path) in message
    assert "at line 5, column 1" in message
    assert "expected ',' or ']'" in message


def test_malformed_yaml_exact_position(tmp_path: Path) -> None:
    # a tab cannot start a token: the scanner reports the exact mark
    path = write(tmp_path, "bad.yaml", "title: x\nsteps:\n\t- id: a\n")
    with pytest.raises(TaskListError, match=r"malformed YAML at line 3, column 1"):
        load_tasklist(path)


def test_malformed_yaml_mid_line_position(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", "title: x\nsteps:\n  - id: a\n   bad: 1\n")
    with pytest.raises(TaskListError, match=r"malformed YAML at line 4, column 4"):
        load_tasklist(path)


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.json", '{\n  "title": "x",\n  "steps": [,]\n}\n')
    with pytest.raises(TaskListError, match=r"malformed JSON at line 3, column 13"):
        load_tasklist(path)


def test_json_suffix_is_parsed_as_json_not_yaml(tmp_path: Path) -> None:
    # valid YAML, invalid JSON: the .json suffix decides the parser
    path = write(tmp_path, "t.json", "title: x\nsteps: []\n")
    with pytest.raises(TaskListError, match="malformed JSON"):
        load_tasklist(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(TaskListError, match="not found") as info:
        load_tasklist(path)
    assert str(path) in str(info.value)


def test_tasklist_error_is_input_error_with_exit_code_2() -> None:
    assert issubclass(TaskListError, InputError)
    assert TaskListError("x").exit_code == 2


@pytest.mark.parametrize("data", [None, [], "just a string", 3])
def test_non_mapping_is_rejected(data: object) -> None:
    with pytest.raises(TaskListError, match="must be a mapping"):
        parse_tasklist(data, "src")


# --- validation ------------------------------------------------------------------------


def test_unknown_step_type_names_the_field(tmp_path: Path) -> None:
    text = "title: x\nsteps:\n  - id: a\n    step_type: Debugg\n    description: d\n"
    with pytest.raises(TaskListError) as info:
        load_tasklist(write(tmp_path, "t.yaml", text))
    message = str(info.value)
    assert "steps[0]" in message
    assert "step_type" in message
    assert "(id 'a')" in message
    assert "Debugg" in message or "Debug" in message


def test_error_in_second_step_names_index_and_id() -> None:
    data = {"title": "x", "steps": [step("a"), {"id": "b", "step_type": "Test"}]}
    with pytest.raises(TaskListError, match=r"steps\[1\] \(id 'b'\)\.description"):
        parse_tasklist(data)


def test_unknown_field_is_rejected() -> None:
    data = {"title": "x", "steps": [{**step("a"), "colour": "red"}]}
    with pytest.raises(TaskListError, match=r"steps\[0\] \(id 'a'\)\.colour"):
        parse_tasklist(data)


@pytest.mark.parametrize("bad_id", ["", "-starts-with-dash", "has space", "a/b", "x" * 65])
def test_invalid_step_id(bad_id: str) -> None:
    with pytest.raises(TaskListError, match=r"steps\[0\].*\.id"):
        parse_tasklist({"title": "x", "steps": [step(bad_id)]})


def test_missing_title() -> None:
    with pytest.raises(TaskListError, match="title"):
        parse_tasklist({"steps": [step("a")]})


def test_duplicate_step_ids() -> None:
    data = {"title": "x", "steps": [step("a"), step("b"), step("a")]}
    with pytest.raises(TaskListError, match=r"duplicate step id 'a'"):
        parse_tasklist(data)


def test_cycle_in_depends_on() -> None:
    data = {"title": "x", "steps": [step("a", "b"), step("b", "a")]}
    with pytest.raises(TaskListError, match="cycle") as info:
        parse_tasklist(data)
    assert "a -> b -> a" in str(info.value) or "b -> a -> b" in str(info.value)


def test_self_dependency_is_a_cycle() -> None:
    with pytest.raises(TaskListError, match=r"cycle: a -> a"):
        parse_tasklist({"title": "x", "steps": [step("a", "a")]})


def test_depends_on_later_step() -> None:
    data = {"title": "x", "steps": [step("a", "b"), step("b")]}
    with pytest.raises(TaskListError, match=r"step 'a' depends_on 'b', which comes after it"):
        parse_tasklist(data)


def test_depends_on_unknown_step() -> None:
    data = {"title": "x", "steps": [step("a"), step("b", "ghost")]}
    with pytest.raises(TaskListError, match=r"step 'b' depends_on unknown step 'ghost'"):
        parse_tasklist(data)


def test_empty_steps_parse_but_are_not_submittable(tmp_path: Path) -> None:
    tasklist = load_tasklist(write(tmp_path, "t.yaml", "title: Nothing\nsteps: []\n"))
    assert tasklist.steps == []
    with pytest.raises(TaskListError, match="no steps"):
        tasklist.check_submittable()


def test_non_empty_list_is_submittable() -> None:
    parse_tasklist({"title": "x", "steps": [step("a")]}).check_submittable()


# --- lifecycle -------------------------------------------------------------------------


def test_state_fields_of_earlier_versions_are_accepted_and_ignored() -> None:
    """A TaskList once carried statuses; a job's state lives in the store now."""
    data = {
        "title": "old file",
        "status": "Completed",
        "steps": [{**step("a"), "status": "Failed", "error": "boom", "result": "x"}],
    }
    tasklist = parse_tasklist(data)
    assert tasklist.steps[0].id == "a"
    dumped = tasklist.model_dump()
    assert "status" not in dumped
    assert set(dumped["steps"][0]) & {"status", "error", "result"} == set()
    with pytest.raises(TaskListError, match="Extra inputs are not permitted"):
        parse_tasklist({"title": "t", "steps": [{**step("a"), "progress": 1}]})


def test_step_lookup() -> None:
    tasklist = parse_tasklist({"title": "x", "steps": [step("a"), step("b")]})
    assert tasklist.step("b").id == "b"
    with pytest.raises(KeyError):
        tasklist.step("c")


# --- properties ------------------------------------------------------------------------

step_ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,10}\Z", fullmatch=True).filter(
    lambda i: ".." not in i and not i.endswith((".", ".lock"))  # git ref names refuse these
)


@st.composite
def valid_step_data(draw: st.DrawFn) -> list[dict[str, object]]:
    ids = draw(st.lists(step_ids, min_size=1, max_size=8, unique=True))
    steps = []
    for index, step_id in enumerate(ids):
        deps = draw(st.lists(st.sampled_from(ids[:index]), unique=True)) if index else []
        step_type = draw(st.sampled_from(list(StepType)))
        steps.append(step(step_id, *deps, step_type=step_type.value))
    return steps


@settings(max_examples=60, deadline=None)
@given(steps=valid_step_data())
def test_earlier_dependencies_always_validate(steps: list[dict[str, object]]) -> None:
    tasklist = parse_tasklist({"title": "prop", "steps": steps})
    tasklist.check_submittable()
    assert [s.id for s in tasklist.steps] == [s["id"] for s in steps]
    assert [s.depends_on for s in tasklist.steps] == [s["depends_on"] for s in steps]


@settings(max_examples=40, deadline=None)
@given(steps=valid_step_data().filter(lambda s: len(s) >= 2))
def test_reversing_a_dependent_list_is_rejected(steps: list[dict[str, object]]) -> None:
    # make the last step depend on the first, then reverse: the dependency now points later
    steps[-1]["depends_on"] = sorted({*steps[-1]["depends_on"], steps[0]["id"]})  # type: ignore[misc]
    parse_tasklist({"title": "prop", "steps": steps})
    with pytest.raises(TaskListError, match="comes after it"):
        parse_tasklist({"title": "prop", "steps": list(reversed(steps))})
