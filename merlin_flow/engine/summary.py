"""The Markdown summary of a finished job, written beside its patch when it is finalized.

It is what a person reads first in ``$MERLIN_HOME/jobs/<job>/summary.md``: the outcome,
each step's attempts, and what the job's history says should be read (the spec check's
warnings).
"""

from __future__ import annotations

from collections.abc import Sequence

from merlin_flow.store import Job


def job_summary(job: Job, patch_error: str | None = None, warnings: Sequence[str] = ()) -> str:
    """A Markdown summary of a finished job: outcome, each step's attempts, the warnings.

    ``warnings``: what the job's history says should be read (the spec check's
    ``spec_warning`` events).
    """
    lines = [
        f"# {job.title}",
        "",
        f"- job: {job.id}, status: **{job.status}**",
        f"- repository: {job.repo}",
        f"- branch: {job.branch} ({job.base_commit[:10]}..{job.head_commit[:10]})",
    ]
    if job.error:
        lines.append(f"- error: {job.error}")
    if patch_error:
        lines.append(f"- patch: not written, the repository could not be read: {patch_error}")
    lines += ["", "| step | type | status | attempts (kind@tier: exit code) |", "|---|---|---|---|"]
    for step in job.steps:
        attempts = ", ".join(
            f"{a.kind}@{a.tier}: {a.exit_code if a.exit_code is not None else a.status}"
            for a in step.attempts
        )
        lines.append(f"| {step.key} | {step.step_type} | {step.status} | {attempts} |")
    if warnings:
        lines += ["", "## Warnings", "", *(f"- {warning}" for warning in warnings)]
    return "\n".join(lines) + "\n"
