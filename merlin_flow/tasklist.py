"""The TaskList: a job's typed steps, as written by a user or a planner.

A TaskList file is YAML or JSON::

    title: Fix the divide bug
    steps:
      - id: fix
        step_type: Debug
        description: Make divide() raise ZeroDivisionError for a zero divisor.
        verification: the tests in test_calc.py pass
        exit_command: python -m pytest -q

``load_tasklist`` reads and validates one; every problem is reported with the field that
has it (``steps[1] (id 'b').step_type: ...``).
"""

from __future__ import annotations

import json
import uuid
from enum import StrEnum
from pathlib import Path
from typing import Any, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from merlin_flow.errors import TaskListError

STEP_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
TOO_DEEP = "nested too deeply to be a TaskList (lists or mappings inside each other)"
YAML_TAG_ERRORS = (AttributeError, LookupError, TypeError, ValueError)
MAX_FLOW_DEPTH = 200
"""Flow collections (``[``, ``{``) nested deeper than this are refused before PyYAML reads
them: it takes time quadratic in the depth to fail (3,000 take seconds)."""


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, raising RecursionError at once for a text nested too deeply.

    The depth is counted over every bracket, quoted or not: a text can only be refused
    too early when over 200 of them stand unclosed in its strings.
    """
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    if deepest > MAX_FLOW_DEPTH:
        raise RecursionError(f"nested {deepest} deep")
    return yaml.safe_load(text)


"""What PyYAML's constructors raise, instead of a YAMLError, for a value unfit for its
explicit tag (``!!int abc``, ``!!int`` with no value, ``!!bool x``, ``!!timestamp 20x``)."""


class OnFailure(StrEnum):
    """What a step's failure (every tier tried) does to the rest of its job."""

    STOP = "stop"
    """The job fails; steps running beside it are cancelled at their next call."""
    CONTINUE = "continue"
    """The steps that need it are skipped; the other branches go on."""


class StepType(StrEnum):
    """What kind of work a step is; it picks the default exit command."""

    DEBUG = "Debug"
    FEATURE = "Feature"
    REFACTOR = "Refactor"
    VERIFY = "Verify"
    TEST = "Test"


RECORD_ONLY_FIELDS = ("status", "error", "result")
"""Fields of a step that TaskLists from earlier versions carried (and a stored job's
TaskList still has): accepted and ignored. A job's state lives in the store."""


def _drop_record_only(data: Any, fields: tuple[str, ...]) -> Any:
    if isinstance(data, dict):
        return {key: value for key, value in data.items() if key not in fields}
    return data


class TaskStep(BaseModel):
    """One typed step: an agent does the work, the exit command decides if it is done."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=STEP_ID_PATTERN)
    """Unique within the TaskList; letters, digits, `_`, `.`, `-`; part of git ref names,
    so no `..` and no `.` or `.lock` at the end."""
    step_type: StepType
    """Debug, Feature, Refactor, Verify or Test."""
    description: str = Field(min_length=1)
    """What the agent must do, in plain words."""
    verification: str = ""
    """How a person would know the step is done; shown to the agent."""
    exit_command: str | None = None
    """Command whose exit code 0 means done; default from config and project kind."""
    agent: str | None = None
    """Name of the agent profile to run the step with (default agent when unset)."""
    tier: str | None = None
    """Model tier to start on, overriding the default (must name a configured tier)."""
    depends_on: list[str] | None = None
    """Ids of earlier steps this one needs: it starts once they all passed (``[]``: at
    once). When no step of the list has a ``depends_on``, each needs the one before it."""
    on_failure: OnFailure | None = None
    """`stop` or `continue` when the step fails on every tier (default: the list's)."""
    spec_check: bool = False
    """Check the step's diff against the relevant specs after its exit command passes:
    violations fail the verification (`enforce`), or only warn when `[specs] check` is
    `warn`. Steps are checked without it when `[specs] check` is not `off`."""

    @model_validator(mode="before")
    @classmethod
    def _ignore_record_only_fields(cls, data: Any) -> Any:
        return _drop_record_only(data, RECORD_ONLY_FIELDS)

    @field_validator("id")
    @classmethod
    def _fits_a_ref_name(cls, value: str) -> str:
        if ".." in value or value.endswith((".", ".lock")):
            raise ValueError(
                f"step id {value!r} cannot be part of a git ref name: no '..', and no "
                "'.' or '.lock' at the end"
            )
        return value


class TaskList(BaseModel):
    """An ordered list of typed steps with a title: what a job is asked to do."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12], pattern=STEP_ID_PATTERN)
    """Identifier of the TaskList (generated when absent)."""
    title: str = Field(min_length=1)
    """A one-line summary of the whole job."""
    steps: list[TaskStep] = Field(default_factory=list)
    """The steps; they run in this order unless some name `depends_on` (a graph)."""
    on_failure: OnFailure = OnFailure.STOP
    """What a failed step does to the job, for steps that do not say: `stop` or `continue`."""

    @model_validator(mode="before")
    @classmethod
    def _ignore_record_only_fields(cls, data: Any) -> Any:
        return _drop_record_only(data, ("status",))

    @model_validator(mode="after")
    def _check_step_graph(self) -> Self:
        seen: set[str] = set()
        for step in self.steps:
            if step.id in seen:
                raise ValueError(f"duplicate step id {step.id!r}: step ids must be unique")
            seen.add(step.id)
        cycle = _find_cycle({s.id: s.depends_on or [] for s in self.steps})
        if cycle:
            raise ValueError("depends_on forms a cycle: " + " -> ".join(cycle))
        earlier: set[str] = set()
        for step in self.steps:
            for dep in step.depends_on or []:
                if dep not in seen:
                    raise ValueError(f"step {step.id!r} depends_on unknown step {dep!r}")
                if dep not in earlier:
                    raise ValueError(
                        f"step {step.id!r} depends_on {dep!r}, which comes after it: "
                        "depends_on must name earlier steps"
                    )
            earlier.add(step.id)
        return self

    def step(self, step_id: str) -> TaskStep:
        """The step with this id."""
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)

    def check_submittable(self) -> None:
        """Raise TaskListError when the list cannot be submitted as a job."""
        if not self.steps:
            raise TaskListError(f"TaskList {self.title!r} has no steps: nothing to run")


def _find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """Return one dependency cycle as a path of ids, or None."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(graph, white)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = grey
        stack.append(node)
        for dep in graph.get(node, []):
            if dep not in graph:
                continue
            if color[dep] == grey:
                return [*stack[stack.index(dep) :], dep]
            if color[dep] == white and (found := visit(dep)):
                return found
        stack.pop()
        color[node] = black
        return None

    for node in graph:
        if color[node] == white and (found := visit(node)):
            return found
    return None


def parse_tasklist(data: Any, source: str = "<data>") -> TaskList:
    """Validate already-parsed data as a TaskList, naming the field of every problem."""
    if not isinstance(data, dict):
        raise TaskListError(f"{source}: a TaskList must be a mapping with 'title' and 'steps'")
    try:
        return TaskList.model_validate(data)
    except ValidationError as exc:
        raise TaskListError(f"{source}: invalid TaskList\n{_describe(exc, data)}") from None
    except RecursionError:
        raise TaskListError(f"{source}: {TOO_DEEP}") from None


def load_tasklist(path: str | Path) -> TaskList:
    """Read a TaskList from a YAML or JSON file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskListError(f"TaskList file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskListError(f"cannot read TaskList file {path}: {exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else load_yaml(text)
    except json.JSONDecodeError as exc:
        raise TaskListError(
            f"{path}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise TaskListError(f"{path}: {TOO_DEEP}") from None
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise TaskListError(f"{path}: malformed YAML{where}: {problem}") from None
    except YAML_TAG_ERRORS as exc:
        raise TaskListError(f"{path}: malformed YAML: a value unfit for its tag ({exc})") from None
    return parse_tasklist(data, str(path))


MAX_PROBLEMS = 20
"""The most problems a TaskListError lists; the rest are counted."""
MAX_SHOWN = 60
"""The most characters of a key, a step id or a message a TaskListError shows of each."""


def _describe(exc: ValidationError, data: dict[str, Any]) -> str:
    lines = []
    errors = exc.errors(include_input=False, include_url=False)
    for error in errors[:MAX_PROBLEMS]:
        loc = list(error["loc"])
        where = _format_loc(loc, data)
        message = _cut(error["msg"].removeprefix("Value error, "), 4 * MAX_SHOWN)
        lines.append(f"  {where}: {message}" if where else f"  {message}")
    if len(errors) > MAX_PROBLEMS:
        lines.append(f"  ... and {len(errors) - MAX_PROBLEMS} more problem(s)")
    return "\n".join(lines)


def _cut(text: str, most: int = MAX_SHOWN) -> str:
    """``text`` cut to ``most`` characters, saying so: a huge key or id is not echoed."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text):,} characters)"


def _format_loc(loc: list[int | str], data: dict[str, Any]) -> str:
    parts: list[str] = []
    for index, item in enumerate(loc):
        if isinstance(item, int):
            label = f"[{item}]"
            if index == 1 and loc[0] == "steps":
                steps = data.get("steps")
                if isinstance(steps, list) and item < len(steps) and isinstance(steps[item], dict):
                    step_id = steps[item].get("id")
                    if step_id is not None:
                        label += f" (id {_cut(repr(step_id))})"
            parts.append(label)
        else:
            parts.append(("." if parts else "") + _cut(str(item)))
    return "".join(parts)
