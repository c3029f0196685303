"""A planner's answer: its steps in every shape models give, the checks, the TaskList.

``parse_plan`` tries these readers in order and takes the first that finds a plan:

1. JSON anywhere in the text, fenced or bare, prose around it ignored: an object with
   ``steps`` or ``plan`` (or ``tasks``), a list of steps, or one step, with the keys
   ``id``, ``step_type``/``type``, ``title``, ``description``, ``instruction``/``do``,
   ``depends_on``/``dependencies``, ``estimated_tokens``/``tokens``, ``files``. Trailing
   commas are accepted on a second try (valid JSON is never changed).
2. a ``---PLAN-START---`` / ``---PLAN-END---`` block of ``STEP N: title`` + ``DO: ...``;
3. ``STEP N: title`` + ``INSTRUCTION: ...`` lines;
4. a numbered list: ``1. title - instruction`` or ``1. title: instruction`` (``1)`` too);
5. ``Step N) title - instruction`` lines.

Missing ids are ``s1``, ``s2``...; in the text formats each step depends on the one
before, and an instruction goes on over the following lines (after the last step, up to
a blank line: closing prose is not kept). Markdown bold and CRLF are ignored. A missing
step type is guessed (``infer_step_type``); a given one that is none of the five is kept
in ``unknown_type`` for ``check_plan`` to report.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from merlin_flow.errors import PlanUnreadable
from merlin_flow.tasklist import STEP_ID_PATTERN, StepType, TaskList, parse_tasklist

TITLE_CHARS = 80  # the longest title made from a request or an instruction
TYPE_WORDS: tuple[tuple[StepType, re.Pattern[str]], ...] = (
    (StepType.TEST, re.compile(r"\b(tests?|testing)\b", re.I)),
    (StepType.DEBUG, re.compile(r"\b(fix(es|ed|ing)?|bugs?|debug\w*|errors?)\b", re.I)),
    (StepType.REFACTOR, re.compile(r"\b(refactor\w*|renam\w*|mov(e|es|ed|ing)|clean\w*)\b", re.I)),
    (StepType.VERIFY, re.compile(r"\b(verif\w*|check(s|ed|ing)?)\b", re.I)),
)
TYPES = {step_type.value.lower(): step_type for step_type in StepType}
TRAILING_COMMA = re.compile(r",(\s*[}\]])")
BRACKET = re.compile(r"[\[{]")
STEP_KEYS = {"title", "description", "instruction", "instructions", "do", "details"}
ONE_STEP_KEYS = {"title", "instruction", "instructions", "do", "step_type"}
BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
MARKED = re.compile(r"---\s*PLAN-START\s*---(.*?)(?:---\s*PLAN-END\s*---|$)", re.S | re.I)
HEAD = r"^(?P<indent>[ \t]*)[>#]*[ \t]*{}[ \t]*(?P<line>.*)$"
STEP_HEAD = re.compile(HEAD.format(r"STEP[ \t]+\d+[ \t]*[:.)-]"), re.I | re.M)
NUMBERED = re.compile(HEAD.format(r"\d+[.)](?=[ \t])"), re.M)
STEP_PAREN = re.compile(HEAD.format(r"Step[ \t]+\d+[ \t]*\)"), re.I | re.M)
LABEL = re.compile(r"^[ \t]*(?:DO|INSTRUCTIONS?)[ \t]*:[ \t]*", re.I | re.M)
SEPARATOR = re.compile(r"\s+[-\u2013\u2014]\s+|:\s+")
CLOSING_PROSE = re.compile(r"\n[ \t]*\n(?=\S)")
TYPE_RULE = "use Debug, Feature, Refactor, Verify or Test"
ID_RULE = "use 1 to 64 letters, digits, '_', '.' or '-', the first a letter or digit"


@dataclass(frozen=True)
class PlannedStep:
    """One step of a plan, as the planner gave it."""

    id: str
    step_type: StepType
    title: str
    instruction: str
    depends_on: tuple[str, ...] = ()
    estimated_tokens: int | None = None
    files: tuple[str, ...] = ()  # the files it expects to touch
    unknown_type: str | None = None
    """The planner's step type when it is none of the five; ``step_type`` is then a guess."""


def infer_step_type(title: str, instruction: str = "") -> StepType:
    """The type the words suggest; the title decides, else the instruction, else Feature.

    The first rule that matches wins: test(s) is Test; fix, bug, debug, error is Debug;
    refactor, rename, move, clean is Refactor; verify, check is Verify.
    """
    found = (
        kind for text in (title, instruction) for kind, words in TYPE_WORDS if words.search(text)
    )
    return next(found, StepType.FEATURE)


def parse_plan(text: str) -> list[PlannedStep]:
    """The steps in a planner's answer; PlanUnreadable when it holds no plan."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if (steps := _from_json(text)) is not None:
        return steps
    plain = BOLD.sub(r"\1", text)
    block = MARKED.search(plain)
    for steps in (
        _items(block.group(1), STEP_HEAD, labelled=True, bounded=True) if block else [],
        _items(plain, STEP_HEAD, labelled=True, bounded=False),
        _items(plain, NUMBERED, labelled=False, bounded=False),
        _items(plain, STEP_PAREN, labelled=False, bounded=False),
    ):
        if steps:
            return steps
    shown = " ".join(text.split())[:120]
    raise PlanUnreadable(f"the planner's answer holds no plan merlin can read: {shown!r}")


def _from_json(text: str) -> list[PlannedStep] | None:
    """Steps from the first JSON value that holds a plan; None when none does."""
    decoder, read = json.JSONDecoder(), 0
    for opening in BRACKET.finditer(text):
        if (start := opening.start()) < read:  # inside a value already read
            continue
        try:
            value, end = decoder.raw_decode(text[start:])
        except json.JSONDecodeError as exc:
            try:
                value, end = decoder.raw_decode(TRAILING_COMMA.sub(r"\1", text[start:]))
            except json.JSONDecodeError:
                if exc.pos > 1:  # JSON cut short or with comments: not taken, even in part
                    return None
                continue  # a bracket in prose
        read = start + end
        if (items := _step_items(value, depth=0)) is not None:
            items = [item if isinstance(item, dict) else {"title": item} for item in items]
            return [_json_step(item, n) for n, item in enumerate(items, 1)]
    return None


def _step_items(value: Any, depth: int) -> list[Any] | None:
    """The steps in a decoded value (a plan may be empty), or None when it holds no plan."""
    if isinstance(value, list):
        steps = all(isinstance(item, dict) and STEP_KEYS & item.keys() for item in value)
        return value if value and steps else None
    if not isinstance(value, dict) or depth > 2:
        return None
    for key in ("steps", "plan", "tasks"):
        if isinstance(value.get(key), list):
            return [item for item in value[key] if isinstance(item, dict | str)]
    if ONE_STEP_KEYS & value.keys():
        return [value]
    inner = (_step_items(part, depth + 1) for part in value.values())  # {"result": {...}}
    return next((items for items in inner if items is not None), None)


def _json_step(item: dict[str, Any], number: int) -> PlannedStep:
    get = item.get
    title = _text(get("title") or get("description"))
    instruction = _text(get("instruction") or get("instructions") or get("do") or get("details"))
    instruction = instruction or _text(get("description")) or title
    title = title or _headline(instruction)
    given = _text(get("step_type") or get("type"))
    tokens: Any = get("estimated_tokens") or get("tokens")
    return PlannedStep(
        id=_text(get("id")) or f"s{number}",
        step_type=TYPES.get(given.lower()) or infer_step_type(title, instruction),
        title=title,
        instruction=instruction,
        depends_on=_strings(get("depends_on") or get("dependencies")),
        estimated_tokens=int(tokens) if type(tokens) in (int, float) else None,
        files=_strings(get("files")),
        unknown_type=given if given and given.lower() not in TYPES else None,
    )


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(_text(part) for part in value).strip()
    return "" if value is None or isinstance(value, dict) else str(value).strip()


def _strings(value: Any) -> tuple[str, ...]:
    parts = value.split(",") if isinstance(value, str) else value
    parts = parts if isinstance(parts, list) else [parts]
    return tuple(text for part in parts if (text := _text(part)))


def _items(text: str, head: re.Pattern[str], labelled: bool, bounded: bool) -> list[PlannedStep]:
    """Steps in sequence from ``head``'s items; ``bounded``: no closing prose to cut."""
    heads = list(head.finditer(text))
    heads = [match for match in heads if match["indent"] == heads[0]["indent"]]
    labels, pairs = 0, list[tuple[str, str]]()
    for index, match in enumerate(heads):
        end = heads[index + 1].start() if index + 1 < len(heads) else len(text)
        body, line = text[match.end() : end], match["line"].strip()
        if index + 1 == len(heads) and not bounded:
            body = CLOSING_PROSE.split(body, maxsplit=1)[0]
        if labelled:
            label = LABEL.search(body)
            labels += label is not None
            title, body = line, body[label.end() :] if label else body
        else:
            title, *rest = SEPARATOR.split(line, maxsplit=1)
            body = "\n".join([*rest, body])
        instruction = "\n".join(filter(None, (part.strip() for part in body.splitlines())))
        pairs.append((title.strip() or _headline(instruction), instruction or title.strip()))
    return [
        PlannedStep(f"s{n}", infer_step_type(t, i), t, i, (f"s{n - 1}",) if n > 1 else ())
        for n, (t, i) in enumerate(pairs, 1)
        if labels or not labelled  # STEP heads need a DO: or INSTRUCTION: label somewhere
    ]


def _headline(text: str) -> str:
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def check_plan(steps: Sequence[PlannedStep], max_steps: int) -> list[str]:
    """What is wrong with a plan, one sentence each; empty when ``to_tasklist`` can take it."""
    if not steps:
        return ["The plan has no steps."]
    problems = [f"The plan has {len(steps)} steps; at most {max_steps} are allowed."]
    problems = problems if len(steps) > max_steps else []
    ids, earlier = [step.id for step in steps], set[str]()
    for step in steps:
        say = [f"Step {step.id!r}"]
        if not re.fullmatch(STEP_ID_PATTERN, step.id):
            say.append(f"has an invalid id: {ID_RULE}.")
        if step.unknown_type is not None:
            say.append(f"has the unknown step_type {step.unknown_type!r}: {TYPE_RULE}.")
        if not step.instruction.strip():
            say.append("has an empty instruction.")
        for dep in step.depends_on:
            if dep not in ids:
                say.append(f"depends on {dep!r}, which is not a step of the plan.")
            elif dep not in earlier and dep != step.id:
                say.append(f"depends on {dep!r}, which comes later: list {dep!r} before it.")
        problems += [f"{say[0]} {sentence}" for sentence in say[1:]]
        earlier.add(step.id)
    for repeated in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(f"The step id {repeated!r} is used {ids.count(repeated)} times.")
    if cycle := _cycle({step.id: step.depends_on for step in steps}):
        problems.append(f"The steps {' -> '.join(cycle)} depend on each other in a cycle.")
    return problems


def _cycle(graph: dict[str, tuple[str, ...]]) -> list[str]:
    """One dependency cycle as a path (its first id repeated at the end), or []."""
    left = dict(graph)
    while done := {node for node, deps in left.items() if not set(deps) & left.keys()}:
        left = {node: deps for node, deps in left.items() if node not in done}
    path = list(left)[:1]  # each step left depends on another step left: walk to a repeat
    while path and path[-1] not in path[:-1]:
        path.append(next(dep for dep in left[path[-1]] if dep in left))
    return path[path.index(path[-1]) :] if path else []


def repair_prompt(problems: list[str]) -> str:
    """The one request to repair a plan: its problems quoted, and the shape wanted."""
    listed = "\n".join(f"- {problem}" for problem in problems)
    return (
        f"Your plan cannot be used:\n{listed}\n\n"
        "Answer again with the whole plan, as JSON only, in this shape:\n"
        '{"steps": [{"id": "short-id", "step_type": "Debug|Feature|Refactor|Verify|Test", '
        '"title": "a short title", "instruction": "what to do, precisely", '
        '"depends_on": ["ids of earlier steps"], "estimated_tokens": 20000, '
        '"files": ["paths the step will change"]}]}'
    )


def fallback_plan(request: str) -> list[PlannedStep]:
    """One step carrying the whole request: the plan when planning failed."""
    text = request.strip()
    return [PlannedStep("request", infer_step_type(_headline(text), text), _headline(text), text)]


def to_tasklist(request: str, steps: Sequence[PlannedStep]) -> TaskList:
    """The plan as a TaskList, validated like a file: TaskListError when it is invalid.

    Title: the request's first line. Description: title, blank line, instruction (the
    instruction alone if it starts with the title). A plan ``check_plan`` passes makes one.
    """
    tasklist = parse_tasklist(
        {"title": _headline(request), "steps": [_task_step(step) for step in steps]},
        source="the plan",
    )
    tasklist.check_submittable()
    return tasklist


def _task_step(step: PlannedStep) -> dict[str, Any]:
    same = step.instruction.startswith(step.title)
    return {
        "id": step.id,
        "step_type": step.unknown_type or step.step_type.value,
        "description": step.instruction if same else f"{step.title}\n\n{step.instruction}",
        "depends_on": list(step.depends_on),
    }
