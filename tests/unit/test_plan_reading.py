"""Planner answers in every shape models give, the checks, the repair and the fallback."""

from __future__ import annotations

import pytest

from merlin_flow.errors import PlanUnreadable
from merlin_flow.plan_reading import (
    PlannedStep,
    check_plan,
    fallback_plan,
    parse_plan,
    repair_prompt,
    to_tasklist,
)
from merlin_flow.tasklist import StepType

D, F, R, T = StepType.DEBUG, StepType.FEATURE, StepType.REFACTOR, StepType.TEST
JSON_STEPS = (
    '{"steps": [{"id": "fix", "step_type": "Debug", "title": "Fix divide", "instruction": '
    '"Raise ZeroDivisionError", "depends_on": [], "estimated_tokens": 12000, "files": '
    '["calc.py"]}, {"id": "docs", "type": "refactor", "title": "Docstring", "do": "Say it '
    'raises", "dependencies": ["fix"]}]}'
)
TWO = [("fix", D, "Fix divide", ()), ("docs", R, "Docstring", ("fix",))]
SEQ3 = [("s1", F, "Add a Point class", ()), ("s2", F, "Add distance()", ("s1",))]
SEQ3 += [("s3", T, "Add tests", ("s2",))]

ANSWERS: list[tuple[str, str, list[tuple[str, StepType, str, tuple[str, ...]]]]] = [
    ("json object", JSON_STEPS, TWO),
    (
        "json in a fence with prose",
        f"Here is the plan:\n```json\n{JSON_STEPS}\n```\nGood luck!",
        TWO,
    ),
    ("json under 'plan'", JSON_STEPS.replace('"steps"', '"plan"'), TWO),
    (
        "json array, no ids or types",
        '[{"description": "Fix the crash in parse()", "instruction": "Guard None"}, '
        '{"description": "Add tests for parse", "instruction": "Cover None"}]',
        [("s1", D, "Fix the crash in parse()", ()), ("s2", T, "Add tests for parse", ())],
    ),
    (
        "one step object",
        '{"title": "Rename get_usr", "instruction": "Rename it to get_user everywhere"}',
        [("s1", R, "Rename get_usr", ())],
    ),
    (
        "a brace in prose before the JSON",
        'Use {braces} carefully. [{"title": "Add X", "instruction": "Do X"}]',
        [("s1", F, "Add X", ())],
    ),
    (
        "plan markers",
        "Sure.\n---PLAN-START---\nSTEP 1: Add a Point class\nDO: In geo.py\nSTEP 2: Add "
        "distance()\nDO: Euclidean\nSTEP 3: Add tests\nDO: For both\n---PLAN-END---\nDone.",
        SEQ3,
    ),
    (
        "plan markers, bold and CRLF",
        "---PLAN-START---\r\n**STEP 1:** Add a Point class\r\nDO: In geo.py,\r\nwith x and y"
        "\r\n**STEP 2:** Add distance()\r\nDO: Euclidean\r\n**STEP 3:** Add tests\r\nDO: all"
        "\r\n---PLAN-END---",
        SEQ3,
    ),
    (
        "plan markers without an end",
        "---PLAN-START---\nSTEP 1: Add a Point class\nDO: x\nSTEP 2: Add distance()\nDO: y"
        "\nSTEP 3: Add tests\nDO: z",
        SEQ3,
    ),
    (
        "STEP and INSTRUCTION lines",
        "STEP 1: Add a Point class\nINSTRUCTION: x\n\nSTEP 2: Add distance()\nINSTRUCTION: y"
        "\nSTEP 3: Add tests\nINSTRUCTION: z",
        SEQ3,
    ),
    (
        "numbered, dash",
        "1. Add a Point class - in geo.py\n2. Add distance() - Euclidean\n3. Add tests - all",
        SEQ3,
    ),
    (
        "numbered, colon",
        "The plan:\n1. Add a Point class: in geo.py\n2. Add distance(): Euclidean\n3. Add "
        "tests: all",
        SEQ3,
    ),
    (
        "numbered with parens and a continued line",
        "1) Add a Point class - in geo.py,\n   with x and y\n2) Add distance() - x\n3) Add "
        "tests - y",
        SEQ3,
    ),
    (
        "Step N) lines",
        "Step 1) Add a Point class - a\nStep 2) Add distance() - b\nStep 3) Add tests - c",
        SEQ3,
    ),
]


@pytest.mark.parametrize(("shape", "answer", "expected"), ANSWERS, ids=[a[0] for a in ANSWERS])
def test_every_shape_of_answer_is_read(
    shape: str, answer: str, expected: list[tuple[str, StepType, str, tuple[str, ...]]]
) -> None:
    steps = parse_plan(answer)
    assert [(s.id, s.step_type, s.title, s.depends_on) for s in steps] == expected, shape
    assert check_plan(steps, max_steps=8) == []


def test_json_keeps_instructions_estimates_and_files() -> None:
    fix, docs = parse_plan(JSON_STEPS)
    assert (fix.instruction, fix.estimated_tokens, fix.files) == (
        "Raise ZeroDivisionError",
        12000,
        ("calc.py",),
    )
    assert (docs.instruction, docs.estimated_tokens) == ("Say it raises", None)
    multi = parse_plan("1. Add a Point class - in geo.py,\n   with x and y\n2. Add tests - y")
    assert multi[0].instruction == "in geo.py, with x and y"


@pytest.mark.parametrize(
    "answer",
    ["I cannot help with that.", "", '```json\n{"note": "no steps"}\n```', "[1, 2, 3]"],
)
def test_an_answer_without_a_plan_is_unreadable(answer: str) -> None:
    with pytest.raises(PlanUnreadable, match="holds no plan merlin can read"):
        parse_plan(answer)


def step(id_: str, *deps: str, step_type: StepType | str = F) -> PlannedStep:
    return PlannedStep(id_, step_type, f"title {id_}", f"do {id_}", tuple(deps))


@pytest.mark.parametrize(
    ("steps", "problem"),
    [
        ([], "the plan has no steps"),
        ([step("a", step_type="Chore")], "step a: unknown step_type 'Chore'"),
        ([step("a", "b")], "step a depends on 'b', which is no step"),
        (
            [step("a", "c"), step("b", "a"), step("c", "b")],
            "the steps depend on each other in a cycle: a -> c -> b -> a",
        ),
        ([step("a"), step("a")], "step ids are repeated: a"),
        ([step("bad id")], "step id 'bad id' must be letters, digits"),
        ([step(f"s{n}") for n in range(9)], "the plan has 9 steps; at most 8 are allowed"),
        ([PlannedStep("a", F, "t", "  ")], "step a has no instruction"),
    ],
)
def test_each_problem_is_named(steps: list[PlannedStep], problem: str) -> None:
    problems = check_plan(steps, max_steps=8)
    assert any(p.startswith(problem) for p in problems), problems


def test_an_unknown_type_in_json_is_a_problem_not_a_guess() -> None:
    (only,) = parse_plan('[{"id": "a", "type": "Chore", "title": "x", "instruction": "y"}]')
    assert only.step_type == "Chore"
    assert check_plan([only], 8)[0].startswith("step a: unknown step_type 'Chore'")


def test_the_repair_request_quotes_the_problems_and_the_shape() -> None:
    text = repair_prompt(["step a depends on 'b', which is no step"])
    assert "- step a depends on 'b', which is no step" in text
    assert '"depends_on"' in text
    assert "Debug, Feature, Refactor, Verify or Test" in text


def test_the_fallback_is_one_step_carrying_the_whole_request() -> None:
    request = "Make the parser faster\nand fix its crash on empty input"
    (only,) = fallback_plan(request)
    assert (only.id, only.step_type, only.title) == ("request", D, "Make the parser faster")
    assert only.instruction == request


def test_a_plan_becomes_a_valid_tasklist() -> None:
    tasklist = to_tasklist("Make divide() strict, and document it", parse_plan(JSON_STEPS))
    assert tasklist.title == "Make divide() strict, and document it"
    assert [(s.id, s.step_type, s.depends_on) for s in tasklist.steps] == [
        ("fix", D, []),
        ("docs", R, ["fix"]),
    ]
    assert tasklist.steps[0].description == "Fix divide\n\nRaise ZeroDivisionError"
    assert len(to_tasklist("x" * 200, fallback_plan("x" * 200)).title) == 80
