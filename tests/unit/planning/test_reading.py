"""Planner answers in every shape models give; the checks, the repair, the fallback."""

from __future__ import annotations

import json

import pytest

from merlin_flow.errors import PlanUnreadable, StepFailure, TaskListError
from merlin_flow.planning.reading import (
    PlannedStep,
    check_plan,
    fallback_plan,
    infer_step_type,
    parse_plan,
    repair_prompt,
    to_tasklist,
)
from merlin_flow.tasklist import StepType, parse_tasklist

D, F, R, V, T = (StepType.DEBUG, StepType.FEATURE, StepType.REFACTOR, StepType.VERIFY,
                 StepType.TEST)  # fmt: skip
Row = tuple[str, StepType, str, tuple[str, ...]]

JSON_STEPS = (
    '{"steps": [{"id": "fix", "step_type": "Debug", "title": "Fix divide", "instruction": '
    '"Raise ZeroDivisionError", "depends_on": [], "estimated_tokens": 12000, "files": '
    '["calc.py"]}, {"id": "docs", "type": "refactor", "title": "Docstring", "do": "Say it '
    'raises", "dependencies": ["fix"]}]}'
)
TWO: list[Row] = [("fix", D, "Fix divide", ()), ("docs", R, "Docstring", ("fix",))]
SEQ: list[Row] = [
    ("s1", F, "Add a Point class", ()),
    ("s2", F, "Add distance()", ("s1",)),
    ("s3", T, "Add tests", ("s2",)),
]

GOOD: list[tuple[str, str, list[Row]]] = [
    ("json object", JSON_STEPS, TWO),
    ("json in a fence, prose around", f"Here is the plan:\n```json\n{JSON_STEPS}\n```\nBye", TWO),
    ("json in a bare fence", f"```\n{JSON_STEPS}\n```", TWO),
    ("json under 'plan'", JSON_STEPS.replace('"steps"', '"plan"'), TWO),
    ("json with CRLF", JSON_STEPS.replace(", ", ",\r\n  "), TWO),
    ("json nested in a wrapper", f'{{"result": {JSON_STEPS}}}', TWO),
    (
        "json with trailing commas (accepted)",
        '{"steps": [{"id": "a", "title": "Add X", "instruction": "Do X",},\n'
        ' {"id": "b", "title": "Check X", "instruction": "Run it", "depends_on": ["a",],},\n]}',
        [("a", F, "Add X", ()), ("b", V, "Check X", ("a",))],
    ),
    (
        "json array, no ids or types",
        '[{"description": "Fix the crash in parse()", "instruction": "Guard None"}, '
        '{"description": "Add tests for parse", "instruction": "Cover None"}]',
        [("s1", D, "Fix the crash in parse()", ()), ("s2", T, "Add tests for parse", ())],
    ),
    (
        "json, numbers for ids",
        '{"steps": [{"id": 1, "title": "Move utils", "instruction": "to lib/"}, {"id": 2, '
        '"title": "Update imports", "instruction": "everywhere", "depends_on": [1]}, {"id": 3, '
        '"title": "Run checks", "instruction": "all", "depends_on": [2]}]}',
        [
            ("1", R, "Move utils", ()),
            ("2", F, "Update imports", ("1",)),
            ("3", V, "Run checks", ("2",)),
        ],
    ),
    (
        "json, depends_on as a string",
        '[{"id": "a", "title": "Add X", "instruction": "x"}, {"id": "b", "title": "Add Y", '
        '"instruction": "y", "depends_on": "a"}]',
        [("a", F, "Add X", ()), ("b", F, "Add Y", ("a",))],
    ),
    (
        "json, steps as plain strings",
        '{"steps": ["Rename get_usr to get_user", "Add tests for get_user"]}',
        [("s1", R, "Rename get_usr to get_user", ()), ("s2", T, "Add tests for get_user", ())],
    ),
    (
        "one step object",
        '{"title": "Rename get_usr", "instruction": "Rename it to get_user everywhere"}',
        [("s1", R, "Rename get_usr", ())],
    ),
    (
        "a brace and a list in prose before the JSON",
        'Use {braces} and [links] carefully. [{"title": "Add X", "instruction": "Do X"}]',
        [("s1", F, "Add X", ())],
    ),
    (
        "a numbered list in prose before the JSON (JSON first)",
        f"I will:\n1. Read the code\n2. Plan the change\n\n```json\n{JSON_STEPS}\n```",
        TWO,
    ),
    (
        "plan markers",
        "Sure.\n---PLAN-START---\nSTEP 1: Add a Point class\nDO: In geo.py\nSTEP 2: Add "
        "distance()\nDO: Euclidean\nSTEP 3: Add tests\nDO: For both\n---PLAN-END---\nDone.",
        SEQ,
    ),
    (
        "plan markers, bold and CRLF",
        "---PLAN-START---\r\n**STEP 1:** Add a Point class\r\n**DO:** In geo.py,\r\nwith x and y"
        "\r\n**STEP 2:** Add distance()\r\nDO: Euclidean\r\n**STEP 3:** Add tests\r\nDO: all"
        "\r\n---PLAN-END---",
        SEQ,
    ),
    (
        "plan markers without an end",
        "---PLAN-START---\nSTEP 1: Add a Point class\nDO: x\nSTEP 2: Add distance()\nDO: y"
        "\nSTEP 3: Add tests\nDO: z",
        SEQ,
    ),
    (
        "STEP and INSTRUCTION lines, prose around",
        "My plan:\n\nSTEP 1: Add a Point class\nINSTRUCTION: x\n\nSTEP 2: Add distance()\n"
        "INSTRUCTION: y\nSTEP 3: Add tests\nINSTRUCTION: z\n\nTell me if this works.",
        SEQ,
    ),
    (
        "STEP lines holding a numbered list (STEP lines before lists)",
        "STEP 1: Add a Point class\nINSTRUCTION: In geo.py:\n1. x\n2. y\nSTEP 2: Add "
        "distance()\nINSTRUCTION: z\nSTEP 3: Add tests\nINSTRUCTION: w",
        SEQ,
    ),
    (
        "bold STEP heads under markdown headings",
        "### **STEP 1:** Add a Point class\n**INSTRUCTION:** x\n### **STEP 2:** Add distance()"
        "\n**INSTRUCTION:** y\n### **STEP 3:** Add tests\n**INSTRUCTION:** z",
        SEQ,
    ),
    (
        "numbered, dash",
        "1. Add a Point class - in geo.py\n2. Add distance() - Euclidean\n3. Add tests - all",
        SEQ,
    ),
    (
        "numbered, colon, prose around",
        "The plan:\n1. Add a Point class: in geo.py\n2. Add distance(): Euclidean\n3. Add "
        "tests: all\n\nLet me know if you want changes.",
        SEQ,
    ),
    (
        "numbered with parens and a continued line",
        "1) Add a Point class - in geo.py,\n   with x and y\n2) Add distance() - x\n3) Add "
        "tests - y",
        SEQ,
    ),
    (
        "numbered, bold titles, CRLF, blank lines between",
        "1. **Add a Point class** - in geo.py\r\n\r\n2. **Add distance()** - Euclidean\r\n\r\n"
        "3. **Add tests** - all\r\n",
        SEQ,
    ),
    (
        "numbered, indented sub-list stays in the instruction",
        "1. Add a Point class - in geo.py:\n   1. x\n   2. y\n2. Add distance() - a\n3. Add "
        "tests - b",
        SEQ,
    ),
    (
        "numbered, instruction on the next line",
        "1. Fix the login bug\n   Check the token expiry.\n2. Add a regression test\n   In "
        "test_auth.py.",
        [("s1", D, "Fix the login bug", ()), ("s2", T, "Add a regression test", ("s1",))],
    ),
    (
        "Step N) lines",
        "Step 1) Add a Point class - a\nStep 2) Add distance() - b\nStep 3) Add tests - c",
        SEQ,
    ),
    (
        "Step N) lines, bold and CRLF, closing prose",
        "Plan:\r\n**Step 1)** Add a Point class: a\r\n**Step 2)** Add distance(): b\r\n"
        "**Step 3)** Add tests: c\r\n\r\nThat is all.",
        SEQ,
    ),
]


@pytest.mark.parametrize(("shape", "answer", "expected"), GOOD, ids=[row[0] for row in GOOD])
def test_every_shape_of_answer_is_read(shape: str, answer: str, expected: list[Row]) -> None:
    steps = parse_plan(answer)
    assert [(s.id, s.step_type, s.title, s.depends_on) for s in steps] == expected, shape
    assert check_plan(steps, max_steps=8) == []
    tasklist = to_tasklist("Plan it", steps)  # a clean plan always makes a TaskList
    assert parse_tasklist(tasklist.model_dump()) == tasklist


@pytest.mark.parametrize(
    ("answer", "instructions"),
    [
        (JSON_STEPS, ["Raise ZeroDivisionError", "Say it raises"]),
        ("1) Add P - in geo.py,\n   with x\n2) Add Q - y\n\nThanks!", ["in geo.py,\nwith x", "y"]),
        ("---PLAN-START---\nSTEP 1: A\nDO: a\n\nmore a\n---PLAN-END---\nbye", ["a\nmore a"]),
        ("STEP 1: A\nINSTRUCTION: a\nSTEP 2: B\nINSTRUCTION: b\n\nHope it helps!", ["a", "b"]),
        ('[{"title": "Pass **kwargs", "instruction": ["Use **kwargs", "in run()"]}]',
         ["Use **kwargs\nin run()"]),
        ('[{"instruction": "Add a cache\\nkeyed by path"}]', ["Add a cache\nkeyed by path"]),
        ("1. Add a cache", ["Add a cache"]),
        ("1. Pass kwargs - forward **kwargs and **extra", ["forward **kwargs and **extra"]),
        ("1. Add P - in geo.py:\n   1. x\n   2. y\n2. Add Q - z", ["in geo.py:\n1. x\n2. y", "z"]),
    ],
)  # fmt: skip
def test_instructions_keep_their_lines_and_leave_closing_prose(
    answer: str, instructions: list[str]
) -> None:
    assert [step.instruction for step in parse_plan(answer)] == instructions


def test_json_keeps_estimates_and_files_and_titles_a_bare_instruction() -> None:
    fix, docs = parse_plan(JSON_STEPS)
    assert (fix.estimated_tokens, fix.files, docs.estimated_tokens, docs.files) == (
        12000,
        ("calc.py",),
        None,
        (),
    )
    (step,) = parse_plan('[{"instruction": "' + "x" * 100 + '", "tokens": 900.0, "files": "a, b"}]')
    assert (len(step.title), step.title[-1], step.estimated_tokens) == (80, "…", 900)
    assert step.files == ("a", "b")
    (step,) = parse_plan('[{"title": "Add X", "instruction": "x", "tokens": true}]')
    assert step.estimated_tokens is None


@pytest.mark.parametrize(
    ("title", "instruction", "expected"),
    [
        ("Add tests for the parser bug", "", T),
        ("Fix the crash in parse()", "", D),
        ("Debug the flaky login", "", D),
        ("Handle errors in the loader", "", D),
        ("Rename get_usr", "", R),
        ("Clean up the imports", "", R),
        ("Move helpers to utils.py", "", R),
        ("Verify the migration", "", V),
        ("Check the build", "", V),
        ("Add a Point class", "", F),
        ("Add a Point class", "Fix the bug in geo.py", D),  # the title says nothing
        ("Add a Point class", "then check it", V),
        ("Rename the module", "and fix the tests", R),  # the title decides
        ("Add a pytest fixture for the latest prefix", "", F),  # no whole word matches
    ],
)
def test_the_step_type_comes_from_the_words(
    title: str, instruction: str, expected: StepType
) -> None:
    assert infer_step_type(title, instruction) is expected


def _json(*steps: str) -> str:
    return '{"steps": [' + ", ".join(steps) + "]}"


def _step(id_: str, deps: str = "[]", extra: str = "") -> str:
    step = {"id": id_, "title": f"Add {id_}", "instruction": "x", "depends_on": json.loads(deps)}
    return json.dumps(step)[:-1] + extra + "}"


NO_PLAN = "the planner's answer holds no plan merlin can read: "
BROKEN: list[tuple[str, str, list[str] | str]] = [
    ("prose only", "I cannot help with that.", NO_PLAN + "'I cannot help with that.'"),
    ("empty answer", "", NO_PLAN + "''"),
    ("json without steps", '```json\n{"note": "no steps"}\n```', NO_PLAN),
    ("a list of numbers", "[1, 2, 3]", NO_PLAN),
    (
        "JSON cut short is not taken in part",
        '{"steps": [{"id": "a", "title": "Add X", "instruction": "x"}, {"id": "b", "tit',
        NO_PLAN,
    ),
    (
        "JSON with comments is not taken in part",
        '[\n  {"id": "a", "title": "Add X", "instruction": "x"},  // first\n'
        '  {"id": "b", "title": "Add Y", "instruction": "y"}\n]',
        NO_PLAN,
    ),
    (
        "a step inside other JSON is no plan",
        '[{"id": "a", "title": "Add X", "instruction": "x"}, 5]',
        NO_PLAN,
    ),
    ("an empty list of steps", '{"steps": []}', ["The plan has no steps."]),
    (
        "unknown step type",
        _json(_step("a", extra=', "step_type": "Chore"')),
        [
            "Step 'a' has the unknown step_type 'Chore': use Debug, Feature, Refactor, Verify or "
            "Test."
        ],
    ),
    (
        "missing dependency",
        _json(_step("a"), _step("b", '["z"]')),
        ["Step 'b' depends on 'z', which is not a step of the plan."],
    ),
    (
        "cycle",
        _json(_step("a", '["c"]'), _step("b", '["a"]'), _step("c", '["b"]')),
        [
            "Step 'a' depends on 'c', which comes later: list 'c' before it.",
            "The steps a -> c -> b -> a depend on each other in a cycle.",
        ],
    ),
    (
        "a step depending on itself",
        _json(_step("a", '["a"]')),
        ["The steps a -> a depend on each other in a cycle."],
    ),
    (
        "a dependency listed later",
        _json(_step("a", '["b"]'), _step("b")),
        ["Step 'a' depends on 'b', which comes later: list 'b' before it."],
    ),
    (
        "too many steps",
        _json(*(_step(f"s{n}") for n in range(9))),
        ["The plan has 9 steps; at most 8 are allowed."],
    ),
    ("duplicate ids", _json(_step("a"), _step("a")), ["The step id 'a' is used 2 times."]),
    (
        "invalid id",
        _json(_step("bad id")),
        [
            "Step 'bad id' has an invalid id: use 1 to 64 letters, digits, '_', '.' or '-', "
            "the first a letter or digit."
        ],
    ),
    (
        "empty instruction",
        '[{"id": "a", "title": "Add X", "instruction": "  "}, {"id": "b", "do": ""}]',
        ["Step 'b' has an empty instruction."],  # a title alone is the instruction
    ),
]


@pytest.mark.parametrize(("case", "answer", "expected"), BROKEN, ids=[row[0] for row in BROKEN])
def test_each_problem_is_named(case: str, answer: str, expected: list[str] | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(PlanUnreadable) as raised:
            parse_plan(answer)
        assert str(raised.value).startswith(expected), case
        return
    steps = parse_plan(answer)
    assert check_plan(steps, max_steps=8) == expected, case
    if case != "too many steps":  # the limit is the planner's: a TaskList has none
        with pytest.raises(TaskListError):  # to_tasklist fails loudly on the same plan
            to_tasklist("Plan it", steps)


def test_an_unknown_type_is_kept_not_guessed() -> None:
    (step,) = parse_plan('[{"id": "a", "type": "Chore", "title": "Fix x", "instruction": "y"}]')
    assert (step.unknown_type, step.step_type) == ("Chore", D)
    (step,) = parse_plan('[{"id": "a", "type": "verify", "title": "Fix x", "instruction": "y"}]')
    assert (step.unknown_type, step.step_type) == (None, V)


def test_an_unreadable_plan_is_expected_input_not_a_crash() -> None:
    assert issubclass(PlanUnreadable, StepFailure)
    assert PlanUnreadable.exit_code == 1


def test_the_repair_request_quotes_the_problems_and_the_shape() -> None:
    problems = ["Step 'b' depends on 'z', which is not a step of the plan.", "The plan has 9"]
    text = repair_prompt(problems)
    assert "- Step 'b' depends on 'z', which is not a step of the plan.\n- The plan has 9" in text
    shape = json.loads(text[text.index('{"steps"') :])
    assert set(shape["steps"][0]) == {
        "id", "step_type", "title", "instruction", "depends_on", "estimated_tokens", "files"
    }  # fmt: skip
    assert shape["steps"][0]["step_type"].split("|") == [t.value for t in StepType]


def test_the_fallback_is_one_flagged_step_carrying_the_whole_request() -> None:
    request = "  Make the parser faster\nand fix its crash on empty input  "
    (only,) = fallback_plan(request)
    assert (only.id, only.step_type, only.title, only.depends_on) == (
        "request",
        D,
        "Make the parser faster",
        (),
    )
    assert only.instruction == request.strip()
    assert to_tasklist(request, [only]).steps[0].description == request.strip()
    (long,) = fallback_plan("x" * 200)
    assert (len(long.title), len(long.instruction)) == (80, 200)


def test_a_plan_becomes_a_valid_tasklist() -> None:
    request = "Make divide() strict, and document it\n\nDetails follow."
    tasklist = to_tasklist(request, parse_plan(JSON_STEPS))
    assert tasklist.title == "Make divide() strict, and document it"
    assert [(s.id, s.step_type, s.depends_on) for s in tasklist.steps] == [
        ("fix", D, []),
        ("docs", R, ["fix"]),
    ]
    assert tasklist.steps[0].description == "Fix divide\n\nRaise ZeroDivisionError"
    assert parse_tasklist(json.loads(tasklist.model_dump_json())) == tasklist
    single = to_tasklist("Add a cache", parse_plan("1. Add a cache"))
    assert single.steps[0].description == "Add a cache"  # not "Add a cache\n\nAdd a cache"
    assert len(to_tasklist("y" * 200, fallback_plan("y" * 200)).title) == 80


@pytest.mark.parametrize(
    ("request_", "steps", "message"),
    [
        ("Plan it", [], "has no steps"),
        ("  ", fallback_plan("x"), "title"),
        ("Plan it", [PlannedStep("a", F, "t", "x", ("b",))], "unknown step 'b'"),
    ],
)
def test_an_invalid_tasklist_fails_loudly(
    request_: str, steps: list[PlannedStep], message: str
) -> None:
    with pytest.raises(TaskListError, match=message):
        to_tasklist(request_, steps)
