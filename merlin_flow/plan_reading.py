"""Reading a planner's answer: every shape models really answer in, then the checks.

``parse_plan`` tries, in order, and takes the first that gives steps:

1. a JSON object or array anywhere in the text (in a fenced block or bare, prose
   around it ignored): ``{"steps": [...]}``, ``{"plan": [...]}``, a list of steps, or one
   step. Keys: ``id``, ``step_type`` (or ``type``), ``title`` (or ``description``),
   ``instruction`` (or ``do``, ``details``), ``depends_on`` (or ``dependencies``),
   ``estimated_tokens`` (or ``tokens``), ``files``;
2. a ``---PLAN-START---`` / ``---PLAN-END---`` block of ``STEP N: title`` + ``DO: ...``;
3. ``STEP N: title`` + ``INSTRUCTION: ...`` lines;
4. a numbered list, ``1. title - instruction`` or ``1. title: instruction`` (``1)`` too);
5. ``Step N) title`` lines.

Markdown bold (``**STEP 1:**``) and CRLF are ignored; an instruction may go on over the
following lines. In the text formats each step depends on the one before, ids are
``s1``, ``s2``..., and the type comes from the words (``requests.step_type_for``); in
JSON a missing id or type is filled the same way, but a type that is given must be one of
the five. ``check_plan`` then lists what is wrong, one sentence each.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from merlin_flow.errors import PlanUnreadable
from merlin_flow.requests import step_type_for
from merlin_flow.tasklist import StepType, TaskList, parse_tasklist

STEP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
TYPES = {step_type.value.lower(): step_type for step_type in StepType}


@dataclass(frozen=True)
class PlannedStep:
    """One step of a plan, as the planner gave it."""

    id: str
    step_type: StepType | str
    """A StepType, or the unknown type the planner wrote (``check_plan`` reports it)."""
    title: str
    instruction: str
    depends_on: tuple[str, ...] = ()
    estimated_tokens: int | None = None
    files: tuple[str, ...] = ()


def parse_plan(text: str) -> list[PlannedStep]:
    """The steps in a planner's answer; PlanUnreadable when it has none."""
    clean = text.replace("\r\n", "\n").replace("**", "")
    for reader in (_from_json, _from_markers, _from_step_lines, _from_numbered, _from_step_paren):
        steps = reader(clean)
        if steps:
            return steps
    shown = " ".join(text.split())[:120]
    raise PlanUnreadable(f"the planner's answer holds no plan merlin can read: {shown!r}")


def _from_json(text: str) -> list[PlannedStep]:
    decoder = json.JSONDecoder()
    for start, char in enumerate(text):
        if char not in "[{":
            continue
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        items = _step_items(value)
        if items:
            return [_json_step(item, n) for n, item in enumerate(items, 1)]
    return []


def _step_items(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        for key in ("steps", "plan", "tasks"):
            if isinstance(value.get(key), list):
                value = value[key]
                break
        else:
            value = [value] if ("instruction" in value or "title" in value) else []
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, dict)]


def _json_step(item: dict[str, Any], number: int) -> PlannedStep:
    def first(*keys: str) -> Any:
        return next((item[k] for k in keys if item.get(k) not in (None, "")), None)

    title = str(first("title", "description", "name") or "").strip()
    instruction = str(first("instruction", "do", "details", "description") or title).strip()
    given = first("step_type", "type")
    step_type = TYPES.get(str(given).lower(), str(given)) if given else None
    tokens = first("estimated_tokens", "tokens")
    return PlannedStep(
        id=str(first("id") or f"s{number}"),
        step_type=step_type or step_type_for(f"{title} {instruction}"),
        title=title or (instruction.splitlines() or [""])[0][:80],
        instruction=instruction,
        depends_on=tuple(str(d) for d in (first("depends_on", "dependencies") or [])),
        estimated_tokens=int(tokens) if isinstance(tokens, int | float) else None,
        files=tuple(str(f) for f in (first("files") or [])),
    )


MARKED = re.compile(r"---PLAN-START---(.*?)(?:---PLAN-END---|$)", re.S)
STEP_HEAD = re.compile(r"^\s*STEP\s+\d+\s*[:.)-]\s*(?P<title>.+)$", re.I | re.M)


def _from_markers(text: str) -> list[PlannedStep]:
    block = MARKED.search(text)
    return _headed(block.group(1), "DO") if block else []


def _from_step_lines(text: str) -> list[PlannedStep]:
    return _headed(text, "INSTRUCTION")


def _headed(text: str, label: str) -> list[PlannedStep]:
    """Steps from ``STEP N: title`` heads, each followed by ``<label>: instruction``."""
    heads = list(STEP_HEAD.finditer(text))
    pairs = []
    for index, head in enumerate(heads):
        end = heads[index + 1].start() if index + 1 < len(heads) else len(text)
        body = text[head.end() : end]
        found = re.search(rf"^\s*{label}\s*:\s*(.*)", body, re.I | re.M | re.S)
        if found is None:
            continue
        pairs.append((head.group("title").strip(), " ".join(found.group(1).split())))
    return _sequence(pairs)


NUMBERED = re.compile(r"^\s*(\d+)[.)]\s+(?P<line>\S.*)$", re.M)
STEP_PAREN = re.compile(r"^\s*Step\s+(\d+)\)\s*(?P<line>\S.*)$", re.I | re.M)


def _from_numbered(text: str) -> list[PlannedStep]:
    return _listed(text, NUMBERED)


def _from_step_paren(text: str) -> list[PlannedStep]:
    return _listed(text, STEP_PAREN)


def _listed(text: str, item: re.Pattern[str]) -> list[PlannedStep]:
    """Steps from list items: ``title - instruction`` or ``title: instruction``."""
    matches = list(item.finditer(text))
    pairs = []
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        more = text[match.end() : end].strip()
        line = " ".join(f"{match.group('line')} {more}".split())
        parts = re.split(r"\s+[-\u2013]\s+|:\s+", line, maxsplit=1)
        title, instruction = parts[0], parts[-1]
        pairs.append((title.strip(), instruction.strip()))
    return _sequence(pairs)


def _sequence(pairs: list[tuple[str, str]]) -> list[PlannedStep]:
    return [
        PlannedStep(
            id=f"s{n}",
            step_type=step_type_for(f"{title} {instruction}"),
            title=title,
            instruction=instruction,
            depends_on=(f"s{n - 1}",) if n > 1 else (),
        )
        for n, (title, instruction) in enumerate(pairs, 1)
    ]


def check_plan(steps: list[PlannedStep], max_steps: int) -> list[str]:
    """What is wrong with a plan, one sentence each; empty when it can run."""
    if not steps:
        return ["the plan has no steps"]
    problems = []
    if len(steps) > max_steps:
        problems.append(f"the plan has {len(steps)} steps; at most {max_steps} are allowed")
    ids = [step.id for step in steps]
    for step in steps:
        if not STEP_ID.match(step.id):
            problems.append(f"step id {step.id!r} must be letters, digits, '_', '.' or '-'")
        if not isinstance(step.step_type, StepType):
            known = ", ".join(t.value for t in StepType)
            problems.append(f"step {step.id}: unknown step_type {step.step_type!r} ({known})")
        if not step.instruction.strip():
            problems.append(f"step {step.id} has no instruction")
        for dependency in step.depends_on:
            if dependency not in ids:
                problems.append(f"step {step.id} depends on {dependency!r}, which is no step")
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        problems.append(f"step ids are repeated: {', '.join(repeated)}")
    cycle = _cycle({s.id: [d for d in s.depends_on if d in ids] for s in steps})
    if cycle:
        problems.append(f"the steps depend on each other in a cycle: {' -> '.join(cycle)}")
    return problems


def _cycle(graph: dict[str, list[str]]) -> list[str]:
    """A dependency cycle as a path (first id repeated at the end), or []."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in graph:
        if node not in state and (found := visit(node)):
            return found
    return []


def repair_prompt(problems: list[str]) -> str:
    """The one request to repair a plan: its problems, and the shape wanted."""
    listed = "\n".join(f"- {problem}" for problem in problems)
    return (
        f"Your plan cannot be used:\n{listed}\nAnswer again with JSON only: "
        '{"steps": [{"id", "step_type" (Debug, Feature, Refactor, Verify or Test), "title", '
        '"instruction", "depends_on" (ids of earlier steps), "estimated_tokens", "files"}]}.'
    )


def fallback_plan(request: str) -> list[PlannedStep]:
    """One step carrying the whole request (the plan when planning failed)."""
    text = request.strip()
    return [
        PlannedStep(
            id="request",
            step_type=step_type_for(text),
            title=text.splitlines()[0][:80],
            instruction=text,
        )
    ]


def to_tasklist(request: str, steps: list[PlannedStep]) -> TaskList:
    """The plan as a TaskList (title from the request), validated like a TaskList file."""
    title = " ".join(request.split())
    return parse_tasklist(
        {
            "title": title if len(title) <= 80 else title[:79] + "…",
            "steps": [
                {
                    "id": step.id,
                    "step_type": str(step.step_type),
                    "description": step.instruction
                    if step.instruction.startswith(step.title)
                    else f"{step.title}\n\n{step.instruction}",
                    "depends_on": list(step.depends_on),
                }
                for step in steps
            ],
        }
    )
