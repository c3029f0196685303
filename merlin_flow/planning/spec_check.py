"""The spec check: a model compares a step's diff with the relevant specs' constraints.

**Policy** (``policy``): ``[specs] check = "enforce"`` or ``"warn"`` applies to every
step; with ``"off"`` (the default) only steps with ``spec_check: true`` are checked, and
they are enforced. ``warn`` wins over a step's flag. A step is checked after its exit
command passed, and only when some relevant spec (``specs.relevant``, scored against
the step's description) has constraint sections and the step changed something.

The checking model answers ``PASS`` or lines ``VIOLATION path:line: what is broken``.
``parse_answer`` reads it leniently: any violation line (a bullet, bold or a missing
line number are fine) makes violations and the prose around them is ignored; else a
``PASS`` is a pass; anything else is unreadable, taken as a pass with a note. A call that
fails is expected input: the check could not run, which is noted and fails nothing.
The same constraints go into each attempt's prompt (``with_spec_constraints``).

**Citations** (``with_citations``): each violation's ``path:line``, and the citations in
its text (``merlin_flow.workspace.citations``), are checked against the attempt's
commit. One that does not hold is marked on its violation (``[citation invalid: no
such file]``). With ``[agents] citations = "enforce"`` a check whose citations do not
all hold fails (``CheckResult.unfounded``), as a violation does, its error naming them.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from merlin_flow.agents.loop import StepBrief
from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.errors import GitError, MerlinError
from merlin_flow.models.diagnosis import examine
from merlin_flow.models.llm import Completion, ModelCall, complete
from merlin_flow.planning.specs import relevant_constraints
from merlin_flow.store.events import EventKind
from merlin_flow.workspace.citations import (
    MARK,
    Citation,
    CitationResult,
    Reader,
    check_citation,
    check_citations,
)

log = logging.getLogger(__name__)

PROMPT_CHARS = 4000  # the most of the specs' constraints a step's prompt is given
CHECK_CHARS = 6000  # the most of the specs' constraints the checking model is given
DIFF_CHARS = 20000  # the most of the diff the checking model is given
MAX_VIOLATIONS = 20  # the most violations kept from one answer

CHECK_PROMPT = """\
You review a change to a software project against the constraints its specs state \
(purpose, invariants, public API, error cases). Report only what the diff breaks: not \
style, not missing features, not constraints the diff does not touch.
If the diff breaks none of them, answer exactly: PASS
Otherwise answer one line per broken constraint, and nothing else:
VIOLATION path:line: what is broken, and which constraint
(path and line in the new version of the changed file)."""

_VIOLATION = re.compile(r"^[\s>*_#`\-\d.)]*violation\b[*_`]*\s*[:\-]?\s*(?P<rest>.*)$", re.I)
_AT_LINE = re.compile(r"^`?(?P<path>[^\s:`]+)`?:(?P<line>\d+)(?:-\d+)?`?\s*[:\-]?\s*(?P<text>.*)$")
_AT_FILE = re.compile(r"^`?(?P<path>[^\s:`]*[./][^\s:`]*)`?\s*[:\-]\s*(?P<text>.+)$")
_PASS = re.compile(r"^[\s>*_#`\-]*pass\b|\bPASS\b", re.I | re.M)


class Policy(StrEnum):
    """What a step's spec check does with violations."""

    OFF = "off"
    WARN = "warn"
    """Violations are recorded (a ``spec_warning`` event); the step passes."""
    ENFORCE = "enforce"
    """Violations fail the verification, like a failed exit command."""


def policy(config: MerlinConfig, spec_check: bool) -> Policy:
    """The policy of a step: ``[specs] check``, or ``enforce`` for a flagged step."""
    setting = Policy(config.specs.check)
    return Policy.ENFORCE if setting is Policy.OFF and spec_check else setting


@dataclass(frozen=True)
class Violation:
    """One broken constraint the checking model named."""

    path: str
    line: int | None
    text: str

    def __str__(self) -> str:
        where = self.path + (f":{self.line}" if self.line is not None else "")
        return f"VIOLATION {where}: {self.text}" if where else f"VIOLATION {self.text}"


@dataclass(frozen=True)
class CheckResult:
    """The checking model's verdict; no violations is a pass."""

    violations: tuple[Violation, ...] = ()
    note: str | None = None
    """Why the answer was taken as a pass (unreadable), or why the check could not run."""
    completion: Completion | None = None
    citations: tuple[CitationResult, ...] = ()
    """The violations' citations, checked at the attempt's commit (``with_citations``)."""
    unfounded: bool = False
    """Some citation does not hold, and ``[agents] citations = "enforce"``: a failure."""

    @property
    def passed(self) -> bool:
        """True when no violation was found (or the check could not run), none unfounded."""
        return not self.violations and not self.unfounded

    def invalid_citations(self) -> str:
        """The citations that do not hold and their problems, on one line."""
        return "; ".join(f"{r.citation}: {r.problem}" for r in self.citations if not r.ok)

    def text(self) -> str:
        """The violations, one ``VIOLATION path:line: text`` line each."""
        return "\n".join(str(violation) for violation in self.violations)


def _violation(rest: str) -> Violation:
    rest = rest.strip(" *_")
    if match := _AT_LINE.match(rest):
        return Violation(match["path"], int(match["line"]), match["text"].strip() or rest)
    if match := _AT_FILE.match(rest):
        return Violation(match["path"], None, match["text"].strip())
    return Violation("", None, rest)


def parse_answer(answer: str) -> CheckResult:
    """The violations ``answer`` names, or a pass (see the module docstring)."""
    found = [m["rest"] for m in map(_VIOLATION.match, answer.splitlines()) if m is not None]
    violations = [_violation(rest) for rest in found if rest.strip(" *_")]
    if violations:
        return CheckResult(tuple(violations[:MAX_VIOLATIONS]))
    if _PASS.search(answer):
        return CheckResult()
    shown = " ".join(answer.split())[:200] or "(empty)"
    return CheckResult(note=f"spec check answer unreadable, taken as a pass: {shown}")


def with_citations(
    result: CheckResult, read: Reader, mode: Literal["check", "enforce"]
) -> CheckResult:
    """``result`` with its violations' citations checked with ``read`` (see the docstring).

    ``read`` gives a file at the attempt's commit
    (``citations.reader_for_commit``); ``mode`` is ``[agents] citations``. A commit git
    cannot read leaves ``result`` as it is.
    """
    files: dict[str, str | None] = {}

    def cached(path: str) -> str | None:
        if path not in files:
            files[path] = read(path)
        return files[path]

    checked: dict[Citation, CitationResult] = {}
    violations = []
    try:
        for violation in result.violations:
            report = check_citations(violation.text, cached)
            text = report.annotate(violation.text)
            if violation.path and violation.line is not None:
                at = check_citation(
                    Citation(violation.path, violation.line, violation.line), cached
                )
                checked.setdefault(at.citation, at)
                text += "" if at.ok else MARK.format(problem=at.problem)
            checked.update((r.citation, r) for r in report.results if r.citation not in checked)
            violations.append(replace(violation, text=text))
    except GitError as exc:  # citations that cannot be read never stop a step
        log.warning("spec check citations not checked: %s", exc)
        return result
    unfounded = mode == "enforce" and any(not r.ok for r in checked.values())
    return replace(
        result, violations=tuple(violations), citations=tuple(checked.values()), unfounded=unfounded
    )


def check_messages(constraints: str, diff: str) -> list[dict[str, Any]]:
    """The checking model's conversation: the instructions, the constraints, the diff."""
    if len(diff) > DIFF_CHARS:
        diff = diff[:DIFF_CHARS] + "\n[... diff cut]"
    user = f"Constraints from the project's specs:\n{constraints}\n\nThe diff:\n{diff}"
    return [{"role": "system", "content": CHECK_PROMPT}, {"role": "user", "content": user}]


def run_check(
    tier: Tier, constraints: str, diff: str, call_model: ModelCall = complete
) -> CheckResult:
    """Ask ``tier``'s model; a failed call is a note ("could not run"), never an error."""
    try:
        reply = call_model(tier, check_messages(constraints, diff), [])
    except Exception as exc:  # a model's failure is expected input
        reason = str(exc) if isinstance(exc, MerlinError) else examine(exc).reason
        return CheckResult(note=f"spec check could not run: {reason}")
    result = parse_answer(str(reply.message.get("content") or ""))
    return replace(result, completion=reply)


def spec_constraints(
    git_dir: Path, commit: str, config: MerlinConfig, query: str, limit: int
) -> tuple[str, list[str]]:
    """The constraints of the specs relevant to ``query`` at ``commit``, and their paths.

    No spec, or none relevant with constraint sections: ``("", [])``.
    """
    specs = config.specs
    try:
        return relevant_constraints(git_dir, commit, specs.paths, specs.top, query, limit)
    except GitError as exc:  # an unreadable spec never stops a step
        log.warning("specs not read at %s: %s", commit[:10], exc)
        return "", []


def with_spec_constraints(
    brief: StepBrief, git_dir: Path, commit: str, config: MerlinConfig
) -> StepBrief:
    """``brief`` with the constraints of the specs relevant to its description."""
    text, _paths = spec_constraints(git_dir, commit, config, brief.description, PROMPT_CHARS)
    return replace(brief, constraints=text)


@dataclass(frozen=True)
class SpecOutcome:
    """A step's spec check: its policy, the specs it used, and what the model found."""

    policy: Policy
    specs: tuple[str, ...]
    result: CheckResult

    @property
    def fails(self) -> bool:
        """True when the verification fails: enforced, with violations."""
        return self.policy is Policy.ENFORCE and not self.result.passed

    def error(self) -> str:
        """The failed attempt's error: the fix attempt's feedback."""
        count = len(self.result.violations)
        unfounded = (
            f'spec check: its citations do not hold ([agents] citations = "enforce"): '
            f"{self.result.invalid_citations()}\n"
            if self.result.unfounded
            else ""
        )
        return (
            f"{unfounded}spec check: the change breaks the project's specs "
            f"({count} violation(s)):\n{self.result.text()}"
        )

    def event(self) -> tuple[EventKind, str]:
        """The event kind and message that record the check in the job's history."""
        specs = ", ".join(self.specs)
        if self.result.violations:
            kind = EventKind.SPEC_VIOLATION if self.fails else EventKind.SPEC_WARNING
            count = len(self.result.violations)
            invalid = self.result.invalid_citations()
            unfounded = f"; its citations do not hold: {invalid}" if self.result.unfounded else ""
            return kind, (
                f"spec check ({self.policy}) found {count} violation(s) of {specs}{unfounded}:\n"
                f"{self.result.text()}"
            )
        return EventKind.SPEC_CHECK, self.result.note or f"spec check passed ({specs})"
