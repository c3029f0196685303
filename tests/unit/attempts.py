"""Attempt rows as the escalation tests need them (only the fields the code reads)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from merlin_flow.failures import AttemptKind


def attempt(
    number: int,
    kind: AttemptKind,
    tier: str = "local",
    status: str = "failed",
    exit_code: int | None = 1,
    error: str | None = None,
    output_tail: str | None = None,
    failure_kind: str | None = None,
    command: str = "python -m pytest -q",
) -> Any:
    return SimpleNamespace(
        number=number,
        kind=kind.value,
        tier=tier,
        status=status,
        exit_code=exit_code,
        error=error,
        output_tail=output_tail,
        failure_kind=failure_kind,
        step=SimpleNamespace(exit_command=command),
    )
