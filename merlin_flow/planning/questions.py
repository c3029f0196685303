"""Answering a question about a repository: a read-only agent, no branch, no commit.

A request that asks rather than orders (``requests.classify``) is answered by the
planning tier's model with the tools that read, list and grep only
(``merlin_flow.tools.toolbox.READ_ONLY_TOOLS``), in a detached worktree of the commit the
job starts at, removed afterwards. There is no exit command and nothing is committed.
The model's last message is the answer; a model that fails, or runs out of turns, gives
an answer-less job whose error says why (expected input, never a crash).

The answer's ``path:line`` citations are checked against that commit
(``merlin_flow.workspace.citations``): each one that does not hold is marked in the
answer (``[citation invalid: no such file]``), and every result is kept with it. With
``[agents] citations = "enforce"`` an answer whose citations do not all hold is no
answer: the job fails, its error naming them (the answer stays in its transcript).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from merlin_flow.agents.loop import converse, for_the_record
from merlin_flow.config import MerlinConfig
from merlin_flow.errors import StepFailure
from merlin_flow.models.llm import ModelCall
from merlin_flow.planning.context import read_context
from merlin_flow.planning.requests import classify
from merlin_flow.tools.permissions import Permissions
from merlin_flow.tools.toolbox import READ_ONLY_TOOLS, Toolbox
from merlin_flow.workspace.citations import check_citations, reader_for_commit
from merlin_flow.workspace.git import add_worktree, remove_worktree
from merlin_flow.workspace.repository import JobRepository

QUESTION_PROMPT = """\
You answer questions about a software repository, whose files are your working \
directory. You can read files, list them and search them with grep; you cannot change \
anything and cannot run commands. Look at what you need, then answer in plain words, \
naming the files (and lines) your answer rests on. Your last message, without a tool \
call, is the answer.
Cite lines as path:line or path:start-end (src/app.py:12-14), the path from the \
repository's top; you may quote the code right after a citation in backquotes \
(src/app.py:12 `return total`). Every citation is checked against the files."""


@dataclass(frozen=True)
class Answer:
    """A question's answer, or why there is none."""

    text: str | None
    error: str | None = None
    transcript: list[dict[str, Any]] = field(default_factory=list)
    """The conversation, as ``merlin logs`` shows it (``agents.loop.for_the_record``)."""
    citations: list[dict[str, Any]] = field(default_factory=list)
    """The answer's citations, checked: ``citation``, ``ok``, ``problem``, ``snippet``."""


def answer_question(
    repository: JobRepository,
    base: str,
    config: MerlinConfig,
    question: str,
    call_model: ModelCall,
    on_progress: Callable[[list[dict[str, Any]]], None] = lambda _messages: None,
) -> Answer:
    """Ask the planning tier ``question`` about ``repository`` at ``base``.

    ``on_progress(transcript)`` is given the conversation as it grows (for ``merlin logs
    --follow``); the answer carries all of it.
    """
    tier = config.planning_tier()
    attached = classify(question).files
    readable = Permissions(config.permissions).path_readable
    context = read_context(
        repository.path, base, attached, config.planning.context_tokens, readable=readable,
        request=question,
    )  # fmt: skip
    messages = [
        {"role": "system", "content": QUESTION_PROMPT},
        {"role": "user", "content": f"Question:\n{question}\n\nThe repository:\n{context.text()}"},
    ]
    folder = repository.scratch / f"question-{uuid.uuid4().hex[:8]}"
    add_worktree(repository.path, folder, base)
    try:
        permissions = Permissions(config.permissions, root=folder)  # as for a step's tools
        toolbox = Toolbox(
            folder,
            only=READ_ONLY_TOOLS,
            gate=permissions.check_call,
            readable=permissions.path_readable,
        )
        result = converse(
            tier,
            messages,
            toolbox,
            lambda *_: None,
            limits=config.limits,
            call_model=call_model,
            on_progress=lambda so_far: on_progress(for_the_record(so_far)),
        )
    except StepFailure as exc:  # the model failed for good, or ran out of turns
        error = f"the question could not be answered: {exc}"
        return Answer(None, error, for_the_record(messages))
    finally:
        remove_worktree(repository.path, folder)
    if not result.summary:
        return Answer(None, "the model gave no answer", for_the_record(messages))
    return checked_answer(result.summary, repository, base, config, for_the_record(messages))


def checked_answer(
    text: str,
    repository: JobRepository,
    base: str,
    config: MerlinConfig,
    transcript: list[dict[str, Any]],
) -> Answer:
    """``text`` with its citations checked at ``base``: marked, or enforced (no answer)."""
    report = check_citations(text, reader_for_commit(repository.path, base))
    if config.agents.citations == "enforce" and not report.all_hold:
        count = len(report.invalid)
        error = (
            f"the answer's citations do not hold ({count} invalid; [agents] citations = "
            f'"enforce"): {report.describe_invalid()}'
        )
        return Answer(None, error, transcript, report.as_json())
    return Answer(report.annotate(text), None, transcript, report.as_json())
